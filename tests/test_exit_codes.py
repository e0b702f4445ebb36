"""Exit codes a launcher and a requeue script can read (docs/troubleshooting.md#exit-codes):
bad input exits 2 on every rank, so that ``mpirun`` (which reports the first rank to exit)
says 2; a rank out of memory says one line and every rank exits 74; Ctrl-C outside
training says one line and exits 130; a ``--config`` that is not a YAML file is one line
with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import yaml
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.errors import BAD_INPUT_EXIT_CODE, INTERRUPTED_EXIT_CODE, RESOURCE_EXIT_CODE
from dgl_scalegnn.train import run
from dgl_scalegnn.train.checkpoint import choose_checkpoint
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import ROOT
from tests.ranks import spawn_ranks

CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 1500, "num_features": 8}},
    "model": {"hidden": 16, "layers": 2},
    "sampling": {"batch_size": 150},
    "train": {"epochs": 1, "max_steps": 6, "evaluate": False, "progress": False},
    "parallel": {"watchdog_s": 5},
}
TOO_LARGE_A_BATCH = {**CONFIG, "sampling": {"batch_size": 1501}}
LAYERWISE = {**CONFIG, "train": {**CONFIG["train"], "evaluate": True, "evaluation": "layerwise"}}


def _config_file(tmp_path, config: dict, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _errors(output: str) -> list[str]:
    """The lines that say an error, or that a rank stops the job."""
    return [line for line in output.splitlines() if "error" in line or "stopping the job" in line]


def test_bad_input_found_by_every_rank_exits_2_on_every_rank(tmp_path):
    """A batch larger than the graph (the trainer's refusal, on every rank): the rank whose
    refusal stops the job says it, the others stop without a word, and all four exit 2."""
    argv = ["train", "--config", _config_file(tmp_path, TOO_LARGE_A_BATCH), "--grid", "1x1x2x2"]
    results = spawn_ranks(
        4, "dgl_scalegnn.cli:main", [argv], tmp_path / "ranks", expect_failure=True, timeout=120
    )
    assert [code for code, _ in results] == [BAD_INPUT_EXIT_CODE] * 4, results
    said = [line for _, output in results for line in _errors(output)]
    assert said == [
        "scalegnn: error: sampling.batch_size: got 1501, but 'synthetic' has only 1500 "
        "vertices; use at most 1500"
    ], said


#: ``scalegnn`` on every rank of launch/mpirun.sh, with rank 1's host short of memory for
#: a layer-wise evaluation (tests/workers/short_of_memory.py; mpirun numbers the ranks).
_SHORT_OF_MEMORY = """#!{python}
import os
import sys

sys.path.insert(0, {root!r})
os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
from tests.workers.short_of_memory import main

sys.exit(main(sys.argv[1:], 1, 2**20))
"""


@pytest.mark.parametrize("refusal", ["batch", "evaluation"])
def test_bad_input_under_mpirun_exits_2(tmp_path, refusal):
    """mpirun reports the exit code of the first rank to exit: every rank must exit 2 (the
    rank a refusal stops exited 17 first, and mpirun said 17). A batch larger than the
    graph, or a layer-wise evaluation refused for memory on rank 1 (both found on every
    rank, after start-up, by the trainer)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    config = TOO_LARGE_A_BATCH
    expected = "scalegnn: error: sampling.batch_size: got 1501"
    if refusal == "evaluation":
        stand_in = tmp_path / "scalegnn"
        stand_in.write_text(_SHORT_OF_MEMORY.format(python=sys.executable, root=str(ROOT)))
        stand_in.chmod(0o755)
        env["SCALEGNN"], config = str(stand_in), LAYERWISE
        expected = "scalegnn: error: parallel.grid 1x1x1x2: a layer-wise evaluation needs"
    command = [str(ROOT / "launch" / "mpirun.sh"), "2", "1x1x1x2", _config_file(tmp_path, config)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == BAD_INPUT_EXIT_CODE, output[-3000:]
    said = _errors(output)
    assert len(said) == 1 and said[0].startswith(expected), output[-3000:]


def test_a_rank_out_of_memory_says_one_line_and_every_rank_exits_74(tmp_path):
    """Rank 1's allocation fails at step 3 as torch's CPU allocator fails (prlimit --as
    gives the same RuntimeError): it says one line naming itself and what to change, no
    trace; rank 0 stops with one line; both exit 74; the checkpoint of step 2 is whole."""
    config = {**CONFIG, "output": {"dir": str(tmp_path / "run"), "checkpoint_every": 2}}
    argv = ["train", "--config", _config_file(tmp_path, config), "--grid", "1x1x1x2"]
    results = spawn_ranks(
        2,
        "tests.workers.fail_on_rank:main",
        [argv, 1, 3, "out of memory"],
        tmp_path / "ranks",
        expect_failure=True,
        timeout=120,
    )
    assert [code for code, _ in results] == [RESOURCE_EXIT_CODE] * 2, results
    (_, stopped), (_, failed) = results
    assert "Traceback" not in failed, failed[-3000:]
    assert _errors(failed) == [
        "scalegnn: error: rank 1 ran out of memory (RuntimeError: [enforce fail at "
        "alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 4611686018427387904 bytes. Error code 12 (Cannot allocate memory)): give "
        "each rank more memory: fewer ranks a host, a smaller sampling.batch_size, or a grid "
        "whose ranks hold smaller shares (scalegnn plan ranks the grids by memory)"
    ], failed[-3000:]
    said = _errors(stopped)
    assert len(said) == 1 and said[0].startswith(
        "[rank 0] stopping the job: rank 1 failed: RuntimeError: "
    ), stopped[-3000:]
    choice = choose_checkpoint(tmp_path / "run" / "checkpoints")
    assert choice.note() is None and choice.checkpoint.path.name == "step_00000002"


def test_one_process_out_of_memory_is_one_line_and_74(tmp_path, monkeypatch, capsys):
    def run_out(trainer: Trainer, global_step: int):
        raise MemoryError("Unable to allocate 74.5 GiB for an array with shape (10000000000,)")

    monkeypatch.setattr(Trainer, "sample", run_out)
    assert cli_main(["train", "--config", _config_file(tmp_path, CONFIG)]) == RESOURCE_EXIT_CODE
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "scalegnn: error: rank 0 ran out of memory (MemoryError: Unable to allocate 74.5 GiB "
        "for an array with shape (10000000000,)): give each rank more memory: fewer ranks a "
        "host, a smaller sampling.batch_size, or a grid whose ranks hold smaller shares "
        "(scalegnn plan ranks the grids by memory)"
    ]


def test_ctrl_c_outside_training_is_one_line_and_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the graph loads (Python's KeyboardInterrupt, before the trainer's
    handlers are installed): no trace."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "load_graph", interrupted)
    try:
        code = cli_main(["train", "--config", _config_file(tmp_path, CONFIG)])
    except KeyboardInterrupt:
        code = "the interrupt escaped"
    assert code == INTERRUPTED_EXIT_CODE
    assert capsys.readouterr().err == "scalegnn: interrupted\n"


@pytest.mark.parametrize("what", ["directory", "binary"])
@pytest.mark.parametrize("command", ["train", "plan", "prepare"])
def test_a_config_that_is_a_directory_or_binary_is_said_as_such(tmp_path, capsys, command, what):
    path = tmp_path
    message = f"config file {str(path)!r} is a directory; give a YAML file"
    if what == "binary":
        path = tmp_path / "graph.bin"
        path.write_bytes(bytes(range(256)) * 16)  # what dgl.save_graphs writes is as binary
        message = (
            f"config file {str(path)!r} is binary, not YAML text; a graph file goes in "
            "data.path (scalegnn train --data GRAPH.bin)"
        )
    extra = {"plan": ["--gpus", "2"], "prepare": ["--out", str(tmp_path / "out")]}
    argv = [command, "--config", str(path), *extra.get(command, [])]
    assert cli_main(argv) == BAD_INPUT_EXIT_CODE
    assert capsys.readouterr().err == f"scalegnn: error: {message}\n"
