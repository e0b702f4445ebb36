"""``peak_rss_mb`` reports a process's own peak, not the peak of the process that started it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

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
