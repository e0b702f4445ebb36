"""Per-component timers and communication byte counters.

Regions are context managers placed around kernels and collectives, outside the maths.
The components match the paper's epoch-time breakdown.

Example
-------
>>> profiler = Profiler()
>>> with profiler.region("gemm"):
...     pass
>>> profiler.add_bytes("x", 1024)
>>> sorted(profiler.snapshot()["bytes"].items())
[('x', 1024)]
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["COMPONENTS", "Profiler"]

#: Components of the epoch-time breakdown.
COMPONENTS = (
    "sampling",
    "prefetch_wait",
    "spmm",
    "gemm",
    "elementwise",
    "tp_allreduce",
    "dp_allreduce",
    "redistribute",
)


class Profiler:
    """Accumulates seconds per component and bytes sent per group kind.

    With ``synchronize=True`` each region waits for the device first, so that
    asynchronous CUDA kernels are charged to the region that launched them.
    """

    def __init__(self, enabled: bool = True, synchronize: bool = False) -> None:
        self._lock = threading.Lock()  # the prefetch thread records regions too
        self.enabled = enabled
        self.synchronize = synchronize and torch.cuda.is_available()
        self.seconds: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    @contextmanager
    def region(self, component: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.synchronize:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            with self._lock:
                self.seconds[component] += elapsed
                self.calls[component] += 1

    def add_bytes(self, group_kind: str, count: int) -> None:
        if self.enabled:
            with self._lock:
                self.bytes[group_kind] += int(count)

    def snapshot(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """Seconds, bytes and calls so far (and start again from zero if ``reset``)."""
        with self._lock:
            state = {
                "seconds": dict(self.seconds),
                "bytes": dict(self.bytes),
                "calls": dict(self.calls),
            }
            if reset:
                self.seconds.clear()
                self.bytes.clear()
                self.calls.clear()
        return state

    def reset(self) -> None:
        self.snapshot(reset=True)
