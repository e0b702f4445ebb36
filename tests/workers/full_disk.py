"""Rank worker: the CLI, with rank 0's metrics file on a file system that fills up.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.full_disk:main``;
:class:`FullDisk` is also patched in-process by tests/test_output_safety.py.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dgl_scalegnn.cli import main as cli_main


class FullDisk:
    """``os.write`` for one file as on a file system with ``free`` bytes left: the write
    that crosses the limit is short, the next one fails with ENOSPC (as Linux does)."""

    def __init__(self, path: str | os.PathLike[str], free: int) -> None:
        self.path, self.free, self.failed = os.path.realpath(path), free, 0
        self._write = os.write

    def __call__(self, fd: int, data: bytes) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") != self.path:
            return self._write(fd, data)
        if self.free == 0:
            self.failed += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self._write(fd, bytes(data[: self.free]))
        self.free -= written
        return written


def main(argv: list[str], metrics: str, free: int) -> int:
    if int(os.environ["RANK"]) == 0:
        os.write = FullDisk(Path(metrics), free)
    return cli_main(argv)
