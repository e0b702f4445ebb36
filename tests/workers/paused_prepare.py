"""Rank worker: ``scalegnn prepare`` that pauses midway, when it is about to write its
features, until a file appears (so that another process can act while it is busy).

Run by :func:`tests.ranks.start_ranks` as ``tests.workers.paused_prepare:main`` with the
CLI arguments, the file it creates when it pauses and the file it waits for.
"""

from __future__ import annotations

import time
from pathlib import Path

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.data import streaming

#: The longest pause: a test that never lets it go on does not leave it waiting forever.
_PAUSE_LIMIT_S = 120.0


def main(argv: list[str], paused: str, go_on: str) -> int:
    write_features = streaming._write_features

    def pause_then_write(*args, **kwargs) -> None:
        Path(paused).touch()
        deadline = time.monotonic() + _PAUSE_LIMIT_S
        while not Path(go_on).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        write_features(*args, **kwargs)

    streaming._write_features = pause_then_write
    return cli_main(argv)
