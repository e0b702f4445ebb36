"""The Python examples of the README and of docs/dgl.md run as written."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT


@pytest.mark.parametrize("page", ["README.md", "docs/dgl.md"])
def test_python_examples_run(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the examples write files (graph.bin)
    text = (ROOT / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, f"{page} has no Python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, page, "exec"), namespace)
        if "loss" in namespace:  # a training loop ran at least one step to a finite loss
            assert bool(namespace["loss"].isfinite())
