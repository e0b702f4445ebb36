"""``train.max_train_s``: training stops at the step that spends the budget of seconds,
every rank at the same step, and the cosine schedule decays over the seconds."""

from __future__ import annotations

import json

import pytest

from dgl_scalegnn.config import ConfigError, config_from_mapping
from dgl_scalegnn.core.schedule import learning_rate
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.train import trainer as trainer_module
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset, record_steps
from tests.ranks import spawn_ranks
from tests.workers.time_budget import fake_clock

BUDGET_S = 3.0
CAP = 100  # train.max_steps: far more steps than the budget allows


def _config(grid: str = "1x1x1x1") -> dict:
    return {
        "model": {"hidden": 8, "layers": 2},
        "sampling": {"batch_size": 40},
        "train": {
            "epochs": 1000,
            "max_steps": CAP,
            "max_train_s": BUDGET_S,
            "evaluate": False,
            "progress": False,
        },
        "optim": {"lr": 0.01, "lr_schedule": "cosine"},
        "parallel": {"grid": grid, "timeout_s": 30},
    }


def _check_stop_and_rates(seen: list[dict], steps: int) -> None:
    """The run ended at the first step whose agreed seconds reached the budget, each
    step at the cosine's rate of the share of the budget spent."""
    agreed = [s["agreed_s"] for s in seen]
    assert steps == len(seen) < CAP
    assert agreed[-1] >= BUDGET_S and all(a < BUDGET_S for a in agreed[:-1])
    expected = [
        learning_rate(0.01, t, CAP, "cosine", done=a / BUDGET_S) for t, a in enumerate(agreed)
    ]
    assert [s["lr"] for s in seen] == pytest.approx(expected, rel=1e-6)
    by_steps = [learning_rate(0.01, t, CAP, "cosine") for t in range(steps)]
    assert seen[-1]["lr"] < 0.1 * by_steps[-1]  # the seconds' schedule, not the steps'


def test_one_process_stops_when_the_budget_is_spent(monkeypatch):
    monkeypatch.setattr(trainer_module, "time", fake_clock(0.1))
    graph = prepare_in_memory(random_dataset(num_nodes=200, num_edges=1000), 0)
    cfg = config_from_mapping(_config())
    trainer = Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    seen = record_steps(trainer)
    summary = trainer.fit()
    _check_stop_and_rates(seen, summary["steps"])
    # one process: the agreed seconds are its own, with the step's so far
    assert all(s["agreed_s"] > s["own_s"] for s in seen)
    assert summary["train_s"] >= BUDGET_S


def test_ranks_stop_together_at_the_slowest_ranks_budget(tmp_path):
    """Rank 1's clock runs 3x as fast as rank 0's: without the agreement rank 1 would
    stop first and rank 0 wait in its next step's all-reduce."""
    spec = {"config": _config("2x1x1x1"), "ticks": [0.05, 0.15], "out": str(tmp_path)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    spawn_ranks(2, "tests.workers.time_budget:main", [str(tmp_path / "spec.json")], tmp_path)
    fast, slow = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert fast["steps"] == slow["steps"] and fast["seen"] == [
        {**s, "own_s": f["own_s"]} for s, f in zip(slow["seen"], fast["seen"], strict=True)
    ]
    _check_stop_and_rates(slow["seen"], slow["steps"])
    assert fast["seen"][-1]["own_s"] < BUDGET_S / 2  # its own clock alone would go on
    for record in (fast, slow):
        assert all(s["agreed_s"] >= s["own_s"] for s in record["seen"])


@pytest.mark.parametrize("budget", [0, -1.0, float("nan")])
def test_a_budget_that_is_not_positive_is_refused(budget):
    with pytest.raises(ConfigError, match=r"train\.max_train_s: got"):
        config_from_mapping({"train": {"max_train_s": budget}})
