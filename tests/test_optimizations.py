"""Each optimisation switch acts, and keeps the answer (Gd = 2 on a 2x2x2 TP grid).

One group of ranks trains every variant from its config; the worker records what each
switch did (:mod:`tests.workers.switch_losses`): the thread that built each batch, the
asynchronous all-reduces in flight together, the compiled tail in each rank, the kernels
the tail ran (native or eager), and the dtype of every all-reduce."""

from __future__ import annotations

import json

import numpy as np
import torch

from dgl_scalegnn.config import SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.parallel.elementwise import LayerTail, LocalRows
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.sampling.prefetch import Prefetcher
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import sample_vertices
from tests.ranks import spawn_ranks

BASE = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 3000, "num_features": 20, "seed": 2}},
    "model": {"hidden": 24, "layers": 3, "dropout": 0.2},
    "sampling": {"batch_size": 600},
    "train": {"epochs": 10, "eval_every": 100, "progress": False},
    "parallel": {"grid": "2x2x2x1"},
}
VARIANTS = {
    "baseline": {},
    "prefetch": {"sampling": {"prefetch": True}},
    "overlap": {"parallel": {"overlap": True}},
    "fuse": {"parallel": {"fuse": True}},
    "eager": {"parallel": {"native_kernels": False}},
    "bf16": {"parallel": {"bf16_comm": True}},
    "all": {
        "sampling": {"prefetch": True},
        "parallel": {"overlap": True, "fuse": True, "bf16_comm": True},
    },
}
STEPS = 20


def _warm_fusion_cache() -> None:
    """Compile the fused layer tail once here: ranks then find it in the on-disk cache."""
    tail = LayerTail(fuse=True)
    for rows in (37, 41):
        x = torch.randn(rows, 6, requires_grad=True)
        gain = torch.ones(6, requires_grad=True).clone()  # a non-leaf, as in the model
        residual = torch.randn(rows, 6, requires_grad=True)
        tail(
            x,
            gain,
            residual,
            torch.arange(rows),
            statistics=LocalRows(),
            key=7,
            col_start=3,
            width=24,
            eps=1e-6,
            rate=0.2,
        ).sum().backward()
    assert tail.fused, "torch.compile failed on this machine"


def _reports(tmp_path) -> list[dict]:
    _warm_fusion_cache()
    world = GridShape.parse(BASE["parallel"]["grid"]).world_size
    spawn_ranks(
        world,
        "tests.workers.switch_losses:main",
        [BASE, VARIANTS, STEPS, str(tmp_path)],
        tmp_path,
        timeout=900,
    )
    return [json.loads((tmp_path / f"report{r}.json").read_text()) for r in range(world)]


#: Widest parameter dimension of BASE (features 20, hidden 24, classes 8): a gradient of
#: a weight has at most this many rows, a batch block has about 600 / 2 = 300.
_WIDEST = 24


def _is_pmm_product(call: dict) -> bool:
    """An all-reduce of a 3D PMM product (X W, A F or their input gradients): a batch
    block of rows, outside the DP group. Statistics, losses and gains are columns,
    pairs or vectors; weight gradients have at most :data:`_WIDEST` rows."""
    shape = call["shape"]
    return not call["dp"] and len(shape) == 2 and shape[1] > 2 and shape[0] > _WIDEST


def test_switches_act_and_keep_the_step_losses(tmp_path):
    reports = _reports(tmp_path)
    for rank, report in enumerate(reports):
        baseline = report["baseline"]
        losses = {name: np.array(variant["losses"]) for name, variant in report.items()}
        assert len(losses["baseline"]) == STEPS and np.isfinite(losses["baseline"]).all()

        # prefetch: every batch built by the worker thread, one step ahead (the batch
        # after the last step was built too), and the wait for it timed
        for name in ("prefetch", "all"):
            threads = report[name]["build_threads"]
            assert len(threads) == STEPS + 1, (rank, name, len(threads))
            assert all(t.startswith("prefetch") for t in threads), (rank, name, threads)
            assert report[name]["prefetch_wait_steps"] == STEPS, (rank, name)
        assert baseline["build_threads"] == ["MainThread"] * STEPS
        assert baseline["prefetch_wait_steps"] == 0

        # overlap: dX and dW all-reduces of a linear in flight together
        for name in ("overlap", "all"):
            assert report[name]["max_in_flight"] >= 2, (rank, name)
        assert baseline["max_in_flight"] == 0

        # fusion: the tail ran compiled in this rank (not fallen back to eager)
        assert report["fuse"]["fused"] and report["all"]["fused"], rank
        assert not baseline["fused"]

        # native kernels (the default): every tail kernel of the baseline ran native, the
        # square sums' reduction between two of them (the grid splits the columns);
        # switched off, every one ran eagerly
        assert baseline["tail_calls"]["eager"] == 0 and baseline["tail_calls"]["native"] > 0, report
        assert report["eager"]["tail_calls"]["native"] == 0
        assert report["eager"]["tail_calls"]["eager"] == baseline["tail_calls"]["native"]

        # bf16: exactly the products' all-reduces travel as bfloat16; the norm
        # statistics, losses, gains, weight gradients and DP gradients stay float32
        plain, low = baseline["reduces"], report["bf16"]["reduces"]
        assert [(c["shape"], c["dp"]) for c in low] == [(c["shape"], c["dp"]) for c in plain]
        assert "torch.bfloat16" not in {c["dtype"] for c in plain}
        assert any(c["dp"] for c in low), "Gd = 2 must reduce gradients over the DP group"
        assert any(_is_pmm_product(c) for c in low)
        for call in low:
            if call["dtype"] in ("torch.float32", "torch.bfloat16"):
                expected = "torch.bfloat16" if _is_pmm_product(call) else "torch.float32"
                assert call["dtype"] == expected, (rank, call)

        for exact in ("prefetch", "overlap"):
            assert np.array_equal(losses[exact], losses["baseline"]), (rank, exact)
        # The compiled and eager tails compute the same operations; sums of squares in
        # another order and a vectorised rsqrt round differently in the last bit, so
        # losses agree to float32 rounding, not bit for bit.
        for rounding in ("fuse", "eager"):
            assert (
                np.abs(losses[rounding] - losses["baseline"]).max()
                <= 1e-5 * np.abs(losses["baseline"]).max()
            ), rounding
        for low_precision in ("bf16", "all"):
            relative = np.abs(losses[low_precision] - losses["baseline"]) / np.abs(
                losses["baseline"]
            )
            assert relative.max() < 1e-2, (low_precision, relative.max())


def test_prefetch_keeps_the_sequence_of_batches():
    graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=800, num_features=8)), 0)
    shape = GridShape.parse("1x2x1x2")

    def build(store):
        return lambda step: store.batch(sample_vertices(800, 150, seed=step), step)

    direct = RankStore(graph, Grid4D.view(shape, 3), num_layers=3)
    ahead = RankStore(graph, Grid4D.view(shape, 3), num_layers=3)
    prefetcher = Prefetcher(build(ahead), Profiler())
    try:
        for step in range(12):
            expected, got = build(direct)(step), prefetcher.get(step)
            assert torch.equal(got.rows.vertex_ids, expected.rows.vertex_ids)
            assert torch.equal(got.features, expected.features)
            assert torch.equal(got.labels, expected.labels)
            for plane, spmm in expected.adjacency.items():
                probe = torch.randn(spmm.num_cols, 3)
                assert torch.equal(got.adjacency[plane].matmul(probe), spmm.matmul(probe))
    finally:
        prefetcher.close()
