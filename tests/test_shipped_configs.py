"""Every shipped YAML config loads, validates and trains a few steps at a tiny size.

The model, sampling, optimiser and switch settings are used as shipped; only what ties a
config to its real size is overridden: the grid (one process), the dataset (the tiny
synthetic graph instead of a public one that is not here, Cora where it is), the batch
and the number of steps. Fusion is switched off to keep compile time out of the suite
(it has its own tests).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dgl_scalegnn.config import load_config
from dgl_scalegnn.train.run import run_training
from tests.helpers import ROOT, SHARED_DATA

CONFIGS = sorted((ROOT / "yaml").glob("*.yaml"))


def test_every_config_is_collected():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.stem)
def test_shipped_config_trains_a_few_steps(path: Path, tmp_path, monkeypatch):
    shipped = load_config(path)  # as shipped: every key known, every value allowed
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(SHARED_DATA))
    tiny = [
        "parallel.grid=1x1x1x1",
        "parallel.fuse=false",
        f"sampling.batch_size={min(shipped.sampling.batch_size, 300)}",
        "train.max_steps=2",
        "train.eval_every_steps=2",
        "train.progress=false",
    ]
    if shipped.data.name != "cora":
        tiny += ["data.name=synthetic", "data.synthetic.num_nodes=600"]
    cfg = load_config(path, tiny)
    assert (cfg.model, cfg.optim) == (shipped.model, shipped.optim)
    summary = run_training(cfg, str(tmp_path / "metrics.jsonl"))
    assert summary["steps"] == 2
    assert 0.0 <= summary["best_val_acc"] <= 1.0 and math.isfinite(summary["train_s"])
