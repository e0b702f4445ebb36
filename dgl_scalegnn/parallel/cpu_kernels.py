"""Native CPU kernels for the element-wise tail and RMSNorm, and for the full-graph
evaluation's SpMM (:func:`csr_scaled_rows`): one loop per kernel.

On CPU the eager tail makes one pass over the ``(rows, cols)`` block per torch
operation and ``torch.compile`` measured slower still; these C loops
(``cpu_kernels.c``) read each input once and write each output once. They are built on
first use and loaded by :class:`~dgl_scalegnn.native.NativeLibrary` (a private cache,
each kernel's prototype below checked against its definition). Where no compiler
works, or for tensors that are not float32 on CPU (CUDA, bfloat16), the callers run
their eager torch kernels: :func:`usable` tells them. The tail's kernels of every kind
take their arguments as one record (:class:`TailArgs` forward, :class:`TailGradArgs`
backward), defined here, the lowest module that reads them.

>>> x = torch.tensor([[3.0, -4.0]])
>>> out = torch.empty(1, 1)
>>> if usable(x):
...     row_square_sums(x, out)
... else:
...     torch.sum(x * x, dim=1, keepdim=True, out=out)
tensor([[25.]])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch

from dgl_scalegnn.native import NativeLibrary
from dgl_scalegnn.parallel.dropout_hash import keep_threshold

__all__ = [
    "LIBRARY",
    "TailArgs",
    "TailOutputs",
    "TailGradArgs",
    "usable",
    "row_square_sums",
    "tail_forward",
    "tail_backward",
    "add_row_scaled",
    "csr_scaled_rows",
    "csr_scaled_window",
    "csr_row_sums",
]

#: The kernels of ``cpu_kernels.c``, each by its C prototype: the wrappers below pass
#: their arguments by these names.
LIBRARY = NativeLibrary(
    Path(__file__).with_name("cpu_kernels.c"),
    (
        "void row_square_sums(const float *x, float *out, int64_t rows, int64_t cols, int threads)",
        "void tail_forward(const float *x, float *inv_rms, int compute_rms, float width,"
        " float eps, const float *gain, float scale, int relu, const float *residual,"
        " const int32_t *row_hash, const int32_t *col_hash, int32_t threshold, float *y,"
        " uint8_t *live, int64_t rows, int64_t cols, int threads)",
        "void norm_backward(const float *grad, const uint8_t *live, const float *x,"
        " const float *inv_rms, const float *gain, float width, float *row_grad,"
        " float *gain_partials, float *grad_x, int finish, int64_t rows, int64_t cols,"
        " int threads)",
        "void add_row_scaled(float *grad_x, const float *x, const float *row_grad,"
        " int64_t rows, int64_t cols, int threads)",
        "void masked_grad(const float *grad, const uint8_t *live, float scale, float *grad_x,"
        " int64_t rows, int64_t cols, int threads)",
        "void csr_scaled_rows(const int64_t *indptr, const void *indices, int wide,"
        " const float *row_scale, const float *col_scale, const float *x, int64_t ld,"
        " int64_t readable, float *out, int64_t start, int64_t stop, int64_t cols,"
        " int64_t *cursor, int64_t col_lo, int64_t col_hi, int finish, int threads)",
        "void csr_row_sums(const int64_t *indptr, const void *indices, int wide,"
        " const float *row_scale, const float *col_scale, float *out, int64_t start,"
        " int64_t stop, int threads)",
    ),
    "native CPU kernels",
    "running eager kernels",
)


def _rows(tensor: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if tensor is None else tensor[rows]


@dataclass(frozen=True)
class TailArgs:
    """The arguments of the layer tail's forward kernel, whichever kind runs it (eager,
    compiled or native), for all rows of a shard or a block of them (:meth:`rows`).

    Attributes
    ----------
    x : torch.Tensor
        ``(rows, cols)``: the local shard.
    gain : torch.Tensor or None
        ``(cols,)``: the RMSNorm gain of this rank's columns; ``None`` without the norm.
    residual : torch.Tensor or None
        ``(rows, cols)``, added last; ``None`` without the residual.
    row_hash, col_hash : torch.Tensor or None
        ``(rows, 1)`` and ``(1, cols)``: the dropout hashes
        (:func:`~dgl_scalegnn.parallel.dropout_hash.dropout_hashes`); ``None`` without
        dropout.
    rate : float
        The dropout rate :math:`p` (0: no dropout).
    relu : bool
        ``False`` (the final RMSNorm: with the norm, no dropout, no mask) leaves the ReLU
        out.
    width : int
        The global width :math:`d` of the rows, for the inverse RMS.
    eps : float
        The RMSNorm's :math:`\\epsilon`.
    keep_mask : bool
        Give ``live`` (:class:`TailOutputs`), for the backward.
    inv_rms : torch.Tensor or None
        ``(rows, 1)``: the rows' inverse RMS over the columns of every rank; with the
        norm and ``None`` (the rows' columns are all here), the forward computes it from
        ``x`` in the same pass, :math:`(s / d + \\epsilon)^{-1/2}` with :math:`s` the
        row sums of squares.
    overwrite : bool
        Write ``y`` over ``x`` (the caller's own matrix, read by nothing after; no
        autograd): no new ``(rows, cols)`` matrix, and the one written is in cache.
        The native and the blocked eager kernels do; the compiled one gives a new
        matrix.
    """

    x: torch.Tensor
    gain: torch.Tensor | None
    residual: torch.Tensor | None
    row_hash: torch.Tensor | None
    col_hash: torch.Tensor | None
    rate: float
    relu: bool
    width: int
    eps: float
    keep_mask: bool = False
    inv_rms: torch.Tensor | None = None
    overwrite: bool = False

    @property
    def scale(self) -> float:
        """The inverted dropout's scale :math:`1 / (1 - p)`."""
        return 1.0 / (1.0 - self.rate)

    @property
    def device(self) -> torch.device:
        return self.x.device

    def rows(self, rows: slice) -> TailArgs:
        """The arguments for a block of rows (the gain and column hashes are shared)."""
        return replace(
            self,
            x=self.x[rows],
            residual=_rows(self.residual, rows),
            row_hash=_rows(self.row_hash, rows),
            inv_rms=_rows(self.inv_rms, rows),
        )


class TailOutputs(NamedTuple):
    """What the tail's forward kernel gives, or the buffers it writes that into.

    ``y`` ``(rows, cols)``; ``live`` (only with ``keep_mask``) 0/1 bytes ``(rows, cols)``
    marking the elements that pass ReLU and dropout, where the tail's derivative is
    ``inv_rms * gain / (1 - rate)`` (elsewhere 0); ``inv_rms`` ``(rows, 1)``, ``None``
    without the norm.
    """

    y: torch.Tensor
    live: torch.Tensor | None
    inv_rms: torch.Tensor | None

    def rows(self, rows: slice) -> TailOutputs:
        """The outputs' views of a block of rows."""
        return TailOutputs(self.y[rows], _rows(self.live, rows), _rows(self.inv_rms, rows))


@dataclass(frozen=True)
class TailGradArgs:
    """The arguments of the tail's backward kernel: the gradient of ``y`` and what the
    forward kept (for all rows or a block of them, :meth:`rows`).

    Attributes
    ----------
    grad : torch.Tensor
        ``(rows, cols)``: the gradient of ``y``.
    live : torch.Tensor or None
        The forward's ``live`` (:class:`TailOutputs`); ``None``: all ones.
    x, inv_rms, gain : torch.Tensor or None
        The forward's input, inverse RMS and gain; ``None`` without the norm.
    rate : float
        The dropout rate :math:`p`.
    width : int
        The global width :math:`d` of the rows.
    finish : bool
        The square sums ``s`` were summed over this rank's columns only: the gradient of
        ``x`` includes its part through them, :math:`2 x\\, \\partial s`; otherwise the
        caller adds it once :math:`\\partial s` is summed over the other columns' ranks.
    """

    grad: torch.Tensor
    live: torch.Tensor | None
    x: torch.Tensor | None
    inv_rms: torch.Tensor | None
    gain: torch.Tensor | None
    rate: float
    width: int
    finish: bool

    @property
    def scale(self) -> float:
        """The inverted dropout's scale :math:`1 / (1 - p)`."""
        return 1.0 / (1.0 - self.rate)

    @property
    def device(self) -> torch.device:
        return self.grad.device

    def rows(self, rows: slice) -> TailGradArgs:
        """The arguments for a block of rows (the gain is shared)."""
        return replace(
            self,
            grad=self.grad[rows],
            live=_rows(self.live, rows),
            x=_rows(self.x, rows),
            inv_rms=_rows(self.inv_rms, rows),
        )


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether the native kernels can take these tensors: the library loads and every
    tensor given is on the CPU, every float one float32 (``None`` entries are skipped).
    The kernels read contiguous memory: the wrappers below make their inputs so."""
    for tensor in tensors:
        if tensor is None:
            continue
        if tensor.device.type != "cpu":
            return False
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            return False
    return LIBRARY.load() is not None


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def row_square_sums(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = sum_j x[i, j]^2`` for ``x`` ``(rows, cols)``, ``out`` ``(rows, 1)``."""
    x = x.contiguous()  # bound to a name: a temporary must outlive the call
    rows, cols = x.shape
    LIBRARY.call(
        "row_square_sums",
        x=_ptr(x),
        out=_ptr(out),
        rows=rows,
        cols=cols,
        threads=torch.get_num_threads(),
    )
    return out


def tail_forward(args: TailArgs) -> TailOutputs:
    """The tail's forward (see ``cpu_kernels.c``) as one loop, with the same operations
    in the same order as the eager kernel; where ``args.inv_rms`` is ``None`` with the
    norm, the inverse RMS is computed in the same pass; with ``args.overwrite``, ``y``
    is ``x`` (its contiguous copy, where it is not)."""
    x, inv_rms, residual = (
        None if t is None else t.contiguous() for t in (args.x, args.inv_rms, args.residual)
    )
    rows, cols = x.shape
    scale, dropout = args.scale, args.rate > 0
    # the kernel takes the gain with the dropout scale in it, and `scale` only without it
    gain = None if args.gain is None else (args.gain * scale).contiguous()
    row_hash, col_hash = (
        t.contiguous() if dropout else None for t in (args.row_hash, args.col_hash)
    )
    compute_rms = gain is not None and inv_rms is None
    if compute_rms:
        inv_rms = x.new_empty(rows, 1)
    y = x if args.overwrite else torch.empty_like(x)
    live = torch.empty_like(x, dtype=torch.uint8) if args.keep_mask else None
    LIBRARY.call(
        "tail_forward",
        x=_ptr(x),
        inv_rms=_ptr(inv_rms),
        compute_rms=int(compute_rms),
        width=float(args.width),
        eps=args.eps,
        gain=_ptr(gain),
        scale=scale,
        relu=int(args.relu),
        residual=_ptr(residual),
        row_hash=_ptr(row_hash),
        col_hash=_ptr(col_hash),
        threshold=keep_threshold(args.rate) if dropout else 0,
        y=_ptr(y),
        live=_ptr(live),
        rows=rows,
        cols=cols,
        threads=torch.get_num_threads(),
    )
    return TailOutputs(y, live, inv_rms)


def tail_backward(
    args: TailGradArgs,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The tail's backward as one loop: gradients of ``x``, of the square sums and of the
    gain (the last two ``None`` without the norm), as the eager kernel's."""
    if args.inv_rms is None:
        return _masked_grad(args.grad, args.live, args.scale if args.rate > 0 else 1.0), None, None
    # the dropout scale enters as part of the gain; its gradient is the gain's times scale
    grad_x, grad_square_sum, grad_scaled_gain = _norm_backward(args, args.gain * args.scale)
    return grad_x, grad_square_sum, grad_scaled_gain * args.scale


def _norm_backward(
    args: TailGradArgs, gain: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :math:`y = (\\mathrm{live} \\odot x\\, r) \\odot \\gamma` with
    :math:`r = (s / d + \\epsilon)^{-1/2}` and :math:`\\gamma` ``gain``: of ``x``, of the
    square sums ``s`` and of the gain."""
    grad, x, inv_rms, gain = (t.contiguous() for t in (args.grad, args.x, args.inv_rms, gain))
    live = None if args.live is None else args.live.contiguous()
    rows, cols = grad.shape
    threads = torch.get_num_threads()
    grad_x = torch.empty_like(grad)
    grad_square_sum = torch.empty_like(inv_rms)
    gain_partials = grad.new_zeros(threads, cols)
    LIBRARY.call(
        "norm_backward",
        grad=_ptr(grad),
        live=_ptr(live),
        x=_ptr(x),
        inv_rms=_ptr(inv_rms),
        gain=_ptr(gain),
        width=float(args.width),
        row_grad=_ptr(grad_square_sum),
        gain_partials=_ptr(gain_partials),
        grad_x=_ptr(grad_x),
        finish=int(args.finish),
        rows=rows,
        cols=cols,
        threads=threads,
    )
    return grad_x, grad_square_sum, gain_partials.sum(dim=0)


def _masked_grad(grad: torch.Tensor, live: torch.Tensor, scale: float) -> torch.Tensor:
    """``grad * live * scale`` (the tail's backward without the norm)."""
    grad, live = grad.contiguous(), live.contiguous()
    rows, cols = grad.shape
    grad_x = torch.empty_like(grad)
    LIBRARY.call(
        "masked_grad",
        grad=_ptr(grad),
        live=_ptr(live),
        scale=scale,
        grad_x=_ptr(grad_x),
        rows=rows,
        cols=cols,
        threads=torch.get_num_threads(),
    )
    return grad_x


def add_row_scaled(grad_x: torch.Tensor, x: torch.Tensor, row_grad: torch.Tensor) -> torch.Tensor:
    """``grad_x += 2 x row_grad`` in place (``grad_x`` contiguous; ``row_grad`` ``(rows, 1)``)."""
    x, row_grad = x.contiguous(), row_grad.contiguous()
    rows, cols = grad_x.shape
    LIBRARY.call(
        "add_row_scaled",
        grad_x=_ptr(grad_x),
        x=_ptr(x),
        row_grad=_ptr(row_grad),
        rows=rows,
        cols=cols,
        threads=torch.get_num_threads(),
    )
    return grad_x


def _csr_arrays(
    name: str, arrays: tuple[torch.Tensor | None, ...], start: int, stop: int
) -> tuple[torch.Tensor | None, ...]:
    """A block's ``(indptr, indices, row_scale, col_scale)`` as the CSR kernels read them
    (contiguous; arrays already so, as a block's are, are not copied; scales ``None``
    both, or neither), after refusing index arrays they cannot read or rows outside the
    block."""
    indptr, indices, row_scale, col_scale = arrays
    if indptr.dtype != torch.int64 or indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{name}: indptr int64 and indices int32/int64, got {indptr.dtype} and {indices.dtype}"
        )
    if not 0 <= start <= stop < indptr.numel():
        raise IndexError(f"{name}: rows [{start}, {stop}) of {indptr.numel() - 1}")
    if (row_scale is None) != (col_scale is None):
        raise ValueError(f"{name}: both scales, or neither (all ones)")
    return tuple(None if t is None else t.contiguous() for t in arrays)


def csr_scaled_rows(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
    x: torch.Tensor,
    start: int,
    stop: int,
) -> torch.Tensor:
    """Rows ``[start, stop)`` of a CSR block whose entry :math:`(i, j)` is
    :math:`r_i c_j` (``indptr`` int64, ``indices`` int32 or int64, ``row_scale`` :math:`r`,
    ``col_scale`` :math:`c`, ``None`` both where they are all ones) times ``x``
    ``(num_cols, D)``: ``(stop - start, D)``, :math:`r_i \\sum_j c_j x_j` row by row,
    without a value array or a CSR copy. ``x`` is read in place where its rows are
    contiguous, as those of a column slice are; the kernel may read past a row's last
    column, never past ``x``'s storage."""
    out = x.new_empty(stop - start, x.shape[1])
    _scaled_rows(indptr, indices, row_scale, col_scale, x, out, start, stop)
    return out


def csr_scaled_window(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
    window: torch.Tensor,
    col_lo: int,
    out: torch.Tensor,
    cursor: torch.Tensor,
    start: int,
    finish: bool,
) -> None:
    """:func:`csr_scaled_rows` of rows ``[start, start + len(out))`` with an operand read
    a window of rows at a time: ``window`` holds its rows ``[col_lo, col_lo +
    len(window))``, and each row's entries with columns there are added to ``out``
    (float32, contiguous), from ``cursor[i]`` on (int64, the row's first entry not yet
    summed), which is advanced past them; with ``finish``, the sums are then scaled by
    :math:`r_i`. Windows in increasing order, from zeros and the rows' first entries
    (``indptr[start:stop]``), the last with ``finish``, give ``out`` the bits of
    :func:`csr_scaled_rows` over the whole operand: each sum adds the same terms in the
    same order (the block's columns are sorted within a row).

    >>> indptr, indices = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1], dtype=torch.int32)
    >>> x = torch.tensor([[1.0], [2.0], [4.0]])
    >>> out, cursor = torch.zeros(2, 1), indptr[:2].clone()
    >>> if usable(x):
    ...     for lo in (0, 2):  # windows of two rows of x
    ...         csr_scaled_window(indptr, indices, None, None, x[lo : lo + 2], lo, out,
    ...                           cursor, 0, finish=lo == 2)
    ... else:
    ...     out = torch.tensor([[5.0], [2.0]])
    >>> out.tolist()
    [[5.0], [2.0]]
    """
    stop = start + out.shape[0]
    if out.dtype != torch.float32 or not out.is_contiguous() or out.shape[1] != window.shape[1]:
        raise ValueError("csr_scaled_window: out must be contiguous float32 of the window's width")
    if cursor.dtype != torch.int64 or not cursor.is_contiguous() or cursor.numel() != out.shape[0]:
        raise ValueError("csr_scaled_window: cursor must be contiguous int64, one per row")
    window_rows = (col_lo, col_lo + window.shape[0], finish)
    _scaled_rows(
        indptr, indices, row_scale, col_scale, window, out, start, stop, cursor, window_rows
    )


def _scaled_rows(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
    x: torch.Tensor,
    out: torch.Tensor,
    start: int,
    stop: int,
    cursor: torch.Tensor | None = None,
    window: tuple[int, int, bool] = (0, 2**63 - 1, True),
) -> None:
    """The kernel ``csr_scaled_rows`` into ``out``: whole rows, or with ``cursor`` the
    entries in ``window`` (its first and last column, and whether it finishes the sums)."""
    # bound to names: a copy made here must outlive the call
    indptr, indices, row_scale, col_scale = _csr_arrays(
        "csr_scaled_rows", (indptr, indices, row_scale, col_scale), start, stop
    )
    if x.stride(1) != 1 or x.stride(0) < x.shape[1]:
        x = x.contiguous()
    readable = x.untyped_storage().nbytes() // x.element_size() - x.storage_offset()
    col_lo, col_hi, finish = window
    LIBRARY.call(
        "csr_scaled_rows",
        indptr=_ptr(indptr),
        indices=_ptr(indices),
        wide=int(indices.dtype == torch.int64),
        row_scale=_ptr(row_scale),
        col_scale=_ptr(col_scale),
        x=_ptr(x),
        ld=x.stride(0),
        readable=readable,
        out=_ptr(out),
        start=start,
        stop=stop,
        cols=x.shape[1],
        cursor=_ptr(cursor),
        col_lo=col_lo,
        col_hi=col_hi,
        finish=int(finish),
        threads=torch.get_num_threads(),
    )


def csr_row_sums(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
    start: int,
    stop: int,
) -> torch.Tensor:
    """:func:`csr_scaled_rows` of a column of ones, ``(stop - start, 1)``, the same sums
    in the same order without reading a ``(num_cols, 1)`` operand:
    :math:`r_i \\sum_j c_j` (a SAGE layer's neighbour count); with the scales ``None``
    (all ones), the rows' entry counts."""
    indptr, indices, row_scale, col_scale = _csr_arrays(
        "csr_row_sums", (indptr, indices, row_scale, col_scale), start, stop
    )
    out = torch.empty(stop - start, 1, dtype=torch.float32)
    LIBRARY.call(
        "csr_row_sums",
        indptr=_ptr(indptr),
        indices=_ptr(indices),
        wide=int(indices.dtype == torch.int64),
        row_scale=_ptr(row_scale),
        col_scale=_ptr(col_scale),
        out=_ptr(out),
        start=start,
        stop=stop,
        threads=torch.get_num_threads(),
    )
    return out
