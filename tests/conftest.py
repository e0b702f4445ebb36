"""Suite-wide settings: prepared graphs that training caches go to a temporary
directory of the test session, never to the user's cache (spawned ranks inherit it)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    previous = os.environ.get("SCALEGNN_CACHE_DIR")
    os.environ["SCALEGNN_CACHE_DIR"] = str(tmp_path_factory.mktemp("scalegnn-cache"))
    yield
    if previous is None:
        del os.environ["SCALEGNN_CACHE_DIR"]
    else:
        os.environ["SCALEGNN_CACHE_DIR"] = previous
