"""Each optimisation switch keeps the answer: same step losses on a 2x2x2 grid."""

from __future__ import annotations

import json

import numpy as np
import torch

from dgl_scalegnn.config import SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.parallel.elementwise import LayerTail
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
    "parallel": {"grid": "1x2x2x2"},
}
VARIANTS = {
    "baseline": {},
    "prefetch": {"sampling": {"prefetch": True}},
    "overlap": {"parallel": {"overlap": True}},
    "fuse": {"parallel": {"fuse": True}},
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
        square_sum = (x * x).sum(1, keepdim=True)
        gain = torch.ones(6, requires_grad=True).clone()  # a non-leaf, as in the model
        residual = torch.randn(rows, 6, requires_grad=True)
        tail(
            x,
            square_sum,
            gain,
            residual,
            torch.arange(rows),
            key=7,
            col_start=3,
            width=24,
            eps=1e-6,
            rate=0.2,
        ).sum().backward()
    assert tail.fused, "torch.compile failed on this machine"


def test_switches_keep_the_step_losses(tmp_path):
    _warm_fusion_cache()
    world = GridShape.parse(BASE["parallel"]["grid"]).world_size
    spawn_ranks(
        world,
        "tests.workers.switch_losses:main",
        [BASE, VARIANTS, STEPS, str(tmp_path)],
        tmp_path,
        timeout=900,
    )
    losses = {k: np.array(v) for k, v in json.loads((tmp_path / "losses.json").read_text()).items()}
    baseline = losses["baseline"]
    assert len(baseline) == STEPS and np.isfinite(baseline).all()
    for exact in ("prefetch", "overlap"):
        assert np.array_equal(losses[exact], baseline), exact
    # The compiled tail computes the same operations; its vectorised rsqrt rounds
    # differently in the last bit, so losses agree to float32 rounding, not bit for bit.
    assert np.abs(losses["fuse"] - baseline).max() <= 1e-5 * np.abs(baseline).max()
    for low_precision in ("bf16", "all"):
        relative = np.abs(losses[low_precision] - baseline) / np.abs(baseline)
        assert relative.max() < 1e-2, (low_precision, relative.max())
        assert not np.array_equal(losses[low_precision], baseline)  # bf16 really was on


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
