"""``peak_rss_mb`` reports a process's own peak, not the peak of the process that started
it; ``release_free_heap`` gives freed heap pages back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch

from dgl_scalegnn.train.heap import release_free_heap
from dgl_scalegnn.train.trainer import peak_rss_mb

_CHILD = "from dgl_scalegnn.train.trainer import peak_rss_mb; print(peak_rss_mb())"


def test_child_does_not_inherit_the_parents_peak() -> None:
    held = np.ones(300 * 2**20, dtype=np.uint8)  # 300 MB touched in this process
    assert peak_rss_mb() >= 300
    child = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
    )
    # The child imports torch (~250-400 MB); the parent's peak here is that plus 300 MB.
    assert float(child.stdout) < peak_rss_mb() - 200, (child.stdout, peak_rss_mb())
    del held


def _resident_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_release_free_heap_returns_what_a_thread_freed() -> None:
    """What a thread frees stays in its malloc arena (the growth between evaluations)
    until :func:`release_free_heap` gives it back."""

    def allocate_and_free() -> None:
        torch.empty(8 << 20, dtype=torch.uint8).fill_(1)  # freed: glibc raises its mmap threshold
        held = [torch.empty(4 << 20, dtype=torch.uint8).fill_(1) for _ in range(64)]
        del held  # 256 MB back in the arena, still resident

    worker = threading.Thread(target=allocate_and_free)
    worker.start()
    worker.join()
    before = _resident_mb()
    assert release_free_heap()
    assert _resident_mb() < before - 150, (before, _resident_mb())
