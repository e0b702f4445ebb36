"""No collective runs while ranks sample: every call into torch.distributed is counted."""

from __future__ import annotations

import json

from dgl_scalegnn.core.grid_shape import GridShape
from tests.ranks import spawn_ranks


def test_no_collective_while_sampling(tmp_path):
    grid = "2x1x2x1"  # two DP groups, a 2-way Y axis
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"grid": grid, "steps": 6, "out": str(tmp_path)}))
    world = GridShape.parse(grid).world_size
    spawn_ranks(world, "tests.workers.count_collectives:main", [str(spec)], tmp_path)
    for rank in range(world):
        counts = json.loads((tmp_path / f"counts{rank}.json").read_text())
        assert counts["sampling"] == {}, f"rank {rank} communicated while sampling: {counts}"
        # The counter works: a training step does call collectives.
        assert counts["training"].get("all_reduce", 0) > 0
