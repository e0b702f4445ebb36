"""Communication-free construction of one rank's mini-batch adjacency block (Algorithm 2).

A rank holds the CSR block of the normalised graph for its row range ``[R0, R1)`` and
column range ``[C0, C1)``. Given the sorted sample :math:`S` shared by its group:

1. locate :math:`S_r = S \\cap [R_0, R_1)` and :math:`S_c = S \\cap [C_0, C_1)` by binary
   search (both are contiguous slices of :math:`S`);
2. gather the CSR rows of :math:`S_r` with a prefix sum over their lengths;
3. keep entries whose column is in :math:`S_c` and remap both ends to positions in
   :math:`S_r` and :math:`S_c`, with a map over the column range tagged by step: each
   step writes the :math:`O(B)` entries of :math:`S_c` and never clears the rest
   (measured 2-4x faster than a binary search in :math:`S_c`);
4. divide off-diagonal values by :math:`p`.

Everything is vectorised; no collective runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dgl_scalegnn.parallel.spmm import BlockCOO
from dgl_scalegnn.sampling.uniform import rescale_off_diagonal

__all__ = ["CSRBlock", "extract_block", "full_block", "gather_rows"]


_TENSOR_FIELDS = ("indptr", "indices", "values", "row_scale", "col_scale")


@dataclass(frozen=True)
class CSRBlock:
    """The rank-resident block of the normalised adjacency.

    ``indptr`` ``(R1 - R0 + 1,)`` int64 over local rows; ``indices`` ``(nnz,)`` int64
    global column ids in ``[C0, C1)``, sorted within a row; ``values`` ``(nnz,)``
    float32; ``row_scale`` / ``col_scale`` the :math:`\\hat d^{-1/2}` of the row and
    column ranges.
    """

    row_start: int
    row_stop: int
    col_start: int
    col_stop: int
    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    row_scale: torch.Tensor
    col_scale: torch.Tensor

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, name) for name in _TENSOR_FIELDS)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def to(self, device: torch.device) -> CSRBlock:
        moved = (t.to(device) for t in self._tensors())
        return dataclasses.replace(self, **dict(zip(_TENSOR_FIELDS, moved)))


def gather_rows(indptr: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry positions of CSR ``rows`` and, for each, the index of its row in ``rows``.

    The prefix sum of the row lengths gives every gathered entry its output slot; the
    owner of a slot is recovered by ``repeat_interleave`` (a vectorised search).
    """
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), counts)
    first_slot = torch.cumsum(counts, 0) - counts
    positions = torch.arange(owner.numel(), device=rows.device) + (starts - first_slot)[owner]
    return positions, owner


class ColumnMap:
    """Position of each sampled column in :math:`S_c`, valid where tagged with this use.

    One map per block lives across steps; :meth:`locate` bumps the tag, writes the
    :math:`O(|S_c|)` sampled entries and reads the candidates' entries.
    """

    def __init__(self, col_start: int, col_stop: int, device: torch.device | str = "cpu") -> None:
        self.col_start = col_start
        self._tag = torch.zeros(col_stop - col_start, dtype=torch.int32, device=device)
        self._slot = torch.zeros(col_stop - col_start, dtype=torch.int64, device=device)
        self._current = 0

    def locate(
        self, col_ids: torch.Tensor, candidates: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For global ids ``candidates``: whether each is in ``col_ids``, and its position."""
        self._current = self._current % (2**31 - 1) + 1
        if self._current == 1:  # the tag wrapped (or first use): forget every old entry
            self._tag.zero_()
        local = col_ids - self.col_start
        self._tag[local] = self._current
        self._slot[local] = torch.arange(col_ids.numel(), device=col_ids.device)
        index = candidates - self.col_start
        return self._tag[index] == self._current, self._slot[index]


def extract_block(
    csr: CSRBlock, sample: torch.Tensor, p: float, column_map: ColumnMap | None = None
) -> BlockCOO:
    """This rank's block of :math:`\\tilde A_S` for the sorted sample ``sample``.

    Parameters
    ----------
    csr : CSRBlock
        The rank's block of the normalised adjacency.
    sample : torch.Tensor
        ``(B,)`` sorted global vertex ids shared by the data-parallel group.
    p : float
        Inclusion probability :math:`(B-1)/(N-1)`; 1 means no rescaling.
    column_map : ColumnMap, optional
        The block's persistent map (a fresh one is made when omitted).

    Returns
    -------
    BlockCOO
        ``len(S_r) x len(S_c)`` block, rows and columns in sample order.
    """
    bounds = torch.tensor(
        [csr.row_start, csr.row_stop, csr.col_start, csr.col_stop], device=sample.device
    )
    r_lo, r_hi, c_lo, c_hi = torch.searchsorted(sample, bounds).tolist()
    row_ids, col_ids = sample[r_lo:r_hi], sample[c_lo:c_hi]
    positions, owner = gather_rows(csr.indptr, row_ids - csr.row_start)
    candidate_cols = csr.indices[positions]
    if column_map is None:
        column_map = ColumnMap(csr.col_start, csr.col_stop, sample.device)
    hit, slot = column_map.locate(col_ids, candidate_cols)
    rows, cols = owner[hit], slot[hit]
    diagonal = row_ids[rows] == col_ids[cols]
    values = rescale_off_diagonal(csr.values[positions[hit]], diagonal, p)
    return BlockCOO(
        rows=rows,
        cols=cols,
        values=values,
        diagonal=diagonal,
        row_scale=csr.row_scale[row_ids - csr.row_start],
        col_scale=csr.col_scale[col_ids - csr.col_start],
        inv_p=1.0 / p,
        num_rows=int(row_ids.numel()),
        num_cols=int(col_ids.numel()),
    )


def full_block(csr: CSRBlock) -> BlockCOO:
    """The whole block without sampling or rescaling (full-graph evaluation)."""
    num_rows = csr.row_stop - csr.row_start
    rows = torch.repeat_interleave(
        torch.arange(num_rows, device=csr.indptr.device), torch.diff(csr.indptr)
    )
    cols = csr.indices - csr.col_start
    return BlockCOO(
        rows=rows,
        cols=cols,
        values=csr.values,
        diagonal=(rows + csr.row_start) == csr.indices,
        row_scale=csr.row_scale,
        col_scale=csr.col_scale,
        inv_p=1.0,
        num_rows=num_rows,
        num_cols=csr.col_stop - csr.col_start,
    )
