"""The normalised adjacency stored as a ``T x T`` grid of vertex-range tiles.

Tile ``(i, j)`` holds the entries whose row lies in vertex range ``i`` and whose
column lies in range ``j`` of :func:`~dgl_scalegnn.core.layout.split_bounds`
``(N, T)``; tiles are stored one after another in row-major tile order, each sorted by
``(row, col)``, as three flat arrays ``rows``, ``cols``, ``values`` and a
``(T*T + 1,)`` offset array; the same entries' columns are stored once more in row
order (``row_cols``, a CSR without values under ``row_indptr``), so that the entries of
any set of rows take one read each (a neighbourhood evaluation:
:mod:`~dgl_scalegnn.evaluation.hops`).
A rank that needs the block ``[R0, R1) x [C0, C1)`` reads,
for each row tile of ``[R0, R1)``, one contiguous run covering the column tiles of
``[C0, C1)``: it reads its share plus at most a partial tile at each edge, whatever
the grid shape. (A plain CSR would make it read whole rows: ``Gc`` times its share.)
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dgl_scalegnn.core.layout import split_bounds
from dgl_scalegnn.data.normalize import NormalizedCSR, csr_row_ids

__all__ = [
    "TiledAdjacency",
    "tile_adjacency",
    "default_tile_count",
    "index_dtype",
    "BlockRead",
    "read_block",
    "release_pages",
    "Verify",
    "no_check",
]


#: ``verify(array name, first row, end row)``: raises if those bytes are corrupt.
Verify = Callable[[str, int, int], None]


def default_tile_count(num_nodes: int) -> int:
    """256 tiles per axis (fewer for tiny graphs): partial tiles cost little on any grid."""
    return max(1, min(256, num_nodes))


def index_dtype(num_nodes: int) -> type:
    """Of stored row and column ids: int32 below 2^31 vertices."""
    return np.int32 if num_nodes < 2**31 else np.int64


@dataclass(frozen=True)
class TiledAdjacency:
    """The normalised adjacency in tiles; arrays may be memory-mapped.

    ``offsets`` ``(T*T + 1,)`` int64; ``rows``/``cols`` ``(nnz,)`` int32 (int64 when
    ``N >= 2^31``); ``values`` ``(nnz,)`` float32; ``degrees`` ``(N,)`` int64 of
    :math:`A + I` (the stored entries of each row); ``row_indptr`` ``(N + 1,)`` int64
    and ``row_cols`` ``(nnz,)`` (the ids' type): the columns in ``(row, col)`` order.
    """

    num_nodes: int
    tile_count: int
    offsets: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    degrees: np.ndarray
    row_indptr: np.ndarray
    row_cols: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.rows.shape[0])

    def bounds(self) -> np.ndarray:
        return np.asarray(split_bounds(self.num_nodes, self.tile_count), dtype=np.int64)


def tile_adjacency(csr: NormalizedCSR, tile_count: int | None = None) -> TiledAdjacency:
    """Reorder a CSR into tiles (a stable sort by tile keeps ``(row, col)`` order inside)."""
    n = csr.num_nodes
    tiles = tile_count or default_tile_count(n)
    bounds = np.asarray(split_bounds(n, tiles), dtype=np.int64)
    rows = csr_row_ids(csr.indptr)
    tile_of_vertex = np.repeat(np.arange(tiles, dtype=np.int64), np.diff(bounds))
    tile = tile_of_vertex[rows] * tiles + tile_of_vertex[csr.indices]
    order = np.argsort(tile, kind="stable")
    offsets = np.zeros(tiles * tiles + 1, dtype=np.int64)
    np.cumsum(np.bincount(tile, minlength=tiles * tiles), out=offsets[1:])
    ids = index_dtype(n)
    return TiledAdjacency(
        num_nodes=n,
        tile_count=tiles,
        offsets=offsets,
        rows=rows[order].astype(ids),
        cols=csr.indices[order].astype(ids),
        values=csr.values[order],
        degrees=csr.degrees,
        row_indptr=csr.indptr.astype(np.int64),
        row_cols=csr.indices.astype(ids),
    )


@dataclass(frozen=True)
class BlockRead:
    """A block read from tiles, as CSR over its rows, plus the bytes read to get it."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    bytes_read: int


def _tile_range(bounds: np.ndarray, start: int, stop: int) -> range:
    """Indices of the tiles that overlap vertex range ``[start, stop)``."""
    if stop <= start:
        return range(0)
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    last = int(np.searchsorted(bounds, stop - 1, side="right")) - 1
    return range(first, last + 1)


def no_check(name: str, start: int, stop: int) -> None:
    """Default of ``read_block``'s ``verify``: arrays in memory need no check."""


def _runs(adjacency: TiledAdjacency, rows: tuple[int, int], cols: tuple[int, int], verify: Verify):
    """Contiguous ``[start, stop)`` runs of stored entries that cover the block.

    A row tile inside ``rows`` gives one run across the column tiles; a row tile cut by
    an edge of ``rows`` is narrowed tile by tile with a binary search on its sorted rows.
    """
    bounds, tiles = adjacency.bounds(), adjacency.tile_count
    verify("offsets", 0, adjacency.offsets.shape[0])
    col_tiles = _tile_range(bounds, *cols)
    if not col_tiles:
        return
    for row_tile in _tile_range(bounds, *rows):
        first = row_tile * tiles + col_tiles.start
        if rows[0] <= bounds[row_tile] and bounds[row_tile + 1] <= rows[1]:
            yield int(adjacency.offsets[first]), int(adjacency.offsets[first + len(col_tiles)])
            continue
        for tile in range(first, first + len(col_tiles)):
            lo, hi = int(adjacency.offsets[tile]), int(adjacency.offsets[tile + 1])
            verify("rows", lo, hi)
            tile_rows = adjacency.rows[lo:hi]
            yield (
                lo + int(np.searchsorted(tile_rows, rows[0])),
                lo + int(np.searchsorted(tile_rows, rows[1])),
            )


def release_pages(array: np.ndarray) -> None:
    """Drop this process's resident pages of a memory-mapped ``array`` (no-op otherwise).

    Pages touched through a memory map count in the resident set until unmapped; they
    stay in the page cache, and are read again if touched. The adjacency arrays are read
    once to build a rank's blocks, so their pages are dropped run by run
    (:func:`read_block`), as are those of a copied feature range.
    """
    mapping = getattr(array, "_mmap", None)
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def read_block(
    adjacency: TiledAdjacency,
    rows: tuple[int, int],
    cols: tuple[int, int],
    verify: Verify = no_check,
) -> BlockRead:
    """The block ``rows x cols`` as a CSR over ``rows`` (column ids global, sorted per row).

    ``verify(name, start, stop)`` is called for every range of an array before it is
    read (a prepared graph's chunk checksums).

    Examples
    --------
    >>> import numpy as np
    >>> from dgl_scalegnn.data.normalize import gcn_normalize
    >>> csr = gcn_normalize(np.array([0, 1, 2]), np.array([1, 2, 3]), 4)
    >>> block = read_block(tile_adjacency(csr, tile_count=2), rows=(1, 3), cols=(2, 4))
    >>> block.indptr.tolist(), block.indices.tolist()
    ([0, 1, 3], [2, 2, 3])
    """
    (r0, r1), (c0, c1) = rows, cols
    num_rows = max(r1 - r0, 0)
    entry_bytes = adjacency.rows.itemsize + adjacency.cols.itemsize + adjacency.values.itemsize
    # Pass 1 keeps each run's entries inside the block in the stored index width (rows
    # made local); pass 2 places them by a counting sort. No int64 copy and no argsort
    # of the whole block: the peak is the block itself plus one run.
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    counts = np.zeros(num_rows, dtype=np.int64)
    bytes_read = 0
    for start, stop in _runs(adjacency, rows, cols, verify):
        for name in ("rows", "cols", "values"):
            verify(name, start, stop)
        run_rows, run_cols = adjacency.rows[start:stop], adjacency.cols[start:stop]
        bytes_read += (stop - start) * entry_bytes
        inside = (run_rows >= r0) & (run_rows < r1) & (run_cols >= c0) & (run_cols < c1)
        local = run_rows[inside] - run_rows.dtype.type(r0)
        if local.size:
            _add_row_counts(counts, local)
            parts.append(
                (local, run_cols[inside], np.asarray(adjacency.values[start:stop])[inside])
            )
        for array in (adjacency.rows, adjacency.cols, adjacency.values):
            release_pages(array)  # what the run kept is copied: its pages may go
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(int(indptr[-1]), dtype=adjacency.cols.dtype)
    values = np.empty(int(indptr[-1]), dtype=adjacency.values.dtype)
    cursor = indptr[:-1].copy()
    for local, part_cols, part_values in parts:
        # A run holds its row tile's column tiles one after another, each sorted by
        # row: a stable sort by row keeps a row's columns ascending (column tiles ascend).
        order = np.argsort(local, kind="stable")
        sorted_rows = local[order]
        first = np.flatnonzero(np.diff(sorted_rows, prepend=sorted_rows[0] - 1))
        rank = np.arange(sorted_rows.size) - np.repeat(
            first, np.diff(first, append=sorted_rows.size)
        )
        slots = cursor[sorted_rows] + rank
        indices[slots], values[slots] = part_cols[order], part_values[order]
        _add_row_counts(cursor, local)
    return BlockRead(indptr, indices, values, bytes_read)


def _add_row_counts(counts: np.ndarray, local_rows: np.ndarray) -> None:
    """``counts[r] += (occurrences of r)``; the rows of a run span one row tile only."""
    low = int(local_rows.min())
    per_row = np.bincount(local_rows - local_rows.dtype.type(low))
    counts[low : low + per_row.size] += per_row
