"""Checkpoints that survive crashes, refuse damage and resume on any grid shape.

Layout of ``DIR`` (``output.dir/checkpoints``)::

    latest                    name of the last published checkpoint (replaced atomically)
    step_00000120/
        meta.json             grid, progress, config, the graph's fingerprint, parameter
                              global shapes/splits, and the size and SHA-256 of every
                              rank file
        rank00003.pt          one file per rank of data-parallel group 0: its parameter
                              shards and their Adam state (``torch.load(weights_only=True)``)
    step_00000120.1/          a later checkpoint of the same step (a resumed run that
                              reached it again): published beside the one it replaces
    step_00000130.partial/    being written, or abandoned by a crash (pruned)
    step_00000110.nonfinite/  set aside: its state diverges at the next step (kept to
                              inspect; never resumed from, never pruned)

Writing. Non-finite state is never written: every rank checks its parameters and Adam
state and the ranks agree with one all-reduce. Each rank of data-parallel group 0
serialises its payload in memory, hashes the bytes (SHA-256) and writes them into
``step_X.partial/`` (a temporary name, fsync, rename), with a sidecar
``rankN.pt.json`` holding the digest and the size. After a barrier rank 0 folds the
sidecars into ``meta.json`` (written last: a directory without it is incomplete),
renames the directory to its published name (``step_X``, or ``step_X.G`` when one of
that step exists), replaces ``latest``, and only then deletes the checkpoint of the
same step it replaces and prunes the older ones but one. A kill at any moment leaves
``latest`` naming a complete checkpoint. A full disk (ENOSPC, EDQUOT, EFBIG) is a
:class:`CheckpointError` naming the file, the bytes it needs and the bytes free.

Reading. Every rank file's size and SHA-256 are checked against ``meta.json`` before
anything is deserialised: a missing, empty, truncated or changed file, or a missing or
unreadable ``meta.json``, is refused naming the file and what is wrong. Resuming tries
the checkpoint ``latest`` names, then the older ones, newest first, and takes the first
that verifies; the ones refused are named with their reason. All ranks read the same
files and so make the same choice. Loading checks the parameters' global shapes against
this run's, and the graph's fingerprint (:func:`graph_fingerprint`: sizes, split and the
SHA-256 of the file it was read from) against this run's graph, assembles every
parameter and its Adam state from the shards of the grid that wrote it, and slices them
for the current grid: a checkpoint from ``1x2x2x1`` resumes on ``1x1x2x2``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import Coords, GridError, GridShape
from dgl_scalegnn.core.schedule import ParamShard
from dgl_scalegnn.data.prepared import GraphMeta
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.errors import InputError
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN

__all__ = [
    "Checkpoints",
    "Resumed",
    "CheckpointError",
    "Checkpoint",
    "ResumeChoice",
    "graph_fingerprint",
    "save_checkpoint",
    "read_checkpoint",
    "choose_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "set_aside_nonfinite",
]

_LATEST = "latest"
_KEEP = 2
#: A published checkpoint's name: its global step, and a generation when it replaced one.
_PUBLISHED = re.compile(r"step_(\d{8})(?:\.(\d+))?")
_META_KEYS = ("grid", "progress", "config", "shards", "files")
#: Write errors that mean the file system is full (or the file too large for it).
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointError(InputError, RuntimeError):
    """A checkpoint that is missing, damaged, incomplete or does not fit this run."""


class _Damaged(CheckpointError):
    """A checkpoint whose files do not verify; ``reason`` names the file and the fault."""

    def __init__(self, checkpoint: Path, reason: str) -> None:
        super().__init__(f"{checkpoint}: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read from disk, every rank file verified against ``meta.json``."""

    path: Path
    meta: dict[str, Any]
    records: list[dict[str, Any]]


@dataclass(frozen=True)
class ResumeChoice:
    """Where a resumed run starts: ``checkpoint`` (``None``: there is none yet), and the
    newer checkpoints refused on the way, by name, with the reason."""

    checkpoint: Checkpoint | None
    refused: dict[str, str]

    def note(self, action: str = "resuming from") -> str | None:
        """One line for the person running the job, or ``None`` if nothing was refused:
        each refused checkpoint, and then ``action`` on the one chosen."""
        if not self.refused or self.checkpoint is None:
            return None
        return f"{_refusals(self.refused)}; {action} {self.checkpoint.path.name}"


def _refusals(refused: dict[str, str]) -> str:
    return "; ".join(f"{name} refused ({reason})" for name, reason in refused.items())


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` (temporary name, fsync, rename); a full disk is a
    :class:`CheckpointError` with the path, the bytes needed and the bytes free."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        temporary.unlink(missing_ok=True)  # give back what the failed write took
        if error.errno not in _NO_SPACE:
            raise
        free = shutil.disk_usage(path.parent).free
        raise CheckpointError(
            f"{path}: {os.strerror(error.errno)} ({errno.errorcode[error.errno]}): writing it "
            f"needs {len(data)} bytes, its file system has {free} free; free space there or "
            "point output.dir at a larger file system (the previous checkpoint stays latest)"
        ) from None
    os.replace(temporary, path)


def _step_name(global_step: int) -> str:
    return f"step_{global_step:08d}"


def _order(name: str) -> tuple[int, int] | None:
    """(step, generation) of a published checkpoint's name; ``None`` for any other name."""
    found = _PUBLISHED.fullmatch(name)
    return None if found is None else (int(found.group(1)), int(found.group(2) or 0))


def _published(root: Path) -> list[Path]:
    """Published checkpoint directories (complete or damaged), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _order(p.name) is not None]
    return sorted(found, key=lambda p: _order(p.name))


def _rank_file(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def _writer_files(shape: GridShape) -> list[str]:
    """The rank files of a checkpoint written on ``shape`` (data-parallel group 0)."""
    return [
        _rank_file(shape.rank_of(Coords(0, x, y, z)))
        for z in range(shape.z)
        for y in range(shape.y)
        for x in range(shape.x)
    ]


def _optimizer_state(model: ParallelScaleGNN, optimizer: torch.optim.Optimizer) -> dict:
    """Adam state per parameter name (``exp_avg``, ``exp_avg_sq``, ``step``)."""
    by_param = {id(p): name for name, p in model.sharded_state_dict().items()}
    state = {}
    for param, values in optimizer.state.items():
        state[by_param[id(param)]] = {k: v.detach().cpu().clone() for k, v in values.items()}
    return state


def _nonfinite_ranks(model: ParallelScaleGNN, optimizer: torch.optim.Optimizer) -> list[int]:
    """The ranks whose parameters or Adam state hold a NaN or an infinity (collective:
    one all-reduce of a flag per rank, on the model's device as NCCL needs)."""
    device = next(model.parameters()).device
    tensors = [*model.parameters()]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v) and v.is_floating_point()]
    finite = torch.stack([torch.isfinite(t).all().to(device) for t in tensors]).all()
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [] if finite else [0]
    flags = torch.zeros(dist.get_world_size(), device=device)
    flags[dist.get_rank()] = (~finite).float()
    dist.all_reduce(flags)
    return torch.nonzero(flags).flatten().tolist()


def _write_rank_file(partial: Path, name: str, payload: dict[str, Any]) -> None:
    """Serialise ``payload`` in memory, write it as ``partial/name`` and its size and
    SHA-256 as the sidecar ``name.json`` that rank 0 folds into ``meta.json``."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getbuffer()
    partial.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(partial / name, data)
    digest = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    _atomic_write_bytes(partial / f"{name}.json", json.dumps(digest).encode())


def save_checkpoint(
    directory: str | os.PathLike[str],
    *,
    grid: Grid4D,
    model: ParallelScaleGNN,
    optimizer: torch.optim.Optimizer,
    progress: dict[str, Any],
    config: dict[str, Any],
    graph: GraphMeta | None = None,
) -> Path:
    """Write a checkpoint of global step ``progress["global_step"]`` (collective).

    Every rank must call it; ranks of data-parallel group 0 write their shards.
    ``graph``, the meta of the graph trained, is recorded as its
    :func:`graph_fingerprint`, which a resume compares.

    Returns
    -------
    Path
        The published checkpoint directory (on every rank).

    Raises
    ------
    CheckpointError
        On every rank when any rank's parameters or Adam state are not finite (nothing
        is written); on the rank whose write found the disk full.
    """
    root = Path(directory)
    step = progress["global_step"]
    nonfinite = _nonfinite_ranks(model, optimizer)
    if nonfinite:
        raise CheckpointError(
            f"not checkpointing global step {step}: the parameters or Adam state of rank(s) "
            f"{nonfinite} hold NaN or infinite values. {_last_good_sentence(root, step + 1)}"
        )
    params = model.sharded_state_dict()
    partial = root / f"{_step_name(step)}.partial"
    if grid.coords.d == 0:
        payload = {
            "coords": asdict(grid.coords),
            "params": {n: p.detach().cpu().clone() for n, p in params.items()},
            "optimizer": _optimizer_state(model, optimizer),
        }
        _write_rank_file(partial, _rank_file(grid.shape.rank_of(grid.coords)), payload)
    _barrier()
    if grid.rank == 0:
        meta = {
            "grid": str(grid.shape),
            "progress": progress,
            "config": config,
            "shards": {
                n: {"global_shape": list(s.global_shape), "axes": [str(a) for a in s.axes]}
                for n, s in ((n, p.shard) for n, p in params.items())
            },
            "optimizer": type(optimizer).__name__,
        }
        if graph is not None:
            meta["graph"] = graph_fingerprint(graph)
        _publish(root, partial, meta, grid.shape)
    _barrier()
    return root / (root / _LATEST).read_text().strip()


def _publish(root: Path, partial: Path, meta: dict[str, Any], shape: GridShape) -> None:
    """Rank 0: complete ``partial`` with ``meta.json``, publish it, point ``latest`` at
    it, and only then drop the checkpoint of the same step it replaces and old ones."""
    files = {}
    for name in _writer_files(shape):
        sidecar = partial / f"{name}.json"
        if not sidecar.is_file():
            raise CheckpointError(
                f"{sidecar}: missing after every rank wrote its file; output.dir must be on "
                "a file system that every node of the job shares"
            )
        files[name] = json.loads(sidecar.read_text())
    for leftover in partial.iterdir():  # sidecars, and files of an abandoned attempt
        if leftover.name not in files:
            leftover.unlink()
    _atomic_write_bytes(
        partial / "meta.json", json.dumps({**meta, "files": files}, indent=2).encode()
    )
    name = partial.name.removesuffix(".partial")
    step = _order(name)[0]
    same_step = [p for p in _published(root) if _order(p.name)[0] == step]
    final = root / name
    if same_step:  # never delete a complete checkpoint before its successor is published
        final = root / f"{name}.{_order(same_step[-1].name)[1] + 1}"
    os.replace(partial, final)
    _atomic_write_bytes(root / _LATEST, final.name.encode())
    for replaced in same_step:
        shutil.rmtree(replaced, ignore_errors=True)
    _prune(root, keep=final.name)


def _prune(root: Path, keep: str) -> None:
    """Keep ``keep`` and the newest checkpoint before it; drop older ones and abandoned
    partial ones. Newer ones (a run this one resumed before) stay, as do set-aside ones."""
    older = [p for p in _published(root) if _order(p.name) < _order(keep)]
    for old in older[: len(older) - (_KEEP - 1)]:
        shutil.rmtree(old, ignore_errors=True)
    for abandoned in root.glob("step_*.partial"):
        shutil.rmtree(abandoned, ignore_errors=True)


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint ``latest`` names in ``directory``, or ``None`` if there is none
    (not verified: :func:`choose_checkpoint` verifies, and falls back)."""
    pointer = Path(directory) / _LATEST
    if not pointer.is_file():
        return None
    checkpoint = Path(directory) / pointer.read_text().strip()
    if not (checkpoint / "meta.json").is_file():
        raise CheckpointError(f"{pointer} names {checkpoint.name}, which has no meta.json")
    return checkpoint


def _read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` of ``path``, checked for the keys and the grid a load needs."""
    if not path.is_dir():
        raise _Damaged(path, "the directory is missing")
    try:
        meta = json.loads((path / "meta.json").read_bytes())
    except FileNotFoundError:
        raise _Damaged(path, "meta.json: missing (the checkpoint was never completed)") from None
    except ValueError as error:  # JSON and UTF-8 decoding errors
        raise _Damaged(path, f"meta.json: not valid JSON ({error})") from None
    if not isinstance(meta, dict):
        raise _Damaged(path, "meta.json: not a JSON object")
    if "files" not in meta and "shards" in meta:
        raise _Damaged(path, "meta.json: records no SHA-256 digests (written by an older version)")
    missing = [key for key in _META_KEYS if key not in meta]
    if missing:
        raise _Damaged(path, f"meta.json: lacks {missing}")
    try:
        GridShape.parse(meta["grid"])
    except (GridError, TypeError):
        raise _Damaged(path, f"meta.json: grid {meta['grid']!r} is not a grid shape") from None
    return meta


def _verified(path: Path) -> tuple[dict[str, Any], list[bytes]]:
    """``meta.json`` and the bytes of every rank file, each checked against its recorded
    size and SHA-256; raises :class:`_Damaged` naming the first file that fails."""
    meta = _read_meta(path)
    blobs = []
    for name in _writer_files(GridShape.parse(meta["grid"])):
        expected = meta["files"].get(name)
        if not isinstance(expected, dict) or not {"sha256", "bytes"} <= set(expected):
            raise _Damaged(path, f"meta.json: no size and SHA-256 for {name}")
        try:
            data = (path / name).read_bytes()
        except FileNotFoundError:
            raise _Damaged(path, f"{name}: missing") from None
        if len(data) != expected["bytes"]:
            size = len(data)
            fault = "empty" if not size else "truncated" if size < expected["bytes"] else "too long"
            raise _Damaged(
                path, f"{name}: {fault}, {size} bytes where meta.json records {expected['bytes']}"
            )
        if hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise _Damaged(path, f"{name}: SHA-256 mismatch (changed since it was written)")
        blobs.append(data)
    return meta, blobs


def read_checkpoint(checkpoint: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint directory.

    Raises
    ------
    CheckpointError
        Naming the file and the fault: a missing or unreadable ``meta.json``; a rank
        file that is missing, empty, truncated, or whose SHA-256 differs.
    """
    path = Path(checkpoint)
    meta, blobs = _verified(path)
    records = [torch.load(io.BytesIO(b), map_location="cpu", weights_only=True) for b in blobs]
    return Checkpoint(path, meta, records)


def choose_checkpoint(directory: str | os.PathLike[str]) -> ResumeChoice:
    """The checkpoint to resume from: the one ``latest`` names if it verifies, else the
    newest older one that does (or every one, newest first, without ``latest``).

    Raises
    ------
    CheckpointError
        If checkpoints exist but none verifies, naming each and its fault.
    """
    root = Path(directory)
    refused: dict[str, str] = {}
    candidates = _published(root)[::-1]
    pointer = root / _LATEST
    if pointer.is_file():
        named = pointer.read_bytes().decode(errors="replace").strip()
        order = _order(named)
        if order is None:
            refused[_LATEST] = f"names {named!r}, which is not a checkpoint"
        else:
            candidates = [root / named, *(p for p in candidates if _order(p.name) < order)]
    for path in candidates:
        try:
            return ResumeChoice(read_checkpoint(path), refused)
        except _Damaged as damaged:
            refused[path.name] = damaged.reason
    if refused:
        raise CheckpointError(
            f"no checkpoint in {root} can be resumed: {_refusals(refused)}; restore or remove "
            "them, or start afresh without --resume (output.resume)"
        )
    return ResumeChoice(None, refused)


def _newest_good(root: Path, before_step: int) -> Path | None:
    """The newest published checkpoint of a step before ``before_step`` that verifies."""
    for path in reversed(_published(root)):
        if _order(path.name)[0] < before_step:
            try:
                _verified(path)
            except _Damaged:
                continue
            return path
    return None


def _last_good_sentence(root: Path, before_step: int) -> str:
    good = _newest_good(root, before_step)
    if good is None:
        return f"There is no good checkpoint in {root} to resume from."
    step = _order(good.name)[0]
    return f"The last good checkpoint is {good} (global step {step}); --resume continues from it."


def set_aside_nonfinite(directory: str | os.PathLike[str], global_step: int) -> str:
    """After a non-finite loss at ``global_step`` (rank 0 only, no collective): set the
    checkpoint of that step aside and point ``latest`` at the newest older good one.

    A checkpoint of ``global_step`` was written right before the step that diverged;
    resuming from it would replay that very step. It is renamed ``<name>.nonfinite``
    (kept to inspect, never resumed from, never pruned); ``latest`` is removed if no
    older checkpoint verifies.

    Returns
    -------
    str
        A sentence naming the last good checkpoint (path and step), or saying there is
        none, for the error message.
    """
    root = Path(directory)
    aside = []
    for path in _published(root):
        if _order(path.name)[0] == global_step:
            target = root / f"{path.name}.nonfinite"
            shutil.rmtree(target, ignore_errors=True)  # set aside by an earlier run
            os.replace(path, target)
            aside.append(target.name)
    good = _newest_good(root, global_step)
    if good is not None:
        _atomic_write_bytes(root / _LATEST, good.name.encode())
    else:
        (root / _LATEST).unlink(missing_ok=True)
    sentence = _last_good_sentence(root, global_step)
    if aside:
        sentence += f" The checkpoint of step {global_step} was set aside as {', '.join(aside)}."
    return sentence


def _assemble(records: list[dict], shape: GridShape, shard: ParamShard, pick) -> torch.Tensor:
    """The global tensor of one parameter (or optimizer moment) from a grid's shards."""
    full = torch.empty(shard.global_shape)
    for record in records:
        coords = Coords(**record["coords"])
        full[shard.local_slices(shape, coords)] = pick(record)
    return full


def _model_section(saved: dict[str, Any], path: Path) -> dict[str, Any]:
    """The model section a checkpoint was written with, keys added since then at their
    defaults (a checkpoint from before ``model.head`` existed had a head)."""
    unknown = sorted(set(saved) - {field.name for field in fields(ModelConfig)})
    if unknown:
        raise CheckpointError(f"{path}: written with model keys this version lacks: {unknown}")
    return asdict(ModelConfig(**saved))


def _dataset(data: dict[str, Any]) -> str:
    return f"{data.get('name')!r}" + (f" ({data['path']})" if data.get("path") else "")


def _check_shapes(
    checkpoint: Checkpoint, params: dict[str, torch.nn.Parameter], data_config: dict[str, Any]
) -> None:
    """Refuse a checkpoint whose parameters' global shapes differ from this run's (another
    feature or class count), naming each parameter and both shapes."""
    saved = {n: tuple(s["global_shape"]) for n, s in checkpoint.meta["shards"].items()}
    here = {n: tuple(p.shard.global_shape) for n, p in params.items()}
    differences = [
        f"parameter {name}: {saved.get(name, 'absent')} in the checkpoint, "
        f"{here.get(name, 'absent')} in this run"
        for name in sorted(set(saved) | set(here))
        if saved.get(name) != here.get(name)
    ]
    if not differences:
        return
    written_for = checkpoint.meta["config"].get("data", {})
    datasets = ""
    if _dataset(written_for) != _dataset(data_config):
        datasets = (
            f"; dataset {_dataset(written_for)} in the checkpoint, "
            f"{_dataset(data_config)} in this run"
        )
    raise CheckpointError(
        f"{checkpoint.path}: written for another dataset or model: {'; '.join(differences)}"
        f"{datasets}; resume with the dataset it was written for, or start afresh in another "
        "output.dir"
    )


def graph_fingerprint(meta: GraphMeta) -> dict[str, Any]:
    """What identifies the graph a run trains, as its checkpoints record it: the
    dataset's name, sizes and split sizes, and the SHA-256 and path of the file it was
    read from (a ``dgl`` file; ``None`` otherwise)."""
    source = meta.source_file or {}
    return {
        "name": meta.name,
        "num_nodes": meta.num_nodes,
        "nnz": meta.nnz,
        "num_features": meta.num_features,
        "num_classes": meta.num_classes,
        "multilabel": meta.multilabel,
        "split_sizes": dict(meta.split_sizes),
        "sha256": source.get("sha256"),
        "path": source.get("path"),
    }


def _check_graph(checkpoint: Checkpoint, graph: GraphMeta | None) -> None:
    """Refuse a checkpoint whose recorded graph is not this run's (another file of the
    same shapes, another split, other edges), naming what differs. The path alone does
    not count (a moved file is the same graph), nor does a SHA-256 one side lacks; a
    checkpoint written before the graph was recorded is not checked."""
    saved = checkpoint.meta.get("graph")
    if graph is None or not isinstance(saved, dict):
        return
    here = graph_fingerprint(graph)
    differences = [
        f"{key} {saved.get(key)} in the checkpoint, {value} in this run"
        for key, value in here.items()
        if key not in ("sha256", "path") and saved.get(key) != value
    ]
    if None not in (saved.get("sha256"), here["sha256"]) and saved["sha256"] != here["sha256"]:
        differences.append(
            f"file {saved.get('path')!r} (SHA-256 {saved['sha256'][:16]}) in the checkpoint, "
            f"{here['path']!r} (SHA-256 {here['sha256'][:16]}) in this run"
        )
    if differences:
        raise CheckpointError(
            f"{checkpoint.path}: written for another graph: {'; '.join(differences)}; resume "
            "on the graph it was written for, or start afresh in another output.dir"
        )


def load_checkpoint(
    checkpoint: Checkpoint | str | os.PathLike[str],
    *,
    grid: Grid4D,
    model: ParallelScaleGNN,
    optimizer: torch.optim.Optimizer,
    model_config: dict[str, Any],
    data_config: dict[str, Any] | None = None,
    graph: GraphMeta | None = None,
) -> dict[str, Any]:
    """Load ``checkpoint`` (read and verified here if given as a path) into this rank's
    shards, re-sliced for its grid; returns the progress it recorded.

    Raises
    ------
    CheckpointError
        A damaged checkpoint (see :func:`read_checkpoint`), another model section,
        parameters of other global shapes (another dataset's feature or class count),
        or another graph than ``graph``, this run's (:func:`graph_fingerprint`), before
        anything is copied.
    """
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = read_checkpoint(checkpoint)
    path, meta, records = checkpoint.path, checkpoint.meta, checkpoint.records
    saved = _model_section(meta["config"]["model"], path)
    if saved != model_config:
        differences = ", ".join(
            f"model.{key}: {saved.get(key)!r} in the checkpoint, {value!r} in this run"
            for key, value in model_config.items()
            if saved.get(key) != value
        )
        raise CheckpointError(f"{path}: {differences}; resume with the same model section")
    params = model.sharded_state_dict()
    _check_shapes(checkpoint, params, data_config or {})
    _check_graph(checkpoint, graph)
    old_shape = GridShape.parse(meta["grid"])
    slices = {n: p.shard.local_slices(grid.shape, grid.coords) for n, p in params.items()}
    device = next(model.parameters()).device
    with torch.no_grad():
        for name, param in params.items():
            full = _assemble(records, old_shape, param.shard, lambda r, n=name: r["params"][n])
            param.copy_(full[slices[name]].to(device))
    for name, param in params.items():
        state_keys = records[0]["optimizer"].get(name, {})
        if not state_keys:
            continue
        state = {}
        for key, value in state_keys.items():
            if value.dim() == 0:
                state[key] = value.clone()
            else:
                full = _assemble(
                    records,
                    old_shape,
                    param.shard,
                    lambda r, n=name, k=key: r["optimizer"][n][k],
                )
                state[key] = full[slices[name]].to(device).contiguous()
        optimizer.state[param] = state
    return meta["progress"]


@dataclass(frozen=True)
class Resumed:
    """What :meth:`Checkpoints.resume` loaded: the ``progress`` the checkpoint recorded
    (its ``global_step`` among it), where it was (``path``), and the newer checkpoints
    refused on the way (``refused``, with ``note``, one line saying so, or ``None``)."""

    progress: dict[str, Any]
    path: Path
    refused: dict[str, str]
    note: str | None


class Checkpoints:
    """The checkpoints of one run in ``directory``, for its model and optimizer:
    :meth:`save` a step (collective, verified, published atomically, any grid reads it)
    and :meth:`resume` from the newest that verifies (re-sliced for this grid).

    Parameters
    ----------
    directory : path
        The run's checkpoints (``output.dir/checkpoints`` for ``scalegnn train``).
    grid : Grid4D
        This rank's place on the grid.
    model, optimizer :
        What is saved and restored (every rank's shards; Adam's state too).
    config : dict
        The run's settings, recorded; its ``model`` and ``data`` sections are checked on
        resume (another model or dataset is refused).
    graph : GraphMeta or None
        The graph trained, recorded as its fingerprint (another graph is refused).

    Example
    -------
    >>> import tempfile
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.distributed.comm import Runtime
    >>> runtime = Runtime.single_process()
    >>> model = ParallelScaleGNN(ModelConfig(hidden=8, layers=2), in_features=5,
    ...                          num_classes=3, runtime=runtime, seed=0)
    >>> optimizer = torch.optim.Adam(model.parameters())
    >>> config = {"model": asdict(ModelConfig(hidden=8, layers=2))}
    >>> checkpoints = Checkpoints(tempfile.mkdtemp(), runtime.grid, model, optimizer, config)
    >>> checkpoints.resume() is None  # none yet
    True
    >>> checkpoints.save({"global_step": 3}).name
    'step_00000003'
    >>> checkpoints.resume().progress
    {'global_step': 3}
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        grid: Grid4D,
        model: ParallelScaleGNN,
        optimizer: torch.optim.Optimizer,
        config: dict[str, Any],
        graph: GraphMeta | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.grid, self.model, self.optimizer = grid, model, optimizer
        self.config, self.graph = config, graph
        #: (global step, directory) of the checkpoint that holds this process's state
        #: (saved, or resumed from, and not trained since): saving again is a no-op.
        self.on_disk: tuple[int, Path] | None = None

    def save(self, progress: dict[str, Any]) -> Path:
        """Write the checkpoint of ``progress["global_step"]`` (collective: every rank
        calls it) and return its directory; the one already on disk if this step is."""
        step = progress["global_step"]
        if self.on_disk is not None and self.on_disk[0] == step:
            return self.on_disk[1]
        written = save_checkpoint(
            self.directory,
            grid=self.grid,
            model=self.model,
            optimizer=self.optimizer,
            progress=progress,
            config=self.config,
            graph=self.graph,
        )
        self.on_disk = (step, written)
        return written

    def resume(self) -> Resumed | None:
        """Load the newest checkpoint that verifies into the model and optimizer (every
        rank reads the same files); ``None`` where there is none yet.

        Raises
        ------
        CheckpointError
            A checkpoint of another model, dataset or graph.
        """
        choice = choose_checkpoint(self.directory)
        if choice.checkpoint is None:
            return None
        progress = load_checkpoint(
            choice.checkpoint,
            grid=self.grid,
            model=self.model,
            optimizer=self.optimizer,
            model_config=self.config.get("model", {}),
            data_config=self.config.get("data"),
            graph=self.graph,
        )
        self.on_disk = (progress["global_step"], choice.checkpoint.path)
        return Resumed(progress, choice.checkpoint.path, choice.refused, choice.note())
