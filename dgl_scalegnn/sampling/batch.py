"""What one rank trains on in a step: its share of a mini-batch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dgl_scalegnn.core.layout import Plane
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import LocalSpMM

__all__ = ["RankBatch"]


@dataclass(frozen=True)
class RankBatch:
    """One rank's share of a mini-batch (or of the full graph for evaluation).

    ``features``: rows of the batch along X, input columns of part Z (state ``(x,z,y)``).
    ``labels``/``masks``: rows along the logits' row axis. ``adjacency``: one local
    SpMM per plane the model uses. ``step`` keys the dropout masks.
    """

    step: int
    rows: RowPartition
    adjacency: Mapping[Plane, LocalSpMM]
    features: torch.Tensor
    labels: torch.Tensor
    masks: Mapping[str, torch.Tensor]
