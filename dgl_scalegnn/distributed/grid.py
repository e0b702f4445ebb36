"""The 4D process grid ``Gd x Gx x Gy x Gz`` and its process groups.

Rank layout: ``x`` varies fastest, then ``y``, then ``z``, then ``d``:

.. math::

    \\mathrm{rank} = x + G_x (y + G_y (z + G_z d)).

An X-group holds the ranks that differ only in ``x`` (one per ``(d, y, z)``), likewise
the Y- and Z-groups; a DP-group holds the ranks that differ only in ``d``; the TP-group
(the 3D grid of one data-parallel replica) the ranks that share ``d``. Every rank creates
every group in the same order, since ``torch.distributed.new_group`` is collective.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import torch.distributed as dist

from dgl_scalegnn.parallel.layout import Axis

__all__ = ["GridShape", "Coords", "CommGroup", "Grid4D", "GridError"]


class GridError(ValueError):
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
        parts = re.fullmatch(r"\s*(\d+)x(\d+)x(\d+)(?:x(\d+))?\s*", str(spec))
        if parts is None:
            raise GridError(
                f"grid {spec!r} is not of the form GdxGxxGyxGz (e.g. 1x2x2x2) or GxxGyxGz"
            )
        sizes = [int(p) for p in parts.groups() if p is not None]
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

    def _group_ranks(self, varying: str) -> list[list[int]]:
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


@dataclass(frozen=True)
class CommGroup:
    """One process group of this rank, named for its role (``x``, ``y``, ``z``, ``dp``, ``tp``).

    ``handle`` is ``None`` when the group has one member: collectives on it are skipped.
    """

    kind: str
    ranks: tuple[int, ...]
    index: int
    handle: dist.ProcessGroup | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class Grid4D:
    """This rank's place in the 4D grid and its process groups.

    Examples
    --------
    >>> grid = Grid4D.single_process()
    >>> str(grid.shape), grid.group(Axis.X).size
    ('1x1x1x1', 1)
    """

    shape: GridShape
    rank: int
    coords: Coords
    axis_groups: dict[Axis, CommGroup]
    dp_group: CommGroup
    tp_group: CommGroup

    def group(self, axis: Axis) -> CommGroup:
        return self.axis_groups[axis]

    def coord(self, axis: Axis) -> int:
        return self.coords.along(axis)

    def size(self, axis: Axis) -> int:
        return self.shape.size(axis)

    @classmethod
    def single_process(cls) -> Grid4D:
        return cls.build(GridShape(1, 1, 1, 1), rank=0)

    @classmethod
    def build(cls, shape: GridShape, rank: int) -> Grid4D:
        """Create every group of ``shape`` (collective over all ranks when distributed)."""
        distributed = dist.is_available() and dist.is_initialized()
        shape.check_world_size(dist.get_world_size() if distributed else 1)
        return cls._assemble(shape, rank, create_groups=distributed)

    @classmethod
    def view(cls, shape: GridShape, rank: int) -> Grid4D:
        """Rank ``rank``'s coordinates and group members, without process groups.

        For work that needs no communication, e.g. building every rank's share of a
        batch in one process to check it.
        """
        return cls._assemble(shape, rank, create_groups=False)

    @classmethod
    def _assemble(cls, shape: GridShape, rank: int, create_groups: bool) -> Grid4D:
        coords = shape.coords(rank)
        mine: dict[str, CommGroup] = {}
        for kind, varying in (("x", "x"), ("y", "y"), ("z", "z"), ("dp", "d"), ("tp", "xyz")):
            for ranks in shape._group_ranks(varying):
                # new_group is collective: every rank creates every group, in this order.
                handle = dist.new_group(ranks) if create_groups and len(ranks) > 1 else None
                if rank in ranks:
                    mine[kind] = CommGroup(kind, tuple(ranks), ranks.index(rank), handle)
        return cls(
            shape=shape,
            rank=rank,
            coords=coords,
            axis_groups={Axis.X: mine["x"], Axis.Y: mine["y"], Axis.Z: mine["z"]},
            dp_group=mine["dp"],
            tp_group=mine["tp"],
        )
