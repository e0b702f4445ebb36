"""The graph a run trains is the graph it names: ``data.prepared`` is checked against
``data.name`` and, for a ``dgl`` file, against the bytes of ``data.path`` (a copy
elsewhere is the same graph; a directory prepared before the file was recorded is
trained with a note); a resume whose checkpoint records another graph of the same shapes
is refused; ``export`` says which newer checkpoint it refused, as ``--resume`` does.

Oracles: the files the tests write (which bytes each holds), and the checkpoints' names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main
from dgl_scalegnn.config import load_config
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import load_graph
from tests.helpers import random_dataset

SHORT = ["--set", "train.progress=false", "--set", "train.evaluate=false"]


def _error(argv: list[str], capsys) -> str:
    """The one line a command says when it refuses its input (exit code 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.removeprefix("scalegnn: error: ").rstrip("\n")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    """``a.bin``; ``b.bin``, the same graph with other features (same shapes, other
    bytes); ``copy.bin``, a's bytes at another path; a run of ``a.bin`` with checkpoints
    of steps 1 and 2; and ``a.bin`` prepared."""
    root = tmp_path_factory.mktemp("identity")
    graph = random_dataset(num_nodes=97).graph
    dgl.save_graphs(str(root / "a.bin"), [graph])
    graph.ndata["feat"] = torch.flip(graph.ndata["feat"], dims=(0,))
    dgl.save_graphs(str(root / "b.bin"), [graph])
    shutil.copyfile(root / "a.bin", root / "copy.bin")
    run = ["--set", f"output.dir={root / 'run'}", "--set", "output.checkpoint_every=1"]
    assert main(["train", "--data", str(root / "a.bin"), *run, "--set", "train.max_steps=2"]) == 0
    prepare = ["prepare", "--dataset", "dgl", "--set", f"data.path={root / 'a.bin'}"]
    assert main([*prepare, "--out", str(root / "prepared")]) == 0
    return {name: root / name for name in ("a.bin", "b.bin", "copy.bin", "run", "prepared")} | {
        "root": root
    }


def _config(path: Path, prepared: Path):
    return load_config(None, ["data.name=dgl", f"data.path={path}", f"data.prepared={prepared}"])


# ------------------------------------------------------------------ probe 7


def test_a_prepared_directory_of_another_graph_is_refused(graphs, tmp_path, capsys):
    synthetic = tmp_path / "synthetic"
    argv = ["prepare", "--dataset", "synthetic", "--set", "data.synthetic.num_nodes=300"]
    assert main([*argv, "--out", str(synthetic)]) == 0
    capsys.readouterr()
    a, b = str(graphs["a.bin"]), str(graphs["b.bin"])
    refused = ["train", "--data", a, "--set", f"data.prepared={synthetic}", *SHORT]
    assert _error(refused, capsys) == (
        f"data.prepared: {str(synthetic)!r} holds 'synthetic' but data.name is 'dgl' "
        f"(data.path {a!r}); point data.prepared at a directory prepared for it, or unset "
        "data.prepared"
    )
    prepared = graphs["prepared"]
    refused = ["train", "--data", b, "--set", f"data.prepared={prepared}", *SHORT]
    size = graphs["a.bin"].stat().st_size
    message = _error(refused, capsys)
    assert message.startswith(
        f"data.prepared: {str(prepared)!r} was prepared from {str(graphs['a.bin'].resolve())!r} "
        f"({size:,} bytes, SHA-256 "
    )
    assert f"but data.path {b!r} holds other bytes ({size:,}): another graph;" in message
    # a's bytes at another path are a's graph: trained without a word
    writer = MetricsWriter(None)
    assert load_graph(_config(graphs["copy.bin"], prepared), metrics=writer).meta.num_nodes == 97
    assert writer.events == [] and capsys.readouterr().err == ""


def test_a_prepared_directory_without_a_source_record_trains_with_a_note(graphs, tmp_path, capsys):
    older = tmp_path / "older"
    shutil.copytree(graphs["prepared"], older)
    meta = json.loads((older / "meta.json").read_text())
    del meta["source_file"], meta["label_facts"]
    (older / "meta.json").write_text(json.dumps(meta))
    writer = MetricsWriter(None)
    assert load_graph(_config(graphs["b.bin"], older), metrics=writer).meta.num_nodes == 97
    note = (
        f"data.prepared: {str(older)!r} records no source file (prepared by an older "
        f"version), so it is not checked against data.path {str(graphs['b.bin'])!r}; "
        "prepare it again to have it checked"
    )
    assert capsys.readouterr().err == f"scalegnn: {note}\n"
    assert writer.events == [{"event": "note", "message": note}]
    with pytest.raises(DatasetError, match="another graph"):
        load_graph(_config(graphs["b.bin"], graphs["prepared"]))


# ------------------------------------------------------------------ probe 8


def test_a_resume_on_another_graph_of_the_same_shapes_is_refused(graphs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(graphs["run"], run)
    resume = ["--resume", "--set", f"output.dir={run}", "--set", "output.checkpoint_every=1"]
    resume += ["--set", "train.max_steps=3", *SHORT]
    message = _error(["train", "--data", str(graphs["b.bin"]), *resume], capsys)
    a, b = (str(graphs[name].resolve()) for name in ("a.bin", "b.bin"))
    assert message.startswith(
        f"{run / 'checkpoints' / 'step_00000002'}: written for another graph: file {a!r} (SHA-256 "
    )
    assert message.endswith(
        f"in the checkpoint, {b!r} (SHA-256 {_sha256(graphs['b.bin'])[:16]}) in this run; resume "
        "on the graph it was written for, or start afresh in another output.dir"
    )
    # a's bytes at another path, and a prepared from a: the graph the checkpoint records
    assert main(["train", "--data", str(graphs["copy.bin"]), *resume]) == 0
    said = capsys.readouterr().out
    assert f"resumed from step 2 of {run / 'checkpoints' / 'step_00000002'}" in said
    prepared = ["--set", f"data.prepared={graphs['prepared']}", "--set", "train.max_steps=4"]
    assert main(["train", "--data", str(graphs["a.bin"]), *resume, *prepared]) == 0
    assert "resumed from step 3" in capsys.readouterr().out


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ probe 17


def test_export_says_which_newer_checkpoint_it_refused(graphs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(graphs["run"], run)
    rank_file = run / "checkpoints" / "step_00000002" / "rank00000.pt"
    data = bytearray(rank_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    rank_file.write_bytes(bytes(data))
    model = tmp_path / "model.pt"
    assert main(["export", "--checkpoint", str(run), "--out", str(model)]) == 0
    said = capsys.readouterr()
    assert said.err == (
        "scalegnn: step_00000002 refused (rank00000.pt: SHA-256 mismatch (changed since it "
        "was written)); exporting step_00000001\n"
    )
    assert said.out.startswith(f"exported {run / 'checkpoints' / 'step_00000001'} (global step 1,")
    record = torch.load(model, weights_only=True)
    assert record["source"]["global_step"] == 1
    assert record["source"]["refused"] == {
        "step_00000002": "rank00000.pt: SHA-256 mismatch (changed since it was written)"
    }
