"""Dataset loaders: each graph is read by DGL's or OGB's own dataset class from local files.

No loader ever downloads: the files a class would fetch are checked first, and a missing
one raises :class:`~dgl_scalegnn.data.graph.DatasetError` naming its path. ``<root>`` is
``data.root`` or ``$SCALEGNN_DATA_ROOT``; ``<cache>`` is ``$SCALEGNN_CACHE_DIR`` or
``dgl_scalegnn`` in the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``).

On-disk layouts
---------------
``cora``, ``citeseer``, ``pubmed`` (:class:`dgl.data.CoraGraphDataset` and siblings)
    ``<root>/planetoid/ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``, the Planetoid
    files. DGL reads them from ``RAW_DIR/<dgl name>_<url hash>/ind.<dgl name>.*``, where
    the directory is ``cora_v2_d697a464``, ``citeseer_d6836239`` or ``pubmed_35464cad``
    (the hash is of DGL's download URL, so it follows ``$DGL_REPO``). The files are linked
    (or copied) into ``<cache>/<name>/<fingerprint>/<that directory>/``, where DGL also
    writes its processed cache, so the data root may be read-only. ``<fingerprint>``
    hashes the source paths, sizes and modification times: changed files are re-read.
    DGL unpickles its processed ``.pkl`` from there, so every directory of that path is
    checked private (:func:`~dgl_scalegnn.cache_dir.default_cache_dir`) before DGL runs.
``reddit`` (:class:`dgl.data.RedditDataset`)
    ``<root>/reddit/reddit_data.npz`` and ``<root>/reddit/reddit_graph.npz`` (the contents
    of DGL's ``reddit.zip``), staged like the above as ``<cache>/reddit/<fingerprint>/
    reddit_69f818f5/``. DGL reorders the vertices (reverse Cuthill-McKee) when it builds
    the graph.
``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M`` (``DglNodePropPredDataset``)
    OGB's own layout under ``<root>/ogbn_arxiv``, ``<root>/ogbn_products``,
    ``<root>/ogbn_papers100M`` (or the same name with ``_dgl`` appended, which OGB
    prefers when present): the unzipped download renamed to that directory. It holds
    ``RELEASE_v1.txt``, ``split/<split>/{train,valid,test}.csv.gz`` (or
    ``split/<split>/split_dict.pt``) and the raw files of :data:`OGB_LAYOUTS`, which are
    not needed once OGB has written ``processed/dgl_data_processed`` there (so the
    directory must be writable on the first load). That file is read by
    ``dgl.load_graphs`` (DGL's binary format, no pickle), and ``split_dict.pt`` by
    ``torch.load`` with ``weights_only``: neither can run code.
``dgl``
    ``data.path``, a file written by ``dgl.save_graphs(path, [g], labels)``; the first
    graph is used (its features and labels are ``ndata[data.feat_key]`` and
    ``ndata[data.label_key]``, by default ``feat`` and ``label``), with
    ``labels["num_classes"]`` when saved (a one-element tensor such as
    ``torch.tensor([7])``: DGL 2.1.0 loses the value of a 0-dim tensor). A file that
    does not begin with DGL's magic number is refused before DGL reads it. The dataset
    records the file's identity (:func:`file_identity`: path, size, modification time,
    SHA-256), which a graph prepared from it keeps.
``synthetic``
    :func:`dgl_scalegnn.data.synthetic.generate` with ``data.synthetic``.

Every loader ends in the same checks and conversions as :func:`dataset_from_graph`;
then the features are scaled by ``data.feature_norm``
(:mod:`~dgl_scalegnn.data.features`). Labels are read as users write them
(:func:`as_labels`): class ids ``(N,)`` or ``(N, 1)`` (as OGB gives them), integer or
float, with NaN or ``-1`` for an unlabelled vertex, or 0/1 multi-label targets
``(N, C)``. Inferred class ids must be dense: ids up to more than twice the number of
distinct ones are refused (a model of 3,000,001 classes for 4 labels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cache_dir import default_cache_dir
from dgl_scalegnn.config import DATASET_NAMES, DataConfig, SyntheticConfig, registry
from dgl_scalegnn.data.featureless import recipe_node_data
from dgl_scalegnn.data.features import column_moments, scale_features, scaled_source
from dgl_scalegnn.data.graph import REQUIRED_NDATA, DatasetError, NodeDataset
from dgl_scalegnn.data.source import GraphSource, source_from_dataset
from dgl_scalegnn.errors import InputError

__all__ = [
    "OGB_LAYOUTS",
    "OgbLayout",
    "as_labels",
    "as_trained",
    "check_homogeneous",
    "dataset_from_graph",
    "file_identity",
    "holds_recorded_file",
    "load_dataset",
    "load_source",
    "read_graph_file",
    "source_files",
]

_MASK_KEYS = ("train_mask", "val_mask", "test_mask")
_PLANETOID_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
_REDDIT_FILES = ("reddit_data.npz", "reddit_graph.npz")


# --------------------------------------------------------------------------------------
# Shared checks: every loader's graph goes through _to_node_dataset.
# --------------------------------------------------------------------------------------


def dataset_from_graph(
    graph: dgl.DGLGraph, name: str = "dgl", num_classes: int | None = None
) -> NodeDataset:
    """Wrap an in-memory graph as a :class:`NodeDataset`.

    Parameters
    ----------
    graph : dgl.DGLGraph
        A graph with one node type and ``ndata`` ``feat``, ``label``, ``train_mask``,
        ``val_mask`` and ``test_mask``. It is not modified: the dataset holds a shallow
        clone whose node data are converted.
    name : str
        The dataset name.
    num_classes : int, optional
        Number of classes; inferred when omitted (largest label plus one, or the number
        of columns of ``(N, C)`` 0/1 multi-label targets).

    Returns
    -------
    NodeDataset
        ``feat`` float32, ``label`` int64 ``(N,)`` (``-1`` for unlabelled vertices) or
        float32 ``(N, C)``, masks bool.

    Raises
    ------
    DatasetError
        If node data are missing or cannot be converted, a mask selects an unlabelled
        vertex, or a label does not fit ``num_classes``.
    """
    return _to_node_dataset(graph, name, num_classes, source=f"graph {name!r}")


def _to_node_dataset(
    graph: dgl.DGLGraph, name: str, num_classes: int | None, source: str
) -> NodeDataset:
    """Check and convert the node data of ``graph``; ``source`` names it in errors."""
    _check_node_data(graph, source)
    graph = graph.clone()
    graph.ndata["feat"] = _as_features(graph.ndata["feat"], source)
    for key in _MASK_KEYS:
        graph.ndata[key] = _as_mask(graph.ndata[key], key, source)
    written = graph.ndata["label"]
    label, multilabel = as_labels(written, source)
    graph.ndata["label"] = label
    if num_classes is None:
        num_classes = _infer_num_classes(label, multilabel, source)
    _check_labels(graph, written, int(num_classes), multilabel, source)
    return NodeDataset(name=name, graph=graph, num_classes=int(num_classes), multilabel=multilabel)


def check_homogeneous(graph: dgl.DGLGraph, subject: str, error: type[InputError]) -> None:
    """Refuse a heterograph (several node or edge types) in one ``error`` beginning
    with ``subject``: a node dataset, and a model's input, has one of each."""
    if len(graph.ntypes) != 1 or len(graph.canonical_etypes) != 1:
        raise error(
            f"{subject} has node types {graph.ntypes} and edge types {graph.etypes}; a node "
            "dataset needs one of each (convert it with dgl.to_homogeneous(graph, ndata=[...]))"
        )


def _check_node_data(graph: dgl.DGLGraph, source: str) -> None:
    check_homogeneous(graph, source, DatasetError)
    missing = [key for key in REQUIRED_NDATA if key not in graph.ndata]
    if missing:
        raise DatasetError(
            f"{source}: graph.ndata lacks {', '.join(repr(key) for key in missing)}; "
            f"set graph.ndata[key] for each of {', '.join(REQUIRED_NDATA)}"
        )


def _as_features(feat: torch.Tensor, source: str) -> torch.Tensor:
    if feat.dim() != 2:
        raise DatasetError(
            f"{source}: ndata['feat'] has shape {tuple(feat.shape)}; expected (N, D)"
        )
    return feat.to(torch.float32)


def _as_mask(mask: torch.Tensor, key: str, source: str) -> torch.Tensor:
    if mask.dim() != 1:
        raise DatasetError(f"{source}: ndata[{key!r}] has shape {tuple(mask.shape)}; expected (N,)")
    if mask.dtype == torch.bool:
        return mask
    if not _is_zero_one(mask):
        raise DatasetError(f"{source}: ndata[{key!r}] holds values other than 0/1; use a bool mask")
    return mask.to(torch.bool)


def _is_zero_one(values: torch.Tensor) -> bool:
    return bool(((values == 0) | (values == 1)).all())


def as_labels(
    label: torch.Tensor, source: str, key: str = "label", error: type[InputError] = DatasetError
) -> tuple[torch.Tensor, bool]:
    """Labels as users write them, in the form training reads: class ids ``(N,)`` or
    ``(N, 1)`` (integer, or float with NaN for an unlabelled vertex) become int64
    ``(N,)`` with ``-1`` unlabelled; 0/1 targets ``(N, C)`` become float32 multi-label
    targets. Returns them and whether they are multi-label.

    Raises
    ------
    InputError
        ``error`` beginning with ``source`` and naming ``ndata[key]``: another shape,
        non-integer class ids, ids below ``-1``, or multi-label targets not 0/1.
    """
    if label.dim() == 2 and label.shape[1] == 1:
        label = label[:, 0]
    if label.dim() == 1:
        return _as_class_indices(label, source, key, error), False
    if label.dim() == 2:
        if not _is_zero_one(label):
            raise error(
                f"{source}: ndata[{key!r}] of shape {tuple(label.shape)} is read as multi-label "
                "targets and must hold only 0/1; give class indices of shape (N,) otherwise"
            )
        return label.to(torch.float32), True
    raise error(
        f"{source}: ndata[{key!r}] has shape {tuple(label.shape)}; expected (N,) or (N, 1) "
        "class indices or (N, C) 0/1 multi-label targets"
    )


def _as_class_indices(
    label: torch.Tensor, source: str, key: str, error: type[InputError]
) -> torch.Tensor:
    """Int64 class indices; NaN (OGB's mark of an unlabelled vertex) becomes ``-1``."""
    if label.is_floating_point():
        unlabelled = torch.isnan(label)
        known = label[~unlabelled]
        if not bool((known == known.round()).all()):
            raise error(
                f"{source}: ndata[{key!r}] holds non-integer values; class labels must be "
                "whole numbers (NaN or -1 for unlabelled vertices)"
            )
        label = torch.where(unlabelled, torch.full_like(label, -1), label)
    label = label.to(torch.int64)
    if label.numel() and int(label.min()) < -1:
        raise error(
            f"{source}: ndata[{key!r}] holds {int(label.min())}; labels are class indices "
            "0..C-1, or -1 (or NaN) for an unlabelled vertex"
        )
    return label


def _infer_num_classes(label: torch.Tensor, multilabel: bool, source: str) -> int:
    """The classes of ``label``: its columns, or its largest class id plus one, refused
    where that is more than twice the ids it holds (sparse ids would make a class of
    every id below the largest)."""
    if multilabel:
        return int(label.shape[1])
    if label.numel() == 0 or int(label.max()) < 0:
        raise DatasetError(f"{source}: no vertex has a label, so the number of classes is unknown")
    ids = int(label.max()) + 1
    distinct = int(torch.unique(label[label >= 0]).numel())
    if ids > 2 * distinct:
        raise DatasetError(
            f"{source}: ndata['label'] holds {distinct:,} distinct class ids up to "
            f"{ids - 1:,}, which would make {ids:,} classes; renumber them 0..{distinct - 1} "
            "(torch.unique(label, return_inverse=True)[1]) and save the graph again"
        )
    return ids


def _check_labels(
    graph: dgl.DGLGraph, written: torch.Tensor, num_classes: int, multilabel: bool, source: str
) -> None:
    """Refuse labels that do not fit ``num_classes`` and masks that select unlabelled
    vertices, naming how the file marks them (``written``: the labels as given)."""
    label = graph.ndata["label"]
    if multilabel:
        if label.shape[1] != num_classes:
            raise DatasetError(
                f"{source}: num_classes is {num_classes} but the multi-label targets have "
                f"{label.shape[1]} columns; they must agree"
            )
        return
    largest = int(label.max()) if label.numel() else -1
    if largest >= num_classes:
        raise DatasetError(
            f"{source}: ndata['label'] holds class {largest} but num_classes is {num_classes}; "
            f"give num_classes of at least {largest + 1}"
        )
    for key in _MASK_KEYS:
        unlabelled = torch.nonzero(graph.ndata[key] & (label < 0)).flatten()
        if unlabelled.numel():
            marks = written.reshape(-1)[unlabelled]
            nan = bool(torch.isnan(marks).any()) if marks.is_floating_point() else False
            minus_one = bool((marks == -1).any())
            mark = " or ".join(m for m, present in (("NaN", nan), ("-1", minus_one)) if present)
            raise DatasetError(
                f"{source}: ndata[{key!r}] selects {unlabelled.numel()} unlabelled vertices "
                f"(label {mark}; the first: vertex {int(unlabelled[0])}); a mask may select "
                "labelled vertices only"
            )


# --------------------------------------------------------------------------------------
# Entry point and paths.
# --------------------------------------------------------------------------------------


def load_dataset(cfg: DataConfig) -> NodeDataset:
    """Load the dataset ``cfg.name`` from local files, never downloading.

    Parameters
    ----------
    cfg : DataConfig
        ``name`` picks the loader; ``root`` (or ``$SCALEGNN_DATA_ROOT``) is where the
        public datasets lie, ``path`` the file of ``name: dgl``, ``synthetic`` the
        generator's settings, ``feature_norm`` how the features are scaled
        (:mod:`~dgl_scalegnn.data.features`). The layouts are in the module docstring.

    Returns
    -------
    NodeDataset

    Raises
    ------
    DatasetError
        If the name is unknown, the root is unset or absent, a file is missing, or the
        data fail the checks of :func:`dataset_from_graph`.
    """
    loader = _LOADERS.get(cfg.name)
    if loader is None:
        raise DatasetError(
            f"data.name: unknown dataset {cfg.name!r}; known datasets are {', '.join(_LOADERS)}"
        )
    return as_trained(loader(cfg), cfg)


def as_trained(dataset: NodeDataset, cfg: DataConfig) -> NodeDataset:
    """``dataset`` as ``cfg`` trains it: with the featureless recipe's features where
    ``data.featureless`` asks for them, scaled by ``data.feature_norm``."""
    if cfg.featureless and cfg.name != "synthetic":  # the generator draws the recipe itself
        dataset.graph.ndata.update(
            recipe_node_data(dataset.graph, cfg.permutation_seed, with_labels=False)
        )
    norm = cfg.resolved_feature_norm()
    if norm != "none":
        features = dataset.graph.ndata["feat"].numpy()
        moments = column_moments([features]) if norm == "standardize" else None
        dataset.graph.ndata["feat"] = torch.from_numpy(scale_features(features, norm, moments))
    return dataset


def load_source(cfg: DataConfig) -> GraphSource:
    """The dataset ``cfg.name`` as a :class:`~dgl_scalegnn.data.source.GraphSource`.

    The synthetic generator's source holds only its edge keys and draws the features
    when they are read; every other loader builds its graph in memory first (see the
    module docstring), and the source reads from it.
    """
    if cfg.name == "synthetic":
        from dgl_scalegnn.data.synthetic import synthetic_source

        return scaled_source(synthetic_source(_synthetic_config(cfg)), cfg.resolved_feature_norm())
    return source_from_dataset(load_dataset(cfg))  # scaled by load_dataset


def source_files(cfg: DataConfig) -> list[Path]:
    """The files whose change makes a graph prepared from ``cfg`` stale.

    Planetoid and Reddit: their raw files; ``dgl``: ``data.path``; OGB: the release
    marker and the split files (what a new download replaces); synthetic: none (the
    config is the whole input).
    """
    if cfg.name == "synthetic":
        return []
    if cfg.name == "dgl":
        return [Path(cfg.path).expanduser()] if cfg.path else []
    root = _data_root(cfg)
    if cfg.name in ("cora", "citeseer", "pubmed"):
        return [root / "planetoid" / f"ind.{cfg.name}.{part}" for part in _PLANETOID_PARTS]
    if cfg.name == "reddit":
        return [root / "reddit" / file for file in _REDDIT_FILES]
    if cfg.name in OGB_LAYOUTS:
        layout = OGB_LAYOUTS[cfg.name]
        dataset_dir = _ogb_dataset_dir(root, cfg.name)
        split_dir = dataset_dir / "split" / layout.split
        splits = sorted(split_dir.iterdir()) if split_dir.is_dir() else []
        return [dataset_dir / layout.release_marker, *splits]
    return []


def _data_root(cfg: DataConfig) -> Path:
    root = cfg.resolved_root()
    if root is None:
        raise DatasetError(
            f"dataset {cfg.name!r} is read from a data root, and none is set; set data.root "
            "in the config or the SCALEGNN_DATA_ROOT environment variable"
        )
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DatasetError(
            f"dataset {cfg.name!r}: data root {str(path)!r} does not exist; set data.root or "
            "SCALEGNN_DATA_ROOT to the directory that holds the datasets"
        )
    return path


def _require_files(name: str, paths: list[Path], fix: str) -> None:
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise DatasetError(f"dataset {name!r}: missing file(s) {', '.join(missing)}; {fix}")


# --------------------------------------------------------------------------------------
# DGL builtin datasets (Planetoid citation graphs, Reddit).
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DglBuiltin:
    """How one of DGL's dataset classes names the directory of its raw files."""

    dgl_name: str  #: DGL's name of the dataset, the prefix of its raw directory
    relative_url: str  #: download URL relative to DGL's repository, hashed into the name
    class_name: str  #: the class in ``dgl.data``; it takes ``raw_dir`` and ``verbose``

    def raw_dirname(self) -> str:
        """``<dgl_name>_<hash>``: what ``DGLDataset.raw_path`` appends to ``raw_dir``."""
        url = dgl.data.utils._get_dgl_url(self.relative_url)
        return f"{self.dgl_name}_{hashlib.sha1(url.encode('utf-8')).hexdigest()[:8]}"

    def dataset(self, raw_dir: Path) -> dgl.data.DGLDataset:
        """DGL's dataset read from ``raw_dir`` (the class is named, not imported: DGL
        loads on first use)."""
        return getattr(dgl.data, self.class_name)(raw_dir=str(raw_dir), verbose=False)


_DGL_BUILTINS = {
    "cora": _DglBuiltin("cora_v2", "dataset/cora_v2.zip", "CoraGraphDataset"),
    "citeseer": _DglBuiltin("citeseer", "dataset/citeseer.zip", "CiteseerGraphDataset"),
    "pubmed": _DglBuiltin("pubmed", "dataset/pubmed.zip", "PubmedGraphDataset"),
    "reddit": _DglBuiltin("reddit", "dataset/reddit.zip", "RedditDataset"),
}


def _load_planetoid(cfg: DataConfig) -> NodeDataset:
    builtin = _DGL_BUILTINS[cfg.name]
    source_dir = _data_root(cfg) / "planetoid"
    files = {
        f"ind.{builtin.dgl_name}.{part}": source_dir / f"ind.{cfg.name}.{part}"
        for part in _PLANETOID_PARTS
    }
    fix = f"put the Planetoid files ind.{cfg.name}.* (kimiyoung/planetoid) in {source_dir}"
    return _load_dgl_builtin(cfg.name, builtin, files, fix)


def _load_reddit(cfg: DataConfig) -> NodeDataset:
    source_dir = _data_root(cfg) / "reddit"
    files = {file: source_dir / file for file in _REDDIT_FILES}
    fix = f"unzip DGL's reddit.zip (https://data.dgl.ai/dataset/reddit.zip) into {source_dir}"
    return _load_dgl_builtin(cfg.name, _DGL_BUILTINS["reddit"], files, fix)


def _load_dgl_builtin(
    name: str, builtin: _DglBuiltin, files: dict[str, Path], fix: str
) -> NodeDataset:
    """Stage ``files`` (DGL's name -> source path) where ``builtin`` looks, then load.

    DGL downloads only when its raw directory is absent, and staging creates it.
    """
    _require_files(name, list(files.values()), fix)
    raw_dirname = builtin.raw_dirname()
    raw_dir = _stage_raw_files(name, raw_dirname, files)
    dataset = builtin.dataset(raw_dir)
    source = f"dataset {name!r} ({raw_dir / raw_dirname})"
    return _to_node_dataset(dataset[0], name, dataset.num_classes, source)


def _stage_raw_files(name: str, raw_dirname: str, files: Mapping[str, Path]) -> Path:
    """Link ``files`` into ``<cache>/<name>/<fingerprint>/<raw_dirname>/``.

    Returns the ``<fingerprint>`` directory, DGL's ``raw_dir`` (and ``save_dir``: its
    processed files go to ``<raw_dirname>/`` too). The directory is built under a
    temporary name and renamed into place, so concurrent loaders (one per rank) either
    create it or find it complete; every directory is private to the user (0700).

    Raises
    ------
    ConfigError
        If a directory of that path is another user's or writable by others: DGL would
        unpickle what it finds there.
    """
    fingerprint = _fingerprint(raw_dirname, files)
    parent = default_cache_dir(name)
    staged = parent / fingerprint
    if (staged / raw_dirname).is_dir():
        default_cache_dir(name, fingerprint, raw_dirname)  # checks them before DGL loads
        return staged
    try:
        building = Path(tempfile.mkdtemp(prefix=".staging-", dir=parent))
        (building / raw_dirname).mkdir(mode=0o700)
        for target, path in files.items():
            _link_or_copy(path, building / raw_dirname / target)
    except OSError as error:
        raise DatasetError(
            f"dataset {name!r}: cannot write the cache directory {str(parent)!r} ({error}); "
            "set SCALEGNN_CACHE_DIR to a writable directory"
        ) from error
    try:
        building.rename(staged)
    except OSError:  # another process staged it first, or the rename failed
        shutil.rmtree(building, ignore_errors=True)
    if not (staged / raw_dirname).is_dir():  # DGL would download into it otherwise
        raise DatasetError(
            f"dataset {name!r}: could not create {str(staged / raw_dirname)!r}; "
            "set SCALEGNN_CACHE_DIR to a writable directory"
        )
    return staged


def _fingerprint(raw_dirname: str, files: Mapping[str, Path]) -> str:
    digest = hashlib.sha1(raw_dirname.encode("utf-8"))
    for target, path in sorted(files.items()):
        stat = path.stat()
        digest.update(f"{target}\0{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        target.symlink_to(source.resolve())
    except OSError:  # no symbolic links on this file system
        shutil.copyfile(source, target)


# --------------------------------------------------------------------------------------
# OGB node property prediction datasets.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OgbLayout:
    """The files ``ogb`` 1.3.6 reads for one ``ogbn-*`` dataset (see ``master.csv``)."""

    raw_files: tuple[str, ...]  #: under ``raw/``, read unless ``processed/`` is there
    split: str  #: the split directory under ``split/``
    version: int = 1  #: ``RELEASE_v<version>.txt`` marks a current download

    @property
    def release_marker(self) -> str:
        return f"RELEASE_v{self.version}.txt"


_OGB_CSV_GRAPH = ("edge.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz", "node-feat.csv.gz")

#: Per ``ogbn-*`` dataset, what :class:`ogb.nodeproppred.DglNodePropPredDataset` reads.
OGB_LAYOUTS = {
    "ogbn-arxiv": OgbLayout((*_OGB_CSV_GRAPH, "node_year.csv.gz", "node-label.csv.gz"), "time"),
    "ogbn-products": OgbLayout((*_OGB_CSV_GRAPH, "node-label.csv.gz"), "sales_ranking"),
    "ogbn-papers100M": OgbLayout(("data.npz", "node-label.npz"), "time"),
}

_OGB_PROCESSED = Path("processed") / "dgl_data_processed"
_OGB_SPLIT_FILES = ("train.csv.gz", "valid.csv.gz", "test.csv.gz")
_OGB_SPLIT_KEYS = {"train": "train_mask", "valid": "val_mask", "test": "test_mask"}


def _load_ogb(cfg: DataConfig) -> NodeDataset:
    root = _data_root(cfg)
    dataset_dir = _ogb_dataset_dir(root, cfg.name)
    _check_ogb_layout(cfg.name, dataset_dir, OGB_LAYOUTS[cfg.name])

    from ogb.nodeproppred import DglNodePropPredDataset

    dataset = DglNodePropPredDataset(name=cfg.name, root=str(root))
    # OGB may torch.load split/<split>/split_dict.pt, which can hold numpy arrays: since
    # torch 2.6 that needs numpy allowed for weights_only loading, here and only here.
    with torch.serialization.safe_globals(_numpy_pickle_globals()):
        split = dataset.get_idx_split()
    graph, labels = dataset[0]
    graph.ndata["label"] = labels
    graph.ndata.update(_masks_from_split(split, graph.num_nodes()))
    source = f"dataset {cfg.name!r} ({dataset_dir})"
    return _to_node_dataset(graph, cfg.name, dataset.num_classes, source)


def _ogb_dataset_dir(root: Path, name: str) -> Path:
    """``<root>/ogbn_<x>``, or ``<root>/ogbn_<x>_dgl`` when present (OGB prefers it)."""
    plain = root / name.replace("-", "_")
    suffixed = plain.with_name(plain.name + "_dgl")
    return suffixed if suffixed.exists() else plain


def _check_ogb_layout(name: str, dataset_dir: Path, layout: OgbLayout) -> None:
    """Refuse every state in which OGB would download or prompt on stdin."""
    if not dataset_dir.is_dir():
        raise DatasetError(
            f"dataset {name!r}: directory {str(dataset_dir)!r} does not exist; unzip OGB's "
            f"download into {str(dataset_dir.parent)!r} and rename its folder to "
            f"{dataset_dir.name!r}"
        )
    marker = dataset_dir / layout.release_marker
    _require_files(
        name,
        [marker],
        "without it OGB takes the download for outdated and asks on stdin to replace it; "
        f"restore {marker.name} from OGB's download",
    )
    if not (dataset_dir / _OGB_PROCESSED).is_file():
        raw = [dataset_dir / "raw" / file for file in layout.raw_files]
        _require_files(
            name, raw, "ogb would try to download the dataset; restore them from its zip"
        )
        if not os.access(dataset_dir, os.W_OK):
            raise DatasetError(
                f"dataset {name!r}: ogb writes {dataset_dir / _OGB_PROCESSED} on the first load "
                f"and {str(dataset_dir)!r} is not writable; load it once with write access"
            )
    split_dir = dataset_dir / "split" / layout.split
    if not (split_dir / "split_dict.pt").is_file():
        _require_files(
            name, [split_dir / file for file in _OGB_SPLIT_FILES], "restore OGB's split files"
        )


def _numpy_pickle_globals() -> list:
    """What ``torch.load(weights_only=True)`` must allow to rebuild pickled numpy arrays."""
    reconstruct = np.zeros(0).__reduce__()[0]
    dtype_classes = [type(np.dtype(code)) for code in "?bhilqBHILQefdg"]
    return [
        reconstruct,
        (reconstruct, "numpy.core.multiarray._reconstruct"),  # as numpy 1.x pickled it
        np.ndarray,
        np.dtype,
        *dtype_classes,
    ]


def _masks_from_split(split: Mapping[str, object], num_nodes: int) -> dict[str, torch.Tensor]:
    masks = {}
    for part, key in _OGB_SPLIT_KEYS.items():
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[torch.as_tensor(split[part], dtype=torch.int64)] = True
        masks[key] = mask
    return masks


# --------------------------------------------------------------------------------------
# Graph files written by dgl.save_graphs, and the synthetic generator.
# --------------------------------------------------------------------------------------


def _load_dgl_file(cfg: DataConfig) -> NodeDataset:
    if not cfg.path:
        raise DatasetError(
            "dataset 'dgl': data.path is unset; give the file written by dgl.save_graphs"
        )
    path = Path(cfg.path).expanduser()
    fix = "set data.path to a file written by dgl.save_graphs(path, [graph])"
    graph, saved = read_graph_file(path, "dataset 'dgl'", fix, DatasetError)
    num_classes = _saved_num_classes(saved, path)
    graph = _renamed_node_data(graph, cfg, path)
    if cfg.featureless and not {"feat", "label"} <= set(graph.ndata):
        # The recipe stands in for what the graph lacks; load_dataset draws the features.
        recipe = recipe_node_data(graph, cfg.permutation_seed, "label" not in graph.ndata)
        graph.ndata.update({k: v for k, v in recipe.items() if k not in graph.ndata})
    dataset = _to_node_dataset(graph, cfg.name, num_classes, f"file {str(path)!r}")
    return dataclasses.replace(dataset, source_file=file_identity(path))


def file_identity(path: Path) -> dict[str, Any]:
    """What identifies the file ``path``: its resolved path, size, modification time
    (ns) and SHA-256, as a prepared graph and a checkpoint record it."""
    resolved = path.expanduser().resolve()
    digest = hashlib.sha256()
    with resolved.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    stat = resolved.stat()
    return {
        "path": str(resolved),
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": digest.hexdigest(),
    }


def holds_recorded_file(path: Path, recorded: Mapping[str, Any]) -> bool:
    """Whether the file ``path`` holds the bytes of the file :func:`file_identity`
    ``recorded``: read and hashed only where its size matches and its path or
    modification time does not (a copy, or a file touched or rewritten)."""
    resolved = path.expanduser().resolve()
    stat = resolved.stat()
    if stat.st_size != recorded["bytes"]:
        return False
    if str(resolved) == recorded["path"] and stat.st_mtime_ns == recorded["mtime_ns"]:
        return True
    return file_identity(resolved)["sha256"] == recorded["sha256"]


def read_graph_file(
    path: Path, subject: str, fix: str, error: type[InputError]
) -> tuple[dgl.DGLGraph, dict[str, torch.Tensor]]:
    """The first graph of the ``dgl.save_graphs`` file ``path`` and the labels saved
    with it. A missing file, one that is not DGL's (checked by its magic number before
    DGL's C++ reader sees it) or one DGL cannot read is one ``error`` beginning with
    ``subject`` and ending with ``fix``."""
    if path.is_dir():
        prepared = (path / "meta.json").is_file()
        hint = " (a prepared directory is given as data.prepared)" if prepared else ""
        raise error(f"{subject}: {str(path)!r} is a directory, not a graph file{hint}; {fix}")
    if not path.is_file():
        raise error(f"{subject}: file {str(path)!r} does not exist; {fix}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(_DGL_MAGIC))
    except OSError as cause:
        raise error(f"{subject}: cannot read {str(path)!r} ({cause})") from None
    if magic != _DGL_MAGIC:
        what = "empty" if not magic else "does not begin with DGL's magic number"
        raise error(f"{subject}: {str(path)!r} is not a DGL graph file ({what}); {fix}")
    try:
        graphs, saved = dgl.load_graphs(str(path), [0])
    except Exception as cause:  # DGL raises DGLError or assertion errors on a bad file
        raise error(
            f"{subject}: {str(path)!r} is not a readable DGL graph file "
            f"({_first_line(cause)}); {fix}"
        ) from None
    return graphs[0], saved


def _renamed_node_data(graph: dgl.DGLGraph, cfg: DataConfig, path: Path) -> dgl.DGLGraph:
    """``graph`` with ``ndata[cfg.feat_key]`` as ``feat`` and ``ndata[cfg.label_key]`` as
    ``label`` (the keys the loader checks), when the user named other keys."""
    for key, wanted in (("feat_key", "feat"), ("label_key", "label")):
        named = getattr(cfg, key)
        if named == wanted:
            continue
        if named not in graph.ndata:
            present = ", ".join(repr(k) for k in graph.ndata) or "none"
            raise DatasetError(
                f"file {str(path)!r}: data.{key} is {named!r}, but the graph has no such node "
                f"data (its ndata keys: {present}); set data.{key} to one of them"
            )
        graph.ndata[wanted] = graph.ndata.pop(named)
    return graph


#: The first bytes of a ``dgl.save_graphs`` file (``kDGLSerializeMagic``, little-endian).
_DGL_MAGIC = (0xDD2E4FF046B4A13F).to_bytes(8, "little")
#: DGL's C++ errors begin with ``[hh:mm:ss] /path/to/source.cc:123: ``.
_DGL_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def _first_line(error: Exception) -> str:
    """What a DGL error says, without its C++ log prefix and stack trace."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return _DGL_LOG_PREFIX.sub("", lines[0]).strip()


def _saved_num_classes(saved: Mapping[str, torch.Tensor], path: Path) -> int | None:
    """``saved["num_classes"]`` as an int, or None when it was not saved.

    DGL 2.1.0 writes a 0-dim label tensor without its value (it reads back as garbage),
    so only a one-element 1-D tensor is accepted.
    """
    value = saved.get("num_classes")
    if value is None:
        return None
    fix = "save it as a one-element tensor, e.g. {'num_classes': torch.tensor([7])}"
    if value.dim() != 1 or value.numel() != 1:
        raise DatasetError(
            f"file {str(path)!r}: saved label 'num_classes' has shape {tuple(value.shape)} "
            f"(dgl.save_graphs does not keep 0-dim tensors); {fix}"
        )
    num_classes = value.item()
    if num_classes != int(num_classes) or num_classes < 1:
        raise DatasetError(f"file {str(path)!r}: saved label 'num_classes' is {num_classes}; {fix}")
    return int(num_classes)


def _synthetic_config(cfg: DataConfig) -> SyntheticConfig:
    """The generator's settings; ``data.featureless`` turns on its own recipe."""
    if cfg.featureless and not cfg.synthetic.featureless:
        return dataclasses.replace(cfg.synthetic, featureless=True)
    return cfg.synthetic


def _load_synthetic(cfg: DataConfig) -> NodeDataset:
    from dgl_scalegnn.data.synthetic import generate

    return generate(_synthetic_config(cfg))


_LOADERS: dict[str, Callable[[DataConfig], NodeDataset]] = registry(
    "data.name",
    DATASET_NAMES,
    {
        "cora": _load_planetoid,
        "citeseer": _load_planetoid,
        "pubmed": _load_planetoid,
        "ogbn-arxiv": _load_ogb,
        "ogbn-products": _load_ogb,
        "ogbn-papers100M": _load_ogb,
        "reddit": _load_reddit,
        "dgl": _load_dgl_file,
        "synthetic": _load_synthetic,
    },
)
