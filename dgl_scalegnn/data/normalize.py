"""GCN normalisation of a whole graph in CSR.

.. math::

    A = \\hat{D}^{-1/2} (A_{sym} + I) \\hat{D}^{-1/2}, \\qquad
    \\hat{D}_{vv} = \\sum_u (A_{sym} + I)_{vu}

where :math:`A_{sym}` is the 0/1 adjacency of the input edges in both directions with
duplicates merged and self loops dropped, so that every vertex gets exactly one self
loop even when the input already has some. Rows are sorted by column, so the CSR is
canonical for a given edge set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "NormalizedCSR",
    "gcn_normalize",
    "csr_row_ids",
    "inverse_sqrt_degrees",
    "BlockEntries",
    "renormalize_block",
]


@dataclass(frozen=True)
class NormalizedCSR:
    """The normalised adjacency :math:`A` of ``num_nodes`` vertices.

    ``indptr`` ``(N + 1,)`` int64, ``indices`` ``(nnz,)`` int64 column ids sorted within
    each row, ``values`` ``(nnz,)`` float32, ``degrees`` ``(N,)`` int64: the row counts
    of :math:`A_{sym} + I` (so ``values[k] = (deg_i deg_j)^{-1/2}``).
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    degrees: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])


def inverse_sqrt_degrees(degrees: np.ndarray, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """:math:`\\hat d^{-1/2}`, computed in float64 and rounded once to ``dtype``."""
    return (1.0 / np.sqrt(np.asarray(degrees, dtype=np.float64))).astype(dtype)


def csr_row_ids(indptr: np.ndarray) -> np.ndarray:
    """Row id of every stored entry of a CSR with row pointer ``indptr``."""
    return np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))


def gcn_normalize(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, dtype: np.dtype | type = np.float32
) -> NormalizedCSR:
    """Symmetrise, merge duplicates, add one self loop per vertex and normalise.

    Parameters
    ----------
    src, dst : np.ndarray
        ``(E,)`` integer endpoints of the input edges, in ``[0, num_nodes)``.
    num_nodes : int
        ``N``; vertices without edges keep only their self loop.
    dtype : numpy dtype
        Of the values (float32 unless a test needs float64).

    Returns
    -------
    NormalizedCSR

    Examples
    --------
    >>> import numpy as np
    >>> csr = gcn_normalize(np.array([0, 0, 1]), np.array([1, 1, 1]), 3)
    >>> csr.indptr.tolist(), csr.indices.tolist(), csr.degrees.tolist()
    ([0, 2, 4, 5], [0, 1, 0, 1, 2], [2, 2, 1])
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.shape[0]} vs {dst.shape[0]}")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise ValueError(f"edge endpoints must lie in [0, {num_nodes})")
    off_diagonal = src != dst
    src, dst = src[off_diagonal], dst[off_diagonal]
    loops = np.arange(num_nodes, dtype=np.int64)
    # One int64 key per directed entry (row * N + col): sorting the keys orders the CSR
    # and np.unique merges duplicates in the same pass.
    keys = np.concatenate((src * num_nodes + dst, dst * num_nodes + src, loops * num_nodes + loops))
    del src, dst
    keys = np.unique(keys)
    rows, cols = np.divmod(keys, num_nodes)
    del keys
    degrees = np.bincount(rows, minlength=num_nodes).astype(np.int64)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    inv_sqrt = inverse_sqrt_degrees(degrees, dtype)
    values = inv_sqrt[rows] * inv_sqrt[cols]
    return NormalizedCSR(indptr=indptr, indices=cols, values=values, degrees=degrees)


@dataclass(frozen=True)
class BlockEntries:
    """A block of the adjacency in the normalisation a layer type asks for.

    ``indptr`` ``(rows + 1,)``, ``indices`` ``(nnz,)`` global column ids, ``values``
    ``(nnz,)``; ``row_scale`` and ``col_scale`` the factors :math:`r, c` with
    ``values[k] = r[i] c[j]`` off the diagonal (what the scaled SpMM kernel applies).
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    row_scale: np.ndarray
    col_scale: np.ndarray


def renormalize_block(
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    row_start: int,
    row_degrees: np.ndarray,
    col_degrees: np.ndarray,
    normalisation: str,
) -> BlockEntries:
    r"""Block rows ``[row_start, row_start + len(indptr) - 1)`` of the stored symmetric
    adjacency (``values`` :math:`(\hat d_i \hat d_j)^{-1/2}`, every vertex with one self
    loop, ``row_degrees``/``col_degrees`` the :math:`\hat d` of its rows and columns) in
    ``normalisation`` (one of :data:`~dgl_scalegnn.core.schedule.NORMALISATIONS`):

    - ``symmetric``: as stored, :math:`r = c = \hat d^{-1/2}`;
    - ``sum``: :math:`A`, self loops dropped, every entry 1.

    >>> import numpy as np
    >>> csr = gcn_normalize(np.array([0, 0]), np.array([1, 2]), 3)
    >>> summed = renormalize_block(csr.indptr, csr.indices, csr.values, 0, csr.degrees,
    ...                            csr.degrees, "sum")
    >>> summed.indptr.tolist(), summed.indices.tolist(), summed.values.tolist()
    ([0, 2, 3, 4], [1, 2, 0, 0], [1.0, 1.0, 1.0, 1.0])
    """
    dtype = values.dtype
    if normalisation == "symmetric":
        return BlockEntries(
            indptr,
            indices,
            values,
            inverse_sqrt_degrees(row_degrees, dtype),
            inverse_sqrt_degrees(col_degrees, dtype),
        )
    if normalisation != "sum":
        raise ValueError(f"unknown normalisation {normalisation!r}")
    rows = csr_row_ids(indptr)
    keep = indices != rows + row_start
    kept_per_row = np.bincount(rows[keep], minlength=indptr.shape[0] - 1)
    new_indptr = np.zeros_like(indptr)
    np.cumsum(kept_per_row, out=new_indptr[1:])
    return BlockEntries(
        new_indptr,
        indices[keep],
        np.ones(int(new_indptr[-1]), dtype=dtype),
        np.ones(indptr.shape[0] - 1, dtype=dtype),
        np.ones(np.asarray(col_degrees).shape[0], dtype=dtype),
    )
