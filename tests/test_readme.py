"""The README's Python examples run as written."""

from __future__ import annotations

import re

from tests.helpers import ROOT


def test_readme_python_examples_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        if "loss" in namespace:  # the training loop ran at least one step to a finite loss
            assert bool(namespace["loss"].isfinite())
