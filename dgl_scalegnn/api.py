"""Your own training loop on the 4D grid: the public API (``import dgl_scalegnn as sg``).

A DistDGL script calls ``dgl.distributed.initialize``, opens a ``DistGraph``, splits
the training vertices with ``node_split``, iterates a ``DistNodeDataLoader`` and wraps
its model in ``DistributedDataParallel``. Here the same loop reads:

- :func:`init` starts this process's place in the job, from whatever launched it (one
  process, ``mpirun``, ``srun``, ``torchrun``): the device policy, the process groups
  of the grid ``Gd x Gx x Gy x Gz``, the watchdog, and the signals that ask for a
  checkpoint; a :class:`Job` is a context manager that ends all of it (and says bad
  input in one line, exit code 2, as ``scalegnn`` does);
- :func:`load_graph` maps this rank's share of a graph: a prepared directory, a
  ``dgl.save_graphs`` file, a dataset name, or (one process) a ``DGLGraph``;
- :func:`build_model` is the model, an ordinary :class:`torch.nn.Module` whose
  parameters are this rank's shards: any torch optimiser and learning-rate scheduler
  drive it;
- :func:`minibatches` gives this rank's communication-free batches,
  ``batches[step]`` or ``batches.epoch(e)``: a batch is a function of its step alone,
  so a resumed run draws the batches it would have drawn;
- :func:`objective` is the loss on the sharded logits (parallel cross-entropy or BCE,
  with class weights and label smoothing); :meth:`Job.agree` averages the gradients
  over the data-parallel replicas and agrees with every rank on the step;
- :func:`evaluate` (accuracies) and :func:`predict` (gathered predictions) run the
  full-graph distributed evaluation; :class:`Checkpoints` save and resume on any grid;
- :class:`MetricsWriter`, :class:`Console`, :func:`read_metrics`, :func:`run_table` and
  :func:`plot_runs` are the CLI's metrics file, lines and report, as helpers.

Shapes: for a batch of ``B`` vertices on a grid, ``model(batch)`` returns this rank's
``(B_local, C_local)`` logits shard and its :class:`~dgl_scalegnn.parallel.partition.ShardSpec`
(rows and classes split over two grid axes); losses and accuracies are the same value
on every rank.

Example
-------
One process here (the same script runs on every rank of ``mpirun -np 8`` with
``grid="1x2x2x2"``):

>>> import torch
>>> import dgl_scalegnn as sg
>>> from dgl_scalegnn.data.synthetic import generate
>>> from dgl_scalegnn.config import SyntheticConfig
>>> with sg.init(grid="1x1x1x1") as job:  # doctest: +ELLIPSIS
...     graph = sg.load_graph(generate(SyntheticConfig(num_nodes=400)).graph, job)
...     model = sg.build_model(graph, job, sg.ModelConfig(conv="sage", layers=2, hidden=16))
...     batches = sg.minibatches(graph, model, job, batch_size=200)
...     loss_of = sg.objective(graph, job, label_smoothing=0.1)
...     optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
...     for step in range(4):
...         model.train()
...         optimizer.zero_grad()
...         batch = batches[step]
...         logits, spec = model(batch)
...         loss = loss_of(logits, spec, batch)
...         loss.backward()
...         agreed = job.agree(model, loss)
...         optimizer.step()
...     sorted(sg.evaluate(model, batches, job))
scalegnn: ...
['test_acc', 'train_acc', 'val_acc']
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import (
    DataConfig,
    ModelConfig,
    ParallelConfig,
    config_from_mapping,
)
from dgl_scalegnn.data.datasets import as_trained, dataset_from_graph
from dgl_scalegnn.data.prepared import PreparedGraph, open_prepared, prepare_in_memory
from dgl_scalegnn.distributed.comm import reduce_over_world
from dgl_scalegnn.distributed.watchdog import stopped_the_job
from dgl_scalegnn.errors import (
    BAD_INPUT_EXIT_CODE,
    RESOURCE_EXIT_CODE,
    InputError,
    ResourceError,
    say_input_error,
)
from dgl_scalegnn.evaluation.evaluator import choose_evaluator
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.model.objective import Objective
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.model.stack import layer_kind
from dgl_scalegnn.parallel.losses import parallel_argmax
from dgl_scalegnn.sampling.minibatches import MiniBatches
from dgl_scalegnn.train.checkpoint import Checkpoints as _Checkpoints
from dgl_scalegnn.train.console import Console
from dgl_scalegnn.train.defaults import agreed_available_bytes
from dgl_scalegnn.train.metrics import MetricsWriter, read_metrics
from dgl_scalegnn.train.preemption import PREEMPTED_EXIT_CODE, Request, SignalRequests
from dgl_scalegnn.train.report import plot_runs, read_runs, run_table
from dgl_scalegnn.train.run import Session, end_session, start_session
from dgl_scalegnn.train.run import load_graph as _load_graph
from dgl_scalegnn.train.run_lock import claim_run_directory
from dgl_scalegnn.train.step_agreement import StepAgreement, agree_on_step

__all__ = [
    "init",
    "Job",
    "load_graph",
    "build_model",
    "minibatches",
    "MiniBatches",
    "objective",
    "Objective",
    "StepAgreement",
    "Request",
    "evaluate",
    "predict",
    "Checkpoints",
    "ModelConfig",
    "ParallelConfig",
    "DataConfig",
    "MetricsWriter",
    "Console",
    "read_metrics",
    "read_runs",
    "run_table",
    "plot_runs",
    "PREEMPTED_EXIT_CODE",
]


class Job:
    """This process's place in a job (:func:`init`): its rank, the grid, the device, and
    the signals received; a context manager that ends the job's session on exit.

    On exit after an error the other ranks are stopped too (the watchdog); bad input
    (:class:`~dgl_scalegnn.errors.InputError`) is said in one line and the process exits
    with code 2 on every rank, a resource failure (a full disk) with 74, as ``scalegnn``
    does. While the job runs, ``SIGTERM``, ``SIGUSR2`` and ``SIGINT`` are recorded as a
    request to checkpoint and stop, ``SIGUSR1`` as a request to checkpoint: the loop
    reads the request every rank agreed on from :meth:`agree` and acts on it.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.requests = SignalRequests()
        self._signals = self.requests.installed()
        self._locks: list[Any] = []
        #: The evaluator :func:`evaluate` chose for each model, batches and method.
        self.evaluators: dict[tuple[Any, ...], Any] = {}

    def claim(self, directory: str | os.PathLike[str]) -> None:
        """Make ``directory`` this job's alone until it ends (collective): its lock, as
        ``scalegnn train`` takes its ``output.dir``'s, so a second job writing there is
        refused on every rank (:class:`~dgl_scalegnn.train.run_lock.RunDirectoryError`,
        exit code 2) instead of interleaving checkpoints. :class:`Checkpoints` claims
        its directory."""
        lock = claim_run_directory(directory, self.rank)
        if lock is not None:
            self._locks.append(lock)

    @property
    def rank(self) -> int:
        """This process's rank in the world."""
        return self.session.launch.rank

    @property
    def world_size(self) -> int:
        return self.session.launch.world_size

    @property
    def is_root(self) -> bool:
        """Rank 0: the one that writes metrics and prints."""
        return self.rank == 0

    @property
    def grid(self) -> Any:
        """The :class:`~dgl_scalegnn.distributed.grid.Grid4D`: shape, coordinates, groups."""
        return self.session.runtime.grid

    @property
    def device(self) -> torch.device:
        return self.session.device

    @property
    def runtime(self) -> Any:
        """The :class:`~dgl_scalegnn.distributed.comm.Runtime` the model computes with."""
        return self.session.runtime

    def agree(
        self, model: torch.nn.Module, loss: torch.Tensor, train_seconds: float = 0.0
    ) -> StepAgreement:
        """After ``loss.backward()``: average ``model``'s gradients over the
        data-parallel replicas and agree with every rank on the step (collective; one read
        of the device): the mean loss, whether any rank saw a non-finite loss or gradient
        (skip the optimizer's step then, on every rank), the strongest signal request any
        rank received (:class:`Request`: checkpoint, or checkpoint and stop), and the
        slowest rank's ``train_seconds``."""
        return agree_on_step(model, loss, self.runtime, self.requests.take(), train_seconds)

    def __enter__(self) -> Job:
        self._signals.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool:
        self._signals.__exit__(kind, error, trace)
        for lock in self._locks:
            lock.release()
        end_session(self.session, error)
        if isinstance(error, InputError | ResourceError):
            if (self.is_root and not stopped_the_job(error)) or isinstance(error, ResourceError):
                say_input_error(error)
            code = BAD_INPUT_EXIT_CODE if isinstance(error, InputError) else RESOURCE_EXIT_CODE
            raise SystemExit(code) from None
        return False


def init(grid: str | None = None, **parallel: Any) -> Job:
    """Start this process's part of a job on the 4D grid ``grid`` (``GdxGxxGyxGz``; by
    default one process), from the launcher's environment (none, ``mpirun``, ``srun``,
    ``torchrun``): the device (``parallel.device``: ``auto`` takes this rank's GPU where
    CUDA is usable; rank 0 says which in one line), the process groups of the grid and a
    warm-up collective on each, and the watchdog that stops every rank when one is lost.

    ``parallel`` takes any key of :class:`~dgl_scalegnn.config.ParallelConfig`
    (``device``, ``tf32``, ``timeout_s`` ...).

    Raises
    ------
    ConfigError
        A grid whose product is not the world size, an unknown key, a device that is not
        usable: the same one-line refusals as ``scalegnn train``.
    """
    keys = {**parallel, **({"grid": grid} if grid is not None else {})}
    cfg = config_from_mapping({"parallel": keys})
    return Job(start_session(cfg.parallel))


def load_graph(
    source: str | os.PathLike[str] | dgl.DGLGraph, job: Job, **data: Any
) -> PreparedGraph:
    """This rank's graph, as ``scalegnn train`` reads it: GCN-normalised, relabelled,
    memory-mapped where it is on disk (each rank reads only its share).

    ``source`` is a directory written by ``scalegnn prepare``, a ``dgl.save_graphs``
    file (its features scaled by rows, as ``--data`` does), the name of a public dataset
    (``cora``, ``ogbn-products`` ...: read from ``data.root``), or, on one process, a
    :class:`dgl.DGLGraph` with ``ndata`` ``feat``, ``label`` and the three masks.
    ``data`` takes any other key of :class:`~dgl_scalegnn.config.DataConfig`
    (``feature_norm``, ``root``, ``label_key`` ...).

    Raises
    ------
    DatasetError
        Missing files, a malformed graph, labels or masks that cannot be trained on.
    """
    if isinstance(source, dgl.DGLGraph):
        if job.world_size > 1:
            raise InputError(
                "load_graph: a DGLGraph in memory serves one process; save it "
                "(dgl.save_graphs) or prepare it (scalegnn prepare) for a job of "
                f"{job.world_size}"
            )
        cfg = DataConfig(name="dgl", **data)  # no file: the graph is here
        dataset = as_trained(dataset_from_graph(source), cfg)
        return prepare_in_memory(dataset, cfg.permutation_seed)
    text = str(source)
    if Path(text).expanduser().is_dir():
        keys = {"name": "dgl", "prepared": text, **data}
        name = _prepared_name(Path(text))
        if name is not None:
            keys["name"] = name
    elif Path(text).expanduser().is_file():
        keys = {"name": "dgl", "path": text, **data}
    else:
        keys = {"name": text, **data}
    return _load_graph(config_from_mapping({"data": keys}), job.session)


def _prepared_name(directory: Path) -> str | None:
    """The dataset a prepared directory holds (its ``meta.json``), if it says."""
    return open_prepared(directory).meta.name if (directory / "meta.json").is_file() else None


def build_model(
    graph: PreparedGraph,
    job: Job,
    cfg: ModelConfig | None = None,
    *,
    layers: Sequence[str] | None = None,
    seed: int = 0,
    fuse: bool | str = "auto",
    native: bool = True,
    **model: Any,
) -> ParallelScaleGNN:
    """The parallel model for ``graph`` on ``job``'s grid, on its device: its parameters
    are this rank's shards (:meth:`~ParallelScaleGNN.sharded_state_dict` gives each
    one's global shape and split).

    ``cfg`` is a :class:`~dgl_scalegnn.config.ModelConfig`; or give ``layers``, the
    registered layer type of each graph layer (``["sage", "sage"]``; one type for every
    layer), and any ``model.*`` key by name (``hidden=128``, ``dropout=0.5`` ...).
    ``seed`` draws the initial weights (the same on every grid).
    """
    keys = dict(model)
    if layers is not None:
        kinds = set(layers)
        if len(kinds) != 1:
            raise InputError(
                f"layers: {list(layers)}; a model has one layer type for all its layers "
                f"(e.g. {[layers[0]] * len(layers)})"
            )
        keys.update(conv=layers[0], layers=len(layers))
    if cfg is not None:  # its keys, with those given by name over them (all checked)
        keys = {**dataclasses.asdict(cfg), **keys}
    cfg = config_from_mapping({"model": keys}).model
    meta = graph.meta
    return ParallelScaleGNN(
        cfg,
        in_features=meta.num_features,
        num_classes=meta.num_classes,
        runtime=job.runtime,
        seed=seed,
        fuse=fuse,
        native=native,
    ).to(job.device)


def minibatches(
    graph: PreparedGraph,
    model: ParallelScaleGNN,
    job: Job,
    batch_size: int,
    *,
    seed: int = 0,
    method: str = "uniform",
) -> MiniBatches:
    """This rank's batches of ``batch_size`` vertices per data-parallel group
    (:class:`~dgl_scalegnn.sampling.minibatches.MiniBatches`), for ``model``'s layers."""
    return MiniBatches(
        graph,
        job.grid,
        model.cfg.layers,
        batch_size,
        kind=layer_kind(model.cfg),
        seed=seed,
        method=method,
        device=job.device,
        profiler=job.runtime.profiler,
    )


def objective(
    graph: PreparedGraph,
    job: Job,
    *,
    class_weights: Sequence[float] | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> Objective:
    """The loss of ``graph``'s labels on the sharded logits, called as
    ``objective(logits, spec, batch)`` (the mean over the batch's training vertices, the
    same on every rank): parallel cross-entropy, or BCE for multi-label graphs, with
    ``class_weights`` ``(C,)`` and ``label_smoothing`` as in
    :func:`torch.nn.functional.cross_entropy`."""
    weights = None
    if class_weights is not None:
        weights = torch.as_tensor(class_weights, dtype=torch.float32, device=job.device)
    return Objective(job.runtime, graph.meta.multilabel, weights, label_smoothing)


def evaluate(
    model: ParallelScaleGNN, batches: MiniBatches, job: Job, how: str = "auto"
) -> dict[str, float | None]:
    """Full-graph accuracy of every split (micro-F1 if multi-label), the same on every
    rank (collective): ``how`` is ``train.evaluation`` (``auto``: the layer-wise
    evaluation where every rank has room for it, else in neighbourhoods). The engine is
    chosen at the first call for ``model``, ``batches`` and ``how`` and kept."""
    key = (model, batches, how)
    if key not in job.evaluators:  # chosen once, as the trainer does: its note said once
        local_ranks = job.session.launch.local_world_size or 1

        def available() -> tuple[int, str]:
            return agreed_available_bytes(job.device, local_ranks), "each rank"

        graph = batches.graph
        scorer = Objective(job.runtime, graph.meta.multilabel)
        choice = choose_evaluator(how, model, batches.store, graph, scorer, available)
        if choice.note is not None and job.is_root:
            print(f"scalegnn: {choice.note}", file=sys.stderr, flush=True)
        job.evaluators[key] = choice.evaluator
    return job.evaluators[key].accuracies()


@torch.no_grad()
def predict(
    model: ParallelScaleGNN, batches: MiniBatches, job: Job, vertices: torch.Tensor | None = None
) -> torch.Tensor:
    """The predicted class of every vertex (``(N,)`` int64; multi-label: ``(N, C)``
    bool), in the graph's own vertex order, gathered on every rank (collective), or of
    ``vertices`` only. The layer-wise evaluation's logits, one all-reduce."""
    model.eval()
    graph = batches.graph
    full = batches.store.full_graph()
    logits, spec = full_graph_forward(model, full)
    grid = job.grid
    rows = spec.rows.ids(spec.layout.rows, grid.coord(spec.layout.rows))
    num_nodes, num_classes = graph.meta.num_nodes, graph.meta.num_classes
    if graph.meta.multilabel:
        start, stop = spec.col_range(grid.shape, grid.coords)
        out = torch.zeros(num_nodes, num_classes, device=logits.device)
        out[rows.to(logits.device), start:stop] = (logits > 0).float()
    else:
        out = torch.full((num_nodes,), -1.0, dtype=torch.float64, device=logits.device)
        out[rows.to(logits.device)] = parallel_argmax(logits, spec, job.runtime).double()
    out = reduce_over_world(out, torch.distributed.ReduceOp.MAX)
    # the store's vertex order is the prepared graph's; the graph's own is its inverse
    permutation = torch.from_numpy(graph.permutation.astype("int64")).to(out.device)
    mine = out[permutation]
    mine = mine.bool() if graph.meta.multilabel else mine.long()
    return mine if vertices is None else mine[vertices.to(mine.device)]


class Checkpoints(_Checkpoints):
    """:class:`~dgl_scalegnn.train.checkpoint.Checkpoints` of ``model`` and ``optimizer``
    in ``directory`` on ``job``'s grid: ``save(progress)`` writes the step
    ``progress["global_step"]`` (collective, verified, published atomically), and
    ``resume()`` loads the newest that verifies, from any grid (``None`` where there is
    none); ``config`` records what the run is (its ``model`` section is checked on
    resume), ``graph`` the graph it trains (another graph is refused). The directory is
    the job's alone while it runs (:meth:`Job.claim`)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        job: Job,
        model: ParallelScaleGNN,
        optimizer: torch.optim.Optimizer,
        config: dict[str, Any] | None = None,
        graph: PreparedGraph | None = None,
    ) -> None:
        job.claim(directory)
        record = {"model": dataclasses.asdict(model.cfg), **(config or {})}
        meta = None if graph is None else graph.meta
        super().__init__(directory, job.grid, model, optimizer, record, meta)
