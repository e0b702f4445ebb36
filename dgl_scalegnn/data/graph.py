"""The dataset value every loader returns: a DGLGraph with the node data DGL users know."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import InputError

__all__ = ["NodeDataset", "REQUIRED_NDATA", "DatasetError"]

#: Node data a graph must carry to be trained on.
REQUIRED_NDATA = ("feat", "label", "train_mask", "val_mask", "test_mask")


class DatasetError(InputError, ValueError):
    """A dataset that is missing, incomplete or malformed; the message names the file."""


@dataclass(frozen=True)
class NodeDataset:
    """A node-classification graph.

    ``graph.ndata`` holds ``feat`` (float32, ``(N, D_in)``), ``label`` (int64 ``(N,)``,
    or float32 ``(N, C)`` 0/1 for multi-label), and boolean ``train_mask``,
    ``val_mask``, ``test_mask`` (``(N,)``). Edges are as the source gives them
    (directed, possibly with duplicates or self loops); normalisation happens later.
    """

    name: str
    graph: dgl.DGLGraph
    num_classes: int
    multilabel: bool = False

    def __post_init__(self) -> None:
        missing = [key for key in REQUIRED_NDATA if key not in self.graph.ndata]
        if missing:
            raise DatasetError(
                f"dataset {self.name!r}: graph.ndata lacks {', '.join(missing)}; "
                f"a graph needs {', '.join(REQUIRED_NDATA)}"
            )
        n = self.graph.num_nodes()
        for key in REQUIRED_NDATA:
            if self.graph.ndata[key].shape[0] != n:
                raise DatasetError(
                    f"dataset {self.name!r}: ndata[{key!r}] has {self.graph.ndata[key].shape[0]} "
                    f"rows for {n} vertices"
                )
        label = self.graph.ndata["label"]
        if self.multilabel and (label.dim() != 2 or label.shape[1] != self.num_classes):
            raise DatasetError(
                f"dataset {self.name!r}: a multi-label dataset needs label of shape "
                f"(N, {self.num_classes}), got {tuple(label.shape)}"
            )
        if not self.multilabel and label.dim() != 1:
            raise DatasetError(
                f"dataset {self.name!r}: single-label data needs label of shape (N,), "
                f"got {tuple(label.shape)}"
            )
        for key in ("train_mask", "val_mask", "test_mask"):
            if self.graph.ndata[key].dtype != torch.bool:
                raise DatasetError(f"dataset {self.name!r}: ndata[{key!r}] must be bool")

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes()

    @property
    def num_features(self) -> int:
        return int(self.graph.ndata["feat"].shape[1])
