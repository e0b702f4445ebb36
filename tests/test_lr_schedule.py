"""The learning-rate schedule: each optimizer step runs at the rate of its global step."""

from __future__ import annotations

import itertools

import pytest

from dgl_scalegnn.config import ConfigError, config_from_mapping
from dgl_scalegnn.core.schedule import learning_rate
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset, record_steps

STEPS = 6


def _rates_seen(optim: dict) -> list[float]:
    """The rate Adam used at each step of a 6-step run (read inside ``optimizer.step``)."""
    cfg = config_from_mapping(
        {
            "model": {"hidden": 8, "layers": 2},
            "sampling": {"batch_size": 40},
            "train": {"max_steps": STEPS, "eval_every_steps": 100, "progress": False},
            "optim": {"lr": 0.01, **optim},
        }
    )
    graph = prepare_in_memory(random_dataset(num_nodes=80, num_edges=400), 0)
    trainer = Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    seen = record_steps(trainer)
    trainer.fit()
    return [step["lr"] for step in seen]


def test_constant_rate_by_default():
    assert _rates_seen({}) == [0.01] * STEPS


def test_cosine_with_warm_up_follows_the_formula():
    seen = _rates_seen({"lr_schedule": "cosine", "warmup_steps": 2})
    expected = [learning_rate(0.01, t, STEPS, "cosine", 2) for t in range(STEPS)]
    assert seen == pytest.approx(expected, rel=1e-12)
    # warm-up halves the first step; the cosine then falls monotonically towards 0
    assert seen[0] == pytest.approx(0.005)
    assert all(a > b for a, b in itertools.pairwise(seen[1:])) and seen[-1] < 0.001


def test_unknown_schedule_and_negative_warm_up_are_refused():
    with pytest.raises(ConfigError, match=r"optim\.lr_schedule"):
        config_from_mapping({"optim": {"lr_schedule": "linear"}})
    with pytest.raises(ConfigError, match=r"optim\.warmup_steps"):
        config_from_mapping({"optim": {"warmup_steps": -1}})
