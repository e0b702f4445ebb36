"""Run configuration: one frozen dataclass per concern, read from YAML.

A config file has the sections ``data``, ``model``, ``sampling``, ``train``,
``parallel``, ``optim`` and ``output``. Unknown keys, wrong types and impossible values
are refused with a :class:`ConfigError` that names the key, the value and what is
expected. ``--set section.key=value`` overrides take YAML scalars. Numbers are read as
YAML 1.2 reads them (:mod:`~dgl_scalegnn.yaml_reader`: ``1e-3`` and ``-.5`` are floats);
a float that equals an int is accepted where an int is (``batch_size: 1e4``), and float
settings must be finite (``.nan`` and ``.inf`` are refused).

Example
-------
>>> from dgl_scalegnn.config import config_from_mapping
>>> cfg = config_from_mapping({"data": {"name": "synthetic"}, "sampling": {"batch_size": 512}})
>>> cfg.sampling.batch_size, cfg.parallel.grid
(512, '1x1x1x1')
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dgl_scalegnn.errors import InputError
from dgl_scalegnn.yaml_reader import parse_yaml

__all__ = [
    "ConfigError",
    "DataConfig",
    "SyntheticConfig",
    "ModelConfig",
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


DATASET_NAMES = (
    "cora",
    "citeseer",
    "pubmed",
    "ogbn-arxiv",
    "ogbn-products",
    "ogbn-papers100M",
    "reddit",
    "dgl",
    "synthetic",
)


#: How ``data.feature_norm`` scales the features (see :mod:`dgl_scalegnn.data.features`).
FEATURE_NORMS = ("none", "row", "standardize")


@dataclass(frozen=True)
class SyntheticConfig:
    """The built-in generator (see :mod:`dgl_scalegnn.data.synthetic`)."""

    num_nodes: int = 20_000
    avg_degree: float = 10.0
    num_features: int = 64
    num_classes: int = 8
    homophily: float = 0.6
    feature_noise: float = 5.0
    degree_exponent: float = 2.5
    train_fraction: float = 0.3
    val_fraction: float = 0.1
    featureless: bool = False
    seed: int = 0


@dataclass(frozen=True)
class DataConfig:
    """Which graph to train on.

    ``root`` defaults to ``$SCALEGNN_DATA_ROOT``; ``path`` is the file of a graph saved
    with ``dgl.save_graphs`` (``name: dgl``); ``prepared`` a directory written by
    ``scalegnn prepare``, which then replaces loading and normalising. ``featureless``
    applies the paper's recipe for graphs without features to any dataset (128 random
    features, and 32 degree classes where the graph has no labels; see
    :mod:`dgl_scalegnn.data.featureless`), drawn from ``permutation_seed``.
    ``feature_norm`` scales the features when the graph is loaded (``none``, ``row``,
    ``standardize``: :mod:`dgl_scalegnn.data.features`); ``auto`` is ``row`` for a
    ``dgl`` file and ``none`` for the other loaders (DGL's Planetoid classes scale the
    rows themselves; OGB's and Reddit's features are used as published), the synthetic
    generator and the featureless recipe.
    ``feat_key`` and ``label_key`` name the node data of a ``dgl`` file that hold the
    features and the labels.
    """

    name: str = "synthetic"
    root: str | None = None
    path: str | None = None
    prepared: str | None = None
    permutation_seed: int = 0
    featureless: bool = False
    feature_norm: str = "auto"
    feat_key: str = "feat"
    label_key: str = "label"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def resolved_root(self) -> str | None:
        return self.root or os.environ.get("SCALEGNN_DATA_ROOT")

    def resolved_feature_norm(self) -> str:
        """``feature_norm``, with ``auto`` resolved: ``row`` for a ``dgl`` file (Kipf &
        Welling's scaling, the best on validation over the real graphs of
        ``make bench-real``), ``none`` otherwise.

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
    """ScaleGNN model: input projection, ``layers`` graph layers of type ``conv``, output head.

    ``conv`` (one of :data:`CONVS`) is the layer type: ``gcn`` (the default,
    :math:`\\tilde A X W`), ``sage`` (GraphSAGE-mean,
    :math:`X W_{self} + (D^{-1} A X) W`) or ``gin`` (:math:`\\mathrm{MLP}((1 + \\epsilon) X
    + A X)`, with ``gin_eps`` the initial :math:`\\epsilon`, learnt when
    ``gin_learn_eps``); each layer's output then goes through the same tail (norm, ReLU,
    dropout, residual).

    ``input_projection`` and ``head`` are the paper's form when true. Without the input
    projection the first GCN layer reads the features; without the head the last GCN
    layer maps to the classes, with no norm, ReLU, dropout or residual after it. Both
    false with ``norm`` and ``residual`` false is Kipf & Welling's GCN (DGL's GraphConv
    stack, without biases). A residual joins only layers whose input and output widths
    agree; it adds the layer's input (``residual_from: input``, the paper's form) or the
    layer's input after aggregation, :math:`\\tilde A X_{h,l-1}` (``aggregated``).
    ``final_norm`` applies an RMSNorm (with its own gain) to the head's input (the paper
    has none). ``rms_eps`` is every RMSNorm's :math:`\\epsilon` in
    :math:`x (s / d + \\epsilon)^{-1/2}`: against the activations' mean square it decides
    how far the norm equalises the rows' magnitudes (on Cora, mean square about 0.003,
    1.0 keeps small rows small and matches the GCN's accuracy; 1e-6 costs 2.4 points).
    ``bias`` adds a learnt bias (initialised to zero) to the output of every linear map:
    the input projection, each GCN layer (before its RMSNorm, as in DGL's ``GraphConv``)
    and the head. The paper's equations have none (``false``).
    """

    conv: str = "gcn"
    hidden: int = 128
    layers: int = 3
    dropout: float = 0.5
    input_dropout: float = 0.0
    norm: bool = True
    residual: bool = True
    input_projection: bool = True
    head: bool = True
    residual_from: str = "input"
    final_norm: bool = False
    rms_eps: float = 1e-6
    bias: bool = False
    gin_eps: float = 0.0
    gin_learn_eps: bool = False


@dataclass(frozen=True)
class SamplingConfig:
    """Vertex sampling (``method``, one of :data:`SAMPLING_METHODS`): ``batch_size``
    vertices per step and DP group."""

    method: str = "uniform"
    batch_size: int = 4096
    seed: int = 0
    prefetch: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """Epochs of ``ceil(N / batch_size) / Gd`` steps with full-graph evaluation.

    Evaluation runs every ``eval_every`` epochs or, when ``eval_every_steps`` or
    ``eval_at_steps`` is set, on a schedule of steps instead (on large graphs an epoch is
    many seconds, and a time to target rounded up to whole epochs says little): every
    ``eval_every_steps`` steps and after each step count in ``eval_at_steps`` (a list,
    e.g. log-spaced to read a time to target within a constant factor with few
    evaluations); always after the last step. ``evaluate: false`` trains without any
    full-graph evaluation. ``evaluation`` says how one runs: ``layerwise`` (each layer
    over every vertex, its input and output held whole and shared by the grid),
    ``neighbourhood`` (each rank its share of the vertices, a chunk at a time, from their
    whole neighbourhoods: memory bounded by the chunk, work recomputed about the average
    degree times in the first layer) or ``auto``: layer-wise where the ranks' memory holds
    it, else neighbourhood, said at start-up with the figures.
    ``progress``: on a terminal, a bar of the steps on stderr (the console's lines print
    above it). Training stops after ``max_steps`` steps or, with ``max_train_s``, after
    the step in which the training seconds (evaluations and checkpoints not counted;
    the slowest rank's) reach that budget; the cosine schedule then decays over the
    seconds instead of the steps.
    """

    epochs: int = 20
    evaluate: bool = True
    evaluation: str = "auto"
    eval_every: int = 1
    eval_every_steps: int | None = None
    eval_at_steps: tuple[int, ...] = ()
    target_metric: str = "val_acc"
    target_acc: float | None = None
    seed: int = 0
    on_nonfinite: str = "stop"
    progress: bool = True
    max_steps: int | None = None
    max_train_s: float | None = None


@dataclass(frozen=True)
class ParallelConfig:
    """The 4D grid ``GdxGxxGyxGz``, the device it runs on and how its communication runs.

    ``device`` decides and ``backend`` follows: ``cuda`` trains on NCCL with one GPU per
    rank, ``cpu`` on gloo, and ``auto`` takes CUDA where it is usable and says at start-up
    which it took and why (see :func:`~dgl_scalegnn.distributed.devices.resolve_device`).
    ``backend`` may name the same choice (``nccl`` means CUDA, ``gloo`` the CPU); a
    contradictory pair is refused. ``fuse`` compiles the layer tail with
    ``torch.compile`` (``auto``: on CUDA tensors, where it saves kernel launches; eager on
    the CPU, where it measured slower); ``tf32`` lets CUDA's float32 matrix products run
    on TensorFloat-32 tensor cores (``auto``: on with CUDA), with 10 mantissa bits in the
    products instead of 23 (sums stay float32).
    """

    grid: str = "1x1x1x1"
    device: str = "auto"
    backend: str = "auto"
    timeout_s: float = 300.0
    watchdog_s: float = 15.0
    bf16_comm: bool = False
    overlap: bool = False
    fuse: bool | str = "auto"
    tf32: bool | str = "auto"
    native_kernels: bool = True
    spmm_kernel: str = "auto"

    def requested_device(self) -> str:
        """``cuda``, ``cpu`` or ``auto``: ``device``, or the device ``backend`` names.

        >>> ParallelConfig(backend="nccl").requested_device()
        'cuda'
        """
        if self.device != "auto":
            return self.device
        return _BACKEND_DEVICE.get(self.backend, "auto")


@dataclass(frozen=True)
class OptimConfig:
    """Adam, at ``lr`` (``constant``) or on a cosine decay to 0 over the run's steps
    (``cosine``), after a linear warm-up of ``warmup_steps`` (see
    :func:`~dgl_scalegnn.core.schedule.learning_rate`)."""

    lr: float = 0.01
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0


@dataclass(frozen=True)
class OutputConfig:
    """Where results go: JSON-lines metrics and checkpoints, and how often the console
    prints a loss line between evaluations (``log_every`` steps; 0: never)."""

    dir: str | None = None
    metrics: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    log_every: int = 50


@dataclass(frozen=True)
class Config:
    """A whole run's configuration, one section per concern.

    ``explicit`` holds the dotted keys the user gave (in the YAML or with ``--set``),
    which :func:`config_from_mapping` records; it is not a key of the YAML. A graph
    that is read (every ``data.name`` but ``synthetic``) takes the settings
    :mod:`~dgl_scalegnn.train.defaults` derives from it for every key of
    :data:`~dgl_scalegnn.train.defaults.DERIVED_KEYS` not in ``explicit``.
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The sections as nested dictionaries (``explicit`` is not a section)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}


#: The sections of a config file (every field of :class:`Config` but ``explicit``).
_SECTIONS = ("data", "model", "sampling", "train", "parallel", "optim", "output")

#: Local SpMM kernels that call DGL's sparse operators, which DGL's wheels provide on CPU
#: only (see :mod:`dgl_scalegnn.parallel.spmm`).
CPU_ONLY_KERNELS = ("dgl-scaled", "dgl-weighted")
#: Every local SpMM kernel (``parallel.spmm_kernel`` also takes ``auto``).
SPMM_KERNELS = ("torch-csr", *CPU_ONLY_KERNELS)
#: Every vertex sampler (``sampling.method``; see :mod:`dgl_scalegnn.sampling.sampler`).
SAMPLING_METHODS = ("uniform",)
#: Every graph layer type (``model.conv``; see :mod:`dgl_scalegnn.model.convs`).
CONVS = ("gcn", "sage", "gin")
#: The device each ``parallel.backend`` runs on.
_BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu"}
#: Switches that take ``auto`` (decided by the device) besides true and false.
_AUTO_SWITCHES = ("parallel.fuse", "parallel.tf32")

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


_CHOICES = {
    "data.name": DATASET_NAMES,
    "train.target_metric": ("train_acc", "val_acc", "test_acc"),
    "train.on_nonfinite": ("stop", "skip"),
    "train.evaluation": ("auto", "layerwise", "neighbourhood"),
    "parallel.device": ("auto", "cpu", "cuda"),
    "parallel.backend": ("auto", "gloo", "nccl"),
    "parallel.spmm_kernel": ("auto", *SPMM_KERNELS),
    "sampling.method": SAMPLING_METHODS,
    "model.conv": CONVS,
    "optim.lr_schedule": ("constant", "cosine"),
    "model.residual_from": ("input", "aggregated"),
    "data.feature_norm": ("auto", *FEATURE_NORMS),
}


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
    """A switch that takes true, false or ``auto`` (:data:`_AUTO_SWITCHES`), on ``device``
    (``"cuda"``, ``"cpu"``...): ``auto`` is on with CUDA.

    >>> switch_on("auto", "cuda"), switch_on("auto", "cpu"), switch_on(True, "cpu")
    (True, False, True)
    """
    return setting is True or (setting == "auto" and device == "cuda")


def _check_parallel(parallel: ParallelConfig) -> None:
    """Refuse a device and backend that contradict each other, a switch that is neither
    true, false nor auto, and a kernel the requested device cannot run."""
    implied = _BACKEND_DEVICE.get(parallel.backend)
    if parallel.device != "auto" and implied not in (None, parallel.device):
        raise ConfigError(
            f"parallel.backend: got {parallel.backend!r} with parallel.device "
            f"{parallel.device!r}, but {parallel.backend} runs on {implied}; give backend auto "
            f"(it follows the device: nccl on cuda, gloo on cpu) or device {implied}"
        )
    for key in _AUTO_SWITCHES:
        value = getattr(parallel, key.split(".")[1])
        if not isinstance(value, bool) and value != "auto":
            raise ConfigError(f"{key}: got {value!r}; give true, false or auto")
    requested = parallel.requested_device()
    check_kernel_backend(parallel.spmm_kernel, "nccl" if requested == "cuda" else "gloo")


def check_config(cfg: Config) -> None:
    """Refuse a value out of its choices or range, or a contradictory pair of values,
    with a :class:`ConfigError` naming the key (what :func:`config_from_mapping` checks)."""
    for key, allowed in _CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in allowed:
            raise ConfigError(f"{key}: got {value!r}; allowed values are {', '.join(allowed)}")

    def positive(key: str, value: float, minimum: float = 1) -> None:
        if value < minimum:
            raise ConfigError(f"{key}: got {value}; it must be at least {minimum}")

    _check_parallel(cfg.parallel)
    sizes = grid_sizes(cfg.parallel.grid)
    if sizes is None or min(sizes) < 1:
        raise ConfigError(
            f"parallel.grid: got {cfg.parallel.grid!r}; give GdxGxxGyxGz (e.g. 1x2x2x2) or "
            "GxxGyxGz, every size at least 1"
        )
    positive("model.hidden", cfg.model.hidden)
    positive("model.layers", cfg.model.layers, 0)
    if cfg.model.layers == 0 and not (cfg.model.head and cfg.model.input_projection):
        switch = "input_projection" if cfg.model.head else "head"
        raise ConfigError(
            f"model.layers: got 0, but model.{switch}: false "
            "needs a GCN layer (to read the features or to output the classes); give at "
            "least one layer or turn it back on"
        )
    if cfg.model.final_norm and not cfg.model.head:
        raise ConfigError(
            "model.final_norm: true normalises the head's input, but model.head: false; "
            "turn the head on or final_norm off"
        )
    positive("sampling.batch_size", cfg.sampling.batch_size, 2)
    positive("train.epochs", cfg.train.epochs)
    positive("train.eval_every", cfg.train.eval_every)
    positive("output.checkpoint_every", cfg.output.checkpoint_every, 0)
    positive("output.log_every", cfg.output.log_every, 0)
    positive("parallel.timeout_s", cfg.parallel.timeout_s, 1)
    positive("parallel.watchdog_s", cfg.parallel.watchdog_s, 2)
    for key in ("dropout", "input_dropout"):
        rate = getattr(cfg.model, key)
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"model.{key}: got {rate}; it must be in [0, 1)")
    if cfg.model.conv != "gin" and (cfg.model.gin_eps != 0 or cfg.model.gin_learn_eps):
        raise ConfigError(
            f"model.gin_eps / model.gin_learn_eps set with model.conv: {cfg.model.conv}; they "
            "are GIN's (model.conv: gin): remove them or choose gin"
        )
    if cfg.model.rms_eps <= 0:
        raise ConfigError(
            f"model.rms_eps: got {cfg.model.rms_eps}; it must be positive (an all-zero row "
            "divides by zero otherwise), e.g. 1e-6"
        )
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr: got {cfg.optim.lr}; it must be positive")
    if cfg.optim.weight_decay < 0:
        raise ConfigError(
            f"optim.weight_decay: got {cfg.optim.weight_decay}; give 0 (none) or more, e.g. 5e-4"
        )
    if cfg.optim.warmup_steps < 0:
        raise ConfigError(
            f"optim.warmup_steps: got {cfg.optim.warmup_steps}; give 0 (no warm-up) or more"
        )
    if cfg.train.target_acc is not None and not cfg.train.evaluate:
        raise ConfigError(
            f"train.target_acc: {cfg.train.target_acc} is checked at evaluations, but "
            "train.evaluate: false runs none; unset one of them"
        )
    if cfg.train.target_acc is not None and not 0.0 < cfg.train.target_acc <= 1.0:
        raise ConfigError(
            f"train.target_acc: got {cfg.train.target_acc}; give a fraction in (0, 1], e.g. 0.8"
        )
    if cfg.train.max_steps is not None:
        positive("train.max_steps", cfg.train.max_steps)
    if cfg.train.max_train_s is not None and not cfg.train.max_train_s > 0:
        raise ConfigError(
            f"train.max_train_s: got {cfg.train.max_train_s}; give the training seconds, e.g. 60"
        )
    if cfg.train.eval_every_steps is not None:
        positive("train.eval_every_steps", cfg.train.eval_every_steps)
    for step in cfg.train.eval_at_steps:
        positive("train.eval_at_steps", step)
    if cfg.data.name == "dgl" and not cfg.data.path and not cfg.data.prepared:
        raise ConfigError("data.path: name 'dgl' needs the file written by dgl.save_graphs")
    for key, default in (("feat_key", "feat"), ("label_key", "label")):
        value = getattr(cfg.data, key)
        if value != default and cfg.data.name != "dgl":
            raise ConfigError(
                f"data.{key}: got {value!r} with data.name {cfg.data.name!r}; it names the node "
                f"data of a dgl.save_graphs file (data.name: dgl); remove it for {cfg.data.name}"
            )
        if not value:
            raise ConfigError(f"data.{key}: empty; give the ndata key, e.g. {default!r}")
    syn = cfg.data.synthetic
    positive("data.synthetic.num_nodes", syn.num_nodes, 2)
    positive("data.synthetic.num_classes", syn.num_classes, 2)
    positive("data.synthetic.num_features", syn.num_features)
    if not 0.0 <= syn.homophily <= 1.0:
        raise ConfigError(f"data.synthetic.homophily: got {syn.homophily}; it must be in [0, 1]")
    if not (
        syn.train_fraction > 0
        and syn.val_fraction > 0
        and syn.train_fraction + syn.val_fraction < 1
    ):
        raise ConfigError(
            "data.synthetic.train_fraction/val_fraction: got "
            f"{syn.train_fraction}/{syn.val_fraction}; both positive with a sum below 1"
        )
    if cfg.output.checkpoint_every and not cfg.output.dir:
        raise ConfigError(
            f"output.checkpoint_every: got {cfg.output.checkpoint_every}, but output.dir is not "
            "set; give output.dir (checkpoints go to output.dir/checkpoints)"
        )
    if cfg.data.prepared is not None and not Path(cfg.data.prepared).is_dir():
        raise ConfigError(f"data.prepared: directory {cfg.data.prepared!r} does not exist")


def _finite(key: str, value: float) -> float:
    """``value``, refused when it is NaN or infinite (no float setting means either)."""
    if not math.isfinite(value):
        raise ConfigError(
            f"{key}: got {value}; give a finite number (YAML's .nan, .inf and -.inf are not)"
        )
    return value


def _whole(key: str, value: float) -> int:
    """``value`` as the int it equals (``1e3`` reads as the float 1000.0), refused when it
    has a fractional part or is not finite."""
    if not value.is_integer():
        raise ConfigError(f"{key}: expected int, got float {value!r}; give a whole number")
    return int(value)


def _coerce(key: str, annotation: Any, value: Any) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are (and
    floats that equal an int where ints are); floats must be finite."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        refusals = []
        for option in (option for option in options if option is not type(None)):
            try:
                return _coerce(key, option, value)
            except ConfigError as refusal:  # the next type may take it (bool | str)
                refusals.append(refusal)
        raise refusals[0]
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
        return _finite(key, float(value))
    if annotation is int and isinstance(value, float):
        return _whole(key, value)
    if not isinstance(value, annotation):
        raise ConfigError(
            f"{key}: expected {annotation.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _build(cls: type, mapping: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
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
    result = _deep_copy(mapping)
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


def _deep_copy(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in mapping.items()}


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
