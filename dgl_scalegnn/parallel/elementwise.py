"""The element-wise tail of a GCN layer: RMSNorm scaling, ReLU, dropout, residual add.

.. math::

    y = \\mathrm{Dropout}\\big(\\mathrm{ReLU}(x (s / d + \\epsilon)^{-1/2} \\odot \\gamma)\\big) + r

with :math:`s` the row sums of squares (already all-reduced), :math:`d` the global
width, and the dropout mask hashed from global (vertex, column) ids
(:func:`~dgl_scalegnn.parallel.dropout_hash.dropout_mask`). :class:`LayerTail` is one autograd
function: its forward keeps a one-byte mask of the elements that pass both ReLU and
dropout, so backward reads the mask instead of hashing again, and the dropout scale is
folded into the gain. Forward and backward are two plain tensor kernels, run eagerly
block of rows by block of rows (temporaries stay in cache); with fusion on,
``torch.compile`` turns each into one loop, and a compiler failure in either (the
backward one is compiled at the first backward) switches the tail to the eager kernels
for the rest of the run, with one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from dgl_scalegnn.parallel.dropout_hash import dropout_hashes, dropout_keep
from dgl_scalegnn.profiling import Profiler

__all__ = [
    "hashed_dropout",
    "tail_forward",
    "tail_backward",
    "tail_forward_blocked",
    "tail_backward_blocked",
    "rms_scale_backward",
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


def tail_forward(
    x: torch.Tensor,
    inv_rms: torch.Tensor | None,
    gain: torch.Tensor | None,
    residual: torch.Tensor | None,
    row_hash: torch.Tensor | None,
    col_hash: torch.Tensor | None,
    rate: float,
    keep_mask: bool,
    out: torch.Tensor | None = None,
    live_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tail's forward kernel: ``(y, live)``.

    ``inv_rms`` ``(rows, 1)`` and ``gain`` ``(cols,)`` are ``None`` without RMSNorm,
    ``residual`` ``None`` without the residual, ``row_hash`` ``(rows, 1)`` and
    ``col_hash`` ``(1, cols)`` ``None`` without dropout (``rate`` 0). ``live`` (0/1
    ``(rows, cols)`` bytes, only if ``keep_mask``) marks the elements that pass ReLU and
    dropout: the tail's derivative there is ``inv_rms * gain / (1 - rate)``, elsewhere 0.
    ``out`` and ``live_out``, if given, receive ``y`` and ``live`` (no copy).
    """
    scale = 1.0 / (1.0 - rate)
    if inv_rms is not None:
        # A positive scale commutes with ReLU: fold the dropout scale into the gain.
        z = torch.mul(x, inv_rms, out=out)
        z.mul_(gain * scale).relu_()
    else:
        z = torch.clamp_min(x, 0.0, out=out)
        if rate > 0:
            z.mul_(scale)
    if rate > 0:
        z.mul_(dropout_keep(row_hash, col_hash, rate))
    live = None
    if live_out is not None:
        # z >= 0 here: its bits as an integer are > 0 exactly where z > 0 (+0.0 is 0,
        # -0.0 negative), and an integer comparison into bytes is the fast one on CPU
        live = torch.gt(z.view(_SAME_WIDTH_INT[z.dtype]), 0, out=live_out)
    elif keep_mask:
        live = (z > 0).to(torch.uint8)
    if residual is not None:
        z = z.add_(residual)
    return z, live


def tail_backward(
    grad: torch.Tensor,
    live: torch.Tensor,
    x: torch.Tensor | None,
    inv_rms: torch.Tensor | None,
    gain: torch.Tensor | None,
    rate: float,
    width: int,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The tail's backward kernel: gradients of ``x``, the square sums and the gain.

    With :math:`g' = g \\odot \\mathrm{live} / (1 - p)` and :math:`n = x\\, r` (``r`` the
    inverse RMS): :math:`\\partial x = g' \\gamma r`,
    :math:`\\partial \\gamma = \\sum_{rows} g' n` and
    :math:`\\partial s = -\\frac{r^3}{2d} \\sum_{cols} g' \\gamma x` (``None`` for the
    last two without RMSNorm). The column and row sums are matrix-vector products.
    ``out``, if given, receives the gradient of ``x``.
    """
    scale = 1.0 / (1.0 - rate)
    masked = torch.mul(grad, live, out=out)  # live: 0/1 bytes
    if inv_rms is None:
        return (masked.mul_(scale) if rate > 0 else masked), None, None
    # the dropout scale enters as part of the gain; its gradient is the gain's times scale
    grad_x, grad_square_sum, grad_scaled_gain = rms_scale_backward(
        masked, x, inv_rms, gain * scale, width, out=masked
    )
    return grad_x, grad_square_sum, grad_scaled_gain * scale


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


def _rows(tensor: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if tensor is None else tensor[rows]


def tail_forward_blocked(
    x: torch.Tensor,
    inv_rms: torch.Tensor | None,
    gain: torch.Tensor | None,
    residual: torch.Tensor | None,
    row_hash: torch.Tensor | None,
    col_hash: torch.Tensor | None,
    rate: float,
    keep_mask: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`tail_forward` block of rows by block of rows (the eager kernel)."""
    y = torch.empty_like(x)
    live = torch.empty_like(x, dtype=torch.uint8) if keep_mask else None
    for rows in row_blocks(x):  # each block is written in place into its rows of y and live
        tail_forward(
            x[rows],
            _rows(inv_rms, rows),
            gain,
            _rows(residual, rows),
            _rows(row_hash, rows),
            col_hash,
            rate,
            keep_mask,
            out=y[rows],
            live_out=_rows(live, rows),
        )
    return y, live


def tail_backward_blocked(
    grad: torch.Tensor,
    live: torch.Tensor,
    x: torch.Tensor | None,
    inv_rms: torch.Tensor | None,
    gain: torch.Tensor | None,
    rate: float,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`tail_backward` block of rows by block of rows (the eager kernel)."""
    grad_x = torch.empty_like(grad)
    grad_square_sum = None if inv_rms is None else torch.empty_like(inv_rms)
    grad_gain = None
    for rows in row_blocks(grad):  # each block's gradient is written in place into grad_x
        _, grad_square_sum_rows, grad_gain_rows = tail_backward(
            grad[rows],
            live[rows],
            _rows(x, rows),
            _rows(inv_rms, rows),
            gain,
            rate,
            width,
            out=grad_x[rows],
        )
        if grad_square_sum is not None:
            grad_square_sum[rows] = grad_square_sum_rows
            grad_gain = grad_gain_rows if grad_gain is None else grad_gain.add_(grad_gain_rows)
    return grad_x, grad_square_sum, grad_gain


class _TailFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        square_sum: torch.Tensor | None,
        gain: torch.Tensor | None,
        residual: torch.Tensor | None,
        row_hash: torch.Tensor | None,
        col_hash: torch.Tensor | None,
        tail: LayerTail,
        profiler: Profiler,
        width: int,
        eps: float,
        rate: float,
    ):
        inv_rms = None if square_sum is None else torch.rsqrt(square_sum / width + eps)
        y, live = tail.run(
            "forward", x, inv_rms, gain, residual, row_hash, col_hash, rate, keep_mask=True
        )
        ctx.save_for_backward(live, *((x, inv_rms, gain) if inv_rms is not None else ()))
        ctx.tail, ctx.profiler, ctx.width, ctx.rate = tail, profiler, width, rate
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        live, *norm = ctx.saved_tensors
        x, inv_rms, gain = norm if norm else (None, None, None)
        with ctx.profiler.region("elementwise"):
            grad_x, grad_square_sum, grad_gain = ctx.tail.run(
                "backward", grad.contiguous(), live, x, inv_rms, gain, ctx.rate, ctx.width
            )
        grad_residual = grad if ctx.needs_input_grad[3] else None
        return grad_x, grad_square_sum, grad_gain, grad_residual, *([None] * 7)


class LayerTail:
    """The layer tail as one autograd function, on eager or compiled kernels.

    Parameters
    ----------
    fuse : bool
        Compile the forward and backward kernels on first use (dynamic shapes: the
        batch rows change every step); eager when ``False`` or when compiling fails.
    Examples
    --------
    >>> tail = LayerTail(fuse=False)
    >>> x = torch.randn(5, 4, requires_grad=True)
    >>> y = tail(x, (x * x).sum(1, keepdim=True), torch.ones(4), None, torch.arange(5),
    ...          key=3, col_start=0, width=4, eps=1e-6, rate=0.25)
    >>> y.sum().backward(); x.grad.shape
    torch.Size([5, 4])
    """

    def __init__(self, fuse: bool) -> None:
        self.fused = fuse
        self._eager: dict[str, Callable[..., Any]] = {
            "forward": tail_forward_blocked,
            "backward": tail_backward_blocked,
        }
        # The compiler fuses each whole kernel into one loop: no blocks needed there.
        self._compiled = (
            {
                "forward": torch.compile(tail_forward, dynamic=True),
                "backward": torch.compile(tail_backward, dynamic=True),
            }
            if fuse
            else self._eager
        )

    def run(self, kernel: str, *args: Any, **kwargs: Any) -> Any:
        """Run the compiled ``kernel`` (``"forward"``/``"backward"``), or the eager one."""
        if self.fused:
            try:
                return self._compiled[kernel](*args, **kwargs)
            except Exception as error:  # any compiler failure means: run eager
                _log.warning(
                    "kernel fusion unavailable, running the layer tail eagerly (%s failed): %s",
                    kernel,
                    error,
                )
                self.fused = False
        return self._eager[kernel](*args, **kwargs)

    def __call__(
        self,
        x: torch.Tensor,
        square_sum: torch.Tensor | None,
        gain: torch.Tensor | None,
        residual: torch.Tensor | None,
        row_ids: torch.Tensor,
        *,
        key: int,
        col_start: int,
        width: int,
        eps: float,
        rate: float,
        profiler: Profiler | None = None,
    ) -> torch.Tensor:
        """``(rows, cols)`` local shard in, same shape out (see the module docstring).

        ``square_sum`` ``(rows, 1)``/``gain`` ``(cols,)`` are ``None`` without RMSNorm,
        ``residual`` ``None`` without the residual, ``rate`` 0 without dropout; ``key``
        (seed, step and layer mixed) enters only the per-row and per-column hashes, so a
        compiled kernel never recompiles for a new step. ``profiler`` charges the
        backward kernel to ``elementwise`` (the caller times the forward).
        """
        row_hash = col_hash = None
        if rate > 0:
            row_hash, col_hash = dropout_hashes(key, row_ids, col_start, x.shape[1])
        tensors = (x, square_sum, gain, residual)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            return _TailFn.apply(
                x,
                square_sum,
                gain,
                residual,
                row_hash,
                col_hash,
                self,
                profiler if profiler is not None else Profiler(enabled=False),
                width,
                eps,
                rate,
            )
        inv_rms = None if square_sum is None else torch.rsqrt(square_sum / width + eps)
        y, _ = self.run(
            "forward", x, inv_rms, gain, residual, row_hash, col_hash, rate, keep_mask=False
        )
        return y
