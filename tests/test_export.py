"""scalegnn export / predict: a checkpoint of a 1x2x2x2 run, gathered into one file, predicts
on one process what the distributed evaluation computed.

Oracle: the distributed full-graph evaluation itself (8 ranks), its logits shards
assembled and mapped back from the prepared vertex order to the graph's. Five models:
the paper's (projection, RMSNorm, residuals, head, biases) on row-scaled features (a
``dgl`` file's default), DGL's GCN stack on standardised features (their columns'
statistics over the training graph are recorded by the export), and the paper's model
with SAGE, with GIN and with GAT layers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main
from dgl_scalegnn.train.export import load_model
from tests.helpers import random_dataset, relative_error
from tests.oracle import assemble
from tests.ranks import spawn_ranks

pytestmark = pytest.mark.slow  # the fixture runs 8 ranks (about 12 s on 2 cores)

GRID = "1x2x2x2"
NUM_NODES, NUM_CLASSES = 97, 5
MODELS = {
    "paper-row": (
        {"hidden": 13, "layers": 3, "dropout": 0.3, "bias": True},
        "auto",
    ),
    "gcn-standardize": (
        {
            "hidden": 8,
            "layers": 2,
            "norm": False,
            "residual": False,
            "input_projection": False,
            "head": False,
            "bias": True,
        },
        "standardize",
    ),
    # the other layer types: SAGE's mean over the whole graph on one process, GIN's
    # learnt epsilon (a replicated scalar) gathered from the shards
    "sage-row": ({"conv": "sage", "hidden": 13, "layers": 2, "dropout": 0.3}, "auto"),
    "gin-row": ({"conv": "gin", "gin_learn_eps": True, "hidden": 8, "layers": 2}, "auto"),
    # GAT's attention over the whole graph on one process, DGL's residual beside the tail's
    "gat-row": (
        {"conv": "gat", "gat_heads": 2, "gat_residual": True, "hidden": 8, "layers": 2},
        "auto",
    ),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A graph file, and per model a checkpoint of 4 steps on 1x2x2x2 and each rank's
    share of the distributed evaluation after them."""
    root = tmp_path_factory.mktemp("export")
    graph = random_dataset(num_nodes=NUM_NODES, num_classes=NUM_CLASSES).graph
    dgl.save_graphs(str(root / "graph.bin"), [graph])
    variants = {
        name: {
            "data": {"name": "dgl", "path": str(root / "graph.bin"), "feature_norm": norm},
            "model": model,
            "sampling": {"batch_size": 40},
            "train": {"epochs": 2, "max_steps": 4, "progress": False},
            "optim": {"lr": 0.05},
            "parallel": {"grid": GRID, "watchdog_s": 5.0},
            "output": {"dir": str(root / name), "checkpoint_every": 4},
        }
        for name, (model, norm) in MODELS.items()
    }
    spec = root / "spec.json"
    spec.write_text(json.dumps({"variants": variants, "out": str(root)}))
    spawn_ranks(8, "tests.workers.export_eval:main", [str(spec)], root / "logs", timeout=120)
    return root


def _distributed(root: Path, name: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The distributed evaluation's logits in the graph's vertex order, and its accuracy."""
    records = [torch.load(root / f"rank{r}_{name}.pt", weights_only=True) for r in range(8)]
    logits = assemble(
        records,
        lambda r: ((slice(*r["logit_rows"]), slice(*r["logit_cols"])), r["logits"]),
        (NUM_NODES, NUM_CLASSES),
    )
    accuracy = {key.removesuffix("_acc"): value for key, value in records[0]["accuracy"].items()}
    return logits[records[0]["permutation"]], accuracy


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_model_predicts_what_the_distributed_evaluation_did(trained, name, capsys):
    model_path, out = trained / f"{name}.pt", trained / f"{name}-predictions.pt"
    checkpoints = trained / name / "checkpoints"
    assert main(["export", "--checkpoint", str(checkpoints), "--out", str(model_path)]) == 0
    assert main(["predict", "--model", str(model_path), "--graph", str(trained / "graph.bin"),
                 "--out", str(out)]) == 0  # fmt: skip
    said = capsys.readouterr().out.splitlines()
    assert said[0] == (
        f"exported {checkpoints / 'step_00000004'} (global step 4, grid {GRID}): 11 features "
        f"-> 5 classes, input scaling {'row' if name.endswith('-row') else 'standardize'} "
        f"-> {model_path}"
    )
    logits, accuracy = _distributed(trained, name)
    predicted = torch.load(out, weights_only=True)
    assert relative_error(predicted["logits"], logits) < 1e-5
    assert torch.equal(predicted["predicted"], logits.argmax(dim=1))
    assert predicted["accuracy"] == accuracy
    scores = " | ".join(f"{split} {accuracy[split]:.4f}" for split in ("train", "val", "test"))
    assert said[1] == f"{NUM_NODES} vertices | {scores} -> {out}"
    # the documented Python call, on a graph read by DGL itself
    (graph,), _ = dgl.load_graphs(str(trained / "graph.bin"))
    model = load_model(model_path)
    assert torch.equal(model.predict(graph), predicted["predicted"])
    record = torch.load(model_path, weights_only=True)  # one file, no pickled code
    assert record["source"]["grid"] == GRID and not record["input"]["multilabel"]


def _error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.removeprefix("scalegnn: error: ").rstrip("\n")


def test_export_and_predict_errors_are_one_line(trained, tmp_path, capsys):
    missing = tmp_path / "absent"
    assert _error(["export", "--checkpoint", str(missing)], capsys) == (
        f"--checkpoint {missing}: no checkpoint there; give a step_* directory, the "
        "checkpoints directory holding them (output.dir/checkpoints) or the run's output.dir"
    )
    # a checkpoint whose model section says another model than its parameters
    other = tmp_path / "other"
    shutil.copytree(trained / "gcn-standardize" / "checkpoints" / "step_00000004", other)
    meta = json.loads((other / "meta.json").read_text())
    meta["config"]["model"]["hidden"] = 16
    (other / "meta.json").write_text(json.dumps(meta))
    message = _error(["export", "--checkpoint", str(other)], capsys)
    assert message.startswith(f"{other}: its parameters [('layer0_bias', (8,)),")
    assert message.endswith("export a checkpoint written by scalegnn train")

    # a checkpoint whose training graph is not where it was
    moved = tmp_path / "moved"
    shutil.copytree(trained / "gcn-standardize" / "checkpoints" / "step_00000004", moved)
    meta = json.loads((moved / "meta.json").read_text())
    meta["config"]["data"]["path"] = str(tmp_path / "gone.bin")
    (moved / "meta.json").write_text(json.dumps(meta))
    assert _error(["export", "--checkpoint", str(moved)], capsys) == (
        "export reads the training graph for its label kind and feature scaling: dataset "
        f"'dgl': file '{tmp_path / 'gone.bin'}' does not exist; set data.path to a file "
        "written by dgl.save_graphs(path, [graph])"
    )

    graph = str(trained / "graph.bin")
    absent_model = tmp_path / "model.pt"
    assert _error(["predict", "--model", str(absent_model), "--graph", graph], capsys) == (
        f"--model {absent_model}: no such file; give a file written by scalegnn export"
    )
    rank_file = other / "rank00000.pt"  # a torch file, but a checkpoint's shard
    assert _error(["predict", "--model", str(rank_file), "--graph", graph], capsys) == (
        f"--model {rank_file}: not a model written by scalegnn export; give a file written "
        "by scalegnn export"
    )
    model_path = tmp_path / "gcn.pt"
    checkpoints = trained / "gcn-standardize" / "checkpoints"
    assert main(["export", "--checkpoint", str(checkpoints), "--out", str(model_path)]) == 0
    wide = tmp_path / "wide.bin"
    dgl.save_graphs(str(wide), [random_dataset(num_features=12).graph])
    assert _error(["predict", "--model", str(model_path), "--graph", str(wide)], capsys) == (
        "ndata['feat'] has shape (97, 12); the model reads (N, 11) features"
    )
    # a --graph that is not a DGL file: refused by its magic number, before DGL reads it
    foreign = tmp_path / "foreign.bin"
    foreign.write_bytes(b"feat,label\n1.0,2\n")
    assert _error(["predict", "--model", str(model_path), "--graph", str(foreign)], capsys) == (
        f"--graph: {str(foreign)!r} is not a DGL graph file (does not begin with DGL's magic "
        "number); give a file written by dgl.save_graphs(path, [graph])"
    )
