"""Prepared directories: prepare -> verify round trip, corruption detection, and a rank
reading only its share of a memory-mapped graph."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from dgl_scalegnn.cli import main
from dgl_scalegnn.config import SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.core.layout import INPUT_LAYOUT, block_range
from dgl_scalegnn.core.schedule import adjacency_planes, logits_layout
from dgl_scalegnn.data import tiles as tiles_module
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.data.prepared import (
    open_prepared,
    prepare_in_memory,
    verify_prepared,
    write_prepared,
)
from dgl_scalegnn.data.streaming import prepare_streaming
from dgl_scalegnn.data.synthetic import generate, synthetic_source
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.sampling import store as store_module
from dgl_scalegnn.sampling.store import RankStore
from tests.helpers import SHARED_DATA


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=6000)), permutation_seed=2)
    return graph, write_prepared(graph, tmp_path_factory.mktemp("prepared") / "synthetic")


def test_cli_prepare_then_verify_cora(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "cora"
    assert (
        main(["prepare", "--dataset", "cora", "--root", str(SHARED_DATA), "--out", str(out)]) == 0
    )
    assert main(["prepare", "--verify", str(out)]) == 0
    assert "ok (cora, 2708 vertices" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format_version"] == 2 and meta["num_classes"] == 7
    assert set(meta["files"]) >= {"offsets", "rows", "cols", "values", "features", "labels"}


def test_memory_mapped_graph_equals_the_in_memory_one(synthetic_dir, tmp_path):
    graph, directory = synthetic_dir
    _, streamed = prepare_streaming(
        synthetic_source(SyntheticConfig(num_nodes=6000)), tmp_path / "streamed", permutation_seed=2
    )
    for opened in (open_prepared(directory), open_prepared(streamed)):
        for name, array in graph.arrays().items():
            mapped = opened.arrays()[name]
            assert isinstance(mapped, np.memmap), name
            assert np.array_equal(mapped, array), name
            assert mapped.dtype == array.dtype, name
        assert opened.meta == graph.meta


def _copy(directory, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(directory, target)
    return target


def test_changed_byte_is_detected_by_checksum(synthetic_dir, tmp_path):
    target = _copy(synthetic_dir[1], tmp_path)
    values = target / "values.npy"
    data = bytearray(values.read_bytes())
    data[-5] ^= 0xFF
    values.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"values\.npy: SHA-256 differs"):
        verify_prepared(target)
    assert main(["prepare", "--verify", str(target)]) == 2


def test_changed_byte_is_refused_by_the_rank_that_reads_it(synthetic_dir, tmp_path):
    """Without hashing whole files: each rank checks the chunks it reads."""
    target = _copy(synthetic_dir[1], tmp_path)
    features = target / "features.npy"
    data = bytearray(features.read_bytes())
    data[-7] ^= 0x01  # a feature of the last vertex, in the upper half of the X range
    features.write_bytes(bytes(data))
    graph = open_prepared(target)  # sizes still match: opening succeeds
    shape = GridShape.parse("1x2x1x1")
    RankStore(graph, Grid4D.view(shape, 0), num_layers=1)  # reads rows [0, N/2): fine
    with pytest.raises(
        DatasetError, match=r"features\.npy: bytes \d+-\d+ differ from their checksum"
    ):
        RankStore(graph, Grid4D.view(shape, 1), num_layers=1)


def test_truncated_file_is_detected_at_open(synthetic_dir, tmp_path):
    target = _copy(synthetic_dir[1], tmp_path)
    features = target / "features.npy"
    features.write_bytes(features.read_bytes()[:-100])
    with pytest.raises(DatasetError, match=r"features\.npy: \d+ bytes, meta.json records"):
        open_prepared(target)


def test_other_format_version_and_missing_meta_are_refused(synthetic_dir, tmp_path):
    target = _copy(synthetic_dir[1], tmp_path)
    meta = json.loads((target / "meta.json").read_text())
    meta["format_version"] = 99
    (target / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="format version 99"):
        open_prepared(target)
    (target / "meta.json").unlink()
    with pytest.raises(DatasetError, match=r"meta\.json: missing"):
        open_prepared(target)


def _independent_share(graph, shape, rank, layers) -> dict[str, int]:
    """A rank's share, computed with scipy from the whole adjacency (the oracle)."""
    adjacency = graph.adjacency
    n = graph.meta.num_nodes
    matrix = sp.csr_matrix(
        (
            np.ones(adjacency.nnz),
            (adjacency.rows.astype(np.int64), adjacency.cols.astype(np.int64)),
        ),
        shape=(n, n),
    )
    grid = Grid4D.view(shape, rank)
    entry_bytes = adjacency.rows.itemsize + adjacency.cols.itemsize + adjacency.values.itemsize
    entries = 0
    for plane in adjacency_planes(layers):
        r0, r1 = block_range(n, grid.size(plane.rows), grid.coord(plane.rows))
        c0, c1 = block_range(n, grid.size(plane.cols), grid.coord(plane.cols))
        entries += matrix[r0:r1, c0:c1].nnz
    f_rows = block_range(n, grid.size(INPUT_LAYOUT.rows), grid.coord(INPUT_LAYOUT.rows))
    f_cols = block_range(
        graph.meta.num_features, grid.size(INPUT_LAYOUT.cols), grid.coord(INPUT_LAYOUT.cols)
    )
    label_axis = logits_layout(layers).rows
    l_rows = block_range(n, grid.size(label_axis), grid.coord(label_axis))
    vertex_bytes = (f_rows[1] - f_rows[0]) * (f_cols[1] - f_cols[0]) * 4
    vertex_bytes += (l_rows[1] - l_rows[0]) * (graph.labels.itemsize + 3)
    return {
        "entries": entries,
        "adjacency_bytes": entries * entry_bytes,
        "vertex_bytes": vertex_bytes,
    }


def test_rank_of_2x2x2_grid_reads_only_its_share(synthetic_dir):
    graph, directory = synthetic_dir
    mapped = open_prepared(directory)
    shape = GridShape.parse("1x2x2x2")
    whole = sum(a.nbytes for a in graph.arrays().values())
    for rank in range(shape.world_size):
        store = RankStore(mapped, Grid4D.view(shape, rank), num_layers=3)
        share = _independent_share(graph, shape, rank, layers=3)
        expected = share["adjacency_bytes"] + share["vertex_bytes"]
        assert sum(b.nnz for b in store.blocks.values()) == share["entries"]
        # bytes copied out of the mapped files: its share, plus partial tiles at edges
        assert store.bytes_read <= 1.25 * expected, (rank, store.bytes_read, expected)
        # bytes it keeps: its blocks (as CSR with int64 ids) and vertex data, nothing else
        resident_share = share["entries"] * 12 + share["vertex_bytes"]
        resident_share += sum(
            8 * (b.row_stop - b.row_start + 1)
            + 4 * (b.row_stop - b.row_start + b.col_stop - b.col_start)
            for b in store.blocks.values()
        )
        assert store.nbytes() <= 1.25 * resident_share
        assert store.bytes_read < 0.5 * whole
        print(
            f"rank {rank}: share {expected} B, read {store.bytes_read} B, "
            f"resident {store.nbytes()} B of {whole} B prepared"
        )


def test_rank_drops_the_pages_of_what_it_copied_and_keeps_its_views(synthetic_dir, monkeypatch):
    # The features' column range is a copy: every column of its rows was read through the
    # mapping, and those pages must leave the rank's resident set; on 1x1x1x1 the
    # features are a view of the mapping, whose pages are the data in use.
    _, directory = synthetic_dir
    released: list[np.ndarray] = []
    monkeypatch.setattr(store_module, "release_pages", released.append)
    mapped = open_prepared(directory)
    split = RankStore(mapped, Grid4D.view(GridShape.parse("1x1x1x2"), 1), num_layers=2)
    assert not np.may_share_memory(split.features.numpy(), mapped.features)
    assert any(np.may_share_memory(array, mapped.features) for array in released)
    released.clear()
    whole = RankStore(mapped, Grid4D.view(GridShape.parse("1x1x1x1"), 0), num_layers=2)
    assert np.may_share_memory(whole.features.numpy(), mapped.features)
    assert not any(np.may_share_memory(array, mapped.features) for array in released)
    assert any(np.may_share_memory(array, mapped.adjacency.cols) for array in released)


def test_pages_are_dropped_while_reading_not_only_at_the_end(synthetic_dir, monkeypatch):
    """A rank's peak while loading is its share plus one run or one block of feature rows
    of mapped pages, not every page its ranges touch: the adjacency's are dropped after
    each run and a column range's after each block of rows, and the copy is exact."""
    _, directory = synthetic_dir

    released_in_read: list[np.ndarray] = []
    monkeypatch.setattr(tiles_module, "release_pages", released_in_read.append)
    mapped = open_prepared(directory)
    runs = tiles_module._runs(mapped.adjacency, (0, 150), (0, 300), lambda *a: None)
    tiles_module.read_block(mapped.adjacency, (0, 150), (0, 300))
    assert len(released_in_read) == 3 * len(list(runs)) > 3
    assert any(np.may_share_memory(a, mapped.adjacency.values) for a in released_in_read)

    released_in_copy: list[np.ndarray] = []
    monkeypatch.setattr(store_module, "release_pages", released_in_copy.append)
    columns = mapped.features[:50, 1:3]
    copied = store_module._copy_by_rows(columns, rows=7)
    assert np.array_equal(copied, np.asarray(columns)) and copied.flags.c_contiguous
    assert len(released_in_copy) == 8  # ceil(50 / 7) blocks
