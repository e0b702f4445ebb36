"""dgl_scalegnn as one more method of the peer comparison, timed by the same loop.

:class:`ScaleGNNPeer` wraps the real trainer (uniform vertex sampling, the parallel
model on a one-process grid, full-graph evaluation) in the ``Baseline`` interface of
:mod:`benchmarks.baselines.training`, so that its training time, evaluation time and
accuracy are measured by exactly the code that measures GraphSAINT and GraphSAGE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from benchmarks.baselines import training
from dgl_scalegnn.config import ModelConfig, TrainConfig, config_from_mapping
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer

__all__ = ["METHOD", "DEFAULTS", "ScaleGNNPeer", "PEER"]

METHOD = "scalegnn"
#: The model's settings are the config's (any ``model`` key of :class:`ModelConfig`,
#: ``conv`` included, can be swept), at two layers; then the training settings.
DEFAULTS: dict[str, Any] = {
    **dataclasses.asdict(ModelConfig(layers=2)),
    "batch_size": 4096,
    "lr": 0.01,
    "weight_decay": 0.0,
    "lr_schedule": "constant",
    "epochs": TrainConfig.epochs,  # the cosine schedule's horizon: set it to the epochs run
}


class ScaleGNNPeer:
    """The trainer of this project behind ``train_epoch`` / ``evaluate``."""

    def __init__(self, dataset: NodeDataset, settings: Mapping[str, Any]) -> None:
        # training.Method.build seeded torch with the run's seed just before this.
        seed = torch.initial_seed()
        model_keys = [field.name for field in dataclasses.fields(ModelConfig)]
        cfg = config_from_mapping(
            {
                "model": {k: settings[k] for k in model_keys},
                "sampling": {
                    "batch_size": min(settings["batch_size"], dataset.num_nodes),
                    "seed": seed,
                },
                "train": {"seed": seed, "progress": False, "epochs": settings["epochs"]},
                "optim": {
                    "lr": settings["lr"],
                    "weight_decay": settings["weight_decay"],
                    "lr_schedule": settings["lr_schedule"],
                },
            }
        )
        graph = prepare_in_memory(dataset, permutation_seed=0)
        self.trainer = Trainer(
            cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False)
        )
        self.step = 0

    def train_epoch(self) -> float | None:
        losses = []
        for _ in range(self.trainer.steps_per_epoch):
            losses.append(self.trainer.train_step(self.trainer.sample(self.step)))
            self.step += 1
        return training.mean_loss(losses)

    def evaluate(self) -> tuple[float, float]:
        accuracy = self.trainer.evaluate()
        return accuracy["val_acc"], accuracy["test_acc"]


#: This method of the comparison (``PEER.train``, ``PEER.sweep``).
PEER = training.Method(METHOD, ScaleGNNPeer, DEFAULTS)
