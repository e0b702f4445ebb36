"""Local sparse products of one rank's mini-batch adjacency block.

A rank holds block :math:`\\tilde A^{loc}` (``num_rows x num_cols``) of the rescaled
mini-batch adjacency. Three kernels compute :math:`\\tilde A^{loc} F` and
:math:`(\\tilde A^{loc})^T G`:

- ``torch-csr`` (the default): ``torch.sparse`` CSR products, the forward CSR taken
  as is from the row-sorted block and the transpose by one stable sort of the columns,
  built on the first backward product only (evaluation never needs it);
- ``dgl-scaled``: the block kept unweighted and the normalisation applied as scalings,

  .. math::

      \\tilde A^{loc} F = r \\odot \\Big(\\tfrac{1}{p}\\, U (c \\odot F) + P (c \\odot F)\\Big)

  with :math:`U` the 0/1 off-diagonal structure, :math:`P` the self loops,
  :math:`r, c` the :math:`\\hat d^{-1/2}` of the block's rows and columns, through
  ``dgl.ops.copy_u_sum``;
- ``dgl-weighted``: ``dgl.ops.u_mul_e_sum`` with the stored values.

The default is chosen by measurement (``benchmarks/bench_spmm.py``, mini-batch blocks of
a 200k-vertex synthetic graph, width 128, CPU): forward plus backward took 0.27-0.37x
the time of ``u_mul_e_sum`` with ``torch-csr`` and 0.5-1.5x with ``dgl-scaled``.
Blocks are built in the prefetch thread, so their build time is off the step's path.

The two DGL kernels run on CPU tensors only: the DGL 2.1 wheels are CPU builds, and
no DGL CUDA wheel exists for the torch this project pins, so the GPU path never needs
DGL's kernels. :func:`build_local_spmm` refuses them for a block on another device, and
the config refuses them on CUDA (``parallel.device: cuda`` or ``parallel.backend: nccl``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Protocol

import torch

from dgl_scalegnn._dgl import dgl, disable_libxsmm
from dgl_scalegnn.config import CPU_ONLY_KERNELS, SPMM_KERNELS, registry

__all__ = [
    "BlockCOO",
    "LocalSpMM",
    "RowSumsByProduct",
    "build_local_spmm",
    "SPMM_KERNELS",
    "CPU_ONLY_KERNELS",
    "DEFAULT_KERNEL",
    "KernelDeviceError",
    "csr_tensor",
]

#: Chosen by measurement (benchmarks/bench_spmm.py; see the module docstring).
DEFAULT_KERNEL = "torch-csr"


class KernelDeviceError(ValueError):
    """A local SpMM kernel asked to run on a device it has no implementation for."""


@dataclass(frozen=True)
class BlockCOO:
    """One rank's block of the rescaled adjacency, in local coordinates.

    ``rows``/``cols`` ``(nnz,)`` int64 local indices (sorted by row), ``values``
    ``(nnz,)`` float32 rescaled entries, ``diagonal`` ``(nnz,)`` bool marks self loops,
    ``row_scale`` ``(num_rows,)`` and ``col_scale`` ``(num_cols,)`` are
    :math:`\\hat d^{-1/2}` of the block's vertices, ``inv_p`` is :math:`1/p`.
    """

    rows: torch.Tensor
    cols: torch.Tensor
    values: torch.Tensor
    diagonal: torch.Tensor
    row_scale: torch.Tensor
    col_scale: torch.Tensor
    inv_p: float
    num_rows: int
    num_cols: int

    @property
    def nnz(self) -> int:
        return int(self.rows.numel())

    def dense(self) -> torch.Tensor:
        """The block as a dense ``(num_rows, num_cols)`` matrix (for tests and debugging)."""
        out = torch.zeros(self.num_rows, self.num_cols, dtype=self.values.dtype)
        out.index_put_((self.rows, self.cols), self.values, accumulate=True)
        return out


class LocalSpMM(Protocol):
    num_rows: int
    num_cols: int

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        """``(num_cols, D) -> (num_rows, D)``: :math:`\\tilde A^{loc} F`, for ``features``
        of any strides."""

    def matmul_t(self, grads: torch.Tensor) -> torch.Tensor:
        """``(num_rows, D) -> (num_cols, D)``: :math:`(\\tilde A^{loc})^T G`."""

    def row_sums(self, like: torch.Tensor) -> torch.Tensor:
        """``(num_rows, 1)``: :math:`\\tilde A^{loc} \\mathbf 1`, in ``like``'s dtype and
        on its device (no gradient)."""

    def structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(nnz,)`` local rows and columns (int64, sorted by row) of the block's
        entries, without their values: what an attention over the edges reads."""


class RowSumsByProduct:
    """:meth:`LocalSpMM.row_sums` as the product with a column of ones."""

    num_cols: int

    def row_sums(self, like: torch.Tensor) -> torch.Tensor:
        return self.matmul(like.new_ones(self.num_cols, 1))  # type: ignore[attr-defined]


def _aggregation_block(src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int):
    """A DGL block whose ``copy_u_sum`` sums source rows into destination rows."""
    disable_libxsmm()
    return dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst)


class _DGLWeighted(RowSumsByProduct):
    def __init__(self, block: BlockCOO) -> None:
        self.num_rows, self.num_cols = block.num_rows, block.num_cols
        self._structure = block.rows, block.cols
        self._forward = _aggregation_block(block.cols, block.rows, block.num_cols, block.num_rows)
        self._backward = _aggregation_block(block.rows, block.cols, block.num_rows, block.num_cols)
        self._values = block.values

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        features = features.contiguous()  # DGL's kernels read dense rows
        return dgl.ops.u_mul_e_sum(self._forward, features, self._values.to(features.dtype))

    def matmul_t(self, grads: torch.Tensor) -> torch.Tensor:
        return dgl.ops.u_mul_e_sum(self._backward, grads, self._values.to(grads.dtype))

    def structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._structure


class _DGLScaled(RowSumsByProduct):
    def __init__(self, block: BlockCOO) -> None:
        self.num_rows, self.num_cols = block.num_rows, block.num_cols
        self._structure = block.rows, block.cols
        off = torch.nonzero(~block.diagonal).squeeze(1)
        loops = torch.nonzero(block.diagonal).squeeze(1)
        rows, cols = block.rows.index_select(0, off), block.cols.index_select(0, off)
        self._forward = _aggregation_block(cols, rows, block.num_cols, block.num_rows)
        self._backward = _aggregation_block(rows, cols, block.num_rows, block.num_cols)
        self._loop_rows = block.rows.index_select(0, loops)
        self._loop_cols = block.cols.index_select(0, loops)
        self._row_scale = block.row_scale.unsqueeze(1)
        self._col_scale = block.col_scale.unsqueeze(1)
        self._inv_p = block.inv_p

    def _apply(
        self,
        graph: dgl.DGLGraph,
        x: torch.Tensor,
        in_scale: torch.Tensor,
        out_scale: torch.Tensor,
        loop_in: torch.Tensor,
        loop_out: torch.Tensor,
    ) -> torch.Tensor:
        scaled = x * in_scale.to(x.dtype)
        out = dgl.ops.copy_u_sum(graph, scaled)
        if self._inv_p != 1.0:
            out.mul_(self._inv_p)
        # Each vertex has one self loop, so the targets are distinct: a gather, an add and a
        # plain scatter (index_add_ was ~10x slower on CPU).
        out.index_put_((loop_out,), out.index_select(0, loop_out) + scaled.index_select(0, loop_in))
        return out.mul_(out_scale.to(x.dtype))

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        return self._apply(
            self._forward,
            features,
            self._col_scale,
            self._row_scale,
            self._loop_cols,
            self._loop_rows,
        )

    def matmul_t(self, grads: torch.Tensor) -> torch.Tensor:
        return self._apply(
            self._backward,
            grads,
            self._row_scale,
            self._col_scale,
            self._loop_rows,
            self._loop_cols,
        )

    def structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._structure


def csr_tensor(
    crow: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """``torch.sparse_csr_tensor`` without invariant checks (the callers build valid
    pointers) and without torch's once-per-process "beta" warning, which on every rank
    is noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, cols, values, shape, check_invariants=False)


def _csr(
    rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """A CSR tensor of the row-sorted entries; row pointers by binary search (a bincount
    would read the largest row back to the host on CUDA)."""
    boundaries = torch.arange(shape[0] + 1, dtype=rows.dtype, device=rows.device)
    return csr_tensor(torch.searchsorted(rows, boundaries), cols, values, shape)


class _TorchCSR(RowSumsByProduct):
    def __init__(self, block: BlockCOO) -> None:
        self.num_rows, self.num_cols = block.num_rows, block.num_cols
        self._block = block
        self._forward = _csr(block.rows, block.cols, block.values, (self.num_rows, self.num_cols))
        self._backward: torch.Tensor | None = None

    def _transpose(self) -> torch.Tensor:
        """The transposed CSR, built on first use: one stable sort by column."""
        if self._backward is None:
            block = self._block
            order = torch.argsort(block.cols, stable=True)
            self._backward = _csr(
                block.cols.index_select(0, order),
                block.rows.index_select(0, order),
                block.values.index_select(0, order),
                (self.num_cols, self.num_rows),
            )
        return self._backward

    def matmul(self, features: torch.Tensor) -> torch.Tensor:
        if self.num_rows == 0 or self.num_cols == 0:
            return features.new_zeros(self.num_rows, features.shape[1])
        return self._forward.to(features.dtype) @ features

    def matmul_t(self, grads: torch.Tensor) -> torch.Tensor:
        if self.num_rows == 0 or self.num_cols == 0:
            return grads.new_zeros(self.num_cols, grads.shape[1])
        return self._transpose().to(grads.dtype) @ grads

    def structure(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._block.rows, self._block.cols


_KERNELS = registry(
    "parallel.spmm_kernel",
    SPMM_KERNELS,
    {"torch-csr": _TorchCSR, "dgl-scaled": _DGLScaled, "dgl-weighted": _DGLWeighted},
)


def build_local_spmm(block: BlockCOO, kernel: str = "auto") -> LocalSpMM:
    """Prepare ``block`` for repeated products with ``kernel`` (one of :data:`SPMM_KERNELS`).

    Examples
    --------
    >>> import torch
    >>> block = BlockCOO(
    ...     rows=torch.tensor([0, 0, 1]), cols=torch.tensor([0, 1, 1]),
    ...     values=torch.tensor([0.5, 1.0, 0.5]), diagonal=torch.tensor([True, False, True]),
    ...     row_scale=torch.full((2,), 0.5 ** 0.5), col_scale=torch.full((2,), 0.5 ** 0.5),
    ...     inv_p=2.0, num_rows=2, num_cols=2)
    >>> out = build_local_spmm(block, "dgl-scaled").matmul(torch.ones(2, 1))
    >>> [round(v, 4) for v in out.flatten().tolist()]
    [1.5, 0.5]

    Raises
    ------
    KernelDeviceError
        For a DGL kernel (:data:`CPU_ONLY_KERNELS`) on a block that is not on the CPU.
    """
    name = DEFAULT_KERNEL if kernel == "auto" else kernel
    if name not in _KERNELS:
        raise ValueError(
            f"unknown SpMM kernel {kernel!r}; choose auto or one of {', '.join(SPMM_KERNELS)}"
        )
    device = block.values.device
    if name in CPU_ONLY_KERNELS and device.type != "cpu":
        raise KernelDeviceError(
            f"parallel.spmm_kernel: {name!r} calls DGL's CPU-only kernels but the block is on "
            f"{device}; use torch-csr (or auto) on {device.type}"
        )
    return _KERNELS[name](block)
