"""Layout states of 3D parallel matrix multiplication, as values.

A matrix distributed over the ``Gx x Gy x Gz`` grid is in state ``(rows, cols, rep)``:
its rows are split along grid axis ``rows``, its columns along ``cols``, and it is
replicated along the third axis ``rep``. The transitions below are the layout rules of
the parallel operators; the collective an operator runs follows from its input state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Axis", "Layout", "Plane", "split_bounds", "block_range", "INPUT_LAYOUT"]


class Axis(enum.Enum):
    """One axis of the 3D PMM grid (data parallelism is a fourth, separate axis)."""

    X = "x"
    Y = "y"
    Z = "z"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Layout:
    """State ``(rows, cols, rep)`` of a matrix on the 3D grid.

    Examples
    --------
    >>> from dgl_scalegnn.core.layout import Axis, Layout
    >>> state = Layout(Axis.X, Axis.Y, Axis.Z)
    >>> str(state), str(state.after_spmm()), str(state.after_linear())
    ('(x,y,z)', '(z,y,x)', '(x,z,y)')
    """

    rows: Axis
    cols: Axis
    rep: Axis

    def __post_init__(self) -> None:
        if len({self.rows, self.cols, self.rep}) != 3:
            raise ValueError(f"a layout names each grid axis once, got {self}")

    def __str__(self) -> str:
        return f"({self.rows},{self.cols},{self.rep})"

    def after_linear(self) -> Layout:
        """``Y = X W`` on ``(a, b, e)``: partial sums over ``b``, result ``(a, e, b)``."""
        return Layout(self.rows, self.rep, self.cols)

    def after_spmm(self) -> Layout:
        """``H = A F`` on ``(a, b, e)``: partial sums over ``a``, result ``(e, b, a)``."""
        return Layout(self.rep, self.cols, self.rows)

    def after_gcn_layer(self) -> Layout:
        """SpMM then linear: ``(r, c, o)`` becomes ``(o, r, c)`` (layer rotation)."""
        return self.after_spmm().after_linear()

    def spmm_plane(self) -> Plane:
        """Adjacency shard SpMM needs on input state ``(a, b, e)``: rows by ``e``, cols by ``a``."""
        return Plane(rows=self.rep, cols=self.rows)


@dataclass(frozen=True)
class Plane:
    """A grid plane holding an adjacency shard: rows split along ``rows``, cols along ``cols``."""

    rows: Axis
    cols: Axis

    def __str__(self) -> str:
        return f"{str(self.rows).upper()}{str(self.cols).upper()}"


#: Input features are rows-by-X, columns-by-Z (the ZX-plane), replicated along Y, so the
#: input projection yields the XY-plane state ``(x, y, z)`` that layer 1 reads.
INPUT_LAYOUT = Layout(Axis.X, Axis.Z, Axis.Y)


def split_bounds(n: int, parts: int) -> list[int]:
    """Boundaries of ``n`` items split into ``parts`` contiguous, near-equal blocks.

    Block ``i`` is ``[i*q + min(i, r), (i+1)*q + min(i+1, r))`` with ``q, r = divmod(n, parts)``:
    the first ``r`` blocks hold one item more. Returns ``parts + 1`` offsets.

    >>> split_bounds(10, 3)
    [0, 4, 7, 10]
    """
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts; parts must be >= 1")
    if n < 0:
        raise ValueError(f"cannot split a negative count {n}")
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def block_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of block ``index`` of :func:`split_bounds` ``(n, parts)``."""
    if not 0 <= index < parts:
        raise ValueError(f"block index {index} is outside [0, {parts})")
    q, r = divmod(n, parts)
    return index * q + min(index, r), (index + 1) * q + min(index + 1, r)
