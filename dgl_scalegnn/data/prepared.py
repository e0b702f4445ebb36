"""Prepared graphs: relabelled, normalised, and stored as memory-mappable ``.npy`` files.

Preparing a :class:`~dgl_scalegnn.data.graph.NodeDataset`:

1. relabel vertices by a seeded random permutation (``new = permutation[old]``), so
   that contiguous vertex ranges, and hence the 2D blocks of every grid, carry
   balanced nonzeros;
2. normalise the whole graph (:func:`~dgl_scalegnn.data.normalize.gcn_normalize`)
   and store it in vertex-range tiles (:mod:`~dgl_scalegnn.data.tiles`);
3. keep features, labels and split masks in the new order.

Features holding NaN or infinities are refused there (:func:`non_finite_rows`), by the
in-memory and the bounded-memory preparation alike; a directory written without that
check is refused by each rank for the rows it reads (:class:`ChunkVerifier`).

On disk a prepared directory holds one ``.npy`` file per array and ``meta.json``
(format version, sizes, dtypes, shapes, byte counts and SHA-256 checksums). Arrays are
opened memory-mapped, so a rank reads only its row ranges and one directory serves
every grid shape.

Writing one never removes what a preparation did not write. The target must be absent,
empty, or a prepared directory holding only the files a preparation writes
(:func:`check_target`); the new one is written into a hidden sibling and swapped in
whole (:func:`install_directory`), so a failure at any point leaves the old one as it
was. Preparations into one target take turns through a lock beside it
(:func:`locked_target`), and a file system that refuses the writes (full, read-only,
not this user's) is a :class:`~dgl_scalegnn.errors.ResourceError` in one line
(:func:`writing_into`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dgl_scalegnn.data.graph import DatasetError, NodeDataset
from dgl_scalegnn.data.locks import FileLock, Holder
from dgl_scalegnn.data.normalize import gcn_normalize
from dgl_scalegnn.data.source import source_from_dataset
from dgl_scalegnn.data.tiles import TiledAdjacency, tile_adjacency
from dgl_scalegnn.errors import ResourceError

__all__ = [
    "FORMAT_VERSION",
    "ARRAY_NAMES",
    "GraphMeta",
    "PreparedGraph",
    "prepare_in_memory",
    "write_prepared",
    "array_entry",
    "PrepareTargetError",
    "NOT_WRITABLE_ERRNOS",
    "target_path",
    "check_target",
    "locked_target",
    "writing_into",
    "new_staging_directory",
    "install_directory",
    "open_prepared",
    "verify_prepared",
    "non_finite_rows",
    "non_finite_error",
]

#: 2: the adjacency's columns are also stored in row order (``row_indptr``, ``row_cols``).
FORMAT_VERSION = 2
#: Arrays of the adjacency (see :mod:`~dgl_scalegnn.data.tiles`) and of the vertices.
ADJACENCY_ARRAYS = ("offsets", "rows", "cols", "values", "degrees", "row_indptr", "row_cols")
VERTEX_ARRAYS = (
    "features",
    "labels",
    "train_mask",
    "val_mask",
    "test_mask",
    "permutation",
)
ARRAY_NAMES = ADJACENCY_ARRAYS + VERTEX_ARRAYS
#: Every name a prepared directory may hold (``cache.json``: the cache's record of it).
_WRITTEN_NAMES = frozenset({"meta.json", "cache.json", *(f"{name}.npy" for name in ARRAY_NAMES)})
#: Write errors that mean the file system will not take the files: full, over quota,
#: read-only, or not this user's to write.
NOT_WRITABLE_ERRNOS = (
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
)
#: NumPy's message for a write the file system took only part of.
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


class PrepareTargetError(DatasetError):
    """A target directory of a preparation that holds what no preparation writes."""


@dataclass(frozen=True)
class GraphMeta:
    """Sizes and provenance of a prepared graph.

    ``source_file`` identifies the ``dgl.save_graphs`` file it was prepared from
    (:func:`~dgl_scalegnn.data.datasets.file_identity`), which a run naming
    ``data.path`` is checked against; ``label_facts`` is what the run says once about
    the labels and split (:func:`~dgl_scalegnn.data.graph.label_facts`). Both are
    ``None`` for a directory prepared before they were recorded (and ``source_file``
    for the other loaders).
    """

    name: str
    num_nodes: int
    nnz: int
    num_features: int
    num_classes: int
    multilabel: bool
    permutation_seed: int
    tile_count: int
    split_sizes: dict[str, int]
    format_version: int = FORMAT_VERSION
    source_file: dict[str, Any] | None = None
    label_facts: dict[str, Any] | None = None


@dataclass(frozen=True)
class PreparedGraph:
    """A relabelled, normalised graph; arrays may be in memory or memory-mapped.

    ``adjacency`` is the tiled normalised adjacency; ``features`` ``(N, D_in)``
    float32, ``labels`` ``(N,)`` int64 or ``(N, C)`` float32, masks ``(N,)`` bool,
    ``permutation`` ``(N,)`` int64 with ``new_id = permutation[original_id]``.
    ``verifier`` checks the bytes a reader touches (memory-mapped graphs).
    """

    meta: GraphMeta
    adjacency: TiledAdjacency
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    permutation: np.ndarray
    verifier: Callable[[str, int, int], None] | None = None

    def verify(self, name: str, start: int, stop: int) -> None:
        """Check rows ``[start, stop)`` of array ``name`` (a no-op for in-memory graphs)."""
        if self.verifier is not None:
            self.verifier(name, start, stop)

    def arrays(self) -> dict[str, np.ndarray]:
        adjacency = {name: getattr(self.adjacency, name) for name in ADJACENCY_ARRAYS}
        return {**adjacency, **{name: getattr(self, name) for name in VERTEX_ARRAYS}}


def prepare_in_memory(
    dataset: NodeDataset, permutation_seed: int = 0, tile_count: int | None = None
) -> PreparedGraph:
    """Relabel and normalise ``dataset`` in memory (about 120 bytes per stored entry at
    the peak; :func:`~dgl_scalegnn.data.streaming.prepare_streaming` writes the same
    bytes to disk within a memory budget).

    Examples
    --------
    >>> from dgl_scalegnn.config import SyntheticConfig
    >>> from dgl_scalegnn.data.synthetic import generate
    >>> graph = prepare_in_memory(generate(SyntheticConfig(num_nodes=500)), permutation_seed=1)
    >>> graph.meta.num_nodes, graph.adjacency.offsets.shape
    (500, (65537,))
    """
    graph = dataset.graph
    ndata = graph.ndata
    bad = non_finite_rows(ndata["feat"].numpy())
    if bad.size:
        raise non_finite_error(f"dataset {dataset.name!r}", bad)
    num_nodes = graph.num_nodes()
    permutation = np.random.default_rng(permutation_seed).permutation(num_nodes).astype(np.int64)
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(num_nodes, dtype=np.int64)
    src, dst = (t.numpy() for t in graph.edges())
    adjacency = tile_adjacency(
        gcn_normalize(permutation[src], permutation[dst], num_nodes), tile_count
    )
    label_dtype = np.float32 if dataset.multilabel else np.int64
    meta = GraphMeta(
        name=dataset.name,
        num_nodes=num_nodes,
        nnz=adjacency.nnz,
        num_features=dataset.num_features,
        num_classes=dataset.num_classes,
        multilabel=dataset.multilabel,
        permutation_seed=permutation_seed,
        tile_count=adjacency.tile_count,
        split_sizes={s: int(ndata[f"{s}_mask"].sum()) for s in ("train", "val", "test")},
        **source_from_dataset(dataset).recorded_facts(),
    )
    return PreparedGraph(
        meta=meta,
        adjacency=adjacency,
        features=np.ascontiguousarray(ndata["feat"].numpy()[inverse], dtype=np.float32),
        labels=np.ascontiguousarray(ndata["label"].numpy()[inverse], dtype=label_dtype),
        **{
            mask: np.ascontiguousarray(ndata[mask].numpy()[inverse], dtype=np.bool_)
            for mask in ("train_mask", "val_mask", "test_mask")
        },
        permutation=permutation,
    )


def non_finite_rows(features: np.ndarray) -> np.ndarray:
    """Positions of the rows of ``features`` ``(N, D)`` that hold NaN or an infinity as
    float32 (the stored type: a float64 beyond its range counts), found a block of rows
    at a time (a mask of the whole array would take N * D bytes)."""
    step = max(1, (1 << 22) // max(1, features.shape[1]))
    found = []
    for start in range(0, features.shape[0], step):
        with np.errstate(over="ignore"):  # what overflows is what this looks for
            block = features[start : start + step].astype(np.float32, copy=False)
        found.append(start + np.flatnonzero(~np.isfinite(block).all(axis=1)))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def non_finite_error(
    where: str, vertices: np.ndarray, scope: str = "", then: str = "prepare the dataset again"
) -> DatasetError:
    """The refusal of features that hold NaN or infinities at ``vertices`` (ids of the
    source graph); ``scope`` says which vertices were looked at, if not all, and
    ``then`` what to do once the values are replaced."""
    count = f"{vertices.size} vert{'ex' if vertices.size == 1 else 'ices'}{scope}"
    return DatasetError(
        f"{where}: NaN or infinite features in {count} (the first: vertex "
        f"{int(vertices.min())}); replace those values (e.g. torch.nan_to_num) or remove "
        f"the vertices, then {then}"
    )


def _chunk_bytes(size: int) -> int:
    """Checksum granule of a file: about 1/1024 of it, in [64 KiB, 64 MiB]."""
    granule = 64 << 10
    wanted = -(-size // 1024)
    return min(64 << 20, max(granule, -(-wanted // granule) * granule))


def _digests(path: Path) -> dict:
    """SHA-256 of the whole file and CRC-32 of each chunk (what a rank re-checks)."""
    size = path.stat().st_size
    chunk = _chunk_bytes(size)
    digest, crcs = hashlib.sha256(), []
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
            crcs.append(zlib.crc32(block))
    return {"bytes": size, "sha256": digest.hexdigest(), "chunk_bytes": chunk, "crc32": crcs}


def array_entry(path: Path) -> dict:
    """The ``meta.json`` entry of a written ``.npy`` file: dtype, shape, size, checksums."""
    array = np.load(path, mmap_mode="r")
    dtype, shape = str(array.dtype), list(array.shape)
    del array
    return {"file": path.name, "dtype": dtype, "shape": shape, **_digests(path)}


def target_path(directory: str | os.PathLike[str]) -> Path:
    """The directory a preparation into ``directory`` writes: the one a symbolic link
    there points to (it is replaced, the link kept), else ``directory`` itself."""
    path = Path(directory)
    return path.resolve() if path.is_symlink() else path


def check_target(target: Path) -> None:
    """Refuse ``target`` unless it is absent, an empty directory, or a prepared directory
    holding only what a preparation writes (which may then be replaced).

    Raises
    ------
    PrepareTargetError
        If ``target`` is a file, or a directory holding anything else.
    """
    if not target.exists():
        return
    keep = "give a new or empty directory (nothing in this one is removed)"
    if not target.is_dir():
        raise PrepareTargetError(f"{target}: a file, not a directory to prepare into; {keep}")
    names = sorted(path.name for path in target.iterdir())
    foreign = [name for name in names if name not in _WRITTEN_NAMES]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise PrepareTargetError(
            f"{target}: holds {foreign[0]!r}{more}, which no preparation writes: it is not a "
            f"prepared directory to replace; {keep}"
        )
    if names and not _written_meta(target / "meta.json"):
        raise PrepareTargetError(
            f"{target}: holds {names[0]!r} but no meta.json of a prepared graph: it is not a "
            f"prepared directory to replace; {keep}"
        )


def _written_meta(path: Path) -> bool:
    """Whether ``path`` is the ``meta.json`` of a prepared directory (of any version)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and "format_version" in meta and "files" in meta


@contextmanager
def locked_target(target: Path) -> Iterator[None]:
    """Hold the lock of the preparations into ``target`` (``.NAME-prepare.lock`` beside
    it, apart from the staging directories ``.NAME.*``): a second preparation of the
    same target waits for the first, saying for whom."""

    def say_waiting(holder: Holder | None) -> None:
        who = f" ({holder.describe()})" if holder is not None else ""
        print(
            f"scalegnn: waiting for another preparation into {target}{who} to finish",
            file=sys.stderr,
            flush=True,
        )

    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(target.parent / f".{target.name}-prepare.lock")
    lock.acquire(on_wait=say_waiting)
    try:
        yield
    finally:
        lock.release()


@contextmanager
def writing_into(target: Path) -> Iterator[None]:
    """Say a file system that will not take a preparation's files (full, read-only, not
    this user's) in one line, a :class:`~dgl_scalegnn.errors.ResourceError`. NumPy
    writing to a full file system raises an ``OSError`` without an errno, saying only
    that it wrote less than it asked to (a short write to a file means a full disk)."""
    try:
        yield
    except OSError as error:
        if error.errno in NOT_WRITABLE_ERRNOS:
            reason = os.strerror(error.errno) + (f" ({error.filename})" if error.filename else "")
        elif error.errno is None and _SHORT_WRITE.fullmatch(str(error)):
            reason = f"{os.strerror(errno.ENOSPC)} (a write stopped short: {error})"
        else:
            raise
        raise ResourceError(
            f"cannot write the prepared directory {target}: {reason}; free space there or "
            "prepare onto a writable file system (a prepared directory already there is kept)"
        ) from None


def new_staging_directory(target: Path) -> Path:
    """A fresh hidden sibling of ``target`` to write into before :func:`install_directory`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))


def install_directory(staging: Path, target: Path, record: dict) -> Path:
    """Write ``meta.json`` (``record``) into ``staging`` and put it in the place of
    ``target``: an older prepared ``target`` is renamed aside first and removed once the
    new one is in place (put back if that fails), so readers see the old directory or
    the new, whole.

    Raises
    ------
    PrepareTargetError
        If ``target`` holds what no preparation writes (:func:`check_target`).
    """
    (staging / "meta.json").write_text(json.dumps(record, indent=2) + "\n")
    check_target(target)
    if not (target.is_dir() and any(target.iterdir())):
        staging.rename(target)  # an empty directory is replaced by the rename
        return target
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.replaced-", dir=target.parent))
    target.rename(aside)
    try:
        staging.rename(target)
    except BaseException:
        aside.rename(target)
        raise
    shutil.rmtree(aside)
    return target


def write_prepared(graph: PreparedGraph, directory: str | os.PathLike[str]) -> Path:
    """Write an in-memory prepared graph to ``directory`` (atomically; see
    :func:`check_target` for what it may replace).

    Raises
    ------
    PrepareTargetError
        If ``directory`` holds what no preparation writes.
    ResourceError
        If its file system does not take the files.
    """
    target = target_path(directory)
    with writing_into(target), locked_target(target):
        check_target(target)
        staging = new_staging_directory(target)
        try:
            files = {}
            for name, array in graph.arrays().items():
                np.save(staging / f"{name}.npy", array)
                files[name] = array_entry(staging / f"{name}.npy")
            return install_directory(staging, target, {**asdict(graph.meta), "files": files})
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


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
    if checksum and _digests(path)["sha256"] != entry["sha256"]:
        raise DatasetError(f"{path}: SHA-256 differs from meta.json (the file was changed)")


class ChunkVerifier:
    """Checks the bytes a rank reads against the chunk CRC-32s in ``meta.json``, and
    the features among them for NaN and infinities (a directory written without the
    preparation's check of them).

    Each chunk is checked once, the first time a read touches it, so a rank pays for
    its own share (plus partial chunks at the edges) and never hashes the whole graph.
    """

    def __init__(self, root: Path, files: dict, arrays: dict[str, np.memmap]) -> None:
        self._root, self._files, self._arrays = root, files, arrays
        self._verified: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str, start: int, stop: int) -> None:
        """Verify the chunks holding rows ``[start, stop)`` of array ``name``."""
        if stop <= start:
            return
        array, entry = self._arrays[name], self._files[name]
        row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
        first = (array.offset + start * row_bytes) // entry["chunk_bytes"]
        last = (array.offset + stop * row_bytes - 1) // entry["chunk_bytes"]
        path = self._root / entry["file"]
        non_finite = []
        with self._lock, path.open("rb") as handle:
            for chunk in range(first, last + 1):
                if (name, chunk) in self._verified:
                    continue
                handle.seek(chunk * entry["chunk_bytes"])
                data = handle.read(entry["chunk_bytes"])
                if zlib.crc32(data) != entry["crc32"][chunk]:
                    start_byte = chunk * entry["chunk_bytes"]
                    raise DatasetError(
                        f"{path}: bytes {start_byte}-{start_byte + entry['chunk_bytes'] - 1} "
                        "differ from their checksum in meta.json (the file was changed); "
                        f"prepare the dataset again or check it with scalegnn prepare --verify"
                    )
                if name == "features":
                    position = chunk * entry["chunk_bytes"]
                    non_finite.append(_non_finite_rows_in(data, position, array))
                self._verified.add((name, chunk))
        rows = np.unique(np.concatenate(non_finite)) if non_finite else np.zeros(0)
        if rows.size:
            vertices = np.flatnonzero(np.isin(self._arrays["permutation"], rows))
            raise non_finite_error(str(path), vertices, " among those this process reads")


def _non_finite_rows_in(data: bytes, position: int, array: np.memmap) -> np.ndarray:
    """Rows of ``array`` (float32 ``.npy``) with NaN or an infinity among ``data``, the
    file's bytes from ``position`` on (chunks are 64 KiB multiples: whole values)."""
    skip = max(0, array.offset - position)
    if skip >= len(data):
        return np.zeros(0, dtype=np.int64)
    values = np.frombuffer(data, dtype=array.dtype, offset=skip)
    first_value = (position + skip - array.offset) // array.dtype.itemsize
    return (first_value + np.flatnonzero(~np.isfinite(values))) // array.shape[1]


def open_prepared(directory: str | os.PathLike[str], *, checksum: bool = False) -> PreparedGraph:
    """Open a prepared directory with every array memory-mapped (read-only).

    Sizes and shapes are checked against ``meta.json`` at once; the returned graph's
    ``verifier`` checks the chunks a reader touches against their CRC-32s;
    ``checksum=True`` also hashes every whole file now (reads all bytes).
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
    graph_meta = GraphMeta(**{k: meta[k] for k in GraphMeta.__dataclass_fields__ if k in meta})
    verifier = ChunkVerifier(root, meta["files"], dict(arrays))
    adjacency = TiledAdjacency(
        num_nodes=graph_meta.num_nodes,
        tile_count=graph_meta.tile_count,
        **{name: arrays.pop(name) for name in ADJACENCY_ARRAYS},
    )
    return PreparedGraph(meta=graph_meta, adjacency=adjacency, verifier=verifier, **arrays)


def verify_prepared(directory: str | os.PathLike[str]) -> GraphMeta:
    """Check every file of a prepared directory (sizes, shapes, checksums, CSR sanity)."""
    graph = open_prepared(directory, checksum=True)
    meta, offsets = graph.meta, graph.adjacency.offsets
    root = Path(directory)
    if offsets.shape[0] != meta.tile_count**2 + 1 or offsets[0] != 0 or offsets[-1] != meta.nnz:
        raise DatasetError(
            f"{root / 'offsets.npy'}: does not span the {meta.nnz} stored entries "
            f"in {meta.tile_count}x{meta.tile_count} tiles"
        )
    if np.any(np.diff(offsets) < 0):
        raise DatasetError(f"{root / 'offsets.npy'}: tile offsets decrease")
    return meta
