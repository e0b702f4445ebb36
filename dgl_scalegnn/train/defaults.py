r"""Settings derived from the graph: what a graph a user brings trains with.

A graph that is read (``data.name`` ``dgl``, the Planetoid, Reddit and OGB loaders; not
the synthetic generator) takes, for every key of :data:`DERIVED_KEYS` that the config
does not set (:attr:`~dgl_scalegnn.config.Config.explicit`), the value one rule derives
from the graph's size and this machine's memory; an explicit value always wins. The
rule is the same for every graph; it was chosen on validation accuracy over every real
graph of ``make bench-real`` (``docs/results.md``):

Batch
    Full batch (:math:`B = N`) when a full-batch step fits: its estimated working set
    (:func:`full_batch_bytes`) is at most a quarter of the memory available to a rank
    (the least over the ranks). Otherwise :math:`B = \lceil N / 100 \rceil`, the
    batch the 1M-vertex benchmarks chose.
Steps and learning rate
    Full batch: 200 epochs of one step at a constant 0.01 (DGL's GCN recipe). Mini-batches:
    10 epochs of 100 steps, 0.01 on a cosine decay over those 1,000 steps (noisy steps
    need the rate to fall).
Model
    Kipf & Welling's GCN as DGL's ``GraphConv`` stack: two layers with biases, hidden
    128, dropout 0.5 between the layers, weight decay 5e-4; no input projection, head,
    RMSNorm or residual (the recipe's hidden 64 was 0.3 points behind on mean
    validation accuracy, the paper's model 0.5).
Features
    ``data.feature_norm: auto`` scales the rows of a ``dgl`` file to sum 1 (decided when
    the graph is loaded, see
    :meth:`~dgl_scalegnn.config.DataConfig.resolved_feature_norm`).

Example
-------
>>> from dgl_scalegnn.config import config_from_mapping
>>> cfg = config_from_mapping({"data": {"name": "dgl", "path": "g.bin"}, "model": {"hidden": 32}})
>>> shape = GraphShape(num_nodes=2995, nnz=19311, num_features=2879, num_classes=7)
>>> resolved, derived = apply_graph_defaults(cfg, shape, available_bytes=16 * 2**30)
>>> resolved.sampling.batch_size, resolved.model.hidden, resolved.train.epochs
(2995, 32, 200)
>>> print(derived[0].reason.replace(", under", "\nunder"))
full batch: a step over all 2,995 vertices needs about 0.11 GB
under a quarter of the 17.2 GB available
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import Config, check_config
from dgl_scalegnn.distributed.comm import reduce_over_world

__all__ = [
    "DERIVED_KEYS",
    "GraphShape",
    "Derived",
    "full_batch_bytes",
    "available_bytes",
    "agreed_available_bytes",
    "apply_graph_defaults",
]

#: Of the memory available to a rank, the share a full-batch step may take (the rest
#: holds evaluation's activations, the interpreter and the allocator's slack).
FIT_SHARE = 0.25
#: Mini-batches hold this fraction of the vertices where a full batch does not fit.
MINI_BATCH_FRACTION = 1 / 100

#: The model every graph gets (the GCN recipe): key -> value.
_MODEL = {
    "model.hidden": 128,
    "model.layers": 2,
    "model.dropout": 0.5,
    "model.input_dropout": 0.0,
    "model.norm": False,
    "model.residual": False,
    "model.input_projection": False,
    "model.head": False,
    "model.bias": True,
}
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
    *_MODEL,
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


def available_bytes(device: torch.device | str = "cpu", local_ranks: int = 1) -> int:
    """Memory this rank may use: free GPU memory on CUDA, else the node's available
    memory (``MemAvailable``) shared by the ``local_ranks`` ranks on the node."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        total = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return total // max(local_ranks, 1)


def agreed_available_bytes(device: torch.device | str = "cpu", local_ranks: int = 1) -> int:
    """:func:`available_bytes`, the least over every rank (one all-reduce), so that every
    rank derives the same settings."""
    mine = available_bytes(device, local_ranks)
    mine = torch.tensor([float(mine)], dtype=torch.float64, device=torch.device(device))
    return int(reduce_over_world(mine, dist.ReduceOp.MIN).item())


def _gigabytes(count: float) -> str:
    return f"{count / 1e9:.2f} GB" if count < 1e9 else f"{count / 1e9:.1f} GB"


def _rule(cfg: Config, shape: GraphShape, available: int) -> list[Derived]:
    """Every derived setting with its reason (before the config's own values win)."""
    n = shape.num_nodes
    hidden = cfg.model.hidden if "model.hidden" in cfg.explicit else _MODEL["model.hidden"]
    layers = cfg.model.layers if "model.layers" in cfg.explicit else _MODEL["model.layers"]
    need = full_batch_bytes(shape, hidden, layers)
    where = f"the {_gigabytes(available)} available"
    if need <= FIT_SHARE * available:
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
    model = [Derived(key, value, _MODEL_REASON) for key, value in _MODEL.items()]
    decay = Derived("optim.weight_decay", 5e-4, "DGL's GCN recipe")
    return [batch, *schedule, decay, *model]


def apply_graph_defaults(
    cfg: Config, shape: GraphShape, available_bytes: int
) -> tuple[Config, list[Derived]]:
    """``cfg`` with every derived setting the config does not set, and those settings.

    The synthetic generator keeps the dataclass defaults (its presets were tuned on them):
    nothing is derived for ``data.name: synthetic``.
    """
    if cfg.data.name == "synthetic":
        return cfg, []
    derived = [d for d in _rule(cfg, shape, available_bytes) if d.key not in cfg.explicit]
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
