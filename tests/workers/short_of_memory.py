"""Rank worker: the CLI, with one rank's host reporting less available memory than the
evaluation needs (a shortage injected on purpose).

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.short_of_memory:main``.
"""

from __future__ import annotations

import os

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.train import defaults


def main(argv: list[str], short_rank: int, available: int) -> int:
    if int(os.environ["RANK"]) == short_rank:
        defaults.available_bytes = lambda device="cpu", local_ranks=1: available
    return cli_main(argv)
