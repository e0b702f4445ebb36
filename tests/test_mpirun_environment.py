"""launch/mpirun.sh hands a rank on another host the variables torch, Triton, gloo and
Python read (tests/multihost.py: two network-namespace hosts, the other host's rank
started by an rsh agent in a login's environment, as ssh starts it): mpirun forwards to
another host only what ``-x`` names, so ``TORCH_NCCL_*``, ``PYTORCH_CUDA_ALLOC_CONF``,
Inductor's and Triton's caches, ``GLOO_SOCKET_IFNAME`` and ``PYTHONPATH`` set for a job
reached only its first host's ranks."""

from __future__ import annotations

import os

from tests.helpers import ROOT, launched
from tests.multihost import cluster

GIVEN = {
    "TORCH_NCCL_BLOCKING_WAIT": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCHINDUCTOR_CACHE_DIR": "/scratch/inductor",
    "TRITON_CACHE_DIR": "/scratch/triton",
    "GLOO_SOCKET_IFNAME": "hsn0",
    "PYTHONPATH": "/opt/site/python",
}
# Stands in for scalegnn: says what a rank was given.
_SHOW_RANK = "#!/bin/sh\necho rank $OMPI_COMM_WORLD_RANK on $(hostname):" + "".join(
    f" {name}=${name}" for name in GIVEN
)


def test_mpirun_sh_hands_a_rank_on_another_host_torchs_and_pythons_variables(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "show-rank").write_text(_SHOW_RANK + "\n")
    (bin_dir / "show-rank").chmod(0o755)
    command = [str(ROOT / "launch" / "mpirun.sh"), "2", "1x1x1x2", "config.yaml"]
    with cluster(tmp_path, 2) as hosts:
        env = {
            **GIVEN,
            "MPIRUN_ARGS": f"--hostfile {hosts.hostfile(1)} --mca plm_rsh_agent {hosts.rsh_agent}",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SCALEGNN": str(bin_dir / "show-rank"),
        }
        with launched(hosts.on("node0", command), env) as process:
            output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output[-4000:]
    seen = {}
    for line in output.splitlines():
        if line.startswith("rank "):
            words = line.split()
            seen[words[3]] = dict(word.split("=", 1) for word in words[4:])
    assert sorted(seen) == ["node0:", "node1:"], output
    for host, variables in seen.items():
        assert variables == GIVEN, host
