"""Checkpoints that can be trusted: every rank file's SHA-256 is checked before a load, a
damaged checkpoint is refused (naming the file) and resume falls back to the newest good
one, saying so; non-finite state is never saved; a step is saved once, and replacing a
checkpoint never leaves nothing to resume; a full disk and a checkpoint of another
dataset are refused with what is needed to fix them."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import shutil
import subprocess

import pytest
import torch

import yaml
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.train.checkpoint import (
    CheckpointError,
    choose_checkpoint,
    latest_checkpoint,
    read_checkpoint,
    set_aside_nonfinite,
)
from dgl_scalegnn.train.metrics import read_metrics
from tests.helpers import random_dataset, step_losses
from tests.ranks import spawn_ranks
from tests.workers.checkpoint_window import KILLED

CONFIG = {
    "data": {
        "name": "synthetic",
        "synthetic": {"num_nodes": 400, "num_features": 16, "num_classes": 4},
    },
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 100},
    "train": {"epochs": 100, "max_steps": 4, "progress": False},
}


def _config(output, every: int = 2, **train) -> dict:
    config = copy.deepcopy(CONFIG)
    config["train"].update(train)
    config["output"] = {"dir": str(output), "checkpoint_every": every}
    return config


def _run(tmp_path, name: str, grid: str, config: dict, *extra, worker=None):
    """``scalegnn train`` on spawned ranks (or ``worker = (target, *its args)``); returns
    each rank's (exit code, output) and the metrics events. Failures are the test's."""
    config_path = tmp_path / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    metrics = tmp_path / f"{name}.jsonl"
    argv = ["train", "--config", str(config_path), "--grid", grid, "--metrics", str(metrics)]
    target, *args = worker or ("dgl_scalegnn.cli:main",)
    world = GridShape.parse(grid).world_size
    results = spawn_ranks(
        world, target, [[*argv, *extra], *args], tmp_path / name, expect_failure=True
    )
    return results, read_metrics(metrics) if metrics.exists() else []


def _ok(results) -> None:
    assert all(code == 0 for code, _ in results), [output[-2000:] for _, output in results]


@pytest.fixture(scope="module")
def two_rank_checkpoints(tmp_path_factory):
    """Checkpoints of steps 4 and 6 written by two ranks (1x1x2x1), and the losses of
    the uninterrupted run."""
    tmp_path = tmp_path_factory.mktemp("two-ranks")
    results, events = _run(tmp_path, "first", "1x1x2x1", _config(tmp_path / "run", max_steps=6))
    _ok(results)
    return tmp_path / "run" / "checkpoints", step_losses(events)


def _copy(checkpoints, tmp_path):
    target = tmp_path / "run" / "checkpoints"
    shutil.copytree(checkpoints, target)
    return target


def test_meta_json_holds_each_rank_files_sha256(two_rank_checkpoints):
    checkpoints, _ = two_rank_checkpoints
    checkpoint = latest_checkpoint(checkpoints)
    assert checkpoint.name == "step_00000006"
    files = json.loads((checkpoint / "meta.json").read_text())["files"]
    assert sorted(files) == ["rank00000.pt", "rank00001.pt"]
    for name, recorded in files.items():
        data = (checkpoint / name).read_bytes()
        assert recorded == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        assert torch.load(checkpoint / name, weights_only=True)["params"]
    assert sorted(p.name for p in checkpoint.iterdir()) == ["meta.json", *sorted(files)]


def _damage(checkpoint, fault: str) -> None:
    rank_file = checkpoint / "rank00001.pt"
    data = rank_file.read_bytes()
    if fault == "flipped bytes":
        flipped = bytearray(data)
        for at in range(len(data) // 2, len(data) // 2 + 50):
            flipped[at] ^= 0x5A
        rank_file.write_bytes(bytes(flipped))
    elif fault == "truncated":
        rank_file.write_bytes(data[: len(data) - 100])
    elif fault == "empty":
        rank_file.write_bytes(b"")
    elif fault == "missing rank file":
        rank_file.unlink()
    elif fault == "missing meta.json":
        (checkpoint / "meta.json").unlink()
    elif fault == "broken meta.json":
        meta = checkpoint / "meta.json"
        meta.write_text(meta.read_text()[:-40])
    else:
        shutil.rmtree(checkpoint)


DAMAGES = {
    "flipped bytes": r"rank00001\.pt: SHA-256 mismatch",
    "truncated": r"rank00001\.pt: truncated, \d+ bytes where meta\.json records \d+",
    "empty": r"rank00001\.pt: empty, 0 bytes where meta\.json records \d+",
    "missing rank file": r"rank00001\.pt: missing",
    "missing meta.json": r"meta\.json: missing",
    "broken meta.json": r"meta\.json: not valid JSON",
}


@pytest.mark.parametrize("fault", list(DAMAGES))
def test_damaged_checkpoint_is_refused_naming_the_file(
    two_rank_checkpoints, tmp_path, capsys, fault
):
    """With no good checkpoint left, resume is an error naming each refused one (not a
    fresh start, not a traceback); on one process, as a checkpoint resumes on any grid."""
    checkpoints = _copy(two_rank_checkpoints[0], tmp_path)
    for step in ("step_00000004", "step_00000006"):
        _damage(checkpoints / step, fault)
    config_path = tmp_path / "resume.yaml"
    config_path.write_text(yaml.safe_dump(_config(tmp_path / "run", max_steps=8)))
    assert cli_main(["train", "--config", str(config_path), "--resume"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    expected = (
        rf"^scalegnn: error: no checkpoint in {re.escape(str(checkpoints))} can be resumed: "
        rf"step_00000006 refused \({DAMAGES[fault]}.*\); step_00000004 refused "
        rf"\({DAMAGES[fault]}.*\); "
    )
    assert re.search(expected, error), error
    with pytest.raises(CheckpointError, match=rf"step_00000006: {DAMAGES[fault]}"):
        read_checkpoint(checkpoints / "step_00000006")


@pytest.mark.parametrize("fault", ["flipped bytes", "deleted"])
def test_resume_falls_back_to_the_newest_good_checkpoint_and_says_why(
    two_rank_checkpoints, tmp_path, fault
):
    """``latest`` names step 6, damaged or gone: the ranks resume from step 4 (the same
    losses as the run that was not stopped), rank 0 says why in one line, and the new
    checkpoint of step 6 replaces the damaged one."""
    checkpoints = _copy(two_rank_checkpoints[0], tmp_path)
    _damage(checkpoints / "step_00000006", fault)
    reason = "rank00001.pt: SHA-256 mismatch (changed since it was written)"
    if fault == "deleted":
        reason = "the directory is missing"
    config = _config(tmp_path / "run", max_steps=6)
    results, events = _run(tmp_path, "resumed", "1x1x2x1", config, "--resume")
    _ok(results)
    note = f"scalegnn: step_00000006 refused ({reason}); resuming from step_00000004\n"
    assert results[0][1].count(note) == 1 and "refused" not in results[1][1], results[0][1]
    [resume] = [e for e in events if e["event"] == "resume"]
    assert resume["checkpoint"].endswith("step_00000004")
    assert resume["refused"] == {"step_00000006": reason}
    assert step_losses(events) == two_rank_checkpoints[1][4:]  # same grid: bit-identical
    rewritten = latest_checkpoint(checkpoints)
    expected = "step_00000006.1" if fault == "flipped bytes" else "step_00000006"
    assert rewritten.name == expected
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted(
        ["latest", "step_00000004", expected]
    )
    assert choose_checkpoint(checkpoints).checkpoint.path == rewritten


def test_nonfinite_state_is_never_saved(tmp_path):
    """Rank 1's Adam state turns infinite before the checkpoint of step 4: no rank
    writes it, the error names the last good checkpoint, and ``latest`` stays step 2."""
    run = tmp_path / "run"
    results, _ = _run(
        tmp_path,
        "poisoned",
        "1x1x2x1",
        _config(run),
        worker=("tests.workers.poison_before_save:main", 4, 1),
    )
    assert all(code != 0 for code, _ in results)
    message = (
        "not checkpointing global step 4: the parameters or Adam state of rank(s) [1] hold "
        f"NaN or infinite values. The last good checkpoint is {run / 'checkpoints'}"
        "/step_00000002 (global step 2); --resume continues from it."
    )
    assert any(message in output for _, output in results), results[0][1][-3000:]
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_00000002"]
    assert latest_checkpoint(checkpoints).name == "step_00000002"


def test_a_diverged_step_is_set_aside_and_never_resumed(tmp_path):
    """A checkpoint of the step whose loss was non-finite would replay that step: it is
    set aside, ``latest`` goes back to the newest older good one (or away), resume
    takes that one, and pruning leaves the set-aside one alone."""
    run = tmp_path / "run"
    results, _ = _run(tmp_path, "first", "1x1x1x1", _config(run))
    _ok(results)
    checkpoints = run / "checkpoints"
    sentence = set_aside_nonfinite(checkpoints, 4)
    assert sentence == (
        f"The last good checkpoint is {checkpoints / 'step_00000002'} (global step 2); "
        "--resume continues from it. The checkpoint of step 4 was set aside as "
        "step_00000004.nonfinite."
    )
    assert latest_checkpoint(checkpoints).name == "step_00000002"
    choice = choose_checkpoint(checkpoints)
    assert choice.checkpoint.path.name == "step_00000002" and choice.refused == {}
    results, events = _run(tmp_path, "resumed", "1x1x1x1", _config(run, max_steps=8), "--resume")
    _ok(results)
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(2, 8))
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "latest",
        "step_00000004.nonfinite",
        "step_00000006",
        "step_00000008",
    ]
    assert set_aside_nonfinite(checkpoints, 8).startswith(
        f"The last good checkpoint is {checkpoints / 'step_00000006'} (global step 6)"
    )
    assert latest_checkpoint(checkpoints).name == "step_00000006"
    assert set_aside_nonfinite(checkpoints, 6) == (
        f"There is no good checkpoint in {checkpoints} to resume from. The checkpoint of "
        "step 6 was set aside as step_00000006.nonfinite."
    )  # step_00000004.nonfinite is no candidate
    assert not (checkpoints / "latest").exists()
    assert choose_checkpoint(checkpoints).checkpoint is None  # only set-aside ones: start


def _window(tmp_path, name: str, config: dict, pattern: str, occurrence: int = 1, *extra):
    """One rank that dies right after the ``occurrence``-th rename or removal of a path
    matching ``pattern``: its (exit code, output) and metrics events."""
    worker = ("tests.workers.checkpoint_window:main", pattern, occurrence)
    results, events = _run(tmp_path, name, "1x1x1x1", config, *extra, worker=worker)
    return (*results[0], events)


def test_a_step_is_saved_once(tmp_path):
    """``max_steps`` a multiple of ``checkpoint_every``: the final save of ``fit`` is the
    checkpoint already written (the old code deleted it and wrote it again, and a kill
    there left ``latest`` naming nothing); resuming from it without training writes
    nothing either."""
    config = _config(tmp_path / "run")
    published = r"/step_00000004(\.\d+)?$"
    code, output, _ = _window(tmp_path, "first", config, published, 2)
    assert code == 0, output[-2000:]
    code, output, events = _window(tmp_path, "again", config, published, 1, "--resume")
    assert code == 0, output[-2000:]
    assert [e["step"] for e in events if e["event"] in ("resume", "step")] == [4]
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step_00000004"


WINDOWS = {
    "new rank file written": r"step_00000002\.partial/rank00000\.pt$",
    "new meta.json written": r"step_00000002\.partial/meta\.json$",
    "new one published": r"/step_00000002\.1$",
    "latest replaced": r"/latest$",
    "old one deleted": r"/step_00000002$",
}


@pytest.fixture(scope="module")
def step_two_run(tmp_path_factory):
    """The output.dir of one process trained to step 2, with its checkpoint of step 2."""
    tmp_path = tmp_path_factory.mktemp("step-two")
    results, _ = _run(tmp_path, "first", "1x1x1x1", _config(tmp_path / "run", max_steps=2))
    _ok(results)
    return tmp_path / "run"


@pytest.mark.parametrize("window", list(WINDOWS))
def test_replacing_a_checkpoint_killed_anywhere_leaves_one_to_resume(
    tmp_path, window, step_two_run
):
    """A second run in the same output.dir (other sampling seed: other state) writes step
    2 again and dies at each point of the replacement: resume then finds a complete
    checkpoint of step 2 and refuses nothing."""
    shutil.copytree(step_two_run, tmp_path / "run")
    config = _config(tmp_path / "run", max_steps=2)
    other = {**config, "sampling": {**config["sampling"], "seed": 7}}
    code, output, _ = _window(tmp_path, "second", other, WINDOWS[window])
    assert code == KILLED, output[-2000:]
    results, events = _run(
        tmp_path, "resumed", "1x1x1x1", _config(tmp_path / "run", max_steps=3), "--resume"
    )
    _ok(results)
    assert "refused" not in results[0][1], results[0][1]
    [resume] = [e for e in events if e["event"] == "resume"]
    assert re.search(r"/step_00000002(\.1)?$", resume["checkpoint"]), resume
    assert [e["step"] for e in events if e["event"] == "step"] == [2]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs (root only, as here and in CI), unmounted afterwards."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a 2 MB tmpfs at {mount_point} (exit {mounted.returncode}: "
            f"{mounted.stderr.strip()}); this test must run as root, as the CI does"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_full_disk_names_the_file_and_the_space_and_keeps_the_last_checkpoint(small_disk, tmp_path):
    """A checkpoint of ~1.2 MB fits the 2 MB disk once; the second does not."""
    config = _config(small_disk / "run")
    config["data"]["synthetic"]["num_features"] = 128
    config["model"]["hidden"] = 192
    results, _ = _run(tmp_path, "full", "1x1x1x1", config)
    code, output = results[0]
    assert code == 2, output[-2000:]
    checkpoints = small_disk / "run" / "checkpoints"
    found = re.search(
        rf"scalegnn: error: {re.escape(str(checkpoints))}/step_00000004\.partial/"
        r"rank00000\.pt: No space left on device \(ENOSPC\): writing it needs (\d+) bytes, "
        r"its file system has (\d+) free; free space there or point output\.dir at a larger "
        r"file system \(the previous checkpoint stays latest\)",
        output,
    )
    assert found, output[-2000:]
    needed, free = int(found.group(1)), int(found.group(2))
    assert needed > free
    written = read_checkpoint(latest_checkpoint(checkpoints))  # verifies every digest
    assert written.path.name == "step_00000002"
    assert needed == pytest.approx((written.path / "rank00000.pt").stat().st_size, rel=0.01)
    assert not list((checkpoints / "step_00000004.partial").glob("*.tmp"))


def _dgl_graph_file(tmp_path):
    dataset = random_dataset(num_nodes=400, num_features=11, num_classes=5)
    path = tmp_path / "graph.bin"
    dgl.save_graphs(str(path), [dataset.graph], {"num_classes": torch.tensor([5])})
    return path


@pytest.mark.parametrize("other", ["feature and class counts", "dataset"])
def test_checkpoint_of_another_dataset_is_refused_naming_the_shapes(tmp_path, capsys, other):
    results, _ = _run(tmp_path, "first", "1x1x1x1", _config(tmp_path / "run", max_steps=2))
    _ok(results)
    config = _config(tmp_path / "run")
    if other == "dataset":
        path = _dgl_graph_file(tmp_path)
        config["data"] = {"name": "dgl", "path": str(path)}
        # the checkpoint's model in full: a dgl file takes the GCN derived from it otherwise
        config["model"] = dataclasses.asdict(ModelConfig(**CONFIG["model"]))
        shapes = r"\(16, 16\) in the checkpoint, \(11, 16\) in this run"
        classes = r"\(16, 4\) in the checkpoint, \(16, 5\) in this run"
        datasets = (
            rf"; dataset 'synthetic' in the checkpoint, 'dgl' \({re.escape(str(path))}\) "
            "in this run"
        )
    else:
        config["data"]["synthetic"].update(num_features=20, num_classes=6)
        shapes = r"\(16, 16\) in the checkpoint, \(20, 16\) in this run"
        classes = r"\(16, 4\) in the checkpoint, \(16, 6\) in this run"
        datasets = ""
    config_path = tmp_path / "other.yaml"
    config_path.write_text(yaml.safe_dump(config))
    assert cli_main(["train", "--config", str(config_path), "--resume"]) == 2
    error = capsys.readouterr().err
    expected = (
        r"scalegnn: error: \S+/step_00000002: written for another dataset or model: "
        rf"parameter head: {classes}; parameter input_proj: "
        rf"{shapes}{datasets}; resume with the dataset it was written for"
    )
    assert re.search(expected, error), error
