"""Rank worker: ``scalegnn prepare`` with one rank failing while it writes its share
(a fault injected on purpose).

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.fail_prepare:main``.
"""

from __future__ import annotations

import os

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.data import streaming


def main(argv: list[str], failing_rank: int) -> int:
    if int(os.environ["RANK"]) == failing_rank:

        def fail(*args, **kwargs):
            raise OSError(f"no space left on device writing the features of rank {failing_rank}")

        streaming._write_features = fail
    return cli_main(argv)
