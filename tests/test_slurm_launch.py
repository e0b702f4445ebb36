"""The Slurm path without Slurm: launch detection from Slurm's variables, and
launch/srun.sh run end to end with stand-ins for ``srun`` and ``scontrol`` that start
the tasks on this machine as Slurm would (``SLURM_PROCID``, ``SLURM_LOCALID``)."""

from __future__ import annotations

import subprocess

import pytest

from dgl_scalegnn.distributed.launch import LaunchInfo, detect_launch
from tests.helpers import ROOT

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
