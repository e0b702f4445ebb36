"""Layout states, uneven splits, the grid's rank layout and its groups."""

from __future__ import annotations

import itertools

import pytest
import torch

from dgl_scalegnn.core.grid_shape import GridError, GridShape
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis, Layout, Plane, block_range, split_bounds
from dgl_scalegnn.core.schedule import adjacency_planes, layer_layouts
from dgl_scalegnn.parallel.partition import RowPartition


def test_split_bounds_are_contiguous_and_balanced():
    for n in range(0, 40):
        for parts in range(1, 7):
            bounds = split_bounds(n, parts)
            sizes = [b - a for a, b in itertools.pairwise(bounds)]
            assert bounds[0] == 0 and bounds[-1] == n
            assert max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)
            assert all(block_range(n, parts, i) == (bounds[i], bounds[i + 1]) for i in range(parts))


def test_layer_rotation_has_period_three_and_reads_the_paper_planes():
    states = layer_layouts(6)
    assert states[0] == Layout(Axis.X, Axis.Y, Axis.Z)  # the XY-plane after input projection
    assert INPUT_LAYOUT.after_linear() == states[0]
    assert states[3] == states[0] and states[6] == states[0]
    # Layer 1 reads the adjacency on rows Z / cols X, layer 2 on Y/Z, layer 3 on X/Y.
    assert adjacency_planes(3) == [
        Plane(Axis.Z, Axis.X),
        Plane(Axis.Y, Axis.Z),
        Plane(Axis.X, Axis.Y),
    ]
    assert adjacency_planes(5) == adjacency_planes(3)
    assert adjacency_planes(1) == [Plane(Axis.Z, Axis.X)]


def test_a_layout_names_each_axis_once():
    with pytest.raises(ValueError, match="once"):
        Layout(Axis.X, Axis.X, Axis.Z)


def test_rank_layout_x_fastest_then_y_z_d():
    shape = GridShape.parse("2x2x3x2")
    assert [shape.coords(r).x for r in range(4)] == [0, 1, 0, 1]
    assert shape.coords(2).y == 1 and shape.coords(6).z == 1 and shape.coords(12).d == 1
    assert all(shape.rank_of(shape.coords(r)) == r for r in range(shape.world_size))


def test_groups_partition_the_ranks():
    shape = GridShape.parse("2x2x3x1")
    for varying in ("x", "y", "z", "d", "xyz"):
        groups = shape.group_ranks(varying)
        members = sorted(r for g in groups for r in g)
        assert members == list(range(shape.world_size))
        for group in groups:
            coords = [shape.coords(r) for r in group]
            for axis in "dxyz":
                values = {getattr(c, axis) for c in coords}
                size = {"d": shape.dp, "x": shape.x, "y": shape.y, "z": shape.z}[axis]
                assert len(values) == (size if axis in varying else 1)


@pytest.mark.parametrize("spec", ["2x2", "0x1x1x1", "axbxc", "1x2x3x4x5"])
def test_bad_grid_specs_are_refused(spec):
    with pytest.raises(GridError):
        GridShape.parse(spec)


def test_grid_that_does_not_fit_the_world_names_both_sizes():
    with pytest.raises(GridError, match="needs 8 processes but the job has 4"):
        GridShape.parse("2x2x2").check_world_size(4)
    assert GridShape.parse("2x2x2") == GridShape(1, 2, 2, 2)


def test_row_partition_follows_vertex_ranges():
    sample = torch.tensor([0, 3, 4, 9, 10, 15, 16])
    rows = RowPartition.of(sample, 17, GridShape.parse("1x3x2x1"))
    # X splits [0,17) as [0,6) [6,12) [12,17); Y as [0,9) [9,17).
    assert [rows.range(Axis.X, i) for i in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [rows.range(Axis.Y, i) for i in range(2)] == [(0, 3), (3, 7)]
    assert rows.ids(Axis.X, 1).tolist() == [9, 10]
