"""launch/srun.sh on GPU nodes without Slurm: every rank sees all GPUs of its node and
takes its own, and each job has a rendezvous port of its own.

The stand-in srun (:func:`tests.helpers.stand_in_slurm`) sits behind one that binds GPUs
as Slurm does: a step holds all the job's GPUs of a node (here 4); with
``--gpus-per-task=N`` (binding ``per_task:N`` unless ``--gpu-bind`` says otherwise) each
task's ``CUDA_VISIBLE_DEVICES`` is narrowed to its own N, with ``--gpu-bind=none`` (or no
GPU option) every task sees all of them. NCCL finds NVLink and peer-to-peer paths only
between GPUs a process sees (NVIDIA/nccl#1066), so the launcher must not narrow them;
each rank then takes GPU ``SLURM_LOCALID`` itself
(:func:`~dgl_scalegnn.distributed.devices.device_for`, on stub CUDA calls that show
the visible GPUs).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tests.helpers import ROOT, launched, stand_in_slurm

GPUS_PER_NODE = 4
NODES = ("127.0.0.1", "127.0.0.2")

# srun OPTIONS... COMMAND...: Slurm's GPU binding of the options, then the stand-in srun
# (renamed srun-tasks) starting each task through bind-gpus.
_BINDING_SRUN = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    here=$(dirname "$0")
    options=() per_task="" bind=""
    while [[ "$1" == --* ]]; do
      case $1 in
        --gpus-per-task=*) per_task=${1#*=} ;;
        --gpu-bind=*) bind=${1#*=} ;;
      esac
      options+=("$1")
      shift
    done
    [ -n "$bind" ] || bind=${per_task:+per_task:$per_task}
    exec "$here/srun-tasks" "${options[@]}" "$here/bind-gpus" "${bind:-none}" "$@"
    """
)
# bind-gpus BINDING COMMAND...: the task's CUDA_VISIBLE_DEVICES as Slurm sets it.
_BIND_GPUS = textwrap.dedent(
    f"""\
    #!/usr/bin/env bash
    binding=$1
    shift
    case $binding in
      none) visible=$(seq -s, 0 {GPUS_PER_NODE - 1}) ;;
      per_task:*) n=${{binding#per_task:}}
        visible=$(seq -s, $(( SLURM_LOCALID * n )) $(( SLURM_LOCALID * n + n - 1 ))) ;;
    esac
    CUDA_VISIBLE_DEVICES=$visible exec "$@"
    """
)
# A rank's device choice with CUDA stubbed to show the GPUs CUDA_VISIBLE_DEVICES names.
_CHOOSE_DEVICE = textwrap.dedent(
    """\
    import os
    import torch
    from dgl_scalegnn.distributed.devices import device_for
    from dgl_scalegnn.distributed.launch import detect_launch
    visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    torch.cuda.device_count = lambda: len(visible)
    torch.cuda.set_device = lambda device: None
    info = detect_launch()
    device = device_for(info, "nccl")
    said = (f"rank {info.rank} local {info.local_rank} sees {','.join(visible)} "
            f"takes {visible[device.index]} port {os.environ['MASTER_PORT']}\\n")
    os.write(1, said.encode())  # one write: the tasks' lines never mix
    """
)


#: A task that says only its rendezvous port (no torch to import).
_SHOW_PORT = 'echo "rank $SLURM_PROCID port $MASTER_PORT"'


def _slurm_job(
    tmp_path: Path, job_id: str, port: int | None = None, task: str | None = None
) -> dict[str, str]:
    """A 2-node, 4-task sbatch job whose srun binds GPUs as Slurm does and whose tasks
    say which GPUs they see and which they take (or run the shell line ``task``)."""
    tmp_path.mkdir(exist_ok=True)
    env = stand_in_slurm(tmp_path, 4, port or 0, NODES)
    bin_dir = tmp_path / "bin"
    (bin_dir / "srun").rename(bin_dir / "srun-tasks")
    for name, text in (("srun", _BINDING_SRUN), ("bind-gpus", _BIND_GPUS)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "root"
    (root / ".venv" / "bin").mkdir(parents=True)
    scalegnn = root / ".venv" / "bin" / "scalegnn"
    (tmp_path / "choose_device.py").write_text(_CHOOSE_DEVICE)
    task = task or f"exec {sys.executable} {tmp_path / 'choose_device.py'}"
    scalegnn.write_text(f"#!/bin/sh\n{task}\n")
    scalegnn.chmod(0o755)
    env.update(SCALEGNN_ROOT=str(root), SLURM_JOB_ID=job_id)
    if port is None:
        del env["MASTER_PORT"]
    return env


def _ranks(
    tmp_path: Path, job_id: str, port: int | None = None, task: str | None = None
) -> dict[int, dict[str, str]]:
    """What each rank of a srun.sh job said: the GPUs it sees, the one it takes, its port."""
    argv = ["bash", str(ROOT / "launch" / "srun.sh"), "1x1x2x2", "config.yaml"]
    env = {"MASTER_PORT": "", **_slurm_job(tmp_path, job_id, port, task)}
    with launched(argv, env) as process:
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    said = {}
    for line in output.splitlines():
        if line.startswith("rank "):
            words = line.split()
            said[int(words[1])] = dict(zip(words[2::2], words[3::2]))
    assert sorted(said) == [0, 1, 2, 3], output
    return said


def test_every_rank_sees_all_gpus_of_its_node_and_takes_its_own(tmp_path):
    said = _ranks(tmp_path, "4242")
    every_gpu = ",".join(str(gpu) for gpu in range(GPUS_PER_NODE))
    for rank, rank_said in said.items():
        local = rank % 2  # two tasks a node
        assert rank_said["local"] == str(local)
        assert rank_said["sees"] == every_gpu, (rank, rank_said)
        assert rank_said["takes"] == str(local), (rank, rank_said)


def test_each_job_has_a_rendezvous_port_of_its_own(tmp_path):
    """Two jobs whose first node is the same must not both listen on one port; a port
    the user gives is kept. Derived ports lie below the kernel's ephemeral ones, which
    an outgoing connection may hold at any time."""
    ports = {}
    for job_id in ("81234", "81235"):
        said = _ranks(tmp_path / job_id, job_id, task=_SHOW_PORT)
        assert len({rank_said["port"] for rank_said in said.values()}) == 1, said
        ports[job_id] = int(said[0]["port"])
    assert ports["81234"] != ports["81235"]
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(1024 <= port < ephemeral for port in ports.values()), ports
    given = _ranks(tmp_path / "given", "81234", port=29555, task=_SHOW_PORT)
    assert {rank_said["port"] for rank_said in given.values()} == {"29555"}
