"""Rank worker: train through the CLI, and on one rank make the Adam state infinite right
before the checkpoint of one step is saved (as a diverging update would).

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.poison_before_save:main`` with
the CLI arguments, the global step and the rank.
"""

from __future__ import annotations

from typing import Any

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.train import checkpoint


def main(argv: list[str], step: int, rank: int) -> int:
    real_save = checkpoint.save_checkpoint

    def poison_then_save(directory: Any, **kwargs: Any) -> Any:
        if kwargs["progress"]["global_step"] == step and kwargs["grid"].rank == rank:
            state = next(iter(kwargs["optimizer"].state.values()))
            state["exp_avg_sq"].fill_(float("inf"))
        return real_save(directory, **kwargs)

    checkpoint.save_checkpoint = poison_then_save
    return cli_main(argv)
