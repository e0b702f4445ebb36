"""Prepared graphs: relabelled, normalised, and stored as memory-mappable ``.npy`` files.

Preparing a :class:`~dgl_scalegnn.data.graph.NodeDataset`:

1. relabel vertices by a seeded random permutation (``new = permutation[old]``), so
   that contiguous vertex ranges, and hence the 2D blocks of every grid, carry
   balanced nonzeros;
2. normalise the whole graph (:func:`~dgl_scalegnn.data.normalize.gcn_normalize`);
3. keep features, labels and split masks in the new order.

On disk a prepared directory holds one ``.npy`` file per array and ``meta.json``
(format version, sizes, dtypes, shapes, byte counts and SHA-256 checksums). Arrays are
opened memory-mapped, so a rank reads only its row ranges and one directory serves
every grid shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dgl_scalegnn.data.graph import DatasetError, NodeDataset
from dgl_scalegnn.data.normalize import gcn_normalize

__all__ = [
    "FORMAT_VERSION",
    "ARRAY_NAMES",
    "GraphMeta",
    "PreparedGraph",
    "prepare_in_memory",
    "write_prepared",
    "open_prepared",
    "verify_prepared",
]

FORMAT_VERSION = 1
ARRAY_NAMES = (
    "indptr",
    "indices",
    "values",
    "degrees",
    "features",
    "labels",
    "train_mask",
    "val_mask",
    "test_mask",
    "permutation",
)
_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class GraphMeta:
    """Sizes and provenance of a prepared graph."""

    name: str
    num_nodes: int
    nnz: int
    num_features: int
    num_classes: int
    multilabel: bool
    permutation_seed: int
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class PreparedGraph:
    """A relabelled, normalised graph; arrays may be in memory or memory-mapped.

    ``indptr`` ``(N+1,)`` int64, ``indices`` ``(nnz,)`` int64, ``values`` ``(nnz,)``
    float32, ``degrees`` ``(N,)`` int64 (of :math:`A+I`), ``features`` ``(N, D_in)``
    float32, ``labels`` ``(N,)`` int64 or ``(N, C)`` float32, masks ``(N,)`` bool,
    ``permutation`` ``(N,)`` int64 with ``new_id = permutation[original_id]``.
    """

    meta: GraphMeta
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    degrees: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    permutation: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAY_NAMES}


def prepare_in_memory(dataset: NodeDataset, permutation_seed: int = 0) -> PreparedGraph:
    """Relabel and normalise ``dataset`` in memory.

    Examples
    --------
    >>> from dgl_scalegnn.config import SyntheticConfig
    >>> from dgl_scalegnn.data.synthetic import generate
    >>> graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=500)), permutation_seed=1)
    >>> graph.meta.num_nodes, graph.indptr.shape
    (500, (501,))
    """
    graph = dataset.graph
    num_nodes = graph.num_nodes()
    permutation = np.random.default_rng(permutation_seed).permutation(num_nodes).astype(np.int64)
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(num_nodes, dtype=np.int64)
    src, dst = (t.numpy() for t in graph.edges())
    csr = gcn_normalize(permutation[src], permutation[dst], num_nodes)
    ndata = graph.ndata
    labels = ndata["label"].numpy()
    meta = GraphMeta(
        name=dataset.name,
        num_nodes=num_nodes,
        nnz=csr.nnz,
        num_features=dataset.num_features,
        num_classes=dataset.num_classes,
        multilabel=dataset.multilabel,
        permutation_seed=permutation_seed,
    )
    return PreparedGraph(
        meta=meta,
        indptr=csr.indptr,
        indices=csr.indices,
        values=csr.values,
        degrees=csr.degrees,
        features=np.ascontiguousarray(ndata["feat"].numpy()[inverse], dtype=np.float32),
        labels=np.ascontiguousarray(labels[inverse]).astype(
            np.float32 if dataset.multilabel else np.int64
        ),
        train_mask=ndata["train_mask"].numpy()[inverse],
        val_mask=ndata["val_mask"].numpy()[inverse],
        test_mask=ndata["test_mask"].numpy()[inverse],
        permutation=permutation,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def write_prepared(graph: PreparedGraph, directory: str | os.PathLike[str]) -> Path:
    """Write ``graph`` to ``directory`` atomically (a temporary sibling, then a rename)."""
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        files = {}
        for name, array in graph.arrays().items():
            path = staging / f"{name}.npy"
            np.save(path, array)
            files[name] = {
                "file": path.name,
                "dtype": str(array.dtype),
                "shape": list(array.shape),
                "bytes": path.stat().st_size,
                "sha256": _sha256(path),
            }
        meta = {**asdict(graph.meta), "files": files}
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _read_meta(directory: Path) -> dict:
    meta_path = directory / "meta.json"
    if not directory.is_dir():
        raise DatasetError(f"prepared directory {str(directory)!r} does not exist")
    if not meta_path.is_file():
        raise DatasetError(f"{meta_path}: missing; is {str(directory)!r} a prepared directory?")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(f"{meta_path}: not valid JSON ({error})") from None
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise DatasetError(
            f"{meta_path}: format version {version!r}, this dgl_scalegnn reads version "
            f"{FORMAT_VERSION}; prepare the dataset again with `scalegnn prepare`"
        )
    missing = [name for name in ARRAY_NAMES if name not in meta.get("files", {})]
    if missing:
        raise DatasetError(f"{meta_path}: no entry for {', '.join(missing)}")
    return meta


def _check_file(directory: Path, entry: dict, checksum: bool) -> None:
    path = directory / entry["file"]
    if not path.is_file():
        raise DatasetError(f"{path}: missing from the prepared directory")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DatasetError(
            f"{path}: {size} bytes, meta.json records {entry['bytes']} (truncated or replaced)"
        )
    if checksum and _sha256(path) != entry["sha256"]:
        raise DatasetError(f"{path}: SHA-256 differs from meta.json (the file was changed)")


def open_prepared(directory: str | os.PathLike[str], *, checksum: bool = False) -> PreparedGraph:
    """Open a prepared directory with every array memory-mapped (read-only).

    Sizes are always checked against ``meta.json``; ``checksum=True`` also hashes every
    file (reads all bytes).
    """
    root = Path(directory)
    meta = _read_meta(root)
    arrays = {}
    for name in ARRAY_NAMES:
        entry = meta["files"][name]
        _check_file(root, entry, checksum)
        path = root / entry["file"]
        try:
            array = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as error:
            raise DatasetError(f"{path}: not a readable .npy file ({error})") from None
        if list(array.shape) != entry["shape"] or str(array.dtype) != entry["dtype"]:
            raise DatasetError(
                f"{path}: holds {array.dtype}{list(array.shape)}, meta.json records "
                f"{entry['dtype']}{entry['shape']}"
            )
        arrays[name] = array
    fields = {k: meta[k] for k in GraphMeta.__dataclass_fields__}
    return PreparedGraph(meta=GraphMeta(**fields), **arrays)


def verify_prepared(directory: str | os.PathLike[str]) -> GraphMeta:
    """Check every file of a prepared directory (sizes, shapes, checksums, CSR sanity)."""
    graph = open_prepared(directory, checksum=True)
    meta = graph.meta
    root = Path(directory)
    if graph.indptr[0] != 0 or graph.indptr[-1] != meta.nnz:
        raise DatasetError(f"{root / 'indptr.npy'}: does not span the {meta.nnz} stored entries")
    if graph.indptr.shape[0] != meta.num_nodes + 1:
        raise DatasetError(f"{root / 'indptr.npy'}: length differs from num_nodes + 1")
    return meta
