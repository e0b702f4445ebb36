"""What the peer baselines share: seeding, settings, the timed epoch loop and sweeps.

Every baseline is an object with ``train_epoch()`` and ``evaluate() -> (val_acc,
test_acc)`` (the :class:`Baseline` protocol; :class:`MiniBatchBaseline` implements it
for Adam and cross-entropy). :func:`run_epochs` drives it and keeps the books in the
common result format (:meth:`Method.train` seeds, builds and runs a baseline;
:func:`sweep` tries a grid of settings):

``history``
    One record per evaluation: ``epoch`` (1-based, epochs finished), ``train_s``
    (cumulative wall time spent in ``train_epoch`` only, evaluation excluded),
    ``val_acc``, ``test_acc``, ``eval_s`` (wall time of that evaluation) and
    ``train_loss`` (the mean training loss of the steps since the previous evaluation;
    ``None`` where a baseline does not report its losses).
``best_val_acc``, ``test_at_best_val``
    The highest validation accuracy and the test accuracy of the same evaluation.
``time_to_target_s``
    ``train_s`` of the first evaluation whose validation accuracy reaches ``target_acc``
    (:func:`benchmarks.harness.first_at_target`, the trainer's definition); ``None``
    when no target is given or it is never reached.
``eval_s_per_round``
    The median ``eval_s``.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from benchmarks.harness import first_at_target
from dgl_scalegnn._dgl import dgl, disable_libxsmm
from dgl_scalegnn.data.graph import NodeDataset

__all__ = [
    "Baseline",
    "MiniBatchBaseline",
    "RESULT_KEYS",
    "HISTORY_KEYS",
    "TrainFn",
    "machine_cores",
    "seed_everything",
    "merge_settings",
    "require_single_label",
    "split_ids",
    "run_epochs",
    "eval_schedule",
    "run_for_seconds",
    "summarise",
    "mean_std",
    "mean_loss",
    "sweep",
    "Method",
]

#: Keys of the dictionary :func:`run_epochs` returns.
RESULT_KEYS = (
    "history",
    "best_val_acc",
    "test_at_best_val",
    "time_to_target_s",
    "eval_s_per_round",
)
#: Keys of each ``history`` record.
HISTORY_KEYS = ("epoch", "train_s", "val_acc", "test_acc", "eval_s", "train_loss")


class Baseline(Protocol):
    """A model with its sampler and optimiser, ready to train epoch by epoch."""

    def train_epoch(self) -> float | None:
        """Run one epoch of mini-batch steps; their mean loss, if the baseline keeps it."""

    def evaluate(self) -> tuple[float, float]:
        """Return ``(val_acc, test_acc)`` of the current parameters."""


#: ``train(dataset, settings, seed, target_acc, max_epochs, eval_every) -> result``.
TrainFn = Callable[[NodeDataset, Mapping[str, Any], int, float | None, int, int], dict]


def machine_cores() -> int:
    """CPU cores this process may run on (2 on the benchmark machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python, NumPy, torch and DGL's samplers; set torch's intra-op threads.

    Parameters
    ----------
    seed : int
        The seed of every generator. DGL's ``NeighborSampler`` draws from DGL's own
        generator (``dgl.seed``); ``SAINTSampler`` and the data loaders' shuffles draw
        from torch's.
    threads : int, optional
        Torch threads (also DGL's: they share torch's OpenMP runtime); the machine's
        cores by default.

    Notes
    -----
    With one thread a run is a function of the seed, bit for bit. With more, DGL's CPU
    kernels are not: sums with atomic adds (COO SpMM, e.g. in ``SAGEConv``'s backward)
    and the concurrent id map of ``to_block`` depend on thread timing, so runs differ
    by round-off, which training can amplify to a few tenths of a percent of accuracy.
    """
    torch.set_num_threads(threads or machine_cores())
    disable_libxsmm()  # the peers' sampled graphs are new every step
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    dgl.seed(seed)


def merge_settings(
    defaults: Mapping[str, Any], settings: Mapping[str, Any] | None, method: str
) -> dict[str, Any]:
    """``defaults`` overridden by ``settings``; unknown keys are refused.

    Raises
    ------
    ValueError
        If ``settings`` has a key that ``defaults`` lacks (a typo would otherwise be
        silently ignored).
    """
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(defaults))
    if unknown:
        raise ValueError(
            f"{method}: unknown setting {unknown[0]!r}; the settings are "
            f"{', '.join(sorted(defaults))}"
        )
    return {**defaults, **settings}


def require_single_label(dataset: NodeDataset, method: str) -> None:
    """Refuse multi-label data: the baselines train softmax classifiers."""
    if dataset.multilabel:
        raise ValueError(f"{method}: dataset {dataset.name!r} is multi-label; not supported")


def split_ids(graph: dgl.DGLGraph, key: str) -> torch.Tensor:
    """Vertex ids (int64) where the boolean ``graph.ndata[key]`` is true."""
    return torch.nonzero(graph.ndata[key], as_tuple=True)[0]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _evaluated(baseline: Baseline, **record: Any) -> dict[str, Any]:
    """``record`` with an evaluation of ``baseline``: its accuracies and seconds."""
    (val_acc, test_acc), eval_s = _timed(baseline.evaluate)
    return {**record, "val_acc": float(val_acc), "test_acc": float(test_acc), "eval_s": eval_s}


class MiniBatchBaseline(ABC):
    """A :class:`Baseline` trained with Adam on mini-batches and softmax cross-entropy.

    Subclasses say what a batch is (:meth:`batches`), what its loss is (:meth:`loss`)
    and how to predict logits for given vertices (:meth:`predict`).

    Parameters
    ----------
    model : torch.nn.Module
        The network; trained by :meth:`train_epoch`.
    labels : torch.Tensor
        ``(N,)`` int64 class of every vertex.
    val_ids, test_ids : torch.Tensor
        The vertices :meth:`evaluate` scores.
    settings : dict
        With ``lr`` and ``weight_decay`` of Adam.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        labels: torch.Tensor,
        val_ids: torch.Tensor,
        test_ids: torch.Tensor,
        settings: Mapping[str, Any],
    ) -> None:
        self.model = model
        self.labels = labels
        self.val_ids, self.test_ids = val_ids, test_ids
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=settings["lr"], weight_decay=settings["weight_decay"]
        )

    @abstractmethod
    def batches(self) -> Iterator[Any]:
        """The mini-batches of one epoch."""

    @abstractmethod
    def loss(self, batch: Any) -> torch.Tensor | None:
        """The training loss of ``batch`` (``None``: nothing to learn from, skip it)."""

    @abstractmethod
    def predict(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the vertices ``ids`` (rows in the order of ``ids``), in eval mode."""

    def train_epoch(self) -> float | None:
        return mean_loss([self.train_step(batch) for batch in self.batches()])

    def train_step(self, batch: Any) -> float | None:
        """One optimiser step on ``batch`` and its loss (nothing, ``None``, when its loss
        is ``None``)."""
        self.model.train()
        loss = self.loss(batch)
        if loss is None:
            return None
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def agree(self, seconds: float) -> float:
        """The training time all processes go by (one process: its own)."""
        return seconds

    def evaluate(self) -> tuple[float, float]:
        self.model.eval()
        ids = torch.cat((self.val_ids, self.test_ids))
        with torch.no_grad():
            correct = (self.predict(ids).argmax(dim=1) == self.labels[ids]).double()
        split = self.val_ids.numel()
        counts = [
            float(correct[:split].sum()),
            float(split),
            float(correct[split:].sum()),
            float(self.test_ids.numel()),
        ]
        val_ok, val_n, test_ok, test_n = self.reduce_counts(counts)
        return val_ok / max(val_n, 1.0), test_ok / max(test_n, 1.0)

    def reduce_counts(self, counts: list[float]) -> list[float]:
        """Combine ``[val_correct, val_total, test_correct, test_total]`` over processes.

        One process scores every vertex: the counts are returned as they are.
        """
        return counts


def run_epochs(
    baseline: Baseline,
    target_acc: float | None,
    max_epochs: int,
    eval_every: int,
    stop_at_target: bool = False,
) -> dict[str, Any]:
    """Train ``max_epochs`` epochs, evaluating every ``eval_every`` and after the last.

    Parameters
    ----------
    baseline : Baseline
        The model, sampler and optimiser.
    target_acc : float or None
        Validation accuracy whose first crossing (at an evaluation) defines
        ``time_to_target_s``.
    max_epochs : int
        Epochs to train.
    eval_every : int
        Evaluate after every ``eval_every``-th epoch (and after the last one).
    stop_at_target : bool
        Stop at the first evaluation that reaches ``target_acc``.

    Returns
    -------
    dict
        The result format described in the module docstring.
    """
    if max_epochs < 1 or eval_every < 1:
        raise ValueError(f"max_epochs ({max_epochs}) and eval_every ({eval_every}) must be >= 1")
    history: list[dict[str, Any]] = []
    train_s = 0.0
    losses: list[float | None] = []
    for epoch in range(1, max_epochs + 1):
        loss, seconds = _timed(baseline.train_epoch)
        train_s += seconds
        losses.append(loss)
        if epoch % eval_every and epoch != max_epochs:
            continue
        history.append(
            _evaluated(baseline, epoch=epoch, train_s=train_s, train_loss=mean_loss(losses))
        )
        losses = []
        if stop_at_target and first_at_target(history[-1:], target_acc):
            break
    return summarise(history, target_acc)


def eval_schedule(budget_s: float, rounds: int, per_doubling: int = 2) -> list[float]:
    r"""``rounds`` training times, evenly spaced on a log axis, ending at ``budget_s``.

    Point ``k`` (0-based) is ``budget_s * 2 ** (-(rounds - 1 - k) / per_doubling)``: two
    per doubling of time by default, so that a time to target read from them is within
    a factor :math:`\sqrt{2}` of the true one, at any scale, with few evaluations (one
    per doubling: within a factor 2, with half the evaluations for the same span).

    >>> [round(t, 2) for t in eval_schedule(8.0, 4)]
    [2.83, 4.0, 5.66, 8.0]
    >>> eval_schedule(8.0, 4, per_doubling=1)
    [1.0, 2.0, 4.0, 8.0]
    """
    if budget_s <= 0 or rounds < 1 or per_doubling < 1:
        raise ValueError(
            f"budget_s ({budget_s}) must be positive, rounds ({rounds}) and per_doubling "
            f"({per_doubling}) >= 1"
        )
    return [budget_s * 2 ** (-(rounds - 1 - k) / per_doubling) for k in range(rounds)]


def run_for_seconds(
    baseline: MiniBatchBaseline,
    budget_s: float,
    eval_at_s: Sequence[float],
    steps_per_epoch: int,
) -> dict[str, Any]:
    """Train step by step for ``budget_s`` seconds, evaluating as ``eval_at_s`` is passed.

    Training time is drawing a batch plus its optimiser step; evaluation is excluded.
    After the first step whose cumulative training time passes ``eval_at_s[k]`` the
    model is evaluated once (several points passed by one step give one evaluation),
    and always after the last step. Epochs restart the baseline's batches as needed.

    Parameters
    ----------
    baseline : MiniBatchBaseline
        The model, sampler and optimiser (``agree`` makes processes stop together).
    budget_s : float
        Training seconds after which no step is started.
    eval_at_s : sequence of float
        Training times that trigger an evaluation (:func:`eval_schedule`).
    steps_per_epoch : int
        Steps of one epoch, to report ``epoch`` (fractional) in the history.

    Returns
    -------
    dict
        The result format of the module docstring; history records also carry
        ``step`` (steps done) and ``epoch`` is ``step / steps_per_epoch``.
    """
    pending = sorted(eval_at_s)
    history: list[dict[str, Any]] = []
    train_s, step = 0.0, 0
    losses: list[float | None] = []
    batches = iter(baseline.batches())
    while True:
        start = time.perf_counter()
        batch = next(batches, None)
        if batch is None:  # the epoch is over: a new one, timed as training
            batches = iter(baseline.batches())
            batch = next(batches)
        losses.append(baseline.train_step(batch))
        train_s += time.perf_counter() - start
        step += 1
        train_s = baseline.agree(train_s)
        done = train_s >= budget_s
        if not done and not (pending and train_s >= pending[0]):
            continue
        while pending and pending[0] <= train_s:
            pending.pop(0)
        record = {"step": step, "epoch": step / steps_per_epoch, "train_s": train_s}
        history.append(_evaluated(baseline, **record, train_loss=mean_loss(losses)))
        losses = []
        if done:
            return summarise(history, None)


def summarise(history: list[dict[str, Any]], target_acc: float | None) -> dict[str, Any]:
    """The result dictionary of a finished ``history`` (see the module docstring)."""
    if not history:
        raise ValueError("an empty history has no result")
    best = max(history, key=lambda record: record["val_acc"])  # first of equals
    reached = first_at_target(history, target_acc)
    return {
        "history": history,
        "best_val_acc": best["val_acc"],
        "test_at_best_val": best["test_acc"],
        "time_to_target_s": None if reached is None else reached["train_s"],
        "eval_s_per_round": statistics.median(record["eval_s"] for record in history),
    }


def mean_loss(losses: Iterable[float | None]) -> float | None:
    """The mean of the losses that are known (``None``: a step that had none to learn
    from, or a baseline that does not keep them); ``None`` if none is.

    >>> mean_loss([1.0, None, 2.0]), mean_loss([None])
    (1.5, None)
    """
    known = [loss for loss in losses if loss is not None]
    return statistics.fmean(known) if known else None


def mean_std(values: Sequence[float]) -> dict[str, float | None]:
    """``{"mean", "std"}``: sample standard deviation, 0 for one value, ``None`` for none."""
    if len(values) == 0:
        return {"mean": None, "std": None}
    array = np.asarray(values, dtype=np.float64)
    std = float(array.std(ddof=1)) if array.size > 1 else 0.0
    return {"mean": float(array.mean()), "std": std}


def _grid_row(settings: Mapping[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    val = mean_std([r["best_val_acc"] for r in results])
    test = mean_std([r["test_at_best_val"] for r in results])
    return {
        "settings": dict(settings),
        "mean_val_acc": val["mean"],
        "std_val_acc": val["std"],
        "mean_test_acc": test["mean"],
        "std_test_acc": test["std"],
    }


def sweep(
    train: TrainFn,
    dataset: NodeDataset,
    grid: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    target_acc: float | None = None,
    max_epochs: int = 50,
    eval_every: int = 1,
) -> dict[str, Any]:
    """Train every setting of ``grid`` with every seed; pick the best mean validation.

    Parameters
    ----------
    train : callable
        ``train(dataset, settings, seed, target_acc, max_epochs, eval_every)``.
    dataset : NodeDataset
        The graph.
    grid : sequence of dict
        Settings to try (each merged over the method's defaults by ``train``).
    seeds : sequence of int
        Seeds of each setting.
    target_acc, max_epochs, eval_every
        Passed to ``train``.

    Returns
    -------
    dict
        ``best_settings``, ``best_mean_val_acc``, ``results`` (the per-seed result
        dictionaries of the best settings, in the order of ``seeds``) and ``table``
        (per setting: ``settings``, ``mean_val_acc``, ``std_val_acc``,
        ``mean_test_acc``, ``std_test_acc``; the test accuracy is taken at the best
        validation accuracy of each run).
    """
    if not grid or not seeds:
        raise ValueError("sweep needs at least one setting and one seed")
    table, per_seed = [], []
    for settings in grid:
        results = [
            train(dataset, settings, seed, target_acc, max_epochs, eval_every) for seed in seeds
        ]
        table.append(_grid_row(settings, results))
        per_seed.append(results)
    best = max(range(len(grid)), key=lambda i: table[i]["mean_val_acc"])
    return {
        "best_settings": dict(grid[best]),
        "best_mean_val_acc": table[best]["mean_val_acc"],
        "results": per_seed[best],
        "table": table,
    }


@dataclass(frozen=True)
class Method:
    """One method of the comparison: its name, how to build it and its default settings.

    Examples
    --------
    ``Method("graphsage", GraphSAGEBaseline, DEFAULTS).train(dataset, {"lr": 0.01}, 0)``
    """

    name: str
    factory: Callable[[NodeDataset, dict[str, Any]], Baseline]
    defaults: Mapping[str, Any]

    def build(
        self, dataset: NodeDataset, settings: Mapping[str, Any] | None, seed: int, **options: Any
    ) -> tuple[Baseline, dict[str, Any], float]:
        """Seed with ``seed`` and build the baseline of ``settings`` over :attr:`defaults`
        (unknown keys refused; ``options`` to its factory): the baseline, the merged
        settings and ``setup_s`` (building the model, sampler and, for GraphSAINT, the
        normalisation; not part of ``train_s``)."""
        require_single_label(dataset, self.name)
        merged = merge_settings(self.defaults, settings, self.name)
        seed_everything(seed)
        baseline, setup_s = _timed(lambda: self.factory(dataset, merged, **options))
        return baseline, merged, setup_s

    def train(
        self,
        dataset: NodeDataset,
        settings: Mapping[str, Any] | None,
        seed: int,
        target_acc: float | None = None,
        max_epochs: int = 50,
        eval_every: int = 1,
        *,
        stop_at_target: bool = False,
    ) -> dict[str, Any]:
        """:meth:`build` the baseline and :func:`run_epochs` it; ``target_acc`` is the
        validation accuracy defining ``time_to_target_s``. Returns the result format of
        the module docstring plus ``method``, ``settings`` (merged), ``seed`` and
        ``setup_s``."""
        baseline, merged, setup_s = self.build(dataset, settings, seed)
        result = run_epochs(baseline, target_acc, max_epochs, eval_every, stop_at_target)
        return {**result, "method": self.name, "settings": merged, "seed": seed, "setup_s": setup_s}

    def sweep(
        self,
        dataset: NodeDataset,
        grid: Sequence[Mapping[str, Any]],
        seeds: Sequence[int],
        target_acc: float | None = None,
        max_epochs: int = 50,
        eval_every: int = 1,
    ) -> dict[str, Any]:
        """:func:`sweep` of :meth:`train` (best settings by mean validation accuracy)."""
        return sweep(self.train, dataset, grid, seeds, target_acc, max_epochs, eval_every)
