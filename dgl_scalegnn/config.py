"""Run configuration: one frozen dataclass per section, read from YAML.

A config file has the sections ``data``, ``model``, ``sampling``, ``train``,
``parallel``, ``optim`` and ``output``. Each key is declared once, below, with its type,
the values it allows, its default and what it does. A config that omits a key gets that
default, except where a graph that is read (every ``data.name`` but ``synthetic``)
derives it: DGL's GCN recipe (:data:`GRAPHCONV_MODEL`), and the batch, steps and rate of
:mod:`~dgl_scalegnn.train.defaults`.

A value that cannot be used is refused with a :class:`ConfigError` naming the key, the
value, what is expected and the fix: when it is read, against its annotation (its type,
the choices of a ``Literal``, the rule of an ``Annotated``), and by :func:`check_config`,
the one place for values that contradict each other. Numbers are read as YAML 1.2 reads
them (:mod:`~dgl_scalegnn.yaml_reader`), also in ``--set section.key=value``.

Example
-------
>>> from dgl_scalegnn.config import config_from_mapping
>>> cfg = config_from_mapping({"data": {"name": "synthetic"}, "sampling": {"batch_size": 512}})
>>> cfg.sampling.batch_size, cfg.parallel.grid
(512, '1x1x1x1')
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from dgl_scalegnn.errors import InputError
from dgl_scalegnn.yaml_reader import parse_yaml

__all__ = [
    "ConfigError",
    "DataConfig",
    "SyntheticConfig",
    "ModelConfig",
    "GRAPHCONV_MODEL",
    "SamplingConfig",
    "TrainConfig",
    "ParallelConfig",
    "OptimConfig",
    "OutputConfig",
    "Config",
    "config_from_mapping",
    "load_config",
    "apply_overrides",
    "DATASET_NAMES",
    "FEATURE_NORMS",
    "check_kernel_backend",
    "check_config",
    "switch_on",
    "SPMM_KERNELS",
    "CPU_ONLY_KERNELS",
    "SAMPLING_METHODS",
    "CONVS",
    "registry",
]


class ConfigError(InputError, ValueError):
    """A configuration value that cannot be used; the message names the key."""


#: The datasets ``data.name`` can read (see :mod:`dgl_scalegnn.data.datasets`).
Dataset = Literal[
    "cora",
    "citeseer",
    "pubmed",
    "ogbn-arxiv",
    "ogbn-products",
    "ogbn-papers100M",
    "reddit",
    "dgl",
    "synthetic",
]
#: How ``data.feature_norm`` scales the features (see :mod:`dgl_scalegnn.data.features`).
FeatureNorm = Literal["none", "row", "standardize"]
#: Every graph layer type (``model.conv``; see :mod:`dgl_scalegnn.model.convs`).
Conv = Literal["gcn", "sage", "gin", "gat"]
#: Every vertex sampler (``sampling.method``; see :mod:`dgl_scalegnn.sampling.sampler`).
SamplingMethod = Literal["uniform"]
#: Local SpMM kernels that call DGL's sparse operators, which DGL's wheels provide on CPU
#: only (see :mod:`dgl_scalegnn.parallel.spmm`).
CpuOnlyKernel = Literal["dgl-scaled", "dgl-weighted"]
#: Every local SpMM kernel (``parallel.spmm_kernel`` also takes ``auto``).
SpmmKernel = Literal["torch-csr", CpuOnlyKernel]
#: A switch that takes true, false or ``auto``, decided by the device (:func:`switch_on`).
Switch = Literal[True, False, "auto"]

#: The names each package's registry (:func:`registry`) implements.
DATASET_NAMES: tuple[str, ...] = typing.get_args(Dataset)
FEATURE_NORMS: tuple[str, ...] = typing.get_args(FeatureNorm)
CONVS: tuple[str, ...] = typing.get_args(Conv)
SAMPLING_METHODS: tuple[str, ...] = typing.get_args(SamplingMethod)
CPU_ONLY_KERNELS: tuple[str, ...] = typing.get_args(CpuOnlyKernel)
SPMM_KERNELS: tuple[str, ...] = typing.get_args(SpmmKernel)


@dataclass(frozen=True)
class _Rule:
    """A condition on a setting beyond its type, declared in its field's annotation
    (``hidden: Annotated[int, _at_least(1)]``) and checked when the value is read: a
    value that ``holds`` is false for is refused, the message saying what is ``expected``."""

    holds: Callable[[Any], bool]
    expected: str


def _at_least(minimum: float, expected: str = "") -> _Rule:
    return _Rule(lambda value: value >= minimum, expected or f"it must be at least {minimum}")


def _positive(expected: str = "it must be positive") -> _Rule:
    return _Rule(lambda value: value > 0, expected)


_RATE = _Rule(lambda value: 0 <= value < 1, "it must be in [0, 1)")
_FRACTION = _Rule(lambda value: 0 < value <= 1, "give a fraction in (0, 1], e.g. 0.8")
_GRID = _Rule(
    lambda spec: min(grid_sizes(spec) or [0]) >= 1,
    "give GdxGxxGyxGz (e.g. 1x2x2x2) or GxxGyxGz, every size at least 1",
)
_DIRECTORY = _Rule(os.path.isdir, "there is no such directory; give one scalegnn prepare wrote")


@dataclass(frozen=True)
class SyntheticConfig:
    """The generator's class-homophilous power-law graph (:mod:`dgl_scalegnn.data.synthetic`)."""

    #: Vertices (at least 2).
    num_nodes: Annotated[int, _at_least(2)] = 20_000
    #: Mean degree.
    avg_degree: float = 10.0
    #: Feature width.
    num_features: Annotated[int, _at_least(1)] = 64
    #: Classes (at least 2), and the communities the edges follow.
    num_classes: Annotated[int, _at_least(2)] = 8
    #: The share of edge ends drawn within the class, in [0, 1].
    homophily: Annotated[float, _Rule(lambda h: 0 <= h <= 1, "it must be in [0, 1]")] = 0.6
    #: The scale of the noise around each class's feature centroid.
    feature_noise: float = 5.0
    #: The power law of the degrees.
    degree_exponent: float = 2.5
    #: The share of training vertices; with ``val_fraction``'s, below 1 (the rest test).
    train_fraction: Annotated[float, _positive()] = 0.3
    #: The share of validation vertices, positive.
    val_fraction: Annotated[float, _positive()] = 0.1
    #: The same graph with features that carry no signal and 32 degree-quantile classes.
    featureless: bool = False
    #: The generator's seed.
    seed: int = 0


@dataclass(frozen=True)
class DataConfig:
    """Which graph to train on, and how it is read."""

    #: A public dataset, ``dgl`` (the file ``path`` names) or ``synthetic`` (the generator).
    name: Dataset = "synthetic"
    #: Where the raw files are; unset: ``$SCALEGNN_DATA_ROOT`` (:meth:`resolved_root`).
    root: str | None = None
    #: The file of a graph saved with ``dgl.save_graphs`` (``name: dgl``).
    path: str | None = None
    #: A directory ``scalegnn prepare`` wrote, which then replaces loading and normalising.
    prepared: Annotated[str, _DIRECTORY] | None = None
    #: The seed of the vertices' relabelling when the graph is prepared and of ``featureless``.
    permutation_seed: int = 0
    #: The paper's recipe for graphs without features, on any dataset: 128 random features,
    #: and 32 degree classes where there are no labels (:mod:`dgl_scalegnn.data.featureless`).
    featureless: bool = False
    #: How loading scales the features (:mod:`dgl_scalegnn.data.features`); ``auto``:
    #: :meth:`resolved_feature_norm`.
    feature_norm: Literal["auto", FeatureNorm] = "auto"
    #: The node data of a ``dgl`` file that holds the features.
    feat_key: Annotated[str, _Rule(bool, "give the ndata key, e.g. 'feat'")] = "feat"
    #: The node data of a ``dgl`` file that holds the labels.
    label_key: Annotated[str, _Rule(bool, "give the ndata key, e.g. 'label'")] = "label"
    #: The built-in generator's settings (``name: synthetic``).
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def resolved_root(self) -> str | None:
        return self.root or os.environ.get("SCALEGNN_DATA_ROOT")

    def resolved_feature_norm(self) -> str:
        """``feature_norm``, with ``auto`` resolved: ``row`` for a ``dgl`` file (Kipf &
        Welling's scaling, the best on validation over the real graphs of
        ``make bench-real``), ``none`` for the other loaders (DGL's Planetoid classes
        scale the rows themselves; OGB's and Reddit's features are used as published),
        the synthetic generator and the featureless recipe.

        >>> DataConfig(name="dgl", path="g.bin").resolved_feature_norm()
        'row'
        >>> DataConfig(name="ogbn-arxiv").resolved_feature_norm()
        'none'
        """
        if self.feature_norm != "auto":
            return self.feature_norm
        return "row" if self.name == "dgl" and not self.featureless else "none"


@dataclass(frozen=True)
class ModelConfig:
    r"""The model: an input projection, ``layers`` graph layers of type ``conv``, a head.

    The defaults are the ScaleGNN model, the paper's form, which the synthetic generator
    trains; a graph that is read takes :data:`GRAPHCONV_MODEL` for the keys its config
    does not set. Each layer's product goes through the same tail (bias, RMSNorm, ReLU,
    dropout, residual); without the head the last layer maps to the classes, with no tail
    but its bias. ``norm``, ``residual``, ``input_projection`` and ``head`` all false is
    Kipf & Welling's GCN: DGL's ``GraphConv`` stack.
    """

    #: The layer type: ``gcn`` (:math:`\tilde A X W`), ``sage`` (GraphSAGE-mean, :math:`X
    #: W_{self} + (D^{-1} A X) W`), ``gin`` (:math:`\mathrm{MLP}((1 + \epsilon) X + A X)`)
    #: or ``gat`` (:math:`\sum_u \alpha_{uv} x_u W`, DGL's ``GATConv``).
    conv: Conv = "gcn"
    #: Hidden width.
    hidden: Annotated[int, _at_least(1)] = 128
    #: Graph layers (0 only with both the input projection and the head).
    layers: Annotated[int, _at_least(0)] = 3
    #: Dropout after each graph layer, in [0, 1).
    dropout: Annotated[float, _RATE] = 0.5
    #: Dropout on the input features, in [0, 1).
    input_dropout: Annotated[float, _RATE] = 0.0
    #: RMSNorm after each graph layer's linear map.
    norm: bool = True
    #: A residual joins each layer whose input and output widths agree.
    residual: bool = True
    #: :math:`X W_{in}` before the first graph layer.
    input_projection: bool = True
    #: :math:`X W_{out}` after the last graph layer.
    head: bool = True
    #: What a residual adds: the layer's input (``input``, the paper's form) or its input
    #: after aggregation, :math:`\tilde A X_{h,l-1}` (``aggregated``).
    residual_from: Literal["input", "aggregated"] = "input"
    #: An RMSNorm (with its own gain) on the head's input; the paper has none.
    final_norm: bool = False
    #: Every RMSNorm's :math:`\epsilon` in :math:`x (s / d + \epsilon)^{-1/2}`, positive (an
    #: all-zero row would divide by zero): against the activations' mean square it decides
    #: how far the norm equalises the rows' magnitudes (``yaml/cora.yaml``: what it costs).
    rms_eps: Annotated[float, _positive("it must be positive, e.g. 1e-6")] = 1e-6
    #: A learnt bias (zero at first) on every linear map's output, a graph layer's before
    #: its RMSNorm (as in DGL's ``GraphConv``); the paper's equations have none.
    bias: bool = False
    #: GIN's :math:`\epsilon`, its initial value where learnt (``conv: gin`` only).
    gin_eps: float = 0.0
    #: Learn GIN's :math:`\epsilon` (``conv: gin`` only).
    gin_learn_eps: bool = False
    #: How GIN's neighbour sum is estimated under uniform vertex sampling (``conv: gin``
    #: only): ``degree_mean``, each vertex's full degree times the mean over its sampled
    #: neighbours (biased, of low variance), or ``unbiased``, the sampled neighbours' sum
    #: divided by :math:`p` (of variance growing as :math:`1/p`). Both are the exact sum
    #: where every neighbour is in the batch (evaluation, a full batch).
    gin_sum: Literal["degree_mean", "unbiased"] = "degree_mean"
    #: GAT's attention heads in each hidden layer, their outputs side by side: ``hidden``
    #: columns are ``gat_heads`` heads of ``hidden / gat_heads`` (``conv: gat`` only).
    gat_heads: Annotated[int, _at_least(1)] = 8
    #: GAT's heads in the layer that outputs the classes (``head: false``), averaged as
    #: in DGL's GAT example (``conv: gat`` only).
    gat_out_heads: Annotated[int, _at_least(1)] = 1
    #: The slope of GAT's LeakyReLU on the attention logits, 0 or more (``conv: gat``
    #: only).
    gat_negative_slope: Annotated[float, _at_least(0)] = 0.2
    #: Dropout on GAT's attention coefficients while training, in [0, 1), hashed by
    #: edge and head (``conv: gat`` only); ``dropout`` is the features'.
    gat_attn_dropout: Annotated[float, _RATE] = 0.0
    #: DGL's ``GATConv`` residual, added before the layer's activation in every layer:
    #: the input itself where its width is the heads' columns, else its product with a
    #: learnt ``residual_weight`` (``conv: gat`` only; ``residual`` is the tail's, after
    #: it).
    gat_residual: bool = False


#: The settings only GAT reads (``model.conv: gat``).
_GAT_KEYS = ("gat_heads", "gat_out_heads", "gat_negative_slope", "gat_attn_dropout", "gat_residual")


#: DGL's GCN recipe, Kipf & Welling's GCN as DGL's ``GraphConv`` stack (two layers with
#: biases, none of the ScaleGNN parts): the ``model`` keys every graph that is read takes
#: where its config does not set them (:mod:`~dgl_scalegnn.train.defaults`). It had the
#: best mean validation accuracy over the real graphs of ``make bench-real``, ahead of the
#: defaults above and of the recipe's own hidden width of 64 (``docs/results.md``).
GRAPHCONV_MODEL: dict[str, Any] = {
    "hidden": 128,
    "layers": 2,
    "dropout": 0.5,
    "input_dropout": 0.0,
    "norm": False,
    "residual": False,
    "input_projection": False,
    "head": False,
    "bias": True,
}


@dataclass(frozen=True)
class SamplingConfig:
    """How the vertices of a training step are drawn."""

    #: The sampler: ``uniform`` draws B of the N vertices without replacement and divides
    #: the off-diagonal edges by p = (B-1)/(N-1), so that the aggregation is unbiased.
    method: SamplingMethod = "uniform"
    #: B, the vertices each data-parallel group samples a step (at least 2).
    batch_size: Annotated[int, _at_least(2)] = 4096
    #: The samples' seed: step t of group d draws from ``(seed, d, t)``, with no message.
    seed: int = 0
    #: Build the batch of step t+1 while step t trains (the same batches).
    prefetch: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """Epochs of ``ceil(ceil(N / batch_size) / Gd)`` steps, the full-graph evaluations
    (every ``eval_every`` epochs, or on a schedule of steps where ``eval_every_steps`` or
    ``eval_at_steps`` is set; always after the last step), and when training stops."""

    #: Epochs to train (at least 1).
    epochs: Annotated[int, _at_least(1)] = 20
    #: ``false`` trains without any full-graph evaluation.
    evaluate: bool = True
    #: How an evaluation runs: ``layerwise`` (each layer over every vertex, held whole and
    #: shared by the grid), ``neighbourhood`` (each rank its vertices, a chunk at a time,
    #: from their whole neighbourhoods: memory bounded by the chunk, work recomputed) or
    #: ``auto``: layer-wise where the ranks' memory holds it, said at start-up.
    evaluation: Literal["auto", "layerwise", "neighbourhood"] = "auto"
    #: Evaluate every that many epochs (at least 1).
    eval_every: Annotated[int, _at_least(1)] = 1
    #: Evaluate every that many steps instead.
    eval_every_steps: Annotated[int, _at_least(1)] | None = None
    #: Evaluate after each of these step counts instead (e.g. log-spaced: a time to target
    #: within a constant factor from few evaluations; an epoch of a large graph is long).
    eval_at_steps: tuple[Annotated[int, _at_least(1)], ...] = ()
    #: The accuracy ``target_acc`` is compared with.
    target_metric: Literal["train_acc", "val_acc", "test_acc"] = "val_acc"
    #: A fraction in (0, 1]: training stops at the first evaluation that reaches it, and
    #: the summary's ``time_to_target_s`` is the training time until then.
    target_acc: Annotated[float, _FRACTION] | None = None
    #: The seed of the weights' initialisation and of dropout.
    seed: int = 0
    #: A NaN or infinite loss or gradient: ``stop`` training at that step, or ``skip`` it.
    on_nonfinite: Literal["stop", "skip"] = "stop"
    #: On a terminal, a bar of the steps on stderr (the console's lines print above it).
    progress: bool = True
    #: Stop after that many steps (also the horizon of the cosine schedule).
    max_steps: Annotated[int, _at_least(1)] | None = None
    #: Stop after the step in which the training seconds (the slowest rank's, without
    #: evaluations and checkpoints) reach this; a cosine schedule then decays over them.
    max_train_s: Annotated[float, _positive("give the training seconds, e.g. 60")] | None = None


@dataclass(frozen=True)
class ParallelConfig:
    """The 4D grid ``GdxGxxGyxGz``, the device it runs on and how its communication runs."""

    #: ``GdxGxxGyxGz`` (or ``GxxGyxGz``), whose product is the number of processes.
    grid: Annotated[str, _GRID] = "1x1x1x1"
    #: ``cuda`` trains on NCCL with one GPU per rank, ``cpu`` on gloo; ``auto`` takes CUDA
    #: where it is usable, saying at start-up which it took and why (see
    #: :func:`~dgl_scalegnn.distributed.devices.resolve_device`).
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: Follows ``device``; it may name the same choice (``nccl`` means CUDA, ``gloo`` the
    #: CPU), and a contradictory pair is refused.
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    #: The time limit (seconds) of the rendezvous and of collectives (at least 1).
    timeout_s: Annotated[float, _at_least(1)] = 300.0
    #: A rank lost or failed stops every rank within this many seconds (at least 2).
    watchdog_s: Annotated[float, _at_least(2)] = 15.0
    #: The 3D PMM all-reduces travel as bfloat16.
    bf16_comm: bool = False
    #: A linear's input- and weight-gradient all-reduces run concurrently.
    overlap: bool = False
    #: Compile the layer tail with ``torch.compile`` (``auto``: on CUDA, where it saves
    #: kernel launches; eager on the CPU, where it is slower).
    fuse: Switch = "auto"
    #: CUDA's float32 matrix products on TensorFloat-32 tensor cores (``auto``: with CUDA):
    #: 10 mantissa bits in the products instead of 23 (sums stay float32).
    tf32: Switch = "auto"
    #: Native CPU loops for the layer tail and the full-graph evaluation's SpMM.
    native_kernels: bool = True
    #: The local SpMM kernel (``auto`` takes ``torch-csr``; the DGL ones run on CPU only).
    spmm_kernel: Literal["auto", SpmmKernel] = "auto"

    def requested_device(self) -> str:
        """``cuda``, ``cpu`` or ``auto``: ``device``, or the device ``backend`` names.

        >>> ParallelConfig(backend="nccl").requested_device()
        'cuda'
        """
        if self.device != "auto":
            return self.device
        return _BACKEND_DEVICE.get(self.backend, "auto")


#: The device each ``parallel.backend`` runs on.
_BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu"}


@dataclass(frozen=True)
class OptimConfig:
    """Adam, on the schedule of :func:`~dgl_scalegnn.core.schedule.learning_rate`."""

    #: The learning rate (the schedule's peak), positive.
    lr: Annotated[float, _positive()] = 0.01
    #: Adam's weight decay, 0 or more.
    weight_decay: Annotated[float, _at_least(0, "give 0 (none) or more, e.g. 5e-4")] = 0.0
    #: ``constant``, or ``cosine``: a decay to 0 over the run's steps (over its training
    #: seconds where ``train.max_train_s`` is set).
    lr_schedule: Literal["constant", "cosine"] = "constant"
    #: Steps of a linear warm-up before the schedule (0: none).
    warmup_steps: Annotated[int, _at_least(0, "give 0 (no warm-up) or more")] = 0


@dataclass(frozen=True)
class OutputConfig:
    """Where results go, and how often the console prints."""

    #: The run's directory: checkpoints go to ``dir/checkpoints``.
    dir: str | None = None
    #: A JSON-lines file of every event (what ``--metrics FILE`` sets).
    metrics: str | None = None
    #: A checkpoint every that many steps and after the last (0: when a signal asks).
    checkpoint_every: Annotated[int, _at_least(0)] = 0
    #: Continue from the latest checkpoint in ``dir`` (what ``--resume`` sets).
    resume: bool = False
    #: A loss line every that many steps between evaluations (0: never).
    log_every: Annotated[int, _at_least(0)] = 50


@dataclass(frozen=True)
class Config:
    """A whole run's configuration, one section per concern."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    #: The dotted keys the user gave (YAML or ``--set``; not a key itself): the ones a
    #: graph that is read does not derive (:mod:`~dgl_scalegnn.train.defaults`).
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The sections as nested dictionaries (``explicit`` is not a section)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}


#: The sections of a config file (every field of :class:`Config` but ``explicit``).
_SECTIONS = ("data", "model", "sampling", "train", "parallel", "optim", "output")

_Entry = TypeVar("_Entry")


def registry(key: str, names: tuple[str, ...], entries: dict[str, _Entry]) -> dict[str, _Entry]:
    """The implementation table of config ``key``, keyed by exactly the ``names`` it accepts.

    The names a user can choose are declared once, here, where every package reads them;
    a package's table of implementations is built through this function, so a name
    without an implementation (or the reverse) fails when that package is imported.

    >>> try:
    ...     registry("parallel.spmm_kernel", ("a", "b"), {"a": 1})
    ... except ImportError as error:
    ...     print(error)
    parallel.spmm_kernel: names without an implementation ['b'], implementations without a name []
    """
    missing, extra = set(names) - set(entries), set(entries) - set(names)
    if missing or extra:
        raise ImportError(
            f"{key}: names without an implementation {sorted(missing)}, "
            f"implementations without a name {sorted(extra)}"
        )
    return entries


def grid_sizes(spec: str) -> tuple[int, ...] | None:
    """The sizes of a grid written ``GdxGxxGyxGz`` or ``GxxGyxGz``, ``None`` if it is not
    of that form (the one parser of the grid syntax; sizes are not checked here).

    >>> grid_sizes("1x2x2x2"), grid_sizes("2x2")
    ((1, 2, 2, 2), None)
    """
    parts = re.fullmatch(r"\s*(\d+)x(\d+)x(\d+)(?:x(\d+))?\s*", str(spec))
    if parts is None:
        return None
    return tuple(int(part) for part in parts.groups() if part is not None)


def check_kernel_backend(kernel: str, backend: str) -> None:
    """Refuse a local SpMM kernel that cannot run with ``backend`` (NCCL means CUDA tensors,
    and the DGL kernels run on CPU only: see :mod:`dgl_scalegnn.parallel.spmm`).

    >>> check_kernel_backend("dgl-scaled", "gloo")
    >>> try:
    ...     check_kernel_backend("dgl-scaled", "nccl")
    ... except ConfigError as error:
    ...     print(str(error).split(";")[0])
    parallel.spmm_kernel: got 'dgl-scaled' on CUDA (parallel.device cuda, backend nccl)
    """
    if backend == "nccl" and kernel in CPU_ONLY_KERNELS:
        raise ConfigError(
            f"parallel.spmm_kernel: got {kernel!r} on CUDA (parallel.device cuda, backend "
            "nccl); the DGL kernels run on CPU tensors only: use spmm_kernel torch-csr (or "
            "auto) on GPUs, or parallel.device cpu to train on the CPU"
        )


def switch_on(setting: bool | str, device: str) -> bool:
    """A :data:`Switch` (true, false or ``auto``) on ``device`` (``"cuda"``, ``"cpu"``...):
    ``auto`` is on with CUDA.

    >>> switch_on("auto", "cuda"), switch_on("auto", "cpu"), switch_on(True, "cpu")
    (True, False, True)
    """
    return setting is True or (setting == "auto" and device == "cuda")


def _check_gat(model: ModelConfig) -> None:
    """Refuse GAT's settings on another layer type, by name, and heads that do not
    divide GAT's hidden width or that no layer reads."""
    gat_keys = [
        f"model.{key}" for key in _GAT_KEYS if getattr(model, key) != getattr(ModelConfig, key)
    ]
    if model.conv != "gat":
        if gat_keys:
            them = "them" if len(gat_keys) > 1 else "it"
            raise ConfigError(
                f"{' / '.join(gat_keys)} set with model.conv: {model.conv}, but only GAT "
                f"(model.conv: gat) reads {them}: remove {them} or choose gat"
            )
        return
    hidden_layers = model.layers - (0 if model.head else 1)
    if hidden_layers > 0 and model.hidden % model.gat_heads:
        raise ConfigError(
            f"model.hidden: {model.hidden} columns do not split into model.gat_heads: "
            f"{model.gat_heads} heads; give a hidden width that divides by the heads "
            f"(e.g. {model.gat_heads * max(1, model.hidden // model.gat_heads)})"
        )
    if model.head and "model.gat_out_heads" in gat_keys:
        raise ConfigError(
            f"model.gat_out_heads: {model.gat_out_heads} heads of the layer that outputs "
            "the classes, but with model.head: true the head outputs them; remove "
            "gat_out_heads or set model.head: false"
        )


def check_config(cfg: Config) -> None:
    """Refuse values that contradict each other, with a :class:`ConfigError` naming the
    keys: every rule between two keys is here (each value alone is checked against its
    annotation when it is read: :func:`config_from_mapping`)."""
    data, model, parallel, output = cfg.data, cfg.model, cfg.parallel, cfg.output
    if data.name == "dgl" and not data.path and not data.prepared:
        raise ConfigError("data.path: name 'dgl' needs the file written by dgl.save_graphs")
    for key, default in (("feat_key", "feat"), ("label_key", "label")):
        if getattr(data, key) != default and data.name != "dgl":
            raise ConfigError(
                f"data.{key}: got {getattr(data, key)!r} with data.name {data.name!r}; it names "
                f"the node data of a dgl.save_graphs file (data.name: dgl); remove it for "
                f"{data.name}"
            )
    synthetic = data.synthetic
    if synthetic.train_fraction + synthetic.val_fraction >= 1:
        raise ConfigError(
            "data.synthetic.train_fraction/val_fraction: got "
            f"{synthetic.train_fraction}/{synthetic.val_fraction}; their sum must be below 1"
        )
    if model.layers == 0 and not (model.head and model.input_projection):
        switch = "input_projection" if model.head else "head"
        raise ConfigError(
            f"model.layers: got 0, but model.{switch}: false needs a GCN layer (to read the "
            "features or to output the classes); give at least one layer or turn it back on"
        )
    if model.final_norm and not model.head:
        raise ConfigError(
            "model.final_norm: true normalises the head's input, but model.head: false; "
            "turn the head on or final_norm off"
        )
    gin_keys = [
        f"model.{key}"
        for key in ("gin_eps", "gin_learn_eps", "gin_sum")
        if getattr(model, key) != getattr(ModelConfig, key)
    ]
    if model.conv != "gin" and gin_keys:
        them = "them" if len(gin_keys) > 1 else "it"
        raise ConfigError(
            f"{' / '.join(gin_keys)} set with model.conv: {model.conv}, but only GIN "
            f"(model.conv: gin) reads {them}: remove {them} or choose gin"
        )
    _check_gat(model)
    if cfg.train.target_acc is not None and not cfg.train.evaluate:
        raise ConfigError(
            f"train.target_acc: {cfg.train.target_acc} is checked at evaluations, but "
            "train.evaluate: false runs none; unset one of them"
        )
    implied = _BACKEND_DEVICE.get(parallel.backend)
    if parallel.device != "auto" and implied not in (None, parallel.device):
        raise ConfigError(
            f"parallel.backend: got {parallel.backend!r} with parallel.device "
            f"{parallel.device!r}, but {parallel.backend} runs on {implied}; give backend auto "
            f"(it follows the device: nccl on cuda, gloo on cpu) or device {implied}"
        )
    requested = parallel.requested_device()
    check_kernel_backend(parallel.spmm_kernel, "nccl" if requested == "cuda" else "gloo")
    if output.checkpoint_every and not output.dir:
        raise ConfigError(
            f"output.checkpoint_every: got {output.checkpoint_every}, but output.dir is not "
            "set; give output.dir (checkpoints go to output.dir/checkpoints)"
        )
    if output.resume and not output.dir:
        raise ConfigError(
            "output.resume: true (--resume) continues from output.dir/checkpoints, but "
            "output.dir is not set; give the run's output.dir"
        )


def _coerce(key: str, annotation: Any, value: Any) -> Any:
    """Check ``value`` against a field annotation: its type (ints are accepted where floats
    are, and floats that equal an int where ints are; floats must be finite), the values
    of a ``Literal`` and the rules of an ``Annotated`` type."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):  # X | None, the schema's one union
        (option,) = (option for option in typing.get_args(annotation) if option is not type(None))
        return None if value is None else _coerce(key, option, value)
    if origin is Annotated:  # a type and its rules
        value = _coerce(key, typing.get_args(annotation)[0], value)
        for rule in annotation.__metadata__:
            if not rule.holds(value):
                raise ConfigError(f"{key}: got {value!r}; {rule.expected}")
        return value
    if origin is Literal:  # one of these values, of their type (1 is not true)
        choices = typing.get_args(annotation)
        if not any(type(value) is type(choice) and value == choice for choice in choices):
            said = (c if isinstance(c, str) else str(c).lower() for c in choices)  # True: true
            raise ConfigError(f"{key}: got {value!r}; allowed values are {', '.join(said)}")
        return value
    if origin is tuple:  # tuple[T, ...]: a YAML list
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        item = typing.get_args(annotation)[0]
        return tuple(_coerce(f"{key}[{i}]", item, v) for i, v in enumerate(value))
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        return _build(annotation, value, key)
    if annotation is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if annotation in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{key}: expected {annotation.__name__}, got bool {value!r}")
    if annotation is float and isinstance(value, (int, float)):
        if not math.isfinite(value):  # no float setting means NaN or infinity
            raise ConfigError(
                f"{key}: got {value}; give a finite number (YAML's .nan, .inf and -.inf are not)"
            )
        return float(value)
    if annotation is int and isinstance(value, float):
        if not value.is_integer():  # 1e3 reads as the float 1000.0
            raise ConfigError(f"{key}: expected int, got float {value!r}; give a whole number")
        return int(value)
    if not isinstance(value, annotation):
        raise ConfigError(
            f"{key}: expected {annotation.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _build(cls: type, mapping: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls, include_extras=True)
    known = set(_SECTIONS) if cls is Config else {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - known)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown key {where}{unknown[0]}; the keys of {prefix or 'the config'} are "
            f"{', '.join(sorted(known))}"
        )
    values = {}
    for name, value in mapping.items():
        key = f"{prefix}.{name}" if prefix else name
        values[name] = _coerce(key, hints[name], value)
    return cls(**values)


def config_from_mapping(mapping: dict[str, Any] | None) -> Config:
    """Build and validate a :class:`Config` from nested dictionaries; the keys given
    are recorded as :attr:`Config.explicit`.

    >>> cfg = config_from_mapping({"data": {"name": "cora"}, "optim": {"lr": 0.1}})
    >>> sorted(cfg.explicit)
    ['data.name', 'optim.lr']
    """
    cfg = _build(Config, mapping or {}, "")
    check_config(cfg)
    return dataclasses.replace(cfg, explicit=frozenset(_dotted_keys(mapping or {})))


def _dotted_keys(mapping: dict[str, Any], prefix: str = "") -> list[str]:
    """Every leaf key of nested ``mapping`` as ``section.key`` (``data.synthetic.seed``)."""
    keys = []
    for name, value in mapping.items():
        key = f"{prefix}{name}"
        keys += _dotted_keys(value, f"{key}.") if isinstance(value, dict) else [key]
    return keys


def apply_overrides(mapping: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as YAML scalars) to a copy."""
    result = copy.deepcopy(mapping)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
            node = child
        try:
            node[parts[-1]] = parse_yaml(raw) if raw.strip() else None
        except ValueError as error:
            raise ConfigError(f"--set {key}: {raw!r} is not a YAML value: {error}") from None
    return result


def _config_text(file: Path) -> str:
    """The text of config file ``file``, or a :class:`ConfigError` that says what it is
    instead: missing, a directory or another kind of file, unreadable, or binary."""
    name = repr(str(file))
    if file.is_dir():
        raise ConfigError(f"config file {name} is a directory; give a YAML file")
    if not file.exists():
        raise ConfigError(f"config file {name} does not exist")
    if not file.is_file():
        raise ConfigError(f"config file {name} is not a regular file; give a YAML file")
    try:
        data = file.read_bytes()
    except OSError as error:
        raise ConfigError(f"config file {name} cannot be read: {error.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:  # NUL is UTF-8, but no text holds it
        raise ConfigError(
            f"config file {name} is binary, not YAML text; a graph file goes in data.path "
            "(scalegnn train --data GRAPH.bin)"
        )
    return text


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config file (or none: all defaults) and apply ``--set`` overrides."""
    mapping: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        text = _config_text(file)
        try:
            loaded = parse_yaml(text)
        except ValueError as error:
            raise ConfigError(f"config file {str(file)!r} is not valid YAML: {error}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {str(file)!r}: expected a mapping of sections, "
                f"got {type(loaded).__name__}"
            )
        mapping = loaded or {}
    return config_from_mapping(apply_overrides(mapping, overrides or []))
