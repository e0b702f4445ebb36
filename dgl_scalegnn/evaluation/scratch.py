"""Whole-graph matrices of a layer-wise evaluation in scratch files, outside the ranks' memory.

Where a layer's input and output over every vertex do not fit a rank's memory, the
streamed layer-wise evaluation (:mod:`~dgl_scalegnn.evaluation.layerwise`) keeps them in
files of a scratch directory (:class:`ScratchDir`) instead: each :class:`ScratchMatrix`
is a rank's local shard, rows in order, written a chunk of rows at a time and read a
range of rows at a time with ``pwrite``/``preadv``, never through a memory map, so that
no page of it enters the process's resident set (the page cache holds it, and the kernel
writes it out where memory runs short).

Ranks that hold the same shard (the replicas along a layout's replicated axis, and the
data-parallel replicas) share one file where they see the same directory: the first
replica writes it, the data-parallel replicas each their own chunks, and every rank
reads it once it is complete (:meth:`ScratchDir.complete`, a collective). Elsewhere each
rank writes a file of its own. The directory is removed when the round ends, and when it
fails.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import torch
import torch.distributed as dist

from dgl_scalegnn.core.layout import Layout
from dgl_scalegnn.distributed.comm import Runtime, agree_on
from dgl_scalegnn.errors import InputError

__all__ = ["ScratchSpaceError", "ScratchMatrix", "ScratchDir"]

#: Bytes a single ``pread``/``pwrite`` moves at most (Linux moves at most 2 GiB - 4 KiB).
_IO_BYTES = 1 << 30


class ScratchSpaceError(InputError):
    """The scratch directory of a streamed evaluation has no room for its matrices."""


def _world() -> tuple[int, int]:
    """This process's rank and the world's size (0 and 1 without a process group)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ScratchMatrix:
    """A rank's shard of a whole-graph matrix in a file: ``rows`` x ``cols`` of ``dtype``,
    read back onto ``device``; ``writer``: whether this rank writes it (else a replica
    does, into the same file)."""

    def __init__(
        self,
        path: Path,
        rows: int,
        cols: int,
        dtype: torch.dtype,
        device: torch.device,
        writer: bool,
    ) -> None:
        self.path, self.rows, self.cols, self.dtype = path, rows, cols, dtype
        self.device, self.writer = device, writer
        self.row_bytes = cols * torch.empty((), dtype=dtype).element_size()
        self._fd: int | None = None

    @property
    def nbytes(self) -> int:
        """The file's bytes once complete."""
        return self.rows * self.row_bytes

    def open(self) -> None:
        """Open the file (for writing where this rank writes it; the first read or write
        opens it too)."""
        self._descriptor()

    def _descriptor(self) -> int:
        if self._fd is None:
            flags = os.O_RDWR | os.O_CREAT if self.writer else os.O_RDONLY
            self._fd = os.open(self.path, flags, 0o600)
        return self._fd

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Rows ``start`` on of the shard: ``rows`` (where this rank writes the file)."""
        if not self.writer or not rows.shape[0]:
            return
        rows = rows.detach().to("cpu", self.dtype).contiguous()
        data = memoryview(rows.view(torch.uint8).numpy()).cast("B")
        fd, offset, done = self._descriptor(), start * self.row_bytes, 0
        while done < len(data):
            done += os.pwrite(fd, data[done : done + _IO_BYTES], offset + done)

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of the shard, on the matrix's device."""
        out = torch.empty((stop - start, self.cols), dtype=self.dtype)
        data = memoryview(out.view(torch.uint8).numpy()).cast("B")
        fd, offset = self._descriptor(), start * self.row_bytes
        done = 0
        while done < len(data):
            got = os.preadv(fd, [data[done : done + _IO_BYTES]], offset + done)
            if got <= 0:
                raise OSError(f"{self.path}: short read at byte {offset + done}")
            done += got
        return out.to(self.device)

    def read_runs(self, runs: Sequence[tuple[int, int]]) -> torch.Tensor:
        """The rows of the ``[start, stop)`` ``runs``, in order."""
        if len(runs) == 1:
            return self.read(*runs[0])
        parts = [self.read(start, stop) for start, stop in runs]
        if not parts:
            return torch.empty((0, self.cols), dtype=self.dtype, device=self.device)
        return torch.cat(parts)

    def placeholder(self) -> torch.Tensor:
        """A ``rows x cols`` tensor that holds one row (every row is its storage): what a
        layer is handed as its input, whose product with the adjacency is made apart."""
        return torch.zeros((1, self.cols), dtype=self.dtype, device=self.device).expand(
            self.rows, self.cols
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ScratchDir:
    """A directory for one round's :class:`ScratchMatrix` files under ``root``, removed
    on exit (also after a failure): a context manager, entered and left by every rank.

    Entering is collective: the ranks agree on the directory's name, find whether they
    all see it (then replicas share files), and check that it has room for the files at
    their largest: each rank's ``alone_bytes`` where each writes its own, else the sum
    over the ranks of what each writes of the shared ones (``shared_bytes``), all alike.

    Raises
    ------
    ScratchSpaceError
        The directory's filesystem has less room than the matrices need (on any rank).
    """

    def __init__(
        self,
        root: Path,
        alone_bytes: int,
        shared_bytes: int,
        runtime: Runtime,
        device: torch.device,
    ) -> None:
        self.root, self.runtime, self.device = root, runtime, device
        self.alone_bytes, self.shared_bytes = alone_bytes, shared_bytes
        self.shared = False
        self.path: Path | None = None
        self._matrices: list[ScratchMatrix] = []

    def __enter__(self) -> ScratchDir:
        rank, _ = _world()
        token = int(
            agree_on(secrets.randbits(48) if rank == 0 else 0, dist.ReduceOp.MAX, self.device)
        )
        self.path = self.root / f"evaluation-{token:012x}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(mode=0o700, exist_ok=True)
        marker = self.path / "rank0"
        if rank == 0:
            marker.touch()
        agree_on(0.0, dist.ReduceOp.SUM, self.device)  # a barrier: rank 0 has made its marker
        unseen = agree_on(0.0 if marker.exists() else 1.0, dist.ReduceOp.SUM, self.device)
        self.shared = unseen == 0.0
        need = (
            agree_on(self.shared_bytes, dist.ReduceOp.SUM, self.device)
            if self.shared
            else self.alone_bytes
        )
        free = shutil.disk_usage(self.path).free
        short = agree_on(1.0 if free < need else 0.0, dist.ReduceOp.MAX, self.device)
        if short:
            self._remove()
            raise ScratchSpaceError(
                f"evaluation scratch {str(self.root)!r}: a streamed layer-wise evaluation "
                f"writes up to {need / 1e9:.2f} GB of a layer's input and output there, but "
                f"its filesystem has {free / 1e9:.2f} GB free; free some, set "
                "SCALEGNN_CACHE_DIR to a directory on a larger filesystem, or set "
                "train.evaluation to neighbourhood"
            )
        return self

    def matrix(
        self,
        name: str,
        layout: Layout,
        shape: tuple[int, int],
        dtype: torch.dtype,
        first_replica: bool,
    ) -> ScratchMatrix:
        """A new matrix ``name`` of ``shape`` local rows and columns in ``layout``; this
        rank writes it where it holds its shard alone or is the ``first_replica`` of
        those that share it (a shared directory)."""
        assert self.path is not None, "enter the ScratchDir first"
        coords = self.runtime.grid.coords
        if self.shared:
            rows, cols = layout.rows, layout.cols
            owner = f"{rows}{coords.along(rows)}-{cols}{coords.along(cols)}"
            writer = first_replica
        else:
            owner, writer = f"rank{_world()[0]}", True
        matrix = ScratchMatrix(
            self.path / f"{name}-{owner}.bin", shape[0], shape[1], dtype, self.device, writer
        )
        self._matrices.append(matrix)
        return matrix

    def complete(self, matrix: ScratchMatrix) -> None:
        """Wait until every rank has written its part of ``matrix`` (collective), then open
        it on every rank: its file is whole, and stays readable here once its writer
        removes it (:meth:`release`)."""
        agree_on(0.0, dist.ReduceOp.SUM, self.device)
        matrix.open()

    def release(self, matrix: ScratchMatrix) -> None:
        """Close ``matrix``'s file, which this rank has read for the last time, and delete
        it where this rank wrote it (the ranks that share it opened it at
        :meth:`complete`: their reads go on)."""
        matrix.close()
        if matrix.writer:
            matrix.path.unlink(missing_ok=True)

    def _remove(self) -> None:
        for matrix in self._matrices:
            matrix.close()
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._remove()
