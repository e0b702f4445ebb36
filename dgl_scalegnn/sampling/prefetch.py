"""Build the batch of step ``t + 1`` while step ``t`` trains.

A single worker thread runs the sampler one step ahead, across epoch boundaries (global
steps are consecutive). On CUDA the worker first makes the rank's GPU its current device
(a thread starts on GPU 0, and entering a stream context there would open a context on
GPU 0 from every rank), then issues its kernels on a side stream and records an event;
the training stream waits on that event before it uses the batch.

A batch's memory belongs to the side stream that allocated it: once freed, the next
allocation there may take it at once, while the training stream may still be reading
the batch (nothing makes the host wait for that stream at the end of a step). So the
prefetcher keeps each batch it hands out until the next :meth:`Prefetcher.get` has
queued the build after it, whose side-stream work waits for all training work queued
before (the build's first event): whatever takes the batch's memory then writes it
only after the training stream has read it. That is what ``Tensor.record_stream`` on
every tensor of the batch would ensure, without knowing what a batch holds.
On CPU the thread alone gives the overlap (torch kernels release the GIL). The time
the training loop waits for a batch is charged to ``prefetch_wait``.

Example
-------
>>> prefetcher = Prefetcher(lambda step: step * 10, Profiler(enabled=False))
>>> prefetcher.get(0), prefetcher.get(1)
(0, 10)
>>> prefetcher.close()
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import torch

from dgl_scalegnn.profiling import Profiler

__all__ = ["Prefetcher"]

T = TypeVar("T")


def _use_device(device: torch.device) -> None:
    """Make ``device`` the current device of the calling (worker) thread."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


class Prefetcher(Generic[T]):
    """Calls ``build(step)`` one step ahead of :meth:`get` on a worker thread.

    Parameters
    ----------
    build : callable
        ``build(global_step)`` returns the batch of that step; it must depend only on
        the step (the sampler does), so prefetching never changes the batches.
    profiler : Profiler
        Charged with the time :meth:`get` waits.
    device : torch.device
        A CUDA device gets a side stream and an event per batch.
    """

    def __init__(
        self, build: Callable[[int], T], profiler: Profiler, device: torch.device | str = "cpu"
    ) -> None:
        self._build, self._profiler = build, profiler
        self._device = torch.device(device)
        if self._device.type == "cuda" and self._device.index is None:
            # "cuda" means the caller's current GPU; the worker thread's would be GPU 0.
            self._device = torch.device("cuda", torch.cuda.current_device())
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="prefetch",
            initializer=_use_device,
            initargs=(self._device,),
        )
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        self._pending: tuple[int, Future] | None = None
        #: On CUDA, the batch :meth:`get` last handed out, kept until the next build is
        #: queued behind the training stream's work (see the module's docstring).
        self._handed: T | None = None

    def _run(
        self, step: int, main_ready: torch.cuda.Event | None
    ) -> tuple[T, torch.cuda.Event | None]:
        if self._stream is None:
            return self._build(step), None
        # Batches freed by the training stream return memory to this stream's pool: wait
        # for the training work queued before this batch was requested, then build.
        self._stream.wait_event(main_ready)
        with torch.cuda.stream(self._stream):
            batch = self._build(step)
            built = torch.cuda.Event()
            built.record(self._stream)
        return batch, built

    def _submit(self, step: int) -> None:
        main_ready = None
        if self._stream is not None:
            main_ready = torch.cuda.Event()
            main_ready.record(torch.cuda.current_stream(self._device))
        self._pending = (step, self._executor.submit(self._run, step, main_ready))

    def get(self, step: int) -> T:
        """The batch of ``step``; the batch of ``step + 1`` starts building at once (on
        CUDA behind the training stream's work so far, and only then is the batch handed
        out before this one let go)."""
        if self._pending is None or self._pending[0] != step:
            if self._pending is not None:
                self._pending[1].result()  # drop a batch built for another step
            self._submit(step)
        with self._profiler.region("prefetch_wait"):
            batch, event = self._pending[1].result()
            if event is not None:
                torch.cuda.current_stream(self._device).wait_event(event)
        self._submit(step + 1)
        if self._stream is not None:
            self._handed = batch
        return batch

    def close(self) -> None:
        """Wait for the batch in flight and stop the worker."""
        if self._pending is not None:
            self._pending[1].result()
            self._pending = None
        self._handed = None
        self._executor.shutdown(wait=True)
