"""Checkpoints that survive crashes and resume on any grid shape.

Layout of ``DIR`` (``output.dir/checkpoints``)::

    latest                 name of the last complete checkpoint (replaced atomically)
    step_00000120/
        meta.json          grid, progress, model config, parameter global shapes/splits
        rank00003.pt       one file per rank of data-parallel group 0: its parameter
                           shards and their Adam state

A checkpoint is written into ``step_X.partial/`` (each file as a temporary name then
renamed), all ranks meet at a barrier, and rank 0 writes ``meta.json``, renames the
directory and then replaces ``latest``. A crash at any point leaves ``latest`` naming
the previous complete checkpoint. Loading assembles every parameter and its optimizer
state from the shards of the grid that wrote it, using their global shapes, and slices
them for the current grid: a checkpoint from ``1x2x2x1`` resumes on ``1x1x2x2``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.schedule import ParamShard
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint"]

_LATEST = "latest"
_KEEP = 2


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or does not fit this run."""


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _rank_file(coords: Coords, shape: GridShape) -> str:
    return f"rank{shape.rank_of(coords):05d}.pt"


def _optimizer_state(model: ParallelScaleGNN, optimizer: torch.optim.Optimizer) -> dict:
    """Adam state per parameter name (``exp_avg``, ``exp_avg_sq``, ``step``)."""
    by_param = {id(p): name for name, p in model.sharded_state_dict().items()}
    state = {}
    for param, values in optimizer.state.items():
        state[by_param[id(param)]] = {k: v.detach().cpu().clone() for k, v in values.items()}
    return state


def save_checkpoint(
    directory: str | os.PathLike[str],
    *,
    grid: Grid4D,
    model: ParallelScaleGNN,
    optimizer: torch.optim.Optimizer,
    progress: dict[str, Any],
    config: dict[str, Any],
) -> Path | None:
    """Write a checkpoint of global step ``progress["global_step"]`` (collective).

    Every rank must call it; ranks of data-parallel group 0 write their shards.
    Returns the checkpoint directory on rank 0.
    """
    root = Path(directory)
    params = model.sharded_state_dict()
    name = f"step_{progress['global_step']:08d}"
    partial = root / f"{name}.partial"
    if grid.coords.d == 0:
        partial.mkdir(parents=True, exist_ok=True)
        payload = {
            "coords": asdict(grid.coords),
            "params": {n: p.detach().cpu().clone() for n, p in params.items()},
            "optimizer": _optimizer_state(model, optimizer),
        }
        target = partial / _rank_file(grid.coords, grid.shape)
        temporary = target.with_name(target.name + ".tmp")
        torch.save(payload, temporary)
        os.replace(temporary, target)
    _barrier()
    final = None
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
        _atomic_write_bytes(partial / "meta.json", json.dumps(meta, indent=2).encode())
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _atomic_write_bytes(root / _LATEST, name.encode())
        _prune(root, keep=name)
    _barrier()
    return final


def _prune(root: Path, keep: str) -> None:
    """Keep the newest complete checkpoints; drop older ones and abandoned partial ones."""
    complete = sorted(
        p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".partial")
    )
    for old in complete[:-_KEEP]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)
    for abandoned in root.glob("step_*.partial"):
        shutil.rmtree(abandoned, ignore_errors=True)


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The last complete checkpoint in ``directory``, or ``None`` if there is none."""
    pointer = Path(directory) / _LATEST
    if not pointer.is_file():
        return None
    checkpoint = Path(directory) / pointer.read_text().strip()
    if not (checkpoint / "meta.json").is_file():
        raise CheckpointError(f"{pointer} names {checkpoint.name}, which has no meta.json")
    return checkpoint


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


def load_checkpoint(
    checkpoint: str | os.PathLike[str],
    *,
    grid: Grid4D,
    model: ParallelScaleGNN,
    optimizer: torch.optim.Optimizer,
    model_config: dict[str, Any],
) -> dict[str, Any]:
    """Load ``checkpoint`` into this rank's shards (re-sliced for its grid); returns progress."""
    path = Path(checkpoint)
    meta = json.loads((path / "meta.json").read_text())
    saved = _model_section(meta["config"]["model"], path)
    if saved != model_config:
        differences = ", ".join(
            f"model.{key}: {saved.get(key)!r} in the checkpoint, {value!r} in this run"
            for key, value in model_config.items()
            if saved.get(key) != value
        )
        raise CheckpointError(f"{path}: {differences}; resume with the same model section")
    old_shape = GridShape.parse(meta["grid"])
    old_ranks = [
        old_shape.rank_of(Coords(0, x, y, z))
        for z in range(old_shape.z)
        for y in range(old_shape.y)
        for x in range(old_shape.x)
    ]
    records = []
    for rank in old_ranks:
        file = path / f"rank{rank:05d}.pt"
        if not file.is_file():
            raise CheckpointError(f"{file}: missing; the checkpoint is incomplete")
        records.append(torch.load(file, map_location="cpu", weights_only=True))
    params = model.sharded_state_dict()
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
