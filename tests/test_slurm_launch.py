"""The Slurm path without Slurm: launch detection from Slurm's variables, and
launch/srun.sh run end to end with stand-ins for ``srun`` and ``scontrol`` that start
the tasks on this machine as Slurm would (``SLURM_PROCID``, ``SLURM_LOCALID``)."""

from __future__ import annotations

import subprocess

import pytest

import yaml
from dgl_scalegnn.distributed.bootstrap import LaunchInfo, detect_launch
from dgl_scalegnn.train.metrics import read_metrics
from tests.helpers import ROOT, launched, stand_in_slurm
from tests.ranks import reserve_port

_LAUNCH_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_SIZE",
    "MV2_COMM_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def clean_launch_env(monkeypatch):
    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_slurm_variables_give_rank_world_and_local_rank(clean_launch_env):
    clean_launch_env.setenv("SLURM_NTASKS", "8")
    clean_launch_env.setenv("SLURM_PROCID", "5")
    clean_launch_env.setenv("SLURM_LOCALID", "1")
    assert detect_launch() == LaunchInfo(rank=5, world_size=8, local_rank=1, launcher="slurm")


def test_one_slurm_task_is_a_single_process(clean_launch_env):
    clean_launch_env.setenv("SLURM_NTASKS", "1")
    clean_launch_env.setenv("SLURM_PROCID", "0")
    assert detect_launch().launcher == "single"


def test_srun_script_without_arguments_prints_its_usage():
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "srun.sh")], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "sbatch" in result.stderr and "grid" in result.stderr


def test_srun_script_trains_the_grid_through_the_slurm_branch(tmp_path, clean_launch_env):
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"name": "synthetic", "synthetic": {"num_nodes": 1200, "num_features": 8}},
                "model": {"hidden": 8, "layers": 2},
                "sampling": {"batch_size": 300},
                "train": {"epochs": 1, "max_steps": 2, "progress": False},
            }
        )
    )
    metrics = tmp_path / "metrics.jsonl"
    with reserve_port() as port:  # held until the job is over
        env = stand_in_slurm(tmp_path, 2, port.getsockname()[1])
        argv = ["bash", str(ROOT / "launch" / "srun.sh"), "1x1x1x2", str(config)]
        with launched([*argv, "--metrics", str(metrics)], env) as process:
            output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output[-3000:]
    srun_args = (tmp_path / "srun_args").read_text().split("\n")
    assert "--gpus-per-task=1" in srun_args and "--ntasks-per-node=2" in srun_args
    assert srun_args[srun_args.index("--grid") + 1] == "1x1x1x2"
    events = read_metrics(metrics)
    assert events[0]["launcher"] == "slurm" and events[0]["world_size"] == 2
    assert events[-1]["event"] == "summary" and events[-1]["steps"] == 2
