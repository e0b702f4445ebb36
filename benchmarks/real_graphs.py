"""The public node-classification graphs committed under ``benchmarks/data/real/``.

Each graph is one compressed ``<name>.npz`` (see ``benchmarks/data/real/README.md`` for
the sources, licences, split rules and sizes) holding:

``src``, ``dst``
    int32, each undirected edge once (``src < dst``); the graph is used symmetrised.
``feat_indptr``, ``feat_indices``, ``feat_data``, ``feat_shape``
    the raw features as a CSR matrix (every source's features are sparse).
``label``
    int64 ``(N,)`` class of every vertex.
``train``, ``val``, ``test``
    int32 vertex ids of each split.

:func:`load_graph` turns one into a :class:`dgl.DGLGraph` with ``ndata`` ``feat``,
``label`` and the three masks; ``python -m benchmarks.real_graphs save NAME OUT.bin``
writes it with ``dgl.save_graphs`` (what ``scalegnn train --data OUT.bin`` reads);
``python -m benchmarks.real_graphs convert --sources DIR`` rebuilds the ``.npz`` files
from the source files (laid out in ``DIR`` as the README says).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import DataConfig
from dgl_scalegnn.data.datasets import load_dataset
from dgl_scalegnn.data.features import column_moments, scale_features
from dgl_scalegnn.data.graph import NodeDataset

__all__ = ["REAL", "RealGraph", "GRAPHS", "load_graph", "load", "scaled", "save", "main"]

#: Where the committed ``.npz`` files are.
REAL = Path(__file__).resolve().parent / "data" / "real"

#: The split of the Shchur et al. graphs: per class, 20 training and 30 validation
#: vertices drawn at random (seed 0); every other vertex is a test vertex.
PER_CLASS_TRAIN, PER_CLASS_VAL, SPLIT_SEED = 20, 30, 0


@dataclass(frozen=True)
class RealGraph:
    """One committed graph: its file stem, where it comes from and how it is split."""

    name: str
    source: str
    split: str
    heterophilous: bool = False


GRAPHS: dict[str, RealGraph] = {
    graph.name: graph
    for graph in (
        RealGraph("cora", "kimiyoung/planetoid (Planetoid files)", "public (Kipf & Welling)"),
        RealGraph("citeseer", "kimiyoung/planetoid (Planetoid files)", "public (Kipf & Welling)"),
        RealGraph("cora_ml", "klicperajo/ppnp ppnp/data/cora_ml.npz", "20/30 per class"),
        RealGraph("citeseer_full", "klicperajo/ppnp ppnp/data/citeseer.npz", "20/30 per class"),
        RealGraph("film", "graphdml-uiuc-jlu/geom-gcn new_data/film", "geom-gcn split 0", True),
        RealGraph(
            "cornell", "graphdml-uiuc-jlu/geom-gcn new_data/cornell", "geom-gcn split 0", True
        ),
        RealGraph("texas", "graphdml-uiuc-jlu/geom-gcn new_data/texas", "geom-gcn split 0", True),
        RealGraph(
            "wisconsin", "graphdml-uiuc-jlu/geom-gcn new_data/wisconsin", "geom-gcn split 0", True
        ),
    )
}


def load_graph(name: str) -> tuple[dgl.DGLGraph, int]:
    """The committed graph ``name`` (symmetrised, no self loops) and its class count.

    >>> graph, classes = load_graph("texas")
    >>> graph.num_nodes(), classes, sorted(graph.ndata)
    (183, 5, ['feat', 'label', 'test_mask', 'train_mask', 'val_mask'])
    """
    if name not in GRAPHS:
        raise ValueError(f"unknown real graph {name!r}; the graphs are {', '.join(GRAPHS)}")
    arrays = np.load(REAL / f"{name}.npz")
    num_nodes = int(arrays["feat_shape"][0])
    src = torch.from_numpy(arrays["src"].astype(np.int64))
    dst = torch.from_numpy(arrays["dst"].astype(np.int64))
    graph = dgl.graph((torch.cat((src, dst)), torch.cat((dst, src))), num_nodes=num_nodes)
    features = sp.csr_matrix(
        (arrays["feat_data"], arrays["feat_indices"], arrays["feat_indptr"]),
        shape=tuple(arrays["feat_shape"]),
    )
    graph.ndata["feat"] = torch.from_numpy(features.toarray().astype(np.float32))
    label = torch.from_numpy(arrays["label"].astype(np.int64))
    graph.ndata["label"] = label
    for split in ("train", "val", "test"):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[torch.from_numpy(arrays[split].astype(np.int64))] = True
        graph.ndata[f"{split}_mask"] = mask
    return graph, int(label.max()) + 1


def load(name: str) -> NodeDataset:
    """The committed graph ``name`` as a :class:`NodeDataset` (what the peers train on)."""
    graph, num_classes = load_graph(name)
    return NodeDataset(name=name, graph=graph, num_classes=num_classes)


def scaled(dataset: NodeDataset, norm: str) -> NodeDataset:
    """``dataset`` with its features scaled by ``norm`` (as ``data.feature_norm`` does)."""
    graph = dataset.graph.clone()
    features = graph.ndata["feat"].numpy()
    moments = column_moments([features]) if norm == "standardize" else None
    graph.ndata["feat"] = torch.from_numpy(scale_features(features, norm, moments))
    return NodeDataset(dataset.name, graph, dataset.num_classes)


def save(name: str, path: str | os.PathLike[str]) -> Path:
    """Write the graph ``name`` with ``dgl.save_graphs`` (its class count saved too)."""
    graph, num_classes = load_graph(name)
    dgl.save_graphs(str(path), [graph], {"num_classes": torch.tensor([num_classes])})
    return Path(path)


# --------------------------------------------------------------------------------------
# Conversion from the source files.
# --------------------------------------------------------------------------------------


def _undirected_pairs(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each undirected edge once as ``(low, high)``, self loops dropped."""
    low, high = np.minimum(src, dst), np.maximum(src, dst)
    keep = low != high
    pairs = np.unique(np.stack((low[keep], high[keep]), axis=1), axis=0)
    return pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32)


def _per_class_split(label: np.ndarray) -> dict[str, np.ndarray]:
    """:data:`PER_CLASS_TRAIN` / :data:`PER_CLASS_VAL` vertices per class, the rest test."""
    rng = np.random.default_rng(SPLIT_SEED)
    train, val = [], []
    for cls in np.unique(label):
        members = rng.permutation(np.flatnonzero(label == cls))
        train.append(members[:PER_CLASS_TRAIN])
        val.append(members[PER_CLASS_TRAIN : PER_CLASS_TRAIN + PER_CLASS_VAL])
    train_ids, val_ids = np.sort(np.concatenate(train)), np.sort(np.concatenate(val))
    test_ids = np.setdiff1d(np.arange(label.shape[0]), np.concatenate((train_ids, val_ids)))
    return {"train": train_ids, "val": val_ids, "test": test_ids}


def _write(name: str, src, dst, features: sp.spmatrix, label, splits) -> None:
    src, dst = _undirected_pairs(np.asarray(src), np.asarray(dst))
    features = sp.csr_matrix(features, dtype=np.float32)
    features.sum_duplicates()
    np.savez_compressed(
        REAL / f"{name}.npz",
        src=src,
        dst=dst,
        feat_indptr=features.indptr.astype(np.int32),
        feat_indices=features.indices.astype(np.int32),
        feat_data=features.data,
        feat_shape=np.asarray(features.shape, dtype=np.int64),
        label=np.asarray(label, dtype=np.int64),
        **{split: np.asarray(ids, dtype=np.int32) for split, ids in splits.items()},
    )


def _convert_planetoid(name: str, sources: Path) -> None:
    """Read ``sources/planetoid/ind.<name>.*`` with DGL's dataset class (public split)."""
    os.environ.setdefault("SCALEGNN_CACHE_DIR", tempfile.mkdtemp(prefix="scalegnn-cache-"))
    graph = load_dataset(DataConfig(name=name, root=str(sources))).graph
    src, dst = (t.numpy() for t in graph.edges())
    splits = {s: np.flatnonzero(graph.ndata[f"{s}_mask"].numpy()) for s in ("train", "val", "test")}
    # DGL's class row-normalises the features; the Planetoid files hold 0/1 (kept raw)
    feat = sp.csr_matrix(graph.ndata["feat"].numpy() > 0)
    _write(name, src, dst, feat, graph.ndata["label"].numpy(), splits)


def _convert_shchur(name: str, sources: Path) -> None:
    """A graph in Shchur et al.'s ``.npz`` format (``sources/<name>.npz``), split per class."""
    arrays = np.load(sources / f"{name}.npz", allow_pickle=False)

    def csr(prefix: str) -> sp.csr_matrix:
        parts = (arrays[f"{prefix}.{key}"] for key in ("data", "indices", "indptr"))
        return sp.csr_matrix(tuple(parts), shape=tuple(arrays[f"{prefix}.shape"]))

    adjacency = csr("adj_matrix").tocoo()
    label = arrays["labels"].astype(np.int64)
    _write(name, adjacency.row, adjacency.col, csr("attr_matrix"), label, _per_class_split(label))


def _convert_geom_gcn(name: str, sources: Path) -> None:
    """geom-gcn's ``out1_graph_edges.txt``, ``out1_node_feature_label.txt`` and split 0."""
    directory = sources / name
    rows = [
        line.split("\t")
        for line in (directory / "out1_node_feature_label.txt").read_text().splitlines()[1:]
    ]
    ids = np.asarray([int(row[0]) for row in rows])
    label = np.empty(len(rows), dtype=np.int64)
    label[ids] = [int(row[2]) for row in rows]
    if name == "film":  # the feature column lists the indices of the ones (932 features)
        cells = [(i, int(f)) for i, row in zip(ids, rows, strict=True) for f in row[1].split(",")]
        r, c = np.asarray(cells).T
        features = sp.csr_matrix((np.ones(len(cells)), (r, c)), shape=(len(rows), 932)) > 0
    else:  # a dense 0/1 row
        dense = np.zeros((len(rows), len(rows[0][1].split(","))), dtype=np.float32)
        dense[ids] = [[float(v) for v in row[1].split(",")] for row in rows]
        features = sp.csr_matrix(dense)
    edges = np.loadtxt(directory / "out1_graph_edges.txt", skiprows=1, dtype=np.int64)
    split = np.load(directory / f"{name}_split_0.6_0.2_0.npz")
    splits = {s: np.flatnonzero(split[f"{s}_mask"]) for s in ("train", "val", "test")}
    _write(name, edges[:, 0], edges[:, 1], features, label, splits)


_CONVERTERS: dict[str, Callable[[str, Path], None]] = {
    "cora": _convert_planetoid,
    "citeseer": _convert_planetoid,
    "cora_ml": _convert_shchur,
    "citeseer_full": _convert_shchur,
    "film": _convert_geom_gcn,
    "cornell": _convert_geom_gcn,
    "texas": _convert_geom_gcn,
    "wisconsin": _convert_geom_gcn,
}


def main(argv: list[str] | None = None) -> int:
    """``save NAME OUT`` or ``convert --sources DIR [NAME ...]`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    save_command = commands.add_parser("save", help="write a graph with dgl.save_graphs")
    save_command.add_argument("name", choices=list(GRAPHS))
    save_command.add_argument("out")
    convert = commands.add_parser("convert", help="rebuild the .npz files from the sources")
    convert.add_argument("--sources", required=True, type=Path)
    convert.add_argument("names", nargs="*", default=list(GRAPHS))
    args = parser.parse_args(argv)
    if args.command == "save":
        print(f"wrote {save(args.name, args.out)}")
        return 0
    for name in args.names:
        _CONVERTERS[name](name, args.sources)
        print(f"wrote {REAL / f'{name}.npz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
