r"""Settings derived from the graph: what a graph a user brings trains with.

A graph that is read (``data.name`` ``dgl``, the Planetoid, Reddit and OGB loaders; not
the synthetic generator) takes, for every key of :data:`DERIVED_KEYS` that the config
does not set (:attr:`~dgl_scalegnn.config.Config.explicit`), the value one rule derives
from the graph's size and this machine's memory; an explicit value always wins. The
rule is the same for every graph; it was chosen on validation accuracy over every real
graph of ``make bench-real`` (``docs/results.md``):

Batch
    Full batch (:math:`B = N`) when a full-batch step fits: its estimated working set
    (:func:`full_batch_bytes`) is at most a quarter of a rank's memory budget
    (:func:`memory_budget_bytes`, the least over the ranks): its GPU's total memory, or
    its share of its host's total memory (capped by the job's control-group limit), never
    what happens to be free at start-up, so that a graph derives the same settings
    however busy the host is, on one rank as on two of one host while a quarter of the
    share still holds the step. Otherwise :math:`B = \lceil N / 100 \rceil`, the batch
    the 1M-vertex benchmarks chose.
Steps and learning rate
    Full batch: 200 epochs of one step at a constant 0.01 (DGL's GCN recipe). Mini-batches:
    10 epochs of 100 steps, 0.01 on a cosine decay over those 1,000 steps (noisy steps
    need the rate to fall).
Model
    :data:`~dgl_scalegnn.config.GRAPHCONV_MODEL`, Kipf & Welling's GCN as DGL's
    ``GraphConv`` stack (two layers with biases), and weight decay 5e-4.
Features
    ``data.feature_norm: auto`` scales the rows of a ``dgl`` file to sum 1 (decided when
    the graph is loaded, see
    :meth:`~dgl_scalegnn.config.DataConfig.resolved_feature_norm`).

Example
-------
>>> from dgl_scalegnn.config import config_from_mapping
>>> cfg = config_from_mapping({"data": {"name": "dgl", "path": "g.bin"}, "model": {"hidden": 32}})
>>> shape = GraphShape(num_nodes=2995, nnz=19311, num_features=2879, num_classes=7)
>>> resolved, derived = apply_graph_defaults(cfg, shape, rank_memory=16 * 2**30)
>>> resolved.sampling.batch_size, resolved.model.hidden, resolved.train.epochs
(2995, 32, 200)
>>> print(derived[0].reason.replace(", under", "\nunder"))
full batch: a step over all 2,995 vertices needs about 0.11 GB
under a quarter of a rank's 17.2 GB (its share of its host's or GPU's total memory)
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import GRAPHCONV_MODEL, Config, check_config
from dgl_scalegnn.distributed.comm import agree_on

__all__ = [
    "DERIVED_KEYS",
    "GraphShape",
    "Derived",
    "full_batch_bytes",
    "available_bytes",
    "agreed_available_bytes",
    "memory_budget_bytes",
    "agreed_memory_budget",
    "apply_graph_defaults",
]

#: Of a rank's memory budget, the share a full-batch step may take (the rest holds
#: evaluation's activations, the interpreter and the allocator's slack).
FIT_SHARE = 0.25
#: Mini-batches hold this fraction of the vertices where a full batch does not fit.
MINI_BATCH_FRACTION = 1 / 100

_MODEL_REASON = (
    "Kipf & Welling's GCN as DGL's GraphConv stack (2 layers with biases, hidden 128, "
    "dropout 0.5), the best mean validation accuracy over the real graphs (docs/results.md)"
)

_NORM_REASON = {
    "row": "a dgl file's rows scaled to sum 1, as DGL's Planetoid classes scale them",
    "none": "the features as the loader gives them",
}

#: Every key that a graph that is read may take from the rule.
DERIVED_KEYS = (
    "sampling.batch_size",
    "train.epochs",
    "optim.lr",
    "optim.lr_schedule",
    "optim.weight_decay",
    *(f"model.{key}" for key in GRAPHCONV_MODEL),
)


@dataclass(frozen=True)
class GraphShape:
    """The sizes the rule reads: vertices, adjacency entries, features and classes."""

    num_nodes: int
    nnz: int
    num_features: int
    num_classes: int


@dataclass(frozen=True)
class Derived:
    """One setting taken from the rule: its dotted key, value and why."""

    key: str
    value: Any
    reason: str


def full_batch_bytes(shape: GraphShape, hidden: int, layers: int) -> int:
    """Estimated peak bytes of one full-batch training step on one rank.

    The features and their dropout copy and aggregation (three ``(N, D_in)`` float32
    matrices), about eight ``(N, hidden)`` activations and gradients per layer, and the
    adjacency twice (CSR with int64 columns and float32 values, and its transpose).
    """
    n = shape.num_nodes
    activations = 4 * n * (3 * shape.num_features + 8 * max(hidden, shape.num_classes) * layers)
    return activations + 2 * 12 * shape.nnz


def _meminfo_bytes(field: str) -> int | None:
    """``field`` of ``/proc/meminfo`` in bytes (``None`` where it cannot be read)."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields[field].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def available_bytes(device: torch.device | str = "cpu", local_ranks: int = 1) -> int:
    """Memory this rank can use now, for a safety check (what a layer-wise evaluation
    may take): free GPU memory on CUDA, else the node's available memory
    (``MemAvailable``) shared by the ``local_ranks`` ranks on the node. It follows what
    other processes hold at the moment: settings derive from
    :func:`memory_budget_bytes` instead."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    total = _meminfo_bytes("MemAvailable")
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return total // max(local_ranks, 1)


def _control_group_limit() -> int | None:
    """The tightest memory limit of this process's control groups and their ancestors
    (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``: what Slurm's ``--mem`` or a
    container's limit sets), or ``None`` where none is set or readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if not controllers:
            root, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        directory = root / group.lstrip("/")
        for folder in (directory, *directory.parents):
            if not folder.is_relative_to(root):
                break
            try:
                text = (folder / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():  # v2 says "max" where it sets none
                limits.append(int(text))
    return min(limits, default=None)


def memory_budget_bytes(device: torch.device | str = "cpu", local_ranks: int = 1) -> int:
    """Memory a rank plans with when settings are derived: its GPU's total memory on
    CUDA, else its host's total memory (``MemTotal``, or the job's control-group limit
    where that is less) shared by the ``local_ranks`` ranks on the host.

    Fixed for the machine and the job: unlike :func:`available_bytes` it does not follow
    what other processes happen to hold at start-up (a rank still loading, another job),
    so a graph derives the same settings on a busy host as on an idle one.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    total = _meminfo_bytes("MemTotal")
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _control_group_limit()
    if limit is not None:
        total = min(total, limit)
    return total // max(local_ranks, 1)


def _least_over_world(count: int, device: torch.device | str) -> int:
    """The least of every rank's ``count`` (one all-reduce)."""
    return int(agree_on(count, dist.ReduceOp.MIN, torch.device(device)))


def agreed_available_bytes(device: torch.device | str = "cpu", local_ranks: int = 1) -> int:
    """:func:`available_bytes`, the least over every rank, so that every rank takes the
    same decision from it."""
    return _least_over_world(available_bytes(device, local_ranks), device)


def agreed_memory_budget(device: torch.device | str = "cpu", local_ranks: int = 1) -> int:
    """:func:`memory_budget_bytes`, the least over every rank, so that every rank
    derives the same settings."""
    return _least_over_world(memory_budget_bytes(device, local_ranks), device)


def _gigabytes(count: float) -> str:
    return f"{count / 1e9:.2f} GB" if count < 1e9 else f"{count / 1e9:.1f} GB"


def _rule(cfg: Config, shape: GraphShape, rank_memory: int) -> list[Derived]:
    """Every derived setting with its reason (before the config's own values win)."""
    n = shape.num_nodes
    hidden = cfg.model.hidden if "model.hidden" in cfg.explicit else GRAPHCONV_MODEL["hidden"]
    layers = cfg.model.layers if "model.layers" in cfg.explicit else GRAPHCONV_MODEL["layers"]
    need = full_batch_bytes(shape, hidden, layers)
    where = f"a rank's {_gigabytes(rank_memory)} (its share of its host's or GPU's total memory)"
    if need <= FIT_SHARE * rank_memory:
        batch = Derived(
            "sampling.batch_size",
            n,
            f"full batch: a step over all {n:,} vertices needs about {_gigabytes(need)}, "
            f"under a quarter of {where}",
        )
        steps = "200 full-batch steps"
        schedule = [
            Derived("train.epochs", 200, "full batch: 200 steps, DGL's GCN recipe"),
            Derived("optim.lr", 0.01, f"{steps} at a constant rate, DGL's GCN recipe"),
            Derived("optim.lr_schedule", "constant", f"{steps}: no decay needed"),
        ]
    else:
        size = max(2, math.ceil(n * MINI_BATCH_FRACTION))
        batch = Derived(
            "sampling.batch_size",
            size,
            f"mini-batches of N/100: a full-batch step over {n:,} vertices needs about "
            f"{_gigabytes(need)}, more than a quarter of {where}",
        )
        steps = math.ceil(n / size)
        schedule = [
            Derived("train.epochs", 10, f"10 epochs of {steps} steps"),
            Derived("optim.lr", 0.01, f"peak rate of {10 * steps:,} mini-batch steps"),
            Derived(
                "optim.lr_schedule", "cosine", f"{10 * steps:,} noisy steps: decay to 0 over them"
            ),
        ]
    model = [Derived(f"model.{k}", v, _MODEL_REASON) for k, v in GRAPHCONV_MODEL.items()]
    decay = Derived("optim.weight_decay", 5e-4, "DGL's GCN recipe")
    return [batch, *schedule, decay, *model]


def apply_graph_defaults(
    cfg: Config, shape: GraphShape, rank_memory: int
) -> tuple[Config, list[Derived]]:
    """``cfg`` with every derived setting the config does not set, and those settings,
    for ranks of ``rank_memory`` bytes each (:func:`agreed_memory_budget`).

    The synthetic generator keeps the dataclass defaults (its presets were tuned on them):
    nothing is derived for ``data.name: synthetic``.
    """
    if cfg.data.name == "synthetic":
        return cfg, []
    derived = [d for d in _rule(cfg, shape, rank_memory) if d.key not in cfg.explicit]
    if cfg.data.feature_norm == "auto":
        norm = cfg.data.resolved_feature_norm()
        derived.append(Derived("data.feature_norm", norm, f"auto: {_NORM_REASON[norm]}"))
    sections: dict[str, dict[str, Any]] = {}
    for setting in derived:
        section, name = setting.key.split(".")
        sections.setdefault(section, {})[name] = setting.value
    changes = {
        section: dataclasses.replace(getattr(cfg, section), **values)
        for section, values in sections.items()
    }
    resolved = dataclasses.replace(cfg, **changes)
    check_config(resolved)  # an explicit key may contradict a derived one
    return resolved, derived
