"""The one DGL import module makes `import dgl` work on this torch, and kernels run."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import torch

from dgl_scalegnn._dgl import dgl, graphbolt_stubbed


def test_dgl_ops_kernels_run_through_the_shim():
    graph = dgl.graph((torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1])), num_nodes=3)
    features = torch.tensor([[1.0], [2.0], [4.0]])
    weights = torch.tensor([0.5, 1.0, 2.0, 3.0])
    # copy_u_sum: each destination sums its in-neighbours' rows.
    assert dgl.ops.copy_u_sum(graph, features).flatten().tolist() == [4.0, 5.0, 2.0]
    assert dgl.ops.u_mul_e_sum(graph, features, weights).flatten().tolist() == [8.0, 12.5, 2.0]
    sub = dgl.node_subgraph(graph, torch.tensor([1, 2]))
    assert sub.num_edges() == 2


_IMPORTS_DGL = re.compile(r"^\s*(import dgl(\s|\.|$)|from dgl(\s|\.))")


def test_shim_is_the_only_import_of_dgl_in_the_package():
    package = pathlib.Path(__file__).resolve().parents[1] / "dgl_scalegnn"
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "_dgl.py"
        and any(_IMPORTS_DGL.match(line) for line in path.read_text().splitlines())
    ]
    assert offenders == []


def test_plain_import_fails_without_the_shim_and_works_with_it():
    """Guards the reason the shim exists: if a future DGL fixes it, this tells us."""
    plain = subprocess.run([sys.executable, "-c", "import dgl"], capture_output=True, text=True)
    if graphbolt_stubbed():
        assert plain.returncode != 0 and "graphbolt" in plain.stderr
    shimmed = subprocess.run(
        [sys.executable, "-c", "from dgl_scalegnn._dgl import dgl; print(dgl.__version__)"],
        capture_output=True,
        text=True,
    )
    assert shimmed.returncode == 0, shimmed.stderr
    assert shimmed.stdout.strip() == "2.1.0"


_GLOBAL_STATE = """
import warnings, torch
from dgl_scalegnn._dgl import dgl
libxsmm = bool(dgl.is_libxsmm_enabled())  # imports DGL, which sets warning filters of its own
filters = list(warnings.filters)
threads = torch.get_num_threads()
import pkgutil, importlib, dgl_scalegnn
for module in pkgutil.walk_packages(dgl_scalegnn.__path__, "dgl_scalegnn."):
    importlib.import_module(module.name)
assert warnings.filters == filters, [f for f in warnings.filters if f not in filters]
assert bool(dgl.is_libxsmm_enabled()) == libxsmm
assert torch.get_num_threads() == threads
print("unchanged", libxsmm)
"""


def test_importing_every_module_changes_no_global_state():
    result = subprocess.run(
        [sys.executable, "-c", _GLOBAL_STATE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["unchanged", "True"]  # DGL's own default


def test_dgl_kernels_switch_libxsmm_off_when_they_build_a_graph():
    from dgl_scalegnn.parallel.spmm import BlockCOO, build_local_spmm

    dgl.use_libxsmm(True)
    block = BlockCOO(
        rows=torch.tensor([0, 1]),
        cols=torch.tensor([1, 0]),
        values=torch.ones(2),
        diagonal=torch.zeros(2, dtype=torch.bool),
        row_scale=torch.ones(2),
        col_scale=torch.ones(2),
        inv_p=1.0,
        num_rows=2,
        num_cols=2,
    )
    build_local_spmm(block, "dgl-weighted")
    assert not dgl.is_libxsmm_enabled()


_PREPARED_RUN = """
import sys
from dgl_scalegnn.cli import main
assert main(["prepare", "--dataset", "synthetic", "--set", "data.synthetic.num_nodes=500",
             "--out", sys.argv[1]]) == 0
assert main(["train", "--set", f"data.prepared={sys.argv[1]}", "--set", "train.max_steps=2",
             "--set", "sampling.batch_size=100", "--set", "train.progress=false"]) == 0
print("dgl imported:", "dgl" in sys.modules)
"""


def test_training_from_a_prepared_graph_never_imports_dgl(tmp_path):
    """Every rank of a job of several trains from a prepared graph: DGL's import (about
    1.5 s of CPU and 95 MB a process) is left to the code that needs it."""
    result = subprocess.run(
        [sys.executable, "-c", _PREPARED_RUN, str(tmp_path / "prepared")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("dgl imported: False"), result.stdout[-2000:]
