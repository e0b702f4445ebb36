"""Rank worker: train with checkpoints and die (SIGKILL) halfway through writing one.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.crash_during_checkpoint:main``
with the CLI arguments and the checkpoint step to crash in.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.train import checkpoint


def main(argv: list[str], crash_step: int) -> int:
    real_write = checkpoint._atomic_write_bytes

    def write_half_then_die(path: Path, data: bytes) -> None:
        if f"step_{crash_step:08d}" in str(path) and path.suffix == ".pt":
            path.write_bytes(bytes(data[: len(data) // 2]))  # half written
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(path, data)

    checkpoint._atomic_write_bytes = write_half_then_die
    return cli_main(argv)
