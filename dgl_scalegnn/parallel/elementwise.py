"""The element-wise tail of a GCN layer: RMSNorm scaling, ReLU, dropout, residual add.

.. math::

    y = \\mathrm{Dropout}\\big(\\mathrm{ReLU}(x (s / d + \\epsilon)^{-1/2} \\odot \\gamma)\\big) + r

with :math:`s` the row sums of squares of :math:`x` over the global columns, :math:`d`
the global width, and the dropout mask hashed from global (vertex, column) ids
(:func:`~dgl_scalegnn.parallel.dropout_hash.dropout_mask`). :class:`LayerTail` is one
autograd function from :math:`x` to :math:`y`, the row statistics included: its forward
sums the squares of the local columns and completes them over the other columns' ranks
(a :class:`RowReducer`), and keeps a one-byte mask of the elements that pass both ReLU
and dropout, so backward reads the mask instead of hashing again; the dropout scale is
folded into the gain. Backward gives :math:`x` its whole gradient, the part through
:math:`s` included, so autograd adds no second gradient of the same matrix; where the
rows' columns are all on this rank it does so in the same pass. The final RMSNorm is
the same function without ReLU (:meth:`LayerTail.normalize`).

Each kernel (square sums, forward, backward, and the completion of the gradient after
the statistics' reduction) is run eagerly block of rows by block of rows (temporaries
stay in cache). With the native kernels on (the default), contiguous float32 CPU
tensors go to one C loop each instead (:mod:`~dgl_scalegnn.parallel.cpu_kernels`: the
forward with the same operations in the same order, one read of each input and one
write of each output). With fusion on, ``torch.compile`` turns the forward and backward
kernels into one loop each (for GPUs, where the eager kernels' blocks are many small
launches; it measured slower than eager on CPU, so ``auto``, the default, compiles for
CUDA tensors only), and a compiler failure in either (the backward one is compiled at
the first backward) switches the tail to the eager kernels for the rest of the run,
with one log line. :attr:`LayerTail.calls` counts what ran. Every kernel kind takes its
arguments as one record: :class:`~dgl_scalegnn.parallel.cpu_kernels.TailArgs` forward,
:class:`~dgl_scalegnn.parallel.cpu_kernels.TailGradArgs` backward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import Any, Protocol

import torch

from dgl_scalegnn.config import switch_on
from dgl_scalegnn.parallel import cpu_kernels
from dgl_scalegnn.parallel.cpu_kernels import TailArgs, TailGradArgs, TailOutputs
from dgl_scalegnn.parallel.dropout_hash import dropout_hashes, dropout_keep
from dgl_scalegnn.profiling import Profiler

__all__ = [
    "TailArgs",
    "TailOutputs",
    "TailGradArgs",
    "hashed_dropout",
    "tail_forward",
    "tail_backward",
    "rms_scale_backward",
    "RowReducer",
    "LocalRows",
    "LayerTail",
    "row_blocks",
]

_log = logging.getLogger(__name__)

#: The integer type of each float type's width (to compare a float's bits).
_SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def hashed_dropout(
    x: torch.Tensor, key: int, row_ids: torch.Tensor, col_start: int, rate: float
) -> torch.Tensor:
    """Inverted dropout of a shard whose rows are vertices ``row_ids`` and whose columns
    start at global column ``col_start``; the mask depends only on global coordinates.

    >>> x = torch.ones(4, 3)
    >>> y = hashed_dropout(x, key=5, row_ids=torch.arange(4), col_start=0, rate=0.5)
    >>> sorted(set(y.flatten().tolist())) in ([0.0, 2.0], [2.0])
    True
    """
    row_hash, col_hash = dropout_hashes(key, row_ids, col_start, x.shape[1])
    return torch.mul(x, dropout_keep(row_hash, col_hash, rate)).mul_(1.0 / (1.0 - rate))


def tail_forward(args: TailArgs, out: TailOutputs | None = None) -> TailOutputs:
    """The tail's forward kernel (eager, or compiled with fusion on): ``(y, live,
    inv_rms)`` (:class:`TailOutputs`), with ``inv_rms`` computed in the same pass where
    ``args`` has the norm and no ``inv_rms``. ``out``, if given, receives the outputs
    in those of its buffers that are not ``None`` (no copy).

    >>> x = torch.tensor([[1.0, -2.0]])
    >>> args = TailArgs(x, gain=None, residual=x, row_hash=None, col_hash=None, rate=0.0,
    ...                 relu=True, width=2, eps=0.0)
    >>> tail_forward(args).y
    tensor([[ 2., -2.]])
    """
    x, gain, rate, scale = args.x, args.gain, args.rate, args.scale
    y_out, live_out, inv_rms_out = (None, None, None) if out is None else out
    inv_rms = args.inv_rms
    if gain is not None and inv_rms is None:
        inv_rms = torch.sum(x * x, dim=1, keepdim=True, out=inv_rms_out)
        inv_rms = torch.rsqrt(inv_rms / args.width + args.eps, out=inv_rms_out)
    if gain is not None:
        # A positive scale commutes with ReLU: fold the dropout scale into the gain.
        z = torch.mul(x, inv_rms, out=y_out)
        z.mul_(gain * scale)
        if args.relu:
            z.relu_()
    else:
        z = torch.clamp_min(x, 0.0, out=y_out)
        if rate > 0:
            z.mul_(scale)
    if rate > 0:
        z.mul_(dropout_keep(args.row_hash, args.col_hash, rate))
    live = None
    if live_out is not None:
        # z >= 0 here: its bits as an integer are > 0 exactly where z > 0 (+0.0 is 0,
        # -0.0 negative), and an integer comparison into bytes is the fast one on CPU
        live = torch.gt(z.view(_SAME_WIDTH_INT[z.dtype]), 0, out=live_out)
    elif args.keep_mask:
        live = (z > 0).to(torch.uint8)
    if args.residual is not None:
        z = z.add_(args.residual)
    return TailOutputs(z, live, inv_rms)


def tail_backward(
    args: TailGradArgs, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The tail's backward kernel: gradients of ``x``, the square sums and the gain.

    With :math:`g' = g \\odot \\mathrm{live} / (1 - p)` and :math:`n = x\\, r` (``r`` the
    inverse RMS): :math:`\\partial x = g' \\gamma r`,
    :math:`\\partial \\gamma = \\sum_{rows} g' n` and
    :math:`\\partial s = -\\frac{r^3}{2d} \\sum_{cols} g' \\gamma x` (``None`` for the
    last two without RMSNorm). With ``args.finish``, :math:`\\partial x` also gets its
    part through ``s``, :math:`2 x\\, \\partial s` (:func:`add_square_sum_grad`).
    ``out``, if given, receives :math:`\\partial x`.
    """
    grad, live, scale = args.grad, args.live, args.scale
    masked = grad if live is None else torch.mul(grad, live, out=out)  # live: 0/1 bytes
    if args.inv_rms is None:
        return (masked.mul_(scale) if args.rate > 0 else masked), None, None
    # the dropout scale enters as part of the gain; its gradient is the gain's times scale
    if out is None and live is not None:
        out = masked  # a fresh product: written over (never the incoming gradient)
    grad_x, grad_square_sum, grad_scaled_gain = rms_scale_backward(
        masked, args.x, args.inv_rms, args.gain * scale, args.width, out=out
    )
    if args.finish:
        add_square_sum_grad(grad_x, args.x, grad_square_sum)
    return grad_x, grad_square_sum, grad_scaled_gain * scale


def add_square_sum_grad(
    grad_x: torch.Tensor, x: torch.Tensor, grad_square_sum: torch.Tensor
) -> torch.Tensor:
    """``grad_x += 2 x grad_square_sum`` in place: the part of :math:`\\partial x` that
    flows through the row sums of squares."""
    return grad_x.addcmul_(x, grad_square_sum, value=2.0)


def rms_scale_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    inv_rms: torch.Tensor,
    gain: torch.Tensor,
    width: int,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :math:`y = x\\, r \\odot \\gamma`, :math:`r = (s / d + \\epsilon)^{-1/2}`,
    given that of ``y``: of ``x`` (through ``y`` only), of the square sums ``s`` and of
    the gain, :math:`\\partial x = g \\gamma r`, :math:`\\partial \\gamma = \\sum_{rows} g x r`,
    :math:`\\partial s = -\\frac{r^3}{2d} \\sum_{cols} g \\gamma x`; the row and column
    sums are matrix-vector products. ``out`` (which may be ``grad``) receives the
    gradient of ``x``.
    """
    gx = grad * x
    grad_gain = (inv_rms.reshape(1, -1) @ gx).reshape(-1)
    grad_square_sum = (gx @ gain).reshape(-1, 1) * inv_rms.pow(3) * (-0.5 / width)
    grad_x = torch.mul(grad, gain, out=out).mul_(inv_rms)
    return grad_x, grad_square_sum, grad_gain


#: Rows per eager block: about 4 MB of float32, so that the kernels' temporaries stay in
#: cache and are served from the allocator's heap instead of fresh (page-faulting) maps.
_BLOCK_ELEMENTS = 1 << 20


def row_blocks(x: torch.Tensor) -> list[slice]:
    """Slices of rows of about :data:`_BLOCK_ELEMENTS` elements each (for eager kernels)."""
    step = max(1, _BLOCK_ELEMENTS // max(1, x.shape[1]))
    return [slice(start, start + step) for start in range(0, x.shape[0], step)]


def square_sums_blocked(x: torch.Tensor) -> torch.Tensor:
    """Row sums of squares ``(rows, 1)``, block by block (no whole-matrix temporary)."""
    square_sum = x.new_empty(x.shape[0], 1)
    for rows in row_blocks(x):
        block = x[rows]
        torch.sum(block * block, dim=1, keepdim=True, out=square_sum[rows])
    return square_sum


def tail_forward_blocked(args: TailArgs) -> TailOutputs:
    """:func:`tail_forward` block of rows by block of rows (the eager kernel; a block's
    square sums are taken while it is in cache); with ``args.overwrite`` into ``x``."""
    x = args.x
    local_norm = args.gain is not None and args.inv_rms is None
    out = TailOutputs(
        x if args.overwrite else torch.empty_like(x),
        torch.empty_like(x, dtype=torch.uint8) if args.keep_mask else None,
        x.new_empty(x.shape[0], 1) if local_norm else None,
    )
    for rows in row_blocks(x):  # each block is written in place into its rows of the outputs
        tail_forward(args.rows(rows), out.rows(rows))
    return out if local_norm else out._replace(inv_rms=args.inv_rms)


def tail_backward_blocked(
    args: TailGradArgs,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`tail_backward` block of rows by block of rows (the eager kernel)."""
    grad_x = torch.empty_like(args.grad)
    grad_square_sum = None if args.inv_rms is None else torch.empty_like(args.inv_rms)
    grad_gain = None
    for rows in row_blocks(args.grad):  # each block's gradient is written in place into grad_x
        _, grad_square_sum_rows, grad_gain_rows = tail_backward(args.rows(rows), out=grad_x[rows])
        if grad_square_sum is not None:
            grad_square_sum[rows] = grad_square_sum_rows
            grad_gain = grad_gain_rows if grad_gain is None else grad_gain.add_(grad_gain_rows)
    return grad_x, grad_square_sum, grad_gain


def add_square_sum_grad_blocked(
    grad_x: torch.Tensor, x: torch.Tensor, grad_square_sum: torch.Tensor
) -> torch.Tensor:
    """:func:`add_square_sum_grad` block of rows by block of rows (the eager kernel)."""
    for rows in row_blocks(grad_x):
        add_square_sum_grad(grad_x[rows], x[rows], grad_square_sum[rows])
    return grad_x


def _square_sums_native(x: torch.Tensor) -> torch.Tensor:
    return cpu_kernels.row_square_sums(x, x.new_empty(x.shape[0], 1))


def _tensors(args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The tensors a kernel reads: its tensor arguments and its records' tensor fields."""
    values = [
        value
        for arg in args
        for value in ([getattr(arg, f.name) for f in fields(arg)] if is_dataclass(arg) else [arg])
    ]
    return [value for value in values if isinstance(value, torch.Tensor)]


class RowReducer(Protocol):
    """Completes per-row sums over the columns of the other ranks that hold the same rows
    (an all-reduce over the column group); ``local`` when there are none."""

    local: bool

    def reduce(self, partial: torch.Tensor) -> torch.Tensor: ...


class LocalRows:
    """Rows whose columns are all on this rank: their sums need no reduction."""

    local = True

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial


class _TailFn(torch.autograd.Function):
    """Forward: square sums, their reduction over the columns' ranks, the tail; backward:
    the tail's gradients, the square sums' gradient reduced likewise, :math:`\\partial x`
    completed with its part through them."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        gain: torch.Tensor | None,
        residual: torch.Tensor | None,
        args: TailArgs,
        tail: LayerTail,
        statistics: RowReducer,
        profiler: Profiler,
    ):
        # x, gain and residual are those of args, given apart for autograd to track them
        y, live, inv_rms = tail.forward(args, statistics, profiler)
        ctx.save_for_backward(live, *((x, inv_rms, gain) if inv_rms is not None else ()))
        ctx.tail, ctx.statistics, ctx.profiler = tail, statistics, profiler
        ctx.width, ctx.rate = args.width, args.rate
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        live, *norm = ctx.saved_tensors
        x, inv_rms, gain = norm if norm else (None, None, None)
        tail, statistics, profiler = ctx.tail, ctx.statistics, ctx.profiler
        args = TailGradArgs(
            grad=grad.contiguous(),
            live=live,
            x=x,
            inv_rms=inv_rms,
            gain=gain,
            rate=ctx.rate,
            width=ctx.width,
            finish=statistics.local,
        )
        with profiler.region("elementwise"):
            grad_x, grad_square_sum, grad_gain = tail.run("backward", args)
        if grad_square_sum is not None and not statistics.local:
            grad_square_sum = statistics.reduce(grad_square_sum)
            with profiler.region("elementwise"):
                grad_x = tail.run("finish", grad_x, x, grad_square_sum)
        grad_residual = grad if ctx.needs_input_grad[2] else None
        return grad_x, grad_gain, grad_residual, None, None, None, None


#: The kernels that fusion compiles (the square sums and the completion stay eager).
_FUSED_KERNELS: dict[str, Callable[..., Any]] = {"forward": tail_forward, "backward": tail_backward}


class LayerTail:
    """The layer tail as one autograd function, on native, compiled or eager kernels.

    Parameters
    ----------
    fuse : bool or "auto"
        Compile the forward and backward kernels on first use (dynamic shapes: the
        batch rows change every step); eager when ``False`` or when compiling fails.
        ``"auto"`` decides at the first call: compiled for CUDA tensors, else not.
    native : bool
        Run float32 CPU tensors through the native kernels
        (:mod:`~dgl_scalegnn.parallel.cpu_kernels`) where they build (without fusion,
        or for the kernels fusion does not compile); eager otherwise.

    Examples
    --------
    >>> tail = LayerTail(fuse=False)
    >>> x = torch.randn(5, 4, requires_grad=True)
    >>> y = tail(x, torch.ones(4), None, torch.arange(5), statistics=LocalRows(),
    ...          key=3, col_start=0, width=4, eps=1e-6, rate=0.25)
    >>> y.sum().backward(); x.grad.shape
    torch.Size([5, 4])
    """

    def __init__(self, fuse: bool | str, native: bool = False) -> None:
        #: The compiled kernels are in use (``None`` until the first call decides
        #: ``auto``; ``False`` after a compiler failure too).
        self.fused: bool | None = None if fuse == "auto" else fuse
        self.native = native
        #: Calls of each kernel kind (``native``, ``compiled``, ``eager``): what ran.
        self.calls = {"native": 0, "compiled": 0, "eager": 0}
        self._native: dict[str, Callable[..., Any]] = {
            "square_sums": _square_sums_native,
            "forward": cpu_kernels.tail_forward,
            "backward": cpu_kernels.tail_backward,
            "finish": cpu_kernels.add_row_scaled,
        }
        self._eager: dict[str, Callable[..., Any]] = {
            "square_sums": square_sums_blocked,
            "forward": tail_forward_blocked,
            "backward": tail_backward_blocked,
            "finish": add_square_sum_grad_blocked,
        }
        #: The compiled kernels made so far, each at its first call with fusion on:
        #: ``torch.compile`` imports the compiler (torch._inductor alone: 0.7 s of CPU and
        #: 45 MB a process), which a CPU rank on ``auto`` never uses.
        self._compiled: dict[str, Callable[..., Any]] = {}

    def run(self, kernel: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``kernel`` (``"square_sums"``, ``"forward"`` on a :class:`TailArgs`,
        ``"backward"`` on a :class:`TailGradArgs`, ``"finish"``): compiled with fusion on
        (all but the square sums and the completion), else native where the tensors allow
        it, else eager."""
        if self.fused is None:
            self.fused = switch_on("auto", args[0].device.type)
        if self.fused and kernel in _FUSED_KERNELS:
            try:
                result = self._compiled_kernel(kernel)(*args, **kwargs)
                self.calls["compiled"] += 1
                return result
            except Exception as error:  # any compiler failure means: run eager
                _log.warning(
                    "kernel fusion unavailable, running the layer tail eagerly (%s failed): %s",
                    kernel,
                    error,
                )
                self.fused = False
        if self.native and cpu_kernels.usable(*_tensors(args)):
            self.calls["native"] += 1
            return self._native[kernel](*args, **kwargs)
        self.calls["eager"] += 1
        return self._eager[kernel](*args, **kwargs)

    def _compiled_kernel(self, kernel: str) -> Callable[..., Any]:
        """``kernel`` compiled (dynamic shapes: the batch rows change every step); the
        compiler fuses each whole kernel into one loop, so no blocks are needed there."""
        if kernel not in self._compiled:
            self._compiled[kernel] = torch.compile(_FUSED_KERNELS[kernel], dynamic=True)
        return self._compiled[kernel]

    def forward(
        self, args: TailArgs, statistics: RowReducer | None, profiler: Profiler
    ) -> TailOutputs:
        """The forward kernels without autograd: ``(y, live, inv_rms)`` (``live`` for
        backward if ``args.keep_mask``; ``inv_rms`` ``None`` without the norm), the rows'
        square sums completed by ``statistics`` first where they are not ``local``."""
        if args.gain is not None and statistics is None:
            raise ValueError("the norm needs the row statistics' reducer (statistics=...)")
        # with the norm on whole rows, args has no inv_rms: computed in the forward's pass
        if args.gain is not None and not statistics.local:
            with profiler.region("elementwise"):
                square_sum = self.run("square_sums", args.x)
            # Statistics stay float32 even when PMM traffic is bfloat16.
            square_sum = statistics.reduce(square_sum)
            with profiler.region("elementwise"):
                inv_rms = torch.rsqrt(square_sum / args.width + args.eps)
            args = replace(args, inv_rms=inv_rms)
        with profiler.region("elementwise"):
            return self.run("forward", args)

    def __call__(
        self,
        x: torch.Tensor,
        gain: torch.Tensor | None,
        residual: torch.Tensor | None,
        row_ids: torch.Tensor,
        *,
        statistics: RowReducer | None,
        key: int,
        col_start: int,
        width: int,
        eps: float,
        rate: float,
        profiler: Profiler | None = None,
        relu: bool = True,
        overwrite: bool = False,
    ) -> torch.Tensor:
        """``(rows, cols)`` local shard in, same shape out (see the module docstring).

        ``gain`` ``(cols,)`` is ``None`` without RMSNorm, and then ``statistics`` (which
        completes the rows' square sums over the other columns' ranks) may be ``None``
        too; ``residual`` ``None`` without the residual, ``rate`` 0 without dropout,
        ``relu`` ``False`` (no dropout then) for a plain RMSNorm. ``key`` (seed, step and
        layer mixed) enters only the per-row and per-column hashes, so a compiled kernel
        never recompiles for a new step. ``profiler`` charges the kernels to
        ``elementwise`` and the reductions to their collectives. ``overwrite``: ``x`` is
        the caller's own and read by nothing after, so that without autograd the result
        may be written over it (:class:`~dgl_scalegnn.parallel.cpu_kernels.TailArgs`).
        """
        if not relu and rate > 0:
            raise ValueError(f"dropout (rate {rate}) needs the ReLU's mask; got relu=False")
        profiler = profiler if profiler is not None else Profiler(enabled=False)
        if gain is None:
            statistics = LocalRows()  # no norm: no row statistics to complete
        row_hash = col_hash = None
        if rate > 0:
            row_hash, col_hash = dropout_hashes(key, row_ids, col_start, x.shape[1])
        tensors = (x, gain, residual)
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in tensors
        )
        args = TailArgs(
            x=x,
            gain=gain,
            residual=residual,
            row_hash=row_hash,
            col_hash=col_hash,
            rate=rate,
            relu=relu,
            width=width,
            eps=eps,
            # Without ReLU (a plain RMSNorm, no dropout) every element passes: no mask.
            keep_mask=needs_grad and relu,
            overwrite=overwrite and not needs_grad,
        )
        if needs_grad:
            return _TailFn.apply(x, gain, residual, args, self, statistics, profiler)
        return self.forward(args, statistics, profiler).y

    def normalize(
        self,
        x: torch.Tensor,
        gain: torch.Tensor,
        statistics: RowReducer,
        *,
        width: int,
        eps: float,
        profiler: Profiler | None = None,
    ) -> torch.Tensor:
        """RMSNorm alone, :math:`x (s / d + \\epsilon)^{-1/2} \\odot \\gamma` (no ReLU,
        dropout or residual): the same autograd function and kernels."""
        rows = torch.empty(0, dtype=torch.int64)  # no dropout: no hashes of the rows
        return self(
            x,
            gain,
            None,
            rows,
            statistics=statistics,
            key=0,
            col_start=0,
            width=width,
            eps=eps,
            rate=0.0,
            profiler=profiler,
            relu=False,
        )
