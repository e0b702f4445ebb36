"""How the C heap serves a run's large tensors: kept between steps, given back after.

A training step allocates and frees the same few dozen ``(B, hidden)`` matrices every
step (51 MB each at B = 100k, hidden 128). glibc serves a block that large with a fresh
``mmap`` and unmaps it when it is freed, so every step page-faults and zeroes each of
them again: on the 1M sparse graph (one process, B = 100k) that was 0.28 of a 0.79 s
step, most of it counted in the element-wise tail, which touches its outputs first.
:func:`reuse_freed_heap` (training) serves them from the heap instead and keeps what a
step frees for the next one; :func:`return_freed_heap` (evaluation, and the checkpoints'
and the summary's quiet phases) restores glibc's default, so an evaluation's row chunks
are unmapped when freed, and gives back what training kept. :func:`release_free_heap`
gives back what the heap holds free, also in the arenas of other threads (an evaluation
allocates from the main loop, the prefetcher and the communication threads; without it
the resident set grew from one evaluation to the next: 1x2x2x2 on the 1M sparse graph,
1.27 GB peak after one evaluation, 2.06 GB after six). :class:`HeapGrowthBound` gives
back the free pages during training too, once the blocks a step keeps no longer fit the
next step's and the heap has grown beside them.

Elsewhere than glibc (musl, macOS, Windows) every function does nothing and says so by
returning ``False``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterator
from typing import Any

__all__ = [
    "HeapGrowthBound",
    "TrainingHeap",
    "evaluation_heap",
    "release_free_heap",
    "resident_mb",
    "reuse_freed_heap",
    "return_freed_heap",
]

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4

#: glibc's default where a run has warmed it up: blocks above 32 MB (the most its dynamic
#: threshold reaches on 64-bit) mapped on their own, up to 65536 of them, and a free top
#: of twice the threshold kept unreleased.
_MAPPED_ABOVE = 32 << 20
_DEFAULT_MMAP_MAX = 65536

#: The free top of the heap kept during training: more than one step's large blocks
#: (at B = 100k, hidden 128 about 0.5 GB are freed at the end of a step).
TRAINING_TRIM_THRESHOLD = 1 << 30


@functools.cache
def _libc() -> Any:
    """glibc (the functions this module calls), or ``None`` for another C library."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not (hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt")):
        return None
    return libc


def _mallopt(settings: dict[int, int]) -> bool:
    libc = _libc()
    if libc is None:
        return False
    # mallopt returns 1 on success; each setting is applied even if one is refused
    return all([libc.mallopt(param, value) == 1 for param, value in settings.items()])


def reuse_freed_heap(trim_threshold: int = TRAINING_TRIM_THRESHOLD) -> bool:
    """Serve every block from the heap (no ``mmap``) and keep up to ``trim_threshold``
    bytes of its free top: what a step frees, the next step reuses without page faults.

    >>> reuse_freed_heap() in (True, False)
    True
    >>> return_freed_heap() in (True, False)
    True
    """
    return _mallopt({_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: trim_threshold})


def return_freed_heap() -> bool:
    """glibc's default again (large blocks mapped on their own and unmapped when freed),
    and what the heap kept free given back (:func:`release_free_heap`)."""
    restored = _mallopt(
        {
            _M_MMAP_MAX: _DEFAULT_MMAP_MAX,
            _M_MMAP_THRESHOLD: _MAPPED_ABOVE,
            _M_TRIM_THRESHOLD: 2 * _MAPPED_ABOVE,
        }
    )
    release_free_heap()
    return restored


def release_free_heap() -> bool:
    """Return the free pages of every malloc arena to the system; ``False`` where the C
    library cannot (then nothing happens).

    >>> release_free_heap() in (True, False)
    True
    """
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def resident_mb() -> float | None:
    """This process's resident set now, in MB (``None`` without ``/proc``)."""
    with contextlib.suppress(OSError), open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return None


class HeapGrowthBound:
    """Gives the heap's free pages back when fragmentation has grown the resident set.

    A step's blocks vary in size with the sample, so the free blocks :func:`reuse_freed_heap`
    keeps do not always fit the next step's: the heap grows beside them. Measured on
    1x2x2x2 (1M sparse graph, B = 100k, 30 steps) the memory in use between steps stayed
    at 165-181 MB a rank while the free part of the heap grew from 220 to 530 MB and the
    peak to 1.08-1.09 GB. Called after every step, :meth:`after_step` takes the resident
    set after the first step (the process with one step's blocks kept) as the level and
    releases the free pages (:func:`release_free_heap`) whenever a later step leaves the
    resident set above it by more than ``slack`` times the first step's own growth, and
    at least ``floor`` times the level; the next step faults back in what it uses. The
    floor keeps small steps, whose growth is small beside their noise, from releasing
    every few steps (B = 25k on 1x2x2x2: a release in 21-27% of the steps without it,
    11-15% with it; at B = 100k 25%, for a peak of 0.88-0.98 GB a rank).

    >>> bound = HeapGrowthBound()
    >>> bound.after_step() in (True, False)
    True
    """

    def __init__(self, slack: float = 0.25, floor: float = 0.05) -> None:
        self.slack, self.floor = slack, floor
        self._before_first: float | None = resident_mb()
        self._limit: float | None = None
        self.releases = 0

    def after_step(self) -> bool:
        """Release the free heap if the resident set is past the bound; ``True`` if it did."""
        now = resident_mb()
        if now is None or self._before_first is None:
            return False
        if self._limit is None:
            growth = max(now - self._before_first, 0.0)
            self._limit = now + max(self.slack * growth, self.floor * now)
            return False
        if now <= self._limit or not release_free_heap():
            return False
        self.releases += 1
        return True


@contextlib.contextmanager
def evaluation_heap() -> Iterator[None]:
    """glibc's default heap for the block (:func:`return_freed_heap`), so that an
    evaluation's row chunks are unmapped when freed, and its free pages given back after
    (:func:`release_free_heap`), else the next evaluation grows the heap.

    >>> with evaluation_heap():
    ...     pass
    """
    return_freed_heap()
    try:
        yield
    finally:
        release_free_heap()


class TrainingHeap:
    """The heap of a training loop, a context manager: freed blocks kept for the next
    step (:func:`reuse_freed_heap`), their growth bounded (:meth:`after_step`), glibc's
    default again at the end; :meth:`evaluating` brings the reuse back after an
    evaluation, which sets its own heap (:func:`evaluation_heap`).

    >>> with TrainingHeap() as heap:
    ...     heap.after_step() in (True, False)
    True
    """

    def __enter__(self) -> TrainingHeap:
        reuse_freed_heap()  # a step's large blocks stay for the next step
        self.bound = HeapGrowthBound()  # ... until fragmentation has grown the heap
        return self

    def __exit__(self, *exc: object) -> None:
        return_freed_heap()

    def after_step(self) -> bool:
        """:meth:`HeapGrowthBound.after_step`."""
        return self.bound.after_step()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """An evaluation (or a checkpoint) between two steps: the steps' reuse of freed
        blocks comes back after it."""
        try:
            yield
        finally:
            reuse_freed_heap()
