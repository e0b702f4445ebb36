"""The element-wise tail of a GCN layer: RMSNorm scaling, ReLU, dropout, residual add.

.. math::

    y = \\mathrm{Dropout}\\big(\\mathrm{ReLU}(x (s / d + \\epsilon)^{-1/2} \\odot \\gamma)\\big) + r

with :math:`s` the row sums of squares (already all-reduced), :math:`d` the global
width, and the dropout mask hashed from global (vertex, column) ids. It is one pure
function so that ``torch.compile`` can fuse it (and its backward) into one kernel
(the paper's kernel fusion); :class:`LayerTail` runs it compiled when asked and falls
back to eager, with one log line, where compilation fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from dgl_scalegnn.parallel.ops import dropout_mask

__all__ = ["hashed_dropout", "layer_tail", "LayerTail"]

_log = logging.getLogger(__name__)


def hashed_dropout(
    x: torch.Tensor,
    key: int | torch.Tensor,
    row_ids: torch.Tensor,
    col_start: int,
    rate: float,
) -> torch.Tensor:
    """Inverted dropout of a shard whose rows are vertices ``row_ids`` and whose columns
    start at global column ``col_start``; the mask depends only on global coordinates."""
    keep = dropout_mask(key, row_ids, col_start, x.shape[1], rate)
    return x * keep.to(x.dtype) * (1.0 / (1.0 - rate))


def layer_tail(
    x: torch.Tensor,
    square_sum: torch.Tensor | None,
    gain: torch.Tensor | None,
    residual: torch.Tensor | None,
    row_ids: torch.Tensor,
    dropout_key: torch.Tensor,
    col_start: int,
    width: int,
    eps: float,
    rate: float,
) -> torch.Tensor:
    """``(rows, cols)`` local shard in, same shape out (see the module docstring).

    ``square_sum``/``gain`` are ``None`` without RMSNorm, ``residual`` ``None`` without
    the residual, ``rate`` 0 without dropout; ``dropout_key`` is a 0-dim int64 tensor
    (a tensor, so that a compiled tail does not recompile for every step).
    """
    if square_sum is not None:
        x = x * torch.rsqrt(square_sum / width + eps) * gain
    x = torch.relu(x)
    if rate > 0:
        x = hashed_dropout(x, dropout_key, row_ids, col_start, rate)
    if residual is not None:
        x = x + residual
    return x


class LayerTail:
    """:func:`layer_tail`, eager or fused by ``torch.compile``.

    Parameters
    ----------
    fuse : bool
        Compile on first use (dynamic shapes: batch rows change every step).
    """

    def __init__(self, fuse: bool) -> None:
        self.fused = fuse
        self._function: Callable[..., torch.Tensor] = (
            torch.compile(layer_tail, dynamic=True) if fuse else layer_tail
        )

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        if not self.fused:
            return layer_tail(*args, **kwargs)
        try:
            return self._function(*args, **kwargs)
        except Exception as error:  # any compiler failure means: run eager
            _log.warning("kernel fusion unavailable, running the layer tail eagerly: %s", error)
            self.fused = False
            return layer_tail(*args, **kwargs)
