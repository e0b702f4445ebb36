"""A trained model to take away: one file from a sharded checkpoint, and inference with it.

:func:`export_checkpoint` gathers the parameter shards of a checkpoint written on any
grid (:mod:`~dgl_scalegnn.train.checkpoint`, every rank file verified; given a run's
directory, the newest that verifies, naming on stderr the newer ones it refused) into one file
that :func:`torch.load` reads with ``weights_only=True``: the model section, the
dataset's shapes (features, classes, single- or multi-label), the whole parameters,
and the input transform training applied: ``data.feature_norm`` (with the columns'
mean and standard deviation over the training graph for ``standardize``) or the
featureless recipe. The file records which checkpoint, grid and step it came from.

:func:`load_model` returns an :class:`ExportedModel`, a :class:`torch.nn.Module` on one
process with no grid: given a :class:`dgl.DGLGraph` it applies the same input transform
and the GCN normalisation of the graph (symmetrised, one self loop a vertex,
:math:`\\hat D^{-1/2} (A + I) \\hat D^{-1/2}`) and runs the full-graph forward of the
single-process model (:class:`~dgl_scalegnn.model.reference.ScaleGNN`, the parallel
model's oracle). Its logits are in the graph's own vertex order. It refuses what training
refuses: a heterograph, NaN or infinite features, and labels of the other kind than the
model's (multi-label targets for a single-label model, and the reverse); class ids
``(N, 1)`` are read as ``(N,)``.

Example
-------
After ``scalegnn export --checkpoint runs/cora/checkpoints --out cora.pt``::

    import dgl
    from dgl_scalegnn.train.export import load_model

    model = load_model("cora.pt")
    (graph,), _ = dgl.load_graphs("cora.bin")
    logits = model(graph)             # (N, C), in the graph's vertex order
    classes = model.predict(graph)    # (N,) class ids ((N, C) booleans if multi-label)
    model.accuracy(graph, logits)     # {"train": 0.98, "val": 0.79, "test": 0.81}
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ConfigError, DataConfig, ModelConfig, config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.datasets import as_labels, check_homogeneous, load_source, read_graph_file
from dgl_scalegnn.data.featureless import recipe_node_data
from dgl_scalegnn.data.features import column_moments, scale_features
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.data.prepared import non_finite_error, non_finite_rows
from dgl_scalegnn.errors import InputError
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.model.stack import layer_kind, parameter_shards
from dgl_scalegnn.sampling.dgl_loader import norm_graph
from dgl_scalegnn.train.checkpoint import (
    Checkpoint,
    ResumeChoice,
    _assemble,
    _model_section,
    choose_checkpoint,
    read_checkpoint,
)
from dgl_scalegnn.train.outputs import TORCH_FILE, check_output, write_output

__all__ = [
    "ExportError",
    "ExportedModel",
    "export_checkpoint",
    "load_model",
    "read_graph",
    "FORMAT",
]

#: What an exported file says it is, and the version of its layout.
FORMAT = "dgl_scalegnn.model"
VERSION = 1
_SPLITS = ("train", "val", "test")


class ExportError(InputError, ValueError):
    """A checkpoint, model file or graph that cannot be exported or predicted on."""


def _checkpoint(path: Path) -> ResumeChoice:
    """The checkpoint at ``path``: a ``step_*`` directory, or the newest that verifies in
    a checkpoints directory (``output.dir/checkpoints``) or an ``output.dir``, with the
    newer ones refused on the way."""
    if (path / "meta.json").is_file():
        return ResumeChoice(read_checkpoint(path), {})
    for root in (path, path / "checkpoints"):
        if (root / "latest").is_file() or any(root.glob("step_*")):
            choice = choose_checkpoint(root)
            if choice.checkpoint is not None:
                return choice
    raise ExportError(
        f"--checkpoint {path}: no checkpoint there; give a step_* directory, the checkpoints "
        "directory holding them (output.dir/checkpoints) or the run's output.dir"
    )


def _dataset_shape(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> tuple[int, int]:
    """Features and classes of the dataset the parameters' global shapes were made for."""
    first = "input_proj" if cfg.input_projection else "layer0_weight"
    last = "head" if cfg.head else f"layer{cfg.layers - 1}_weight"
    if first not in shapes or last not in shapes:
        raise KeyError(first if first not in shapes else last)
    return shapes[first][0], shapes[last][1]


def _parameters(
    checkpoint: Checkpoint, cfg: ModelConfig
) -> tuple[dict[str, torch.Tensor], int, int]:
    """The whole parameters of ``checkpoint``, and the feature and class counts."""
    saved = {name: tuple(s["global_shape"]) for name, s in checkpoint.meta["shards"].items()}
    try:
        in_features, num_classes = _dataset_shape(cfg, saved)
    except KeyError as missing:
        raise ExportError(
            f"{checkpoint.path}: records no parameter {missing} that its model section "
            "implies; export a checkpoint written by scalegnn train"
        ) from None
    shards = parameter_shards(cfg, in_features, num_classes)
    expected = {name: tuple(shard.global_shape) for name, shard in shards.items()}
    if expected != saved:
        raise ExportError(
            f"{checkpoint.path}: its parameters {sorted(saved.items())} are not those of its "
            f"model section ({sorted(expected.items())}); export a checkpoint written by "
            "scalegnn train"
        )
    grid = GridShape.parse(checkpoint.meta["grid"])
    params = {
        name: _assemble(checkpoint.records, grid, shard, lambda r, n=name: r["params"][n])
        for name, shard in shards.items()
    }
    return params, in_features, num_classes


def _input_transform(data: DataConfig, in_features: int, num_classes: int) -> dict[str, Any]:
    """How training turned the graph's features into the model's input; reads the
    training graph (unscaled) for its label kind and, to standardise, its columns' moments."""
    norm = data.resolved_feature_norm()
    try:
        source = load_source(dataclasses.replace(data, feature_norm="none", prepared=None))
    except DatasetError as error:
        raise ExportError(
            f"export reads the training graph for its label kind and feature scaling: {error}"
        ) from None
    if (source.num_features, source.num_classes) != (in_features, num_classes):
        raise ExportError(
            f"data.name {data.name!r}: the training graph has {source.num_features} features "
            f"and {source.num_classes} classes, the checkpoint's model {in_features} and "
            f"{num_classes}; export where data.root/data.path name the graph it was trained on"
        )
    mean, std = column_moments(source.feature_blocks()) if norm == "standardize" else (None, None)
    return {
        "feature_norm": norm,
        "mean": None if mean is None else torch.from_numpy(mean),
        "std": None if std is None else torch.from_numpy(std),
        "featureless": data.featureless,
        "permutation_seed": data.permutation_seed,
        "feat_key": data.feat_key,
        "label_key": data.label_key,
        "multilabel": source.multilabel,
    }


def export_checkpoint(
    checkpoint: str | os.PathLike[str], out: str | os.PathLike[str]
) -> dict[str, Any]:
    """Gather ``checkpoint`` (a ``step_*`` directory, a checkpoints directory or an
    ``output.dir``) into the single file ``out``; returns what was written. Newer
    checkpoints that do not verify are said on stderr in one line, with why, as
    ``--resume`` says them.

    Raises
    ------
    ExportError
        No checkpoint at ``checkpoint``, parameters that are not its model's, or a
        training graph that cannot be read (its label kind and feature scaling are
        recorded) or is not the one the model was trained on.
    CheckpointError
        A checkpoint that does not verify (:func:`~dgl_scalegnn.train.checkpoint.read_checkpoint`).
    OutputError
        ``out`` is a file of the checkpoint or the training graph, in a checkpoint
        directory, a directory or a file of another kind
        (:func:`~dgl_scalegnn.train.outputs.check_output`).
    ResourceError
        ``out`` cannot be written (it is then left as it was).
    """
    choice = _checkpoint(Path(checkpoint))
    found = choice.checkpoint
    note = choice.note("exporting")
    if note is not None:
        print(f"scalegnn: {note}", file=sys.stderr, flush=True)
    config = found.meta["config"]
    training_graph = config.get("data", {}).get("path")
    inputs = [("checkpoint", found.path), ("training graph file", training_graph)]
    check_output(out, "--out", TORCH_FILE, inputs)
    cfg = ModelConfig(**_model_section(config.get("model", {}), found.path))
    params, in_features, num_classes = _parameters(found, cfg)
    try:
        data = config_from_mapping({"data": config.get("data", {})}).data
    except ConfigError as error:
        raise ExportError(f"{found.path}: meta.json's data section: {error}") from None
    record = {
        "format": FORMAT,
        "version": VERSION,
        "model": asdict(cfg),
        "in_features": in_features,
        "num_classes": num_classes,
        "seed": int(config.get("train", {}).get("seed", 0)),
        "input": _input_transform(data, in_features, num_classes),
        "params": params,
        "source": {
            "checkpoint": str(found.path),
            "grid": found.meta["grid"],
            "global_step": int(found.meta["progress"]["global_step"]),
            "dataset": data.name,
            "refused": choice.refused,
        },
    }
    write_output(out, "--out", lambda file: torch.save(record, file))
    return record


class ExportedModel(nn.Module):
    """A model written by :func:`export_checkpoint`, on one process: full-graph inference
    on a :class:`dgl.DGLGraph` with the input transform and normalisation of training."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__()
        self.record = record
        self.input = record["input"]
        self.multilabel = bool(self.input["multilabel"])
        self.model = ScaleGNN(
            ModelConfig(**record["model"]),
            in_features=record["in_features"],
            num_classes=record["num_classes"],
            seed=record["seed"],
        )
        with torch.no_grad():
            for name, value in record["params"].items():
                self.model.params[name].copy_(value)
        self.eval()

    def features(self, graph: dgl.DGLGraph) -> torch.Tensor:
        """The model's input for ``graph``: its features (or the featureless recipe's),
        scaled as in training."""
        transform = self.input
        if transform["featureless"]:
            return recipe_node_data(graph, transform["permutation_seed"], with_labels=False)["feat"]
        key = transform["feat_key"]
        if key not in graph.ndata:
            present = ", ".join(repr(k) for k in graph.ndata) or "none"
            raise ExportError(
                f"the graph has no ndata[{key!r}] with the features (its ndata keys: {present}); "
                f"set graph.ndata[{key!r}] to the (N, {self.record['in_features']}) features"
            )
        raw = graph.ndata[key]
        if raw.dim() != 2 or raw.shape[1] != self.record["in_features"]:
            raise ExportError(
                f"ndata[{key!r}] has shape {tuple(raw.shape)}; the model reads "
                f"(N, {self.record['in_features']}) features"
            )
        moments = None
        if transform["feature_norm"] == "standardize":
            moments = (transform["mean"].numpy(), transform["std"].numpy())
        scaled = scale_features(raw.numpy(), transform["feature_norm"], moments)
        bad = non_finite_rows(scaled)
        if bad.size:  # as training refuses them: their logits would be NaN
            raise non_finite_error(f"ndata[{key!r}]", bad, then="predict again")
        return torch.from_numpy(np.ascontiguousarray(scaled))

    @torch.no_grad()
    def forward(self, graph: dgl.DGLGraph) -> torch.Tensor:
        """``(N, C)`` logits of every vertex of ``graph``, in its vertex order."""
        check_homogeneous(graph, "the graph", ExportError)
        normalisation = layer_kind(self.model.cfg).normalisation
        normalized = norm_graph(
            dgl.graph(graph.edges(), num_nodes=graph.num_nodes()), normalisation
        )
        return self.model(normalized, self.features(graph))

    def classes(self, logits: torch.Tensor) -> torch.Tensor:
        """The predictions of ``logits``: class ids ``(N,)``, or ``(N, C)`` booleans for a
        multi-label model."""
        return logits > 0 if self.multilabel else logits.argmax(dim=1)

    def predict(self, graph: dgl.DGLGraph) -> torch.Tensor:
        """:meth:`classes` of the logits of ``graph``."""
        return self.classes(self(graph))

    def labels(self, graph: dgl.DGLGraph) -> torch.Tensor | None:
        """``ndata[label_key]`` of ``graph`` read as training reads labels
        (:func:`~dgl_scalegnn.data.datasets.as_labels`: ``(N, 1)`` class ids as ``(N,)``,
        NaN as ``-1``), or ``None`` without labels.

        Raises
        ------
        ExportError
            Labels of the other kind than the model's (multi-label targets for a
            single-label model, or the reverse), or targets of another class count.
        """
        check_homogeneous(graph, "the graph", ExportError)
        key = self.input["label_key"]
        if key not in graph.ndata:
            return None
        written = graph.ndata[key]
        labels, multilabel = as_labels(written, "the graph", key, ExportError)
        classes = self.record["num_classes"]
        if multilabel != self.multilabel:
            given = "0/1 multi-label targets" if multilabel else "class ids"
            wanted = f"(N, {classes}) 0/1 targets" if self.multilabel else "class ids (N,)"
            raise ExportError(
                f"ndata[{key!r}] holds {given} of shape {tuple(written.shape)}, but the model "
                f"is {'multi' if self.multilabel else 'single'}-label and is scored against "
                f"{wanted}; give the labels it was trained on, or remove ndata[{key!r}]"
            )
        if multilabel and labels.shape[1] != classes:
            raise ExportError(
                f"ndata[{key!r}] holds {labels.shape[1]} labels a vertex, the model {classes}; "
                f"give the labels it was trained on, or remove ndata[{key!r}]"
            )
        return labels

    def accuracy(self, graph: dgl.DGLGraph, logits: torch.Tensor) -> dict[str, float]:
        """Accuracy (micro-F1 if multi-label) per split whose mask ``graph`` has, against
        :meth:`labels`; empty without labels."""
        labels = self.labels(graph)
        if labels is None:
            return {}
        scores = {}
        for split in _SPLITS:
            mask = graph.ndata.get(f"{split}_mask")
            if mask is None or not bool(mask.bool().any()):
                continue
            mask = mask.bool()
            if self.multilabel:
                predicted, truth = logits[mask] > 0, labels[mask] > 0.5
                true_pos = 2 * int((predicted & truth).sum())
                scores[split] = true_pos / max(1, true_pos + int((predicted ^ truth).sum()))
            else:
                correct = logits[mask].argmax(dim=1) == labels[mask]
                scores[split] = int(correct.sum()) / int(mask.sum())
        return scores


def load_model(path: str | os.PathLike[str]) -> ExportedModel:
    """The model :func:`export_checkpoint` wrote to ``path`` (read with
    ``weights_only=True``), ready for inference.

    Raises
    ------
    ExportError
        A missing file, or one that is not an exported model of this version.
    """
    fix = "give a file written by scalegnn export"
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ExportError(f"--model {path}: no such file; {fix}") from None
    except Exception as error:  # torch raises pickle, zip and unpickling errors alike
        raise ExportError(
            f"--model {path}: not a model file ({type(error).__name__}); {fix}"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ExportError(f"--model {path}: not a model written by scalegnn export; {fix}")
    if record.get("version") != VERSION:
        raise ExportError(
            f"--model {path}: format version {record.get('version')}, this version reads "
            f"{VERSION}; export the checkpoint again"
        )
    return ExportedModel(record)


def read_graph(path: str | os.PathLike[str]) -> dgl.DGLGraph:
    """The first graph of a ``dgl.save_graphs`` file.

    Raises
    ------
    ExportError
        A missing file, one that is not DGL's, or one DGL cannot read.
    """
    fix = "give a file written by dgl.save_graphs(path, [graph])"
    return read_graph_file(Path(path), "--graph", fix, ExportError)[0]
