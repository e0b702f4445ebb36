"""Rank worker: the CLI, with one rank failing at one step (a fault injected on purpose):
a shard file missing, or an allocation that no host holds, refused by torch's CPU
allocator as one that exceeds the memory left would be (``fault="out of memory"``).

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.fail_on_rank:main``.
"""

from __future__ import annotations

import os

import torch

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.train.trainer import Trainer


def main(argv: list[str], failing_rank: int, failing_step: int, fault: str = "missing") -> int:
    if int(os.environ["RANK"]) == failing_rank:
        sample = Trainer.sample

        def sample_or_fail(self, global_step):
            if global_step == failing_step and fault == "out of memory":
                torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: the allocator refuses it
            if global_step == failing_step:
                raise FileNotFoundError(f"shard file part-{failing_rank}.npy is missing")
            return sample(self, global_step)

        Trainer.sample = sample_or_fail
    return cli_main(argv)
