"""The dataset value every loader returns: a DGLGraph with the node data DGL users know,
and the facts of its labels and split that a run says once (:func:`label_facts`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.errors import InputError

__all__ = ["NodeDataset", "REQUIRED_NDATA", "DatasetError", "label_facts", "label_notes"]

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
    ``source_file`` identifies the ``dgl.save_graphs`` file it was read from (see
    :func:`~dgl_scalegnn.data.datasets.file_identity`; ``None`` for other loaders): a
    graph prepared from it records it, and a run checks it names that file.
    """

    name: str
    graph: dgl.DGLGraph
    num_classes: int
    multilabel: bool = False
    source_file: dict[str, Any] | None = None

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


#: Pairs of splits whose shared vertices :func:`label_facts` counts.
_SPLIT_PAIRS = (("train", "val"), ("train", "test"), ("val", "test"))
#: How many of the classes without a training vertex are recorded by id.
_NAMED_CLASSES = 5


def label_facts(
    labels: np.ndarray, masks: Mapping[str, np.ndarray], num_classes: int, multilabel: bool
) -> dict[str, Any]:
    """What a run says once about a graph's labels and split, recorded when it is
    prepared (:func:`label_notes` words it): the classes that any labelled vertex has,
    the classes (or multi-label columns) that no training vertex has, and the vertices
    that two split masks share.

    Parameters
    ----------
    labels : numpy.ndarray
        Class ids ``(N,)`` (``-1`` unlabelled) or 0/1 targets ``(N, C)``.
    masks : Mapping[str, numpy.ndarray]
        ``train_mask``, ``val_mask``, ``test_mask``, bool ``(N,)``.
    num_classes : int
        The model's classes.
    multilabel : bool
        Whether ``labels`` are multi-label targets.

    Returns
    -------
    dict
        ``num_classes``, ``multilabel``, ``classes_present``, ``untrained_classes`` (a
        count), ``first_untrained`` (the first ids) and ``overlaps`` (``"train&test"``
        and the like: shared vertices, where there are any). Plain ints: ``meta.json``
        records it.
    """
    train = masks["train_mask"]
    if multilabel:
        positive = labels > 0.5
        present = positive.any(axis=0)
        trained = positive[train].any(axis=0)
    else:
        present = np.bincount(labels[labels >= 0], minlength=num_classes) > 0
        trained = np.bincount(labels[train & (labels >= 0)], minlength=num_classes) > 0
    untrained = np.flatnonzero(~trained[:num_classes])
    overlaps = {
        f"{first}&{second}": int((masks[f"{first}_mask"] & masks[f"{second}_mask"]).sum())
        for first, second in _SPLIT_PAIRS
    }
    return {
        "num_classes": int(num_classes),
        "multilabel": bool(multilabel),
        "classes_present": int(present.sum()),
        "untrained_classes": int(untrained.size),
        "first_untrained": [int(c) for c in untrained[:_NAMED_CLASSES]],
        "overlaps": {pair: count for pair, count in overlaps.items() if count},
    }


def label_notes(name: str, facts: Mapping[str, Any] | None) -> list[str]:
    """The sentences of :func:`label_facts` ``facts`` worth telling the person who trains
    ``name``: one class only, classes that no training vertex has, splits that share
    vertices (none for a graph prepared before the facts were recorded: ``None``)."""
    if not facts:
        return []
    notes = []
    subject = f"dataset {name!r}"
    if not facts["multilabel"] and facts["classes_present"] == 1:
        notes.append(
            f"{subject}: every labelled vertex has the same class, so a model that always "
            "predicts it is 1.0 accurate and the accuracies say nothing; check ndata['label']"
        )
    untrained = facts["untrained_classes"]
    if untrained:
        named = ", ".join(str(c) for c in facts["first_untrained"])
        more = ", ..." if untrained > len(facts["first_untrained"]) else ""
        which = f"{untrained} of the {facts['num_classes']}"
        if facts["multilabel"]:
            which += f" labels ({named}{more}) are on no training vertex"
        else:
            which += f" classes ({named}{more}) have no training vertex"
        notes.append(
            f"{subject}: {which}: the model cannot learn them, and their vertices in the "
            "other splits count as errors"
        )
    if facts["overlaps"]:
        shared = ", ".join(
            f"{pair.replace('&', '_mask and ')}_mask share {count:,} vertices"
            for pair, count in facts["overlaps"].items()
        )
        notes.append(
            f"{subject}: {shared}; a vertex in two splits is evaluated on what it was "
            "trained (or selected) on, so those accuracies are not independent"
        )
    return notes
