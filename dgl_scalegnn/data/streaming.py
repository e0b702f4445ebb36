"""Preparing a graph with bounded memory, on one process or split over several.

The result is byte for byte the directory that
:func:`~dgl_scalegnn.data.prepared.write_prepared` writes for
:func:`~dgl_scalegnn.data.prepared.prepare_in_memory` (same files, same checksums), but
no step holds the whole edge list or all features:

1. **bucket**: the edges are read in chunks, relabelled, symmetrised, and each entry's
   key ``row * N + col`` is appended to a spill file of its row tile;
2. **merge**: row tiles are taken in groups whose spilled entries fit the budget; each
   group is sorted, duplicates merged, one self loop per vertex added, its degrees and
   per-tile entry counts noted and the merged keys spilled again;
3. **write**: with every degree known, each group gets its values, is put in tile
   order and written at its place in ``rows``/``cols``/``values``;
4. features are gathered in new order one block of rows at a time (a source that can
   only stream its rows is read once per block), and refused if they hold NaN or
   infinities.

Peak memory is about the budget plus ~50 bytes per vertex (permutation, degrees) plus
what the source itself holds. With several ranks (``mpirun -np P scalegnn prepare``)
rank ``r`` takes the ``r``-th contiguous range of row tiles and of feature rows, the
ranks trade degrees and entry counts through files in the staging directory, and rank 0
writes the small arrays, the checksums and ``meta.json``: the staging directory must
be on a file system every rank sees. Rank 0 alone decides about the target: it holds
the lock of the preparations into it for the whole run, refuses a target that holds
what no preparation writes, and swaps the new directory in
(:func:`~dgl_scalegnn.data.prepared.install_directory`); the other ranks follow it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from dgl_scalegnn.core.layout import block_range, split_bounds
from dgl_scalegnn.data.normalize import inverse_sqrt_degrees
from dgl_scalegnn.data.prepared import (
    ARRAY_NAMES,
    GraphMeta,
    array_entry,
    check_target,
    install_directory,
    locked_target,
    new_staging_directory,
    non_finite_error,
    non_finite_rows,
    target_path,
    writing_into,
)
from dgl_scalegnn.data.source import MASK_NAMES, GraphSource
from dgl_scalegnn.data.tiles import default_tile_count, index_dtype

__all__ = [
    "DEFAULT_MEMORY_GB",
    "Coordinator",
    "SingleProcess",
    "StoreCoordinator",
    "MemoryBudget",
    "prepare_streaming",
]

DEFAULT_MEMORY_GB = 2.0
#: Rows per step when a rank handles an ``O(N)`` array (degrees, labels, masks).
_SMALL_CHUNK = 1 << 22


class Coordinator(Protocol):
    """How the ranks of a parallel preparation meet: ``gather`` returns every rank's
    string in rank order (and so is also a barrier)."""

    rank: int
    size: int

    def gather(self, name: str, value: str) -> list[str]: ...


class SingleProcess:
    """The coordinator of a preparation on one process."""

    rank, size = 0, 1

    def gather(self, name: str, value: str) -> list[str]:
        return [value]


class StoreCoordinator:
    """Ranks that meet through the rendezvous key-value store by polling it.

    Polling, not a collective: a rank may wait here for many minutes while another
    prepares, and if that one fails the watchdog ends this process with its message.
    """

    def __init__(self, store, rank: int, size: int, prefix: str = "prepare") -> None:
        self.store, self.rank, self.size, self.prefix = store, rank, size, prefix

    def gather(self, name: str, value: str) -> list[str]:
        keys = [f"{self.prefix}/{name}/{rank}" for rank in range(self.size)]
        self.store.set(keys[self.rank], value)
        while not self.store.check(keys):
            time.sleep(0.2)
        return [self.store.get(key).decode() for key in keys]


@dataclass(frozen=True)
class MemoryBudget:
    """Working memory of a preparation, in bytes, and the chunk sizes it implies.

    The bytes per item are what each step holds at once (inputs, sort permutations,
    outputs); the budget does not cover the ``O(N)`` arrays nor the source.
    """

    total: int

    @classmethod
    def gigabytes(cls, gb: float) -> MemoryBudget:
        if not gb > 0:
            raise ValueError(f"--memory-gb: got {gb}; give a positive number of GB")
        return cls(int(gb * (1 << 30)))

    @property
    def edges_per_chunk(self) -> int:
        return max(1, self.total // 160)

    @property
    def entries_per_group(self) -> int:
        return max(1, self.total // 64)

    def feature_rows(self, row_bytes: int) -> int:
        return max(1, self.total // (2 * max(1, row_bytes)))


@dataclass(frozen=True)
class _Layout:
    """Tiles of the graph and the share of one rank."""

    num_nodes: int
    tile_count: int
    bounds: np.ndarray  # (T + 1,) vertex bounds of the tiles
    tile_of_vertex: np.ndarray  # (N,) int32
    tiles: tuple[int, int]  # this rank's row tiles [t0, t1)

    @property
    def vertices(self) -> tuple[int, int]:
        return int(self.bounds[self.tiles[0]]), int(self.bounds[self.tiles[1]])

    @classmethod
    def of(cls, num_nodes: int, tile_count: int | None, coordinator: Coordinator) -> _Layout:
        tiles = tile_count or default_tile_count(num_nodes)
        bounds = np.asarray(split_bounds(num_nodes, tiles), dtype=np.int64)
        tile_of_vertex = np.repeat(np.arange(tiles, dtype=np.int32), np.diff(bounds))
        mine = block_range(tiles, coordinator.size, coordinator.rank)
        return cls(num_nodes, tiles, bounds, tile_of_vertex, mine)


def _write_at(path: Path, offset: int, array: np.ndarray) -> None:
    """Write ``array``'s bytes at ``offset`` with plain writes (a memory map would count
    every written page in this process's resident memory)."""
    view = memoryview(np.ascontiguousarray(array)).cast("B")
    fd = os.open(path, os.O_WRONLY)
    try:
        while view.nbytes:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    finally:
        os.close(fd)


def _allocate(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """Create the ``.npy`` file (header as ``np.save`` writes it, sparse body); returns
    the byte offset of the data."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    offset = int(array.offset)
    del array
    return offset


def _data_offset(path: Path) -> int:
    array = np.load(path, mmap_mode="r")
    return int(array.offset)


def _spill_edges(
    source: GraphSource, permutation: np.ndarray, layout: _Layout, budget: MemoryBudget, spill: Path
) -> np.ndarray:
    """Step 1: append each entry key of this rank's rows to its row tile's file.

    Returns the number of keys spilled per row tile of this rank.
    """
    n = layout.num_nodes
    t0, t1 = layout.tiles
    v0, v1 = layout.vertices
    spilled = np.zeros(t1 - t0, dtype=np.int64)
    for src, dst in source.edge_chunks(budget.edges_per_chunk):
        head = permutation[np.asarray(src, dtype=np.int64)]
        tail = permutation[np.asarray(dst, dtype=np.int64)]
        apart = head != tail
        head, tail = head[apart], tail[apart]
        rows = np.concatenate((head, tail))
        cols = np.concatenate((tail, head))
        del head, tail, apart
        if (v0, v1) != (0, n):
            mine = (rows >= v0) & (rows < v1)
            rows, cols = rows[mine], cols[mine]
        keys = rows * n
        keys += cols
        del cols
        tile = layout.tile_of_vertex[rows] - t0
        del rows
        order = np.argsort(tile, kind="stable")
        keys, counts = keys[order], np.bincount(tile, minlength=t1 - t0)
        del tile, order
        start = 0
        for local, count in enumerate(counts.tolist()):
            if count:
                with (spill / f"tile-{t0 + local}.bin").open("ab") as handle:
                    keys[start : start + count].tofile(handle)
                start += count
        spilled += counts
    return spilled


def _groups(spilled: np.ndarray, layout: _Layout, budget: MemoryBudget) -> list[tuple[int, int]]:
    """Consecutive row tiles ``[a, b)`` whose entries (with self loops) fit the budget."""
    t0, t1 = layout.tiles
    sizes = spilled + np.diff(layout.bounds)[t0:t1]
    groups, start, held = [], t0, 0
    for tile in range(t0, t1):
        size = int(sizes[tile - t0])
        if tile > start and held + size > budget.entries_per_group:
            groups.append((start, tile))
            start, held = tile, 0
        held += size
    if t1 > t0:
        groups.append((start, t1))
    return groups


def _merge_group(
    group: tuple[int, int], layout: _Layout, spill: Path, degrees: np.ndarray
) -> tuple[np.ndarray, int]:
    """Step 2 for row tiles ``group``: merge, count, and spill the merged keys.

    Fills the group's rows of ``degrees`` (which holds this rank's rows); returns the
    entry count per tile ``(row tile, col tile)`` of the group, flattened, and the
    group's entry count.
    """
    n, tiles = layout.num_nodes, layout.tile_count
    a, b = group
    r0, r1 = int(layout.bounds[a]), int(layout.bounds[b])
    loops = np.arange(r0, r1, dtype=np.int64)
    parts = [loops * n + loops]
    del loops
    for tile in range(a, b):
        path = spill / f"tile-{tile}.bin"
        if path.exists():
            parts.append(np.fromfile(path, dtype=np.int64))
            path.unlink()
    keys = np.concatenate(parts)
    del parts
    keys.sort()
    distinct = np.empty(keys.shape[0], dtype=bool)
    distinct[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    keys = keys[distinct]
    del distinct
    rows = keys // n
    first = int(layout.bounds[layout.tiles[0]])
    degrees[r0 - first : r1 - first] = np.bincount(rows - r0, minlength=r1 - r0)
    tile = (layout.tile_of_vertex[rows] - a).astype(np.int64) * tiles
    del rows
    tile += layout.tile_of_vertex[keys % n]
    counts = np.bincount(tile, minlength=(b - a) * tiles)
    del tile
    keys.tofile(spill / f"group-{a}.bin")
    return counts, int(keys.shape[0])


def _write_group(
    group: tuple[int, int],
    layout: _Layout,
    spill: Path,
    inv_sqrt: np.ndarray,
    files: dict[str, tuple[Path, int]],
    start: int,
) -> int:
    """Step 3 for row tiles ``group``: values, tile order, written from entry ``start``."""
    n, tiles = layout.num_nodes, layout.tile_count
    path = spill / f"group-{group[0]}.bin"
    keys = np.fromfile(path, dtype=np.int64)
    path.unlink()
    rows, cols = np.divmod(keys, n)
    del keys
    # Keys are in (row, col) order; a stable sort by tile keeps that order inside tiles,
    # exactly as tile_adjacency orders the whole graph.
    tile = layout.tile_of_vertex[rows].astype(np.int64) * tiles
    tile += layout.tile_of_vertex[cols]
    order = np.argsort(tile, kind="stable")
    del tile
    index = index_dtype(n)
    # the group's rows are whole row tiles: its entries start at ``start`` in row order too
    target, offset = files["row_cols"]
    _write_at(target, offset + start * np.dtype(index).itemsize, cols.astype(index))
    for name, column in (("rows", rows), ("cols", cols)):
        target, offset = files[name]
        _write_at(target, offset + start * np.dtype(index).itemsize, column[order].astype(index))
    values = inv_sqrt[rows[order]]
    values *= inv_sqrt[cols[order]]
    target, offset = files["values"]
    _write_at(target, offset + start * values.itemsize, values)
    return start + int(order.shape[0])


def _write_features(
    source: GraphSource,
    permutation: np.ndarray,
    inverse: np.ndarray,
    vertices: tuple[int, int],
    budget: MemoryBudget,
    target: tuple[Path, int],
) -> None:
    """Features of new ids ``vertices``, in new order, one block of rows at a time.

    Raises
    ------
    DatasetError
        If a feature is NaN or infinite (once all the blocks are looked at, to count
        them).
    """
    width = source.num_features
    row_bytes = 4 * width
    step = budget.feature_rows(row_bytes)
    path, offset = target
    non_finite = []
    for a in range(vertices[0], vertices[1], step):
        b = min(a + step, vertices[1])
        if source.feature_rows is not None:
            block = source.feature_rows(inverse[a:b])
        else:
            block = np.empty((b - a, width), dtype=np.float32)
            first = 0
            for chunk in source.feature_blocks():
                new = permutation[first : first + chunk.shape[0]]
                wanted = (new >= a) & (new < b)
                block[new[wanted] - a] = chunk[wanted]
                first += chunk.shape[0]
        non_finite.append(inverse[a + non_finite_rows(block)])
        _write_at(path, offset + a * row_bytes, block)
    found = np.concatenate(non_finite) if non_finite else np.zeros(0, np.int64)
    if found.size:
        scope = "" if vertices == (0, source.num_nodes) else " among those this process prepares"
        raise non_finite_error(f"dataset {source.name!r}", found, scope)


def prepare_streaming(
    source: GraphSource,
    directory: str | os.PathLike[str],
    permutation_seed: int = 0,
    tile_count: int | None = None,
    budget: MemoryBudget | None = None,
    coordinator: Coordinator | None = None,
) -> tuple[GraphMeta, Path]:
    """Prepare ``source`` into ``directory`` within ``budget`` (see the module docstring).

    Every rank of ``coordinator`` calls this with the same arguments; each writes its
    share and rank 0 installs the directory (atomically, as
    :func:`~dgl_scalegnn.data.prepared.write_prepared` does, replacing only a prepared
    directory; a second preparation into the same target waits for the first).

    Raises
    ------
    PrepareTargetError
        On rank 0, if ``directory`` holds what no preparation writes.
    ResourceError
        If the file system does not take the files (full, read-only, not this user's).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from dgl_scalegnn.config import SyntheticConfig
    >>> from dgl_scalegnn.data.synthetic import synthetic_source
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "graph"
    >>> meta, path = prepare_streaming(
    ...     synthetic_source(SyntheticConfig(num_nodes=500)), out, budget=MemoryBudget(1 << 16)
    ... )
    >>> meta.num_nodes, (path / "meta.json").is_file()
    (500, True)
    """
    budget = budget or MemoryBudget.gigabytes(DEFAULT_MEMORY_GB)
    coordinator = coordinator or SingleProcess()
    rank = coordinator.rank
    target = target_path(directory)
    with writing_into(target), ExitStack() as held:
        if rank == 0:
            held.enter_context(locked_target(target))
            check_target(target)  # before the work: refused now, not after it
        made = str(new_staging_directory(target)) if rank == 0 else ""
        staging = Path(coordinator.gather("staging", made)[0])
        spill = staging / f".spill-{rank}"
        try:
            meta = _prepare_into(
                source, staging, spill, permutation_seed, tile_count, budget, coordinator
            )
            if rank == 0:
                files = {name: array_entry(staging / f"{name}.npy") for name in ARRAY_NAMES}
                install_directory(staging, target, {**asdict(meta), "files": files})
            coordinator.gather("installed", "")
        except BaseException:
            shutil.rmtree(spill if rank else staging, ignore_errors=True)
            raise
    return meta, target


def _prepare_into(
    source: GraphSource,
    staging: Path,
    spill: Path,
    permutation_seed: int,
    tile_count: int | None,
    budget: MemoryBudget,
    coordinator: Coordinator,
) -> GraphMeta:
    n, rank = source.num_nodes, coordinator.rank
    spill.mkdir(mode=0o700)
    permutation = np.random.default_rng(permutation_seed).permutation(n).astype(np.int64)
    layout = _Layout.of(n, tile_count, coordinator)
    spilled = _spill_edges(source, permutation, layout, budget, spill)
    groups = _groups(spilled, layout, budget)
    v0, v1 = layout.vertices
    degrees = np.zeros(v1 - v0, dtype=np.int64)
    counts, entries = [], 0
    for group in groups:
        group_counts, group_entries = _merge_group(group, layout, spill, degrees)
        counts.append(group_counts)
        entries += group_entries
    np.save(spill / "degrees.npy", degrees)
    np.save(spill / "counts.npy", np.concatenate(counts or [np.zeros(0, np.int64)]))
    del degrees, counts
    per_rank = [int(x) for x in coordinator.gather("entries", str(entries))]
    nnz = sum(per_rank)
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(n, dtype=np.int64)
    if rank == 0:
        _write_small_arrays(staging, source, permutation, inverse, nnz, layout, coordinator.size)
    coordinator.gather("allocated", "")
    paths = {name: staging / f"{name}.npy" for name in ARRAY_NAMES}
    files = {name: (path, _data_offset(path)) for name, path in paths.items()}
    degrees = np.load(staging / "degrees.npy", mmap_mode="r")
    inv_sqrt = np.empty(n, dtype=np.float32)
    for a, b in _chunks(n, _SMALL_CHUNK):
        inv_sqrt[a:b] = inverse_sqrt_degrees(degrees[a:b])
    del degrees
    start = sum(per_rank[:rank])
    for group in groups:
        start = _write_group(group, layout, spill, inv_sqrt, files, start)
    del inv_sqrt
    _write_features(source, permutation, inverse, layout.vertices, budget, files["features"])
    shutil.rmtree(spill)  # before rank 0 may move the staging directory
    coordinator.gather("written", "")
    return GraphMeta(
        name=source.name,
        num_nodes=n,
        nnz=nnz,
        num_features=source.num_features,
        num_classes=source.num_classes,
        multilabel=source.multilabel,
        permutation_seed=permutation_seed,
        tile_count=layout.tile_count,
        split_sizes={
            name.removesuffix("_mask"): int(source.masks[name].sum()) for name in MASK_NAMES
        },
        **source.recorded_facts(),
    )


def _shapes(source: GraphSource, n: int, nnz: int, tiles: int) -> dict:
    index = np.dtype(index_dtype(n))
    labels = source.labels
    return {
        "offsets": (np.dtype(np.int64), (tiles * tiles + 1,)),
        "rows": (index, (nnz,)),
        "cols": (index, (nnz,)),
        "values": (np.dtype(np.float32), (nnz,)),
        "degrees": (np.dtype(np.int64), (n,)),
        "row_indptr": (np.dtype(np.int64), (n + 1,)),
        "row_cols": (index, (nnz,)),
        "features": (np.dtype(np.float32), (n, source.num_features)),
        "labels": (labels.dtype, labels.shape),
        **{name: (np.dtype(np.bool_), (n,)) for name in MASK_NAMES},
        "permutation": (np.dtype(np.int64), (n,)),
    }


def _write_small_arrays(
    staging: Path,
    source: GraphSource,
    permutation: np.ndarray,
    inverse: np.ndarray,
    nnz: int,
    layout: _Layout,
    size: int,
) -> None:
    """Rank 0: create every output file, and write the arrays of ``O(N)`` or ``O(T^2)``
    entries, from the degrees and entry counts that the ranks left in their spill
    directories."""
    n = source.num_nodes
    offsets = {
        name: _allocate(staging / f"{name}.npy", dtype, shape)
        for name, (dtype, shape) in _shapes(source, n, nnz, layout.tile_count).items()
    }
    parts = [staging / f".spill-{rank}" for rank in range(size)]
    counts = np.concatenate([np.load(part / "counts.npy") for part in parts])
    tile_offsets = np.zeros(layout.tile_count**2 + 1, dtype=np.int64)
    np.cumsum(counts, out=tile_offsets[1:])
    _write_at(staging / "offsets.npy", offsets["offsets"], tile_offsets)
    position, row_start, entries_before = offsets["degrees"], 0, 0
    _write_at(staging / "row_indptr.npy", offsets["row_indptr"], np.zeros(1, np.int64))
    for part in parts:
        degrees = np.load(part / "degrees.npy")
        _write_at(staging / "degrees.npy", position, degrees)
        # a row's stored entries are its degree (A + I): row pointers are their running sum
        ends = np.cumsum(degrees) + entries_before
        _write_at(staging / "row_indptr.npy", offsets["row_indptr"] + 8 * (row_start + 1), ends)
        position += degrees.nbytes
        row_start += degrees.size
        entries_before = int(ends[-1]) if ends.size else entries_before
    _write_at(staging / "permutation.npy", offsets["permutation"], permutation)
    for name in ("labels", *MASK_NAMES):
        values = source.labels if name == "labels" else source.masks[name]
        row_bytes = values.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
        for a, b in _chunks(n, _SMALL_CHUNK):
            _write_at(staging / f"{name}.npy", offsets[name] + a * row_bytes, values[inverse[a:b]])


def _chunks(total: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, step):
        yield start, min(start + step, total)
