"""The communication model predicts the bytes the ranks actually send, per group kind."""

from __future__ import annotations

import json

import pytest

from dgl_scalegnn.config import ModelConfig, SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.perfmodel import Hardware, Workload, epoch_time, memory_bytes, step_bytes
from tests.ranks import spawn_ranks

SYNTHETIC = {"num_nodes": 12_000, "num_features": 30, "num_classes": 6, "avg_degree": 8.0}
STEPS = 4


#: Kipf & Welling's GCN: the features redistributed to the first layer, no head.
KIPF = {"input_projection": False, "head": False, "norm": False, "residual": False}


@pytest.mark.parametrize(
    ("grid", "bf16", "model"),
    [
        ("2x1x3x1", False, {"bias": True, "conv": "sage"}),
        ("1x2x1x2", True, {"conv": "gin", "gin_learn_eps": True}),
        ("1x2x2x2", False, KIPF),
        # GAT's heads split over the ranks of a row's columns (5 columns a head, 10 a rank)
        ("1x2x1x2", False, {"conv": "gat", "gat_heads": 4, "gat_residual": True}),
    ],
)
def test_predicted_bytes_within_5_percent_of_counted(tmp_path, grid, bf16, model):
    shape = GridShape.parse(grid)
    config = {
        "data": {"name": "synthetic", "synthetic": SYNTHETIC},
        "model": {"hidden": 20, "layers": 4, "dropout": 0.1, **model},
        "sampling": {"batch_size": 6000},
        "parallel": {"grid": grid, "bf16_comm": bf16},
    }
    spawn_ranks(
        shape.world_size, "tests.workers.count_bytes:main", [config, STEPS, str(tmp_path)], tmp_path
    )

    nnz = prepare_in_memory(generate(SyntheticConfig(**SYNTHETIC)), 0).meta.nnz
    work = Workload(
        num_nodes=SYNTHETIC["num_nodes"],
        nnz=nnz,
        batch_size=6000,
        in_features=30,
        num_classes=6,
        model=ModelConfig(hidden=20, layers=4, **model),
        bf16_comm=bf16,
    )
    worst = 0.0
    for rank in range(shape.world_size):
        steps = json.loads((tmp_path / f"bytes{rank}.json").read_text())
        counted = {k: sum(s.get(k, 0) for s in steps) / len(steps) for k in steps[0]}
        predicted = step_bytes(work, shape, rank)
        assert set(counted) == set(predicted), (rank, counted, predicted)
        for kind, value in predicted.items():
            assert counted[kind] == pytest.approx(value, rel=0.05), (grid, rank, kind)
            if value:  # a rank whose redistributed block stays with it sends nothing
                worst = max(worst, abs(counted[kind] - value) / value)
    print(f"{grid}: largest relative error of predicted bytes {worst:.2%}")


def test_projection_and_memory_are_consistent():
    products = Workload(
        num_nodes=2_449_029,
        nnz=126_167_053,
        batch_size=131_072,
        in_features=100,
        num_classes=47,
        model=ModelConfig(hidden=256, layers=3),
    )
    a100 = Hardware(
        bandwidth={"x": 80e9, "y": 80e9, "z": 80e9, "tp": 80e9, "dp": 20e9},
        latency_s=10e-6,
        gemm_flops=19.5e12,
        memory_bw=1.5e12,
    )
    small, large = GridShape.parse("1x2x2x2"), GridShape.parse("2x2x2x2")
    # Doubling data parallelism halves the steps per epoch and adds a DP all-reduce.
    assert epoch_time(products, large, a100) < epoch_time(products, small, a100)
    assert "dp" in step_bytes(products, large, 0) and "dp" not in step_bytes(products, small, 0)
    one, eight = memory_bytes(products, GridShape.parse("1x1x1x1")), memory_bytes(products, small)
    assert eight["graph"] < 0.5 * one["graph"]
