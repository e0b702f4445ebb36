"""DGL's GAT with the published recipe (Veličković et al., 2018), full batch.

Written from DGL's own layers, as DGL's GAT example trains Cora and Citeseer
(``examples/pytorch/gat`` in DGL's repository): the graph with one self loop per vertex,
two ``GATConv`` layers (:class:`benchmarks.baselines.neighbour_sampled.GAT`): 8 heads
of 8 columns side by side, ELU, then one head of the classes; dropout 0.6 on each
layer's input features (``feat_drop``) and on the attention coefficients
(``attn_drop``), LeakyReLU slope 0.2; Adam at 0.005 with weight decay 5e-4 on every
parameter; the features' rows scaled to sum 1 (DGL's Planetoid classes). Training stops
when the validation accuracy has not risen for ``patience`` (100) epochs, or after the
epochs it is given; the test accuracy is the best validation epoch's (the model the
recipe's early stopping keeps). The paper reports 83.0 ± 0.7 on Cora and 72.5 ± 0.7 on
Citeseer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from benchmarks.baselines import training
from benchmarks.baselines.dgl_recipes import FullBatchBaseline
from benchmarks.baselines.neighbour_sampled import GAT
from dgl_scalegnn._dgl import dgl

__all__ = ["GAT_RECIPE_DEFAULTS", "GATRecipeBaseline", "GAT_RECIPE"]

#: The published recipe's settings.
GAT_RECIPE_DEFAULTS: dict[str, Any] = {
    "hidden": 64,
    "heads": 8,
    "out_heads": 1,
    "dropout": 0.6,
    "attn_dropout": 0.6,
    "negative_slope": 0.2,
    "lr": 0.005,
    "weight_decay": 5e-4,
    "feature_norm": "row",
    "patience": 100,
}


class _WholeGraph(nn.Module):
    """A :class:`~benchmarks.baselines.neighbour_sampled.GAT` stack whose every layer
    reads the whole graph."""

    def __init__(self, stack: GAT) -> None:
        super().__init__()
        self.stack = stack

    def forward(self, graph: dgl.DGLGraph, features: torch.Tensor) -> torch.Tensor:
        return self.stack([graph] * self.stack.num_layers, features)


def _gat(dim_in: int, classes: int, settings: Mapping[str, Any]) -> nn.Module:
    options = ("heads", "out_heads", "attn_dropout", "negative_slope")
    stack = GAT(
        dim_in, settings["hidden"], classes, 2, settings["dropout"], *(settings[k] for k in options)
    )
    return _WholeGraph(stack)


class GATRecipeBaseline(FullBatchBaseline):
    """The recipe's GAT, full batch, with its early stopping: once the validation
    accuracy has not risen for ``patience`` evaluations (one an epoch), the model is
    final: an epoch no longer steps and an evaluation repeats the last one's accuracies,
    so the best validation epoch stays the one early stopping keeps."""

    build = staticmethod(_gat)

    def __init__(self, dataset, settings: Mapping[str, Any]) -> None:
        super().__init__(dataset, settings)
        self.patience = settings["patience"]
        self.best_val, self.since_best = -1.0, 0
        self.last: tuple[float, float] | None = None

    @property
    def stopped(self) -> bool:
        """Whether early stopping has ended training."""
        return self.since_best >= self.patience

    def train_epoch(self) -> float | None:
        return None if self.stopped else super().train_epoch()

    def evaluate(self) -> tuple[float, float]:
        if self.stopped and self.last is not None:
            return self.last
        self.last = super().evaluate()
        val_acc = self.last[0]
        if val_acc > self.best_val:
            self.best_val, self.since_best = val_acc, 0
        else:
            self.since_best += 1
        return self.last


#: DGL's GAT, the published recipe.
GAT_RECIPE = training.Method("dgl-gat-recipe", GATRecipeBaseline, GAT_RECIPE_DEFAULTS)
