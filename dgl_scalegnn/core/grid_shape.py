"""The shape ``Gd x Gx x Gy x Gz`` of the 4D grid and a rank's coordinates on it: pure
arithmetic, no process group (those are :class:`~dgl_scalegnn.distributed.grid.Grid4D`'s).

Rank layout: ``x`` varies fastest, then ``y``, then ``z``, then ``d``:
:math:`\\mathrm{rank} = x + G_x (y + G_y (z + G_z d))`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from dgl_scalegnn.config import grid_sizes
from dgl_scalegnn.core.layout import Axis
from dgl_scalegnn.errors import InputError

__all__ = ["GridShape", "Coords", "GridError"]


class GridError(InputError, ValueError):
    """A grid that cannot be used with this world size or spec."""


@dataclass(frozen=True)
class Coords:
    d: int
    x: int
    y: int
    z: int

    def along(self, axis: Axis) -> int:
        return getattr(self, axis.value)


@dataclass(frozen=True)
class GridShape:
    """Sizes of the four grid axes.

    >>> shape = GridShape.parse("2x2x3x1")
    >>> shape.world_size, shape.coords(7), shape.rank_of(shape.coords(7))
    (12, Coords(d=1, x=1, y=0, z=0), 7)
    """

    dp: int
    x: int
    y: int
    z: int

    def __post_init__(self) -> None:
        for name, size in (("Gd", self.dp), ("Gx", self.x), ("Gy", self.y), ("Gz", self.z)):
            if size < 1:
                raise GridError(f"grid axis {name} is {size}; every axis needs at least 1 process")

    @classmethod
    def parse(cls, spec: str) -> GridShape:
        """``"GdxGxxGyxGz"`` (e.g. ``2x2x2x2``); a 3-part ``GxxGyxGz`` means ``Gd = 1``."""
        sizes = grid_sizes(spec)
        if sizes is None:
            raise GridError(
                f"grid {spec!r} is not of the form GdxGxxGyxGz (e.g. 1x2x2x2) or GxxGyxGz"
            )
        return cls(*sizes) if len(sizes) == 4 else cls(1, *sizes)

    def __str__(self) -> str:
        return f"{self.dp}x{self.x}x{self.y}x{self.z}"

    @property
    def world_size(self) -> int:
        return self.dp * self.x * self.y * self.z

    @property
    def tp_size(self) -> int:
        return self.x * self.y * self.z

    def size(self, axis: Axis) -> int:
        return getattr(self, axis.value)

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise GridError(f"rank {rank} is outside the grid {self} of {self.world_size} ranks")
        x, rest = rank % self.x, rank // self.x
        y, rest = rest % self.y, rest // self.y
        z, d = rest % self.z, rest // self.z
        return Coords(d=d, x=x, y=y, z=z)

    def rank_of(self, coords: Coords) -> int:
        return coords.x + self.x * (coords.y + self.y * (coords.z + self.z * coords.d))

    def check_world_size(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise GridError(
                f"grid {self} needs {self.world_size} processes but the job has {world_size}; "
                f"launch {self.world_size} processes or pass a grid whose product is {world_size}"
            )

    def group_ranks(self, varying: str) -> list[list[int]]:
        """Rank lists of the groups whose members differ only in the ``varying`` axes."""
        axes = ("d", "x", "y", "z")
        sizes = {"d": self.dp, "x": self.x, "y": self.y, "z": self.z}
        fixed = [a for a in axes if a not in varying]
        groups = []
        for fixed_values in itertools.product(*(range(sizes[a]) for a in fixed)):
            base = dict(zip(fixed, fixed_values))
            members = []
            for varying_values in itertools.product(
                *(range(sizes[a]) for a in axes if a in varying)
            ):
                coords = {**base, **dict(zip([a for a in axes if a in varying], varying_values))}
                members.append(self.rank_of(Coords(**coords)))
            groups.append(sorted(members))
        return groups
