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

__all__ = ["COMPONENTS", "HOST_WAITS", "HOST_AND_DEVICE", "Profiler"]

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
#: Components that are the host waiting (for the prefetch thread's batch): timed by the
#: host clock on every device, since the GPU may be busy or idle all along.
HOST_WAITS = frozenset({"prefetch_wait"})
#: Components with work on both sides (the sample is drawn and split on the CPU, the
#: blocks cut out on the GPU): charged the longer of the host's time and the GPU's.
HOST_AND_DEVICE = frozenset({"sampling"})


class Profiler:
    """Accumulates seconds per component and bytes sent per group kind.

    On the CPU a region is timed by the host clock. On a CUDA ``device`` kernels and NCCL
    collectives return as soon as they are queued, so a region records a pair of CUDA
    events on the current stream of the thread that enters it (the prefetch thread's
    side stream, or the training stream) and is charged the device time between them.
    Reading those times never waits: :meth:`snapshot` takes the regions whose events
    have completed, and regions still running go to the next snapshot (or are waited
    for with ``wait=True``). Two kinds of region are not only device work: the host's
    waits (:data:`HOST_WAITS`) take the host clock, since events queued behind other
    work would time the GPU instead, and regions with host work too
    (:data:`HOST_AND_DEVICE`) are charged the longer of the two clocks, so the CPU part
    counts where the GPU was busy with earlier work meanwhile.

    Parameters
    ----------
    enabled : bool
        A disabled profiler records nothing.
    device : torch.device or str
        The device whose work the regions time.
    """

    def __init__(self, enabled: bool = True, device: torch.device | str = "cpu") -> None:
        self._lock = threading.Lock()  # the prefetch thread records regions too
        self.enabled = enabled
        self.device = torch.device(device)
        self.seconds: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        #: Device regions not yet charged: component, events, and the host's seconds
        #: (0 where the device's time alone counts).
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event, float]] = []

    @contextmanager
    def region(self, component: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.device.type == "cuda" and component not in HOST_WAITS:
            with self._device_region(component):
                yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self.seconds[component] += elapsed
                self.calls[component] += 1

    @contextmanager
    def _device_region(self, component: str) -> Iterator[None]:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        host_start = time.perf_counter()
        try:
            yield
        finally:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            host = time.perf_counter() - host_start if component in HOST_AND_DEVICE else 0.0
            with self._lock:
                self._pending.append((component, start, end, host))
                self.calls[component] += 1

    def _collect(self, wait: bool) -> None:
        """Charge the regions whose events have completed (all of them if ``wait``)."""
        running = []
        for component, start, end, host in self._pending:
            if wait:
                end.synchronize()
            elif not end.query():
                running.append((component, start, end, host))
                continue
            self.seconds[component] += max(start.elapsed_time(end) / 1000.0, host)
        self._pending = running

    def add_bytes(self, group_kind: str, count: int) -> None:
        if self.enabled:
            with self._lock:
                self.bytes[group_kind] += int(count)

    def snapshot(self, reset: bool = False, wait: bool = False) -> dict[str, dict[str, float]]:
        """Seconds, bytes and calls so far (and start again from zero if ``reset``).

        On CUDA, regions whose kernels still run are left for the next snapshot unless
        ``wait`` (which waits for them: a host synchronisation).
        """
        with self._lock:
            self._collect(wait)
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
