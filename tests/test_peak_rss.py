"""``peak_rss_mb`` reports a process's own peak, not the peak of the process that started
it; ``reuse_freed_heap`` keeps a freed large block for the next allocation, and
``release_free_heap`` gives freed heap pages back, which ``HeapGrowthBound`` does once a
step has left the heap grown past its bound."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import torch

from dgl_scalegnn import heap
from dgl_scalegnn.heap import HeapGrowthBound, release_free_heap, resident_mb
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
    before = resident_mb()
    assert release_free_heap()
    assert resident_mb() < before - 150, (before, resident_mb())


def test_heap_growth_bound_releases_past_a_quarter_of_the_first_step_or_its_floor(
    monkeypatch,
) -> None:
    released: list[bool] = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: released.append(True) or True)
    # start 500 MB, first step 700: limit 700 + max(0.25 * 200, 0.05 * 700) = 750 MB
    readings = iter([500.0, 700.0, 740.0, 760.0, 745.0, 800.0])
    monkeypatch.setattr(heap, "resident_mb", lambda: next(readings))
    bound = HeapGrowthBound(slack=0.25, floor=0.05)
    assert [bound.after_step() for _ in range(5)] == [False, False, True, False, True]
    assert len(released) == bound.releases == 2
    # a small first step (700 -> 720): the floor sets the limit, 720 + 36 = 756 MB
    readings = iter([700.0, 720.0, 750.0, 760.0])
    bound = HeapGrowthBound(slack=0.25, floor=0.05)
    assert [bound.after_step() for _ in range(3)] == [False, False, True]


_GROWTH = """
import torch
from dgl_scalegnn.heap import HeapGrowthBound, resident_mb, reuse_freed_heap
assert reuse_freed_heap()
bound = HeapGrowthBound(slack=0.25, floor=0.0)
step = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(16)]  # the first step: 64 MB
del step  # kept by the heap for the next step
assert not bound.after_step()  # sets the bound: a quarter of 64 MB above the first step
grown = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(56)]  # a later step: 224 MB
del grown
before = resident_mb()
print(bound.after_step(), before - resident_mb())
"""


def test_heap_growth_bound_gives_back_what_a_grown_heap_holds_free() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _GROWTH], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "True"
    assert float(out[1]) > 100, out  # most of the 224 MB the later step left free


# A fresh interpreter, so the switch does not change the heap of the test process.
_STEP_FAULTS = """
import resource, sys, torch
from dgl_scalegnn.heap import return_freed_heap, reuse_freed_heap
assert (reuse_freed_heap if sys.argv[1] == "reuse" else return_freed_heap)()
rows = 100_000  # a step's (B, 128) float32 blocks, 51 MB each

def step() -> None:
    x = torch.randn(rows, 128)
    y = torch.relu(x) * 2  # two temporaries
    del x
    (y + 1).sum()

for _ in range(5):  # warm-up: the heap grows to a step's working set
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_of_five_steps(mode: str) -> int:
    # 4 KiB pages: torch's huge-page option (which the CLI turns on, also in this
    # process when a test ran it) would count one fault per 2 MiB instead.
    child = subprocess.run(
        [sys.executable, "-c", _STEP_FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "THP_MEM_ALLOC_ENABLE": "0"},
    )
    return int(child.stdout)


def test_reuse_freed_heap_serves_steps_without_page_faults() -> None:
    """With glibc's default each 51 MB block of a step is a fresh mapping that faults in
    page by page; after :func:`reuse_freed_heap` a step reuses the pages the last one
    freed (all of them as a rule; now and then one block misses, since torch's aligned
    allocations ask for a little more than a freed block holds)."""
    mapped = _faults_of_five_steps("return")
    reused = _faults_of_five_steps("reuse")
    assert mapped >= 5 * 13_000, mapped  # three 51 MB blocks a step, in 4 KiB pages
    assert reused * 5 < mapped, (reused, mapped)
