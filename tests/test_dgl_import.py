"""Plain `import dgl` works on this torch (the start-up hook), and so do DGL's kernels."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import torch

from dgl_scalegnn._dgl import (
    GraphboltPlaceholderFinder,
    dgl,
    graphbolt_stubbed,
    write_startup_hook,
)


def test_dgl_ops_kernels_run_through_the_shim():
    graph = dgl.graph((torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1])), num_nodes=3)
    features = torch.tensor([[1.0], [2.0], [4.0]])
    weights = torch.tensor([0.5, 1.0, 2.0, 3.0])
    # copy_u_sum: each destination sums its in-neighbours' rows.
    assert dgl.ops.copy_u_sum(graph, features).flatten().tolist() == [4.0, 5.0, 2.0]
    assert dgl.ops.u_mul_e_sum(graph, features, weights).flatten().tolist() == [8.0, 12.5, 2.0]
    sub = dgl.node_subgraph(graph, torch.tensor([1, 2]))
    assert sub.num_edges() == 2


def _imports_dgl(node: ast.AST) -> bool:
    """Whether ``node`` is an import statement of ``dgl`` or one of its modules."""
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "dgl" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dgl"


def test_shim_is_the_only_import_of_dgl_in_the_package():
    """Code of the package imports DGL through the shim (docstrings show users plain
    ``import dgl``, which the start-up hook makes work)."""
    package = pathlib.Path(__file__).resolve().parents[1] / "dgl_scalegnn"
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "_dgl.py" and any(map(_imports_dgl, ast.walk(ast.parse(path.read_text()))))
    ]
    assert offenders == []


#: A DGL user's script, as DGL's examples write it: plain ``import dgl``, a graph saved
#: and loaded, a GraphConv trained on it.
_DGL_EXAMPLE = """
import sys
import torch
import torch.nn.functional as F
import dgl
from dgl.nn import GraphConv

g = dgl.add_self_loop(dgl.graph(([0, 1, 2, 3], [1, 2, 3, 0]), num_nodes=4))
g.ndata["feat"] = torch.eye(4)
g.ndata["label"] = torch.tensor([0, 1, 0, 1])
dgl.save_graphs(sys.argv[1], [g], {"num_classes": torch.tensor([2])})
(graph,), saved = dgl.load_graphs(sys.argv[1])
torch.manual_seed(0)
conv = GraphConv(4, 2)
optimizer = torch.optim.Adam(conv.parameters(), lr=0.1)
losses = []
for _ in range(30):
    loss = F.cross_entropy(conv(graph, graph.ndata["feat"]), graph.ndata["label"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(graph.num_nodes(), graph.num_edges(), int(saved["num_classes"][0]), losses[-1] < losses[0])
"""


def _fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_plain_import_dgl_runs_a_dgl_example_script(tmp_path):
    result = _fresh_python(_DGL_EXAMPLE, str(tmp_path / "graph.bin"))
    assert result.returncode == 0, f"run `make install` (it writes the hook):\n{result.stderr}"
    assert result.stdout.split() == ["4", "8", "2", "True"]


def test_plain_import_dgl_after_the_package_and_the_placeholder_explains_itself():
    code = (
        "import dgl_scalegnn.cli, dgl, dgl.graphbolt\n"
        "from dgl_scalegnn._dgl import graphbolt_stubbed\n"
        "try:\n    dgl.graphbolt.ItemSampler\nexcept AttributeError as error:\n    print(error)\n"
        "print(dgl.__version__, graphbolt_stubbed())"
    )
    result = _fresh_python(code)
    assert result.returncode == 0, result.stderr
    if graphbolt_stubbed():  # DGL 2.1.0 on a torch it ships no graphbolt library for
        reason, versions = result.stdout.splitlines()
        assert reason.startswith("dgl.graphbolt.ItemSampler is unavailable: DGL has no graphbolt")
        assert versions == "2.1.0 True"


def test_start_up_hook_imports_neither_torch_nor_dgl():
    """Every interpreter of the environment runs the hook: it may cost no import of note."""
    code = (
        "import sys\n"
        "from dgl_scalegnn._dgl import GraphboltPlaceholderFinder as finder\n"
        "print(any(isinstance(f, finder) for f in sys.meta_path), "
        "sorted({'torch', 'dgl', 'numpy'} & set(sys.modules)))"
    )
    result = _fresh_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True []"


def test_start_up_hook_is_silent_once_the_package_is_gone(tmp_path):
    """pip does not remove a file it did not install: the hook must then do nothing."""
    write_startup_hook(str(tmp_path))
    code = f"import site, sys; site.addsitedir({str(tmp_path)!r}); print(len(sys.meta_path))"
    bare = subprocess.run(  # -I -S: no site-packages, so dgl_scalegnn is not importable
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert (bare.returncode, bare.stderr) == (0, "")


def test_finder_gives_the_placeholder_only_where_the_library_is_missing(tmp_path):
    finder = GraphboltPlaceholderFinder()
    (tmp_path / "graphbolt").mkdir()
    spec = finder.find_spec("dgl.graphbolt", [str(tmp_path)])
    assert spec is not None and spec.name == "dgl.graphbolt"
    version = torch.__version__.split("+")[0]
    (tmp_path / "graphbolt" / f"libgraphbolt_pytorch_{version}.so").touch()
    assert finder.find_spec("dgl.graphbolt", [str(tmp_path)]) is None
    assert finder.find_spec("dgl", None) is None
    assert finder.find_spec("dgl.sparse", [str(tmp_path)]) is None


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
