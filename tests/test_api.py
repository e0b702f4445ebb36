"""The public API (``import dgl_scalegnn as sg``) and the example loop written with it.

The example (``examples/graphsage.py``) runs under ``launch/mpirun.sh`` as a user runs
it, and as ``python examples/graphsage.py``; its other runs are spawned ranks with
torchrun's environment (``tests/workers/run_script.py``), as are the CLI's. With
``--plain`` its settings are the CLI's (Adam, a constant rate, no class weights), so its
losses must be the CLI's bit for bit on the same grid; a run stopped with a checkpoint
resumes on another grid with the losses of an uninterrupted one.
"""

from __future__ import annotations

import ast
import json
import os

import pytest

import dgl_scalegnn
from dgl_scalegnn._dgl import dgl
from tests.helpers import ROOT, launched, random_dataset, train_through_cli
from tests.ranks import spawn_ranks

#: The public surface. A name may be added (here too); removing one breaks users.
PUBLIC = {
    "init",
    "Job",
    "load_graph",
    "build_model",
    "minibatches",
    "MiniBatches",
    "objective",
    "Objective",
    "StepAgreement",
    "Request",
    "evaluate",
    "predict",
    "Checkpoints",
    "ModelConfig",
    "ParallelConfig",
    "DataConfig",
    "MetricsWriter",
    "Console",
    "read_metrics",
    "read_runs",
    "run_table",
    "plot_runs",
    "PREEMPTED_EXIT_CODE",
}

EXAMPLE = ROOT / "examples" / "graphsage.py"
STEPS, BATCH = 8, 128
#: The example's model and optimiser as CLI settings (``--plain``).
CLI_SETTINGS = {
    "model": {
        "conv": "sage",
        "layers": 2,
        "hidden": 64,
        "dropout": 0.5,
        "bias": True,
        "norm": False,
        "residual": False,
        "input_projection": False,
        "head": False,
    },
    "optim": {"lr": 0.01, "weight_decay": 0.0, "lr_schedule": "constant"},
    "sampling": {"batch_size": BATCH},
    "train": {"max_steps": STEPS, "evaluate": False, "progress": False},
}


def test_every_public_name_is_listed_and_resolves_from_the_package():
    from dgl_scalegnn import api

    missing = PUBLIC - set(api.__all__)
    assert not missing, f"public names removed: {sorted(missing)}"
    for name in PUBLIC:
        assert getattr(dgl_scalegnn, name) is getattr(api, name)
    assert set(dir(dgl_scalegnn)) >= PUBLIC
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        dgl_scalegnn.Trainer  # noqa: B018 (internals are not reachable by the package)


def test_the_example_imports_only_the_public_module_torch_and_the_standard_library():
    tree = ast.parse(EXAMPLE.read_text())
    modules = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules <= {"argparse", "math", "sys", "pathlib", "torch", "dgl_scalegnn"}, modules
    assert not any(
        isinstance(n, ast.ImportFrom) and n.module == "dgl_scalegnn" for n in ast.walk(tree)
    )


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "graph.bin"
    dataset = random_dataset(num_nodes=600, num_edges=3000, num_features=12, num_classes=4)
    dgl.save_graphs(str(path), [dataset.graph])
    return path


def _events(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _example(grid: str, graph_file, out, *args: str, mpirun: bool = False) -> list[dict]:
    """The example on two ranks of ``grid``: under ``launch/mpirun.sh``, or spawned."""
    argv = ["--graph", str(graph_file), "--out", str(out), "--steps", str(STEPS),
            "--batch-size", str(BATCH), *args]  # fmt: skip
    if mpirun:
        with launched([str(ROOT / "launch" / "mpirun.sh"), "2", grid, str(EXAMPLE), *argv]) as run:
            output, _ = run.communicate(timeout=300)
        assert run.returncode == 0, output[-4000:]
    else:
        spawn_ranks(2, "tests.workers.run_script:main", [str(EXAMPLE), [*argv, "--grid", grid]],
                    out.parent / f"{out.name}-logs")  # fmt: skip
    return _events(out)


def _cli(grid: str, graph_file, tmp_path, name: str) -> list[float]:
    config = {**CLI_SETTINGS, "data": {"name": "dgl", "path": str(graph_file)}}
    config["output"] = {"dir": str(tmp_path / f"{name}-run")}
    return _losses(train_through_cli(tmp_path, name, grid, config))


def _losses(events: list[dict]) -> list[float]:
    return [e["loss"] for e in events if e["event"] == "step"]


def test_the_example_under_mpirun_is_the_cli_bit_for_bit_and_resumes_on_another_grid(
    graph_file, tmp_path
):
    """1x1x2x1: the example stops at step 4 with a checkpoint, its losses the CLI's bits;
    resumed on 1x2x1x1 it continues with the CLI's losses (another grid: within 1e-5)."""
    cli = _cli("1x1x2x1", graph_file, tmp_path, "cli")
    out = tmp_path / "example"
    first = _example("1x1x2x1", graph_file, out, "--plain", "--stop-at", "4",
                     "--eval-every", "100", mpirun=True)  # fmt: skip
    assert _losses(first) == cli[:4]
    assert (out / "checkpoints" / "step_00000004").is_dir()
    resumed = _example("1x2x1x1", graph_file, out, "--plain", "--resume", "--eval-every", "2")
    steps = [e["step"] for e in resumed if e["event"] == "step"]
    assert steps == list(range(STEPS))  # the first job's 4, then the resumed 4
    assert _losses(resumed)[4:] == pytest.approx(cli[4:], rel=1e-5, abs=0)
    evaluations = [e for e in resumed if e["event"] == "eval"]
    assert [e["step"] for e in evaluations] == [6, 8]
    assert all(
        0 <= e[key] <= 1 for e in evaluations for key in ("train_acc", "val_acc", "test_acc")
    )


def test_the_example_with_data_parallel_replicas_is_the_cli_bit_for_bit(graph_file, tmp_path):
    cli = _cli("2x1x1x1", graph_file, tmp_path, "cli")
    assert _losses(_example("2x1x1x1", graph_file, tmp_path / "example", "--plain")) == cli


def test_the_example_with_its_own_schedule_weights_and_early_stopping_trains(graph_file, tmp_path):
    """AdamW, warm-up and cosine decay, class weights, early stopping: on one process, it
    learns and stops once validation stops improving."""
    out = tmp_path / "example"
    argv = ["--graph", str(graph_file), "--out", str(out), "--steps", "60", "--batch-size",
            "300", "--eval-every", "3", "--patience", "2", "--lr", "0.02"]  # fmt: skip
    spawn_ranks(1, "tests.workers.run_script:main", [str(EXAMPLE), argv], tmp_path / "logs")
    events = _events(out)
    losses = _losses(events)
    accuracies = [e["val_acc"] for e in events if e["event"] == "eval"]
    best = max(range(len(accuracies)), key=lambda i: (accuracies[i], -i))  # first best
    assert len(accuracies) - 1 - best == 2  # patience: two evaluations without progress
    assert len(losses) == 3 * len(accuracies) < 60
    assert sum(losses[-3:]) < sum(losses[:3])


def test_a_second_job_on_the_examples_checkpoints_is_refused_in_one_line(graph_file, tmp_path):
    """The API's checkpoints claim their directory, as ``scalegnn train`` claims its
    ``output.dir``: another job holding it (here this process) makes the script, run as
    ``python examples/graphsage.py``, exit 2."""
    from dgl_scalegnn.train.run_lock import claim_run_directory

    held = claim_run_directory(tmp_path / "example" / "checkpoints", rank=0)
    try:
        with launched([str(ROOT / ".venv" / "bin" / "python"), str(EXAMPLE), "--graph",
                       str(graph_file), "--out", str(tmp_path / "example"),
                       "--batch-size", "128"]) as run:  # fmt: skip
            output, _ = run.communicate(timeout=300)
    finally:
        held.release()
    assert run.returncode == 2, output[-4000:]
    refusal = [line for line in output.splitlines() if "another job" in line or "lock" in line]
    assert len(refusal) == 1 and str(os.getpid()) in refusal[0], output
    assert "Traceback" not in output
