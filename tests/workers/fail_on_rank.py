"""Rank worker: the CLI, with one rank raising at one step (a fault injected on purpose).

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.fail_on_rank:main``.
"""

from __future__ import annotations

import os

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.train.trainer import Trainer


def main(argv: list[str], failing_rank: int, failing_step: int) -> int:
    if int(os.environ["RANK"]) == failing_rank:
        sample = Trainer.sample

        def sample_or_fail(self, global_step):
            if global_step == failing_step:
                raise FileNotFoundError(f"shard file part-{failing_rank}.npy is missing")
            return sample(self, global_step)

        Trainer.sample = sample_or_fail
    return cli_main(argv)
