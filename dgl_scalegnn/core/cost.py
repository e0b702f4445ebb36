"""What a parallel operator communicates, as values.

Every operator of :mod:`dgl_scalegnn.parallel` has a cost function beside its autograd
function, reading the same layout rule: given the operator's input state and a
:class:`LocalSizes` (the rank's expected local extents), it returns the
:class:`CollectiveCost` of each collective it runs in forward and backward. The layers
compose their operators' costs and the performance model sums them; nothing else lists
the communication schedule.

>>> str(CollectiveCost(Axis.X, 1500.0, low_precision=True))
'all_reduce over x: 1500 elements'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dgl_scalegnn.core.layout import Axis, Layout

__all__ = ["TP_GRID", "DATA_PARALLEL", "CollectiveCost", "LocalSizes", "UniformSizes"]

#: Group of a collective over the whole TP grid (the residual's all-to-all).
TP_GRID = "tp"
#: Group of the data-parallel gradient average.
DATA_PARALLEL = "dp"


@dataclass(frozen=True)
class CollectiveCost:
    """One collective: its group (a grid axis, :data:`TP_GRID` or :data:`DATA_PARALLEL`),
    the elements each rank contributes (all-reduce) or sends (all-to-all), whether it
    travels in bfloat16 when ``parallel.bf16_comm`` is on, and whether it runs in the
    backward pass (an evaluation's forward runs only the others)."""

    group: Axis | str
    elements: float
    operation: str = "all_reduce"
    low_precision: bool = False
    backward: bool = False

    def __str__(self) -> str:
        return f"{self.operation} over {self.group}: {self.elements:g} elements"


class LocalSizes(Protocol):
    """Expected local extents of one rank's shards of a batch; ``sampled`` is whether
    the rows are a sampled batch (a training step) rather than the whole graph (an
    evaluation's chunk), where an estimator of a sample has nothing to rescale."""

    sampled: bool

    def rows(self, axis: Axis) -> float:
        """Batch rows of this rank's part of the vertex range split along ``axis``."""
        ...

    def cols(self, width: int, axis: Axis) -> float:
        """Columns of this rank's part of ``width`` columns split along ``axis``."""
        ...

    def sent(self, src: Layout, dst: Layout, width: int) -> float:
        """Elements this rank sends when a ``(batch, width)`` matrix moves ``src -> dst``."""
        ...


@dataclass(frozen=True)
class UniformSizes:
    """Every axis split into ``parts`` equal parts of ``rows_per_part`` rows (examples, tests)."""

    rows_per_part: float
    parts: int
    sampled: bool = True

    def rows(self, axis: Axis) -> float:
        return self.rows_per_part

    def cols(self, width: int, axis: Axis) -> float:
        return width / self.parts

    def sent(self, src: Layout, dst: Layout, width: int) -> float:
        return 0.0 if src == dst else self.rows_per_part * width / self.parts
