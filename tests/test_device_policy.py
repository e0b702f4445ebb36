"""What decides where and how a job starts, checked without a GPU or a cluster.

``parallel.device`` and ``parallel.backend`` together; which launcher started the ranks
when Slurm's and a PMI's variables are both set (srun with PMI-2, Cray PMI or PMIx
sets both; mpiexec inside an allocation sets both too, but for different worlds); the
arguments launch/srun.sh hands srun (run with a stand-in srun); ``make test-gpu``
failing, not skipping, where no GPU is usable; and the Python versions the package
admits against those docs/gpu.md names (the stub CUDA checks are in test_gpu_guards).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from types import SimpleNamespace

import pytest
from packaging.specifiers import SpecifierSet

from dgl_scalegnn.config import ConfigError, config_from_mapping
from dgl_scalegnn.distributed.launch import LaunchInfo, detect_launch
from tests.helpers import ROOT, launched, stand_in_slurm

# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("parallel", "device"),
    [
        ({}, "auto"),
        ({"backend": "nccl"}, "cuda"),
        ({"backend": "gloo"}, "cpu"),
        ({"device": "cuda", "backend": "nccl"}, "cuda"),
        ({"device": "cpu", "backend": "auto"}, "cpu"),
    ],
)
def test_the_device_decides_and_the_backend_may_name_it(parallel, device):
    assert config_from_mapping({"parallel": parallel}).parallel.requested_device() == device


@pytest.mark.parametrize(("device", "backend"), [("cpu", "nccl"), ("cuda", "gloo")])
def test_a_device_and_backend_that_contradict_each_other_are_refused(device, backend):
    with pytest.raises(
        ConfigError, match=f"parallel.backend: got '{backend}' with parallel.device"
    ):
        config_from_mapping({"parallel": {"device": device, "backend": backend}})


@pytest.mark.parametrize("key", ["fuse", "tf32"])
def test_fuse_and_tf32_take_true_false_or_auto(key):
    assert getattr(config_from_mapping({}).parallel, key) == "auto"
    for value in (True, False, "auto"):
        assert getattr(config_from_mapping({"parallel": {key: value}}).parallel, key) == value
    for value in ("on", 1):
        with pytest.raises(
            ConfigError,
            match=f"parallel.{key}: got {value!r}; allowed values are true, false, auto",
        ):
            config_from_mapping({"parallel": {key: value}})


# -------------------------------------------------------------------- launchers


@pytest.fixture
def launch_env(monkeypatch):
    """No launcher's variable from the test's own environment."""
    prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_")
    torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    for name in list(os.environ):
        if name.startswith(prefixes) or name in torchrun:
            monkeypatch.delenv(name)
    return monkeypatch


def _mpi(monkeypatch, rank: int, size: int, local_rank: int, local_size: int) -> None:
    """A stand-in mpi4py whose world is ``size`` ranks, ``local_size`` on this node."""

    def comm(rank: int, size: int) -> SimpleNamespace:
        return SimpleNamespace(Get_rank=lambda: rank, Get_size=lambda: size, Free=lambda: None)

    world = comm(rank, size)
    world.Split_type = lambda kind: comm(local_rank, local_size)
    module = types.ModuleType("mpi4py")
    module.MPI = SimpleNamespace(COMM_WORLD=world, COMM_TYPE_SHARED=0)
    monkeypatch.setitem(sys.modules, "mpi4py", module)


@pytest.mark.parametrize("pmi", ["PMI_SIZE", "PMIX_SIZE"])
def test_srun_with_a_pmi_reads_slurms_variables_and_leaves_mpi_alone(launch_env, pmi):
    """srun --mpi=pmi2 (or Cray PMI, PMIx) sets a PMI size too: the pip Open MPI speaks
    PMIx only, so initialising it there fails or gives each task a world of one."""
    for name, value in {
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        pmi: "8",
        "PMI_RANK": "5",
    }.items():
        launch_env.setenv(name, value)
    launch_env.setitem(sys.modules, "mpi4py", None)  # importing it fails the test
    assert detect_launch() == LaunchInfo(5, 8, 1, "slurm", local_world_size=4)


@pytest.mark.parametrize(
    "variables",
    [
        # mpiexec inside an allocation: its world is not the batch step's
        {"PMI_SIZE": "8", "PMI_RANK": "3", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},
        # Open MPI's mpirun: never srun, whatever Slurm's variables say
        {"OMPI_COMM_WORLD_SIZE": "8", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"},
    ],
)
def test_an_mpi_launch_inside_an_allocation_is_mpi(launch_env, variables):
    for name, value in variables.items():
        launch_env.setenv(name, value)
    _mpi(launch_env, rank=3, size=8, local_rank=3, local_size=4)
    assert detect_launch() == LaunchInfo(3, 8, 3, "mpi", local_world_size=4)


def test_slurm_tasks_per_node_are_read_for_this_node(launch_env):
    launch_env.setenv("SLURM_NTASKS", "7")
    launch_env.setenv("SLURM_PROCID", "6")
    launch_env.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1")
    for node, tasks in ((0, 2), (2, 2), (3, 1)):
        launch_env.setenv("SLURM_NODEID", str(node))
        assert detect_launch().local_world_size == tasks


def test_srun_script_leaves_every_gpu_visible_and_passes_the_cpus_on(tmp_path):
    """Slurm >= 22.05 hands sbatch's --cpus-per-task to srun no more; GPUs are not bound
    per task (tests/test_srun_gpu_binding.py: each rank takes its own)."""
    root = tmp_path / "root"
    (root / ".venv" / "bin").mkdir(parents=True)
    scalegnn = root / ".venv" / "bin" / "scalegnn"  # notes what each task was given
    scalegnn.write_text(f'#!/bin/sh\necho "$SLURM_PROCID $OMP_NUM_THREADS" >> {tmp_path}/tasks\n')
    scalegnn.chmod(0o755)
    env = {**stand_in_slurm(tmp_path, 2, 29500), "SCALEGNN_ROOT": str(root)}
    env["SLURM_CPUS_PER_TASK"] = "3"
    argv = ["bash", str(ROOT / "launch" / "srun.sh"), "1x1x1x2", "config.yaml"]
    with launched(argv, env) as process:
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    srun_args = (tmp_path / "srun_args").read_text().split("\n")
    options = srun_args[: srun_args.index(str(scalegnn))]
    assert options == ["--ntasks-per-node=2", "--cpus-per-task=3", "--gpu-bind=none"]
    assert sorted((tmp_path / "tasks").read_text().split("\n")[:-1]) == ["0 3", "1 3"]


# ------------------------------------------------------------- make test-gpu, Python


def test_make_test_gpu_fails_saying_why_where_no_gpu_is_usable():
    """Not every test skipped and exit 0: the run stops, non-zero, with the reason."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu"],
        cwd=ROOT,
        env={**os.environ, "SCALEGNN_TEST_GPU": "1", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 3, said
    assert "make test-gpu expects a usable GPU, and CUDA is not usable here: torch " in said


def test_requires_python_admits_the_versions_docs_gpu_md_names():
    """dgl 2.1.0 publishes wheels for CPython 3.10-3.12 only."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    admitted = SpecifierSet(re.search(r'^requires-python = "([^"]+)"$', pyproject, re.M)[1])
    assert '"dgl==2.1.0"' in pyproject
    named = re.search(r"Python 3\.(\d+)-3\.(\d+)", (ROOT / "docs" / "gpu.md").read_text())
    assert named is not None, "docs/gpu.md names no Python range (Python 3.x-3.y)"
    low, high = int(named[1]), int(named[2])
    assert [minor for minor in range(6, 20) if f"3.{minor}" in admitted] == [*range(low, high + 1)]
    assert (low, high) == (10, 12)
