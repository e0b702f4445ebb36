"""The CUDA smoke suite runs from ``make test-gpu`` only (``SCALEGNN_TEST_GPU=1``).

``make test`` must never report a skip, and on a machine without a GPU every test here
would be one; so the plain suite does not collect this directory at all. Asked for with
``SCALEGNN_TEST_GPU=1``, a GPU is expected: where CUDA is not usable the run stops at
once, non-zero, saying why (a CPU build of torch, a driver too old for torch's CUDA, no
GPU visible, a GPU too old, a kernel that does not run: gpu-check's own decision),
instead of passing with every test skipped.
"""

import os

import pytest

from tests.gpu.check import gpu_problem

_ASKED = os.environ.get("SCALEGNN_TEST_GPU") == "1"
if not _ASKED:
    collect_ignore_glob = ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    problem = gpu_problem() if _ASKED else None
    if problem is not None:
        pytest.exit(
            f"make test-gpu expects a usable GPU, and CUDA is not usable here: {problem}; see "
            "docs/gpu.md for what is supported, and run it on a GPU machine (make test holds "
            "the CPU guards of the GPU path)",
            returncode=3,
        )
