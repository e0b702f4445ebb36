"""Suite-wide settings: prepared graphs that training caches go to a temporary
directory of the test session, never to the user's cache (spawned ranks inherit it);
OpenMP threads wait passively."""

from __future__ import annotations

import os
import sys

import pytest

# Set before torch loads its OpenMP runtime, which reads it once. Actively waiting, the
# suite's idle OpenMP threads spin on the cores that the ranks it spawns need: beside a
# busy process, three test files took 68-72 s, and 56 s waiting passively.
if "OMP_WAIT_POLICY" not in os.environ:
    if "torch" in sys.modules:
        raise RuntimeError("torch was imported before tests/conftest.py set OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "passive"


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    previous = os.environ.get("SCALEGNN_CACHE_DIR")
    os.environ["SCALEGNN_CACHE_DIR"] = str(tmp_path_factory.mktemp("scalegnn-cache"))
    yield
    if previous is None:
        del os.environ["SCALEGNN_CACHE_DIR"]
    else:
        os.environ["SCALEGNN_CACHE_DIR"] = previous
