"""A prefetched batch's memory is not handed to the next build while the training stream
may still read it (stub CUDA streams and events on the CPU).

The batch of step ``s`` is built on the side stream and read by the training stream in
step ``s``; freed, its memory goes back to the side stream, whose next allocation may
take it at once. Nothing makes the host wait for the training stream at the end of a
step (the per-step read of the loss does today, by chance), so the batch may be freed
only once a build has been queued behind an event recorded on the training stream after
step ``s``'s work: ``get(s + 1)`` records it and queues the build of ``s + 2``.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext

import torch

from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.sampling.prefetch import Prefetcher

STEPS = 5


class _Batch:
    """A batch that notes in ``log`` when it is freed."""

    def __init__(self, step: int, log: list) -> None:
        self.step = step
        weakref.finalize(self, log.append, ("freed", step))


def _stub_cuda(monkeypatch, log: list) -> None:
    """Streams and events that note each event recorded on the training stream."""

    class Stream:
        def __init__(self, device=None, name: str = "side") -> None:
            self.name = name

        def wait_event(self, event) -> None:
            pass

    training = Stream(name="training")

    class Event:
        def record(self, stream=None) -> None:
            if stream is training:
                log.append(("recorded on the training stream",))

    for name, value in {
        "set_device": lambda device: None,
        "current_device": lambda: 0,
        "Stream": Stream,
        "Event": Event,
        "stream": lambda stream: nullcontext(),
        "current_stream": lambda device=None: training,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)


def _train(device: str, log: list) -> None:
    """``STEPS`` steps through a prefetcher, each batch dropped once its step is queued,
    as the training loop drops it."""
    prefetcher = Prefetcher(lambda step: _Batch(step, log), Profiler(enabled=False), device)
    try:
        for step in range(STEPS):
            batch = prefetcher.get(step)
            log.append(("handed", batch.step))
            del batch  # the step's work is queued; the loop lets the batch go
    finally:
        prefetcher.close()


def test_a_batch_is_freed_only_once_a_build_waits_for_its_step(monkeypatch):
    log: list = []
    _stub_cuda(monkeypatch, log)
    _train("cuda:0", log)
    for step in range(STEPS - 1):
        handed = log.index(("handed", step))
        freed = log.index(("freed", step))
        # get(step) records before the build of step + 1 (before this step's work),
        # get(step + 1) after it, for the build of step + 2
        after_the_step = [
            i for i, entry in enumerate(log[:freed]) if i > handed and entry[0].startswith("rec")
        ]
        assert after_the_step, (step, log)


def test_on_the_cpu_a_batch_is_freed_as_soon_as_the_loop_lets_it_go():
    log: list = []
    _train("cpu", log)
    for step in range(STEPS):
        assert log.index(("freed", step)) == log.index(("handed", step)) + 1, log
