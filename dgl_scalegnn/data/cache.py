"""Prepared graphs cached on disk, so that training without ``data.prepared`` never
builds the whole graph on every rank.

A cached graph lives in ``<cache>/prepared/<name>-<key>/`` (``<cache>`` is
:func:`~dgl_scalegnn.cache_dir.default_cache_dir`, private to the user), where ``<key>``
hashes every setting that changes the prepared bytes (:func:`cache_settings`, which
includes the package version). Next to ``meta.json`` it holds ``cache.json``: those
settings and the size and modification time of each source file
(:func:`~dgl_scalegnn.data.datasets.source_files`). Outside it, beside its lock,
``<name>-<key>.sha256`` keeps the SHA-256 of both as they were written, so that a
directory moved into its place (even a sound prepared graph with its own records) is
not taken for it.

In a job of several processes, the first process of each node (local rank 0) takes a
lock (``<name>-<key>.lock``, a :class:`~dgl_scalegnn.data.locks.FileLock`), removes the
staging directories that a killed preparation of the same key left (while the lock is
held, nothing else writes them), reuses the directory if ``cache.json`` matches, the
SHA-256 kept beside the lock match, and the files open with the sizes ``meta.json``
records, and otherwise prepares it
(:func:`~dgl_scalegnn.data.streaming.prepare_streaming`, into a temporary sibling
renamed into place) and says why. It then posts the path in the rendezvous store; the
other processes of its node poll for it, their watchdogs running, so a failure while
preparing stops every rank with its message. Every rank then memory-maps the directory
and reads its share, checking the chunk checksums of what it reads. With a cache
directory shared by several nodes, their first processes take turns through the lock and
only the first one prepares.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

import dgl_scalegnn
from dgl_scalegnn.cache_dir import default_cache_dir
from dgl_scalegnn.config import DataConfig
from dgl_scalegnn.data.datasets import load_source, source_files
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.data.locks import FileLock
from dgl_scalegnn.data.prepared import FORMAT_VERSION, open_prepared
from dgl_scalegnn.data.streaming import DEFAULT_MEMORY_GB, MemoryBudget, prepare_streaming

__all__ = [
    "cache_settings",
    "cache_directory",
    "cache_problem",
    "prepare_cached",
    "shared_prepared_directory",
    "MEMORY_ENV",
]

#: Environment variable: the working memory (GiB) of the rank that prepares the cache.
MEMORY_ENV = "SCALEGNN_PREPARE_MEMORY_GB"
_RECORD = "cache.json"
#: The files whose SHA-256 are kept outside the directory (meta.json holds the arrays').
_PINNED = ("meta.json", _RECORD)


def cache_settings(cfg: DataConfig) -> dict:
    """Everything that decides the prepared bytes, apart from the source files' contents.

    Examples
    --------
    >>> from dgl_scalegnn.config import DataConfig
    >>> settings = cache_settings(DataConfig(name="synthetic", permutation_seed=3))
    >>> settings["permutation_seed"], settings["synthetic"]["num_nodes"]
    (3, 20000)
    """
    settings: dict = {
        "dgl_scalegnn": dgl_scalegnn.__version__,  # a new version may prepare differently
        "format_version": FORMAT_VERSION,
        "name": cfg.name,
        "permutation_seed": cfg.permutation_seed,
        "featureless": cfg.featureless,
        "feature_norm": cfg.resolved_feature_norm(),
        "feat_key": cfg.feat_key,
        "label_key": cfg.label_key,
    }
    if cfg.name == "synthetic":
        settings["synthetic"] = asdict(cfg.synthetic)
    elif cfg.name == "dgl":
        settings["path"] = str(Path(cfg.path).expanduser().resolve()) if cfg.path else None
    else:
        root = cfg.resolved_root()
        settings["root"] = str(Path(root).expanduser().resolve()) if root else None
    return settings


def cache_directory(cfg: DataConfig) -> Path:
    """``<cache>/prepared/<name>-<16 hex digits of the settings' SHA-256>``.

    Raises
    ------
    ConfigError
        If the cache directory or its ``prepared/`` is not private (see
        :func:`~dgl_scalegnn.cache_dir.default_cache_dir`).
    """
    text = json.dumps(cache_settings(cfg), sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return default_cache_dir("prepared") / f"{cfg.name}-{key}"


def _record(cfg: DataConfig) -> dict:
    sources = {}
    for path in source_files(cfg):
        if path.is_file():
            stat = path.stat()
            sources[str(path)] = [stat.st_size, stat.st_mtime_ns]
    return {"settings": cache_settings(cfg), "sources": sources}


def _digest_path(directory: Path) -> Path:
    """Where the SHA-256 of ``directory``'s records are kept: beside its lock."""
    return directory.parent / f"{directory.name}.sha256"


def _digests(directory: Path) -> dict[str, str | None]:
    """SHA-256 of each file of :data:`_PINNED` in ``directory`` (None: missing)."""
    return {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        if (directory / name).is_file()
        else None
        for name in _PINNED
    }


def cache_problem(directory: Path, cfg: DataConfig) -> str | None:
    """Why ``directory`` cannot serve ``cfg`` (absent, interrupted, stale, damaged,
    replaced), or None when it can."""
    if not directory.is_dir():
        return "absent"
    record_path = directory / _RECORD
    try:
        record = json.loads(record_path.read_text())
    except (OSError, json.JSONDecodeError):
        return f"{record_path} is missing or unreadable (an interrupted preparation)"
    if record != _record(cfg):
        return f"stale: {record_path} records other settings or source files than these"
    try:
        open_prepared(directory)
    except DatasetError as error:
        return f"damaged: {error}"
    digest_path = _digest_path(directory)
    try:
        kept = json.loads(digest_path.read_text())
    except (OSError, json.JSONDecodeError):
        return (
            f"no SHA-256 of its records kept in {digest_path} (prepared by an older "
            "version, or interrupted)"
        )
    if kept != _digests(directory):
        return (
            f"replaced: its {' or '.join(_PINNED)} differs from the SHA-256 kept in "
            f"{digest_path} when it was prepared (another directory was moved there)"
        )
    return None


def _say(message: str) -> None:
    print(f"scalegnn: {message}", file=sys.stderr, flush=True)


def prepare_cached(cfg: DataConfig, budget: MemoryBudget | None = None) -> Path:
    """The cache directory of ``cfg``, reused if sound, prepared (again) otherwise.

    Raises
    ------
    DatasetError
        If the cache directory cannot be written, or the dataset cannot be loaded.
    """
    directory = cache_directory(cfg)
    try:
        lock = directory.parent / f"{directory.name}.lock"
        lock.touch(mode=0o600)
    except OSError as error:
        raise DatasetError(
            f"cannot write the cache directory {str(directory.parent)!r} ({error}); set "
            "SCALEGNN_CACHE_DIR to a writable directory, or prepare the dataset with "
            "`scalegnn prepare` and set data.prepared"
        ) from error
    with FileLock(lock, mode=0o600):
        _remove_staging(directory)
        problem = cache_problem(directory, cfg)
        if problem is None:
            _say(f"reusing the prepared {cfg.name!r} in {directory}")
            return directory
        if problem != "absent":
            _say(f"preparing {directory} again: {problem}")
        record = _record(cfg)  # before loading: a change made meanwhile shows up next time
        _say(f"preparing {cfg.name!r} into {directory} (once; later runs reuse it)")
        prepare_streaming(
            load_source(cfg), directory, cfg.permutation_seed, budget=budget or _budget()
        )
        _write_atomically(directory / _RECORD, json.dumps(record, indent=2) + "\n")
        _write_atomically(_digest_path(directory), json.dumps(_digests(directory)) + "\n")
    return directory


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)


def _remove_staging(directory: Path) -> None:
    """Remove the staging siblings of ``directory``
    (:func:`~dgl_scalegnn.data.prepared.new_staging_directory`): with the lock held,
    each was left by a preparation that was killed."""
    for staging in directory.parent.glob(f".{directory.name}.*"):
        if staging.is_dir():
            size = sum(path.stat().st_size for path in staging.rglob("*") if path.is_file())
            shutil.rmtree(staging)
            _say(
                f"removed {staging} ({size / 2**20:.1f} MiB), left by a preparation of "
                f"{directory.name} that did not finish"
            )


def _budget() -> MemoryBudget:
    value = os.environ.get(MEMORY_ENV, str(DEFAULT_MEMORY_GB))
    try:
        return MemoryBudget.gigabytes(float(value))
    except ValueError:
        raise DatasetError(
            f"{MEMORY_ENV}: got {value!r}; give the preparation's working memory in GiB, "
            f"e.g. {DEFAULT_MEMORY_GB:g}"
        ) from None


def shared_prepared_directory(cfg: DataConfig, store, local_rank: int) -> Path:
    """The prepared directory for every rank of a job: the first rank of each node
    prepares or reuses it, the others of that node poll the rendezvous ``store``."""
    key = f"prepared-cache/{socket.gethostname()}/{cache_directory(cfg).name}"
    if local_rank == 0:
        directory = prepare_cached(cfg)
        store.set(key, str(directory))
        return directory
    while not store.check([key]):
        time.sleep(0.5)  # the watchdog ends this process if the preparing rank fails
    return Path(store.get(key).decode())
