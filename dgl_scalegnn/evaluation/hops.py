"""One hop of a neighbourhood, read from the prepared graph: what an evaluation needs
whose memory is bounded by its pieces, not by the graph.

A graph layer computes its output rows :math:`S` from its input rows :math:`I`, the
vertices :math:`S` reaches:

.. math::

    I = \\{ j : \\hat A_{ij} \\ne 0,\\ i \\in S \\}, \\qquad
    X_{h,l}[S] = \\mathrm{layer}_l\\big(\\hat A[S, I],\\ X_{h,l-1}[I]\\big).

:math:`I` holds :math:`S` (each vertex has its self loop in :math:`A + I`), so a
layer's own rows (the residual, SAGE's and GIN's self terms) are rows of its input.
Rows come from the row-ordered copy of the adjacency (:func:`read_rows`), features and
degrees from their files, each row read with ``pread`` rather than through the memory
map (:func:`read_vertex_rows`), so that a piece's reads leave nothing resident beyond
the rows themselves. :func:`pieces` splits rows into
pieces of bounded entries, and :func:`hubs` names the vertices of highest degree, whose
hidden rows an evaluation keeps rather than recomputes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dgl_scalegnn.data.normalize import inverse_sqrt_degrees
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.data.row_reads import pread_runs
from dgl_scalegnn.data.tiles import TiledAdjacency, Verify, no_check, release_pages
from dgl_scalegnn.sampling.blocks import CSRBlock

__all__ = ["Hop", "hop", "hubs", "pieces", "read_rows", "read_vertex_rows"]


@dataclass(frozen=True)
class Hop:
    """A layer's output ``rows`` :math:`S` (sorted global ids), its ``inputs``
    :math:`I \\supseteq S` (sorted), the block :math:`\\hat A[S, I]` (columns numbered
    by their position in :math:`I`) and ``own``, the position of each row of :math:`S`
    in :math:`I`."""

    rows: np.ndarray
    inputs: np.ndarray
    block: CSRBlock
    own: np.ndarray


def _read_runs(array: np.ndarray, starts: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
    """Runs of rows of ``array``, packed: run ``i`` is ``counts[i]`` rows (one without
    ``counts``) from row ``starts[i]``. A memory-mapped array (a whole one, as
    :func:`~dgl_scalegnn.data.prepared.open_prepared` opens it) is read with one
    ``pread`` a run (:func:`~dgl_scalegnn.data.row_reads.pread_runs`): through the
    map, each row would map its page, and on a page cache of large folios (ext4 on Linux
    6.x, after sequential reads) the whole folio, into the resident set: 2,725 random
    feature rows of the 10M graph mapped 1.1 GB until released. Others are indexed."""
    starts = np.asarray(starts, dtype=np.int64)
    total = starts.size if counts is None else int(counts.sum())
    out = np.empty((total, *array.shape[1:]), dtype=array.dtype)
    path = array.filename if isinstance(array, np.memmap) else None
    if path is None:
        if counts is None:
            out[...] = array[starts]
        else:
            first = np.repeat(starts - np.cumsum(counts) + counts, counts)
            out[...] = array[first + np.arange(total)]
        return out
    fd = os.open(path, os.O_RDONLY)
    try:
        row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
        pread_runs(fd, array.offset, row_bytes, starts, counts, out)
    finally:
        os.close(fd)
    return out


def read_vertex_rows(array: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """``array[vertices]``; a memory-mapped array is read a row at a time with ``pread``,
    so that none of its pages enters this process's resident set."""
    return _read_runs(array, vertices, None)


def read_rows(
    adjacency: TiledAdjacency, vertices: np.ndarray, verify: Verify = no_check
) -> tuple[np.ndarray, np.ndarray]:
    """The stored entries of rows ``vertices`` (any order, repeats allowed) as CSR over
    them, ``(indptr, column ids)``, from the row-ordered copy of the adjacency: one read
    of the row pointers and one of the columns a row (``verify`` sees their spans).

    Examples
    --------
    >>> import numpy as np
    >>> from dgl_scalegnn.data.normalize import gcn_normalize
    >>> from dgl_scalegnn.data.tiles import tile_adjacency
    >>> csr = gcn_normalize(np.array([0, 1, 2]), np.array([1, 2, 3]), 4)
    >>> indptr, cols = read_rows(tile_adjacency(csr, tile_count=2), np.array([3, 1]))
    >>> indptr.tolist(), cols.tolist()
    ([0, 2, 5], [2, 3, 0, 1, 2])
    """
    vertices = np.asarray(vertices, dtype=np.int64)
    if vertices.size:
        verify("row_indptr", int(vertices.min()), int(vertices.max()) + 2)
    pointers = _read_runs(adjacency.row_indptr, vertices, np.full(vertices.size, 2))
    starts, counts = pointers[0::2], pointers[1::2] - pointers[0::2]
    indptr = np.zeros(vertices.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if indptr[-1]:  # the span of the runs: each chunk of it is checked once per process
        verify("row_cols", int(starts.min()), int((starts + counts).max()))
    return indptr, _read_runs(adjacency.row_cols, starts, counts)


def hop(graph: PreparedGraph, rows: np.ndarray, normalisation: str) -> Hop:
    """The hop of sorted unique ``rows``, its block in ``normalisation``
    (:func:`~dgl_scalegnn.data.normalize.renormalize_block`'s: ``symmetric``
    :math:`r = c = \\hat d^{-1/2}`; ``sum`` ones, without self loops).

    Examples
    --------
    >>> import numpy as np
    >>> from dgl_scalegnn.data.normalize import gcn_normalize
    >>> from dgl_scalegnn.config import SyntheticConfig
    >>> from dgl_scalegnn.data.prepared import prepare_in_memory
    >>> from dgl_scalegnn.data.synthetic import generate
    >>> graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=300)))
    >>> step = hop(graph, np.array([5, 7]), "sum")
    >>> bool(np.isin([5, 7], step.inputs).all()), step.block.nnz + 2 == step.inputs.size
    (True, True)
    """
    adjacency = graph.adjacency
    rows = np.asarray(rows, dtype=np.int64)
    indptr, columns = read_rows(adjacency, rows, graph.verify)
    # sorted; holds ``rows`` (self loops); one sort numbers the columns and own rows too
    inputs, position = np.unique(
        np.concatenate((rows, columns.astype(np.int64))), return_inverse=True
    )
    own, cols = position[: rows.size], position[rows.size :]
    if normalisation == "symmetric":
        # a row's stored entries are its degree (A + I): only the inputs' are read
        graph.verify("degrees", int(inputs[0]), int(inputs[-1]) + 1)
        row_scale = inverse_sqrt_degrees(np.diff(indptr), np.float32)
        col_scale = inverse_sqrt_degrees(read_vertex_rows(adjacency.degrees, inputs), np.float32)
    elif normalisation == "sum":
        row_of = np.repeat(np.arange(rows.size), np.diff(indptr))
        keep = cols != own[row_of]
        indptr = np.zeros_like(indptr)
        np.cumsum(np.bincount(row_of[keep], minlength=rows.size), out=indptr[1:])
        cols = cols[keep]
        row_scale = np.ones(rows.size, dtype=np.float32)
        col_scale = np.ones(inputs.size, dtype=np.float32)
    else:
        raise ValueError(f"unknown normalisation {normalisation!r}")
    block = CSRBlock(
        row_start=0,
        row_stop=rows.size,
        col_start=0,
        col_stop=inputs.size,
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(cols.astype(np.int32 if inputs.size < 2**31 else np.int64)),
        row_scale=torch.from_numpy(row_scale),
        col_scale=torch.from_numpy(col_scale),
        unit_scales=normalisation == "sum",
    )
    return Hop(rows, inputs, block, own)


def pieces(degrees: np.ndarray, entries: int) -> Iterator[slice]:
    """Consecutive slices of rows whose ``degrees`` (their stored entries) add up to at
    most ``entries`` (a row with more forms a piece of its own).

    >>> [(s.start, s.stop) for s in pieces(np.array([3, 3, 9, 1, 1]), entries=6)]
    [(0, 2), (2, 3), (3, 5)]
    """
    start, ends = 0, np.cumsum(degrees)
    while start < degrees.size:
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + entries, side="right")))
        yield slice(start, stop)
        start = stop


def hubs(graph: PreparedGraph, count: int, chunk: int = 1 << 22) -> np.ndarray:
    """The sorted ids of the ``count`` vertices of highest degree (fewer where ties at the
    cut would exceed ``count``), reading the degrees ``chunk`` at a time.

    >>> from dgl_scalegnn.config import SyntheticConfig
    >>> from dgl_scalegnn.data.prepared import prepare_in_memory
    >>> from dgl_scalegnn.data.synthetic import generate
    >>> graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=300)))
    >>> top = hubs(graph, 5)
    >>> degrees = graph.adjacency.degrees
    >>> bool(0 < top.size <= 5 and degrees[top].min() >= np.sort(degrees)[-top.size :].min())
    True
    """
    degrees, n = graph.adjacency.degrees, graph.meta.num_nodes
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    histogram, found = np.zeros(1, dtype=np.int64), []
    for start in range(0, n, chunk):
        counts = np.bincount(np.asarray(degrees[start : start + chunk]))
        release_pages(degrees)  # read in order, a chunk at a time: its pages may go
        if counts.size > histogram.size:
            counts[: histogram.size] += histogram
            histogram = counts
        else:
            histogram[: counts.size] += counts
    above = np.cumsum(histogram[::-1])[::-1]  # above[d]: vertices of degree >= d
    cut = int(np.searchsorted(-above, -count, side="left"))  # least d with above[d] <= count
    for start in range(0, n, chunk):
        found.append(start + np.flatnonzero(np.asarray(degrees[start : start + chunk]) >= cut))
        release_pages(degrees)
    return np.concatenate(found).astype(np.int64)
