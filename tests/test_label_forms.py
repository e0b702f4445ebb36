"""Labels as users write them: ``(N, 1)`` class ids (as OGB gives them) train and predict
as ``(N,)`` ones; sparse class ids, NaN labels in a split, NaN features given to
``predict``, a heterograph, and labels of the other kind than the model's are each one
line with exit code 2; one class, a class without a training vertex and overlapping
masks are each said once at the start of a run.

Oracles: accuracies and micro-F1 counted here from the predicted logits and the labels
as written; the messages' numbers from the graphs the tests build.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main
from tests.helpers import random_dataset

#: Two steps, a checkpoint after them, nothing else: what predict and export need.
SHORT = ["--set", "train.max_steps=2", "--set", "train.progress=false"]


def _save(directory: Path, name: str, graph: dgl.DGLGraph) -> str:
    path = directory / name
    dgl.save_graphs(str(path), [graph])
    return str(path)


def _error(argv: list[str], capsys) -> str:
    """The one line a command says when it refuses its input (exit code 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.removeprefix("scalegnn: error: ").rstrip("\n")


def _export(directory: Path, graph_file: str, name: str) -> str:
    """Train ``graph_file`` for two steps and export the checkpoint; returns the model."""
    run = directory / name
    argv = ["train", "--data", graph_file, *SHORT, "--set", f"output.dir={run}"]
    assert main([*argv, "--set", "output.checkpoint_every=2"]) == 0
    model = directory / f"{name}.pt"
    assert main(["export", "--checkpoint", str(run), "--out", str(model)]) == 0
    return str(model)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """A single-label model trained on (N,) labels, a multi-label one, and their graphs:
    the same single-label graph with (N,) and with (N, 1) labels, and the multi-label one."""
    root = tmp_path_factory.mktemp("label-forms")
    single = random_dataset(num_nodes=97).graph
    column = single.clone()
    column.ndata["label"] = single.ndata["label"][:, None]
    files = {
        "flat": _save(root, "flat.bin", single),
        "column": _save(root, "column.bin", column),
        "multi": _save(root, "multi.bin", random_dataset(num_nodes=97, multilabel=True).graph),
    }
    files["single_model"] = _export(root, files["flat"], "single")
    files["multi_model"] = _export(root, files["multi"], "multi")
    files["root"] = str(root)
    return files


def _predict(model: str, graph: str, out: Path, capsys) -> tuple[dict, str]:
    assert main(["predict", "--model", model, "--graph", graph, "--out", str(out)]) == 0
    return torch.load(out, weights_only=True), capsys.readouterr().out


# ------------------------------------------------------------------ probe 5


def test_predict_scores_n_by_1_labels_and_multilabel_targets(models, tmp_path, capsys):
    """(N, 1) class ids score as (N,) ones, the accuracies counted here; a multi-label
    model's micro-F1 counted here from its true and false positives and negatives."""
    flat, flat_said = _predict(models["single_model"], models["flat"], tmp_path / "a.pt", capsys)
    column, column_said = _predict(
        models["single_model"], models["column"], tmp_path / "b.pt", capsys
    )
    (graph,), _ = dgl.load_graphs(models["column"])
    label = graph.ndata["label"][:, 0]
    predicted = column["logits"].argmax(dim=1)
    counted = {}
    for split in ("train", "val", "test"):
        mask = graph.ndata[f"{split}_mask"].bool()
        counted[split] = int((predicted == label)[mask].sum()) / int(mask.sum())
    assert column["accuracy"] == pytest.approx(counted, abs=1e-12)
    assert flat["accuracy"] == column["accuracy"]
    scores = " | ".join(f"{split} {counted[split]:.4f}" for split in ("train", "val", "test"))
    assert column_said.splitlines()[-1] == f"97 vertices | {scores} -> {tmp_path / 'b.pt'}"
    assert flat_said.splitlines()[-1] == f"97 vertices | {scores} -> {tmp_path / 'a.pt'}"

    result, _ = _predict(models["multi_model"], models["multi"], tmp_path / "m.pt", capsys)
    (graph,), _ = dgl.load_graphs(models["multi"])
    truth, predicted = graph.ndata["label"] > 0.5, result["logits"] > 0
    for split in ("train", "val", "test"):
        mask = graph.ndata[f"{split}_mask"].bool()
        tp = int((predicted & truth)[mask].sum())
        fp = int((predicted & ~truth)[mask].sum())
        fn = int((~predicted & truth)[mask].sum())
        assert result["accuracy"][split] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)


# ------------------------------------------------------------------ probe 6


def test_sparse_class_ids_are_refused_with_both_counts(tmp_path, capsys):
    graph = random_dataset(num_nodes=300, num_classes=4).graph
    stray = graph.clone()
    stray.ndata["label"] = graph.ndata["label"].clone()
    stray.ndata["label"][7] = 99
    message = _error(["train", "--data", _save(tmp_path, "stray.bin", stray), *SHORT], capsys)
    assert re.search(r"holds 5 distinct class ids up to 99, which would make 100 classes", message)
    graph.ndata["label"] = graph.ndata["label"] * 1_000_000
    path = _save(tmp_path, "sparse.bin", graph)
    started = time.perf_counter()
    message = _error(["train", "--data", path, *SHORT], capsys)
    assert time.perf_counter() - started < 10
    assert message == (
        f"file {path!r}: ndata['label'] holds 4 distinct class ids up to 3,000,000, which "
        "would make 3,000,001 classes; renumber them 0..3 (torch.unique(label, "
        "return_inverse=True)[1]) and save the graph again"
    )


# ------------------------------------------------------------------ probe 13


def test_predict_refuses_nan_features_as_training_does(models, tmp_path, capsys):
    (graph,), _ = dgl.load_graphs(models["flat"])
    graph.ndata["feat"][[5, 40]] = float("nan")
    graph.ndata["feat"][60, 2] = float("inf")
    path = _save(tmp_path, "nan.bin", graph)
    out = tmp_path / "out.pt"
    argv = ["predict", "--model", models["single_model"], "--graph", path, "--out", str(out)]
    assert _error(argv, capsys) == (
        "ndata['feat']: NaN or infinite features in 3 vertices (the first: vertex 5); replace "
        "those values (e.g. torch.nan_to_num) or remove the vertices, then predict again"
    )
    assert not out.exists()
    training = _error(["train", "--data", path, *SHORT], capsys)
    assert "NaN or infinite features in 3 vertices (the first: vertex 5)" in training


# ------------------------------------------------------------------ probe 14


def test_predict_refuses_heterographs_and_labels_of_the_other_kind(models, tmp_path, capsys):
    hetero = dgl.heterograph(
        {
            ("user", "follows", "user"): (torch.tensor([0, 1]), torch.tensor([1, 2])),
            ("user", "buys", "item"): (torch.tensor([0]), torch.tensor([1])),
        }
    )
    single, multi = models["single_model"], models["multi_model"]
    out = str(tmp_path / "out.pt")
    path = _save(tmp_path, "hetero.bin", hetero)
    assert _error(["predict", "--model", single, "--graph", path, "--out", out], capsys) == (
        "the graph has node types ['item', 'user'] and edge types ['buys', 'follows']; a "
        "node dataset needs one of each (convert it with dgl.to_homogeneous(graph, ndata=[...]))"
    )
    graph = models["multi"]
    assert _error(["predict", "--model", single, "--graph", graph, "--out", out], capsys) == (
        "ndata['label'] holds 0/1 multi-label targets of shape (97, 5), but the model is "
        "single-label and is scored against class ids (N,); give the labels it was trained "
        "on, or remove ndata['label']"
    )
    for graph in (models["column"], models["flat"]):
        shape = "(97, 1)" if graph == models["column"] else "(97,)"
        assert _error(["predict", "--model", multi, "--graph", graph, "--out", out], capsys) == (
            f"ndata['label'] holds class ids of shape {shape}, but the model is multi-label "
            "and is scored against (N, 5) 0/1 targets; give the labels it was trained on, or "
            "remove ndata['label']"
        )
    assert not Path(out).exists()


# ------------------------------------------------------------------ probe 20


def test_a_directory_given_as_the_graph_is_named_a_directory(models, tmp_path, capsys):
    assert _error(["train", "--data", str(tmp_path), *SHORT], capsys) == (
        f"dataset 'dgl': {str(tmp_path)!r} is a directory, not a graph file; set data.path "
        "to a file written by dgl.save_graphs(path, [graph])"
    )
    argv = ["predict", "--model", models["single_model"], "--graph", str(tmp_path)]
    assert _error(argv, capsys) == (
        f"--graph: {str(tmp_path)!r} is a directory, not a graph file; give a file written "
        "by dgl.save_graphs(path, [graph])"
    )


def test_nan_labels_in_a_split_are_called_nan(tmp_path, capsys):
    graph = random_dataset(num_nodes=97).graph
    label = graph.ndata["label"].double()
    train = torch.nonzero(graph.ndata["train_mask"]).flatten()
    label[train[[3, 8]]] = float("nan")
    graph.ndata["label"] = label[:, None]  # as OGB writes them: (N, 1) floats, NaN unlabelled
    path = _save(tmp_path, "nan-labels.bin", graph)
    assert _error(["train", "--data", path, *SHORT], capsys) == (
        f"file {path!r}: ndata['train_mask'] selects 2 unlabelled vertices (label NaN; the "
        f"first: vertex {int(train[3])}); a mask may select labelled vertices only"
    )


def _start_notes(path: str, capsys) -> list[str]:
    """The notes a run of ``path`` says on stderr (one step, no evaluation)."""
    argv = ["train", "--data", path, "--set", "train.max_steps=1", "--set", "train.evaluate=false"]
    assert main([*argv, "--set", "train.progress=false"]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("scalegnn:")]


def test_one_class_untrained_classes_and_overlapping_masks_are_said_once(tmp_path, capsys):
    graph = random_dataset(num_nodes=97, num_classes=5).graph
    train, val = graph.ndata["train_mask"], graph.ndata["val_mask"]
    graph.ndata["label"][train & (graph.ndata["label"] == 4)] = 0  # class 4: no training vertex
    shared = torch.nonzero(train).flatten()[:3]
    val[shared] = True  # three training vertices in validation too
    untrained = int((~train & (graph.ndata["label"] == 4)).sum())
    assert untrained > 0
    notes = _start_notes(_save(tmp_path, "awkward.bin", graph), capsys)
    assert (
        notes.count(
            "scalegnn: dataset 'dgl': 1 of the 5 classes (4) have no training vertex: the model "
            "cannot learn them, and their vertices in the other splits count as errors"
        )
        == 1
    ), notes
    assert (
        notes.count(
            "scalegnn: dataset 'dgl': train_mask and val_mask share 3 vertices; a vertex in two "
            "splits is evaluated on what it was trained (or selected) on, so those accuracies "
            "are not independent"
        )
        == 1
    ), notes
    assert not any("same class" in note for note in notes), notes

    one_class = random_dataset(num_nodes=97).graph
    one_class.ndata["label"] = torch.zeros(97, dtype=torch.int64)
    notes = _start_notes(_save(tmp_path, "one-class.bin", one_class), capsys)
    assert (
        notes.count(
            "scalegnn: dataset 'dgl': every labelled vertex has the same class, so a model that "
            "always predicts it is 1.0 accurate and the accuracies say nothing; check "
            "ndata['label']"
        )
        == 1
    ), notes
    assert not any("no training vertex" in note or "share" in note for note in notes), notes
