"""Rank worker: train with checkpoints and die (SIGKILL) halfway through writing one.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.crash_during_checkpoint:main``
with the CLI arguments and the checkpoint step to crash in.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from dgl_scalegnn.cli import main as cli_main


def main(argv: list[str], crash_step: int) -> int:
    real_save = torch.save

    def save_then_die(obj, target, *args, **kwargs):
        real_save(obj, target, *args, **kwargs)
        if f"step_{crash_step:08d}" in str(target):
            path = Path(target)
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # half written
            os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save_then_die
    return cli_main(argv)
