"""The 4D mini-batch trainer.

Each data-parallel group ``d`` draws its own sample at global step ``t`` from
``(sampling.seed, d, t)``; all ranks of the group share it, so each builds its shard
of the batch alone. An epoch is ``ceil(ceil(N / B) / Gd)`` steps. After backward the
gradients are averaged over the DP group and one Adam step follows. Every
``eval_every`` epochs (or on the step schedule of ``eval_every_steps`` and
``eval_at_steps``) the whole normalised graph is
evaluated (no sampling): by one distributed layer-wise forward pass, or, where its
whole-graph matrices do not fit the ranks (``train.evaluation``), by every rank from its
share of the vertices' neighbourhoods; training stops at the target
accuracy or after the last epoch. The summary records each rank's peak resident memory.
Training time excludes evaluation, as the paper reports it.
"""

from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import Config, ConfigError
from dgl_scalegnn.core.schedule import learning_rate
from dgl_scalegnn.data.graph import DatasetError, label_notes
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.distributed.comm import Runtime, agree_on
from dgl_scalegnn.evaluation.evaluator import (
    Evaluator,
    LayerwiseEvaluation,
    NeighbourhoodEvaluation,
    choose_evaluator,
)
from dgl_scalegnn.heap import TrainingHeap
from dgl_scalegnn.model.objective import Objective
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.model.stack import layer_kind
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.minibatches import MiniBatches
from dgl_scalegnn.sampling.prefetch import Prefetcher
from dgl_scalegnn.train.checkpoint import (
    Checkpoints,
    set_aside_nonfinite,
)
from dgl_scalegnn.train.defaults import agreed_available_bytes
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.preemption import (
    PREEMPTED_EXIT_CODE,
    Preempted,
    Request,
    SignalRequests,
)
from dgl_scalegnn.train.step_agreement import agree_on_step

__all__ = ["Trainer", "NonFiniteError", "peak_rss_mb"]


class NonFiniteError(FloatingPointError):
    """A NaN or infinite loss or gradient; the message names the epoch and step."""


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    Linux's ``VmHWM`` (the high-water mark of this program's own memory map) where it
    exists: ``ru_maxrss`` survives ``fork`` and ``exec``, so a process started by a
    large parent (a benchmark driver, a launcher) would report the parent's peak.
    """
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB elsewhere


@dataclass
class _Progress:
    """What training has done so far (restored from a checkpoint on resume)."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    train_seconds: float = 0.0
    best_val: float = -1.0
    best_val_step: int = -1  # the global step evaluated there (kept across a resume)
    test_at_best_val: float = 0.0
    time_to_target: float | None = None
    evaluated_step: int = -1
    skipped_steps: int = 0


class Trainer:
    """Trains a :class:`ParallelScaleGNN` on this rank's :class:`RankStore`.

    Parameters
    ----------
    cfg : Config
        The resolved run configuration.
    graph : PreparedGraph
        The prepared graph (memory-mapped or in memory); each rank reads its share.
    runtime : Runtime
        Grid, communication switches and profiler.
    metrics : MetricsWriter
        Enabled on rank 0 only.
    device : torch.device
        Where the rank's share, the model and the batches live.
    """

    def __init__(
        self,
        cfg: Config,
        graph: PreparedGraph,
        runtime: Runtime,
        metrics: MetricsWriter,
        device: torch.device | str = "cpu",
    ) -> None:
        meta = graph.meta
        if meta.split_sizes["train"] == 0:
            raise DatasetError(
                f"dataset {meta.name!r}: train_mask selects no vertex, so there is nothing to "
                "train on; give the graph a non-empty train_mask"
            )
        if cfg.sampling.batch_size > meta.num_nodes:
            raise ConfigError(
                f"sampling.batch_size: got {cfg.sampling.batch_size}, but {meta.name!r} has "
                f"only {meta.num_nodes} vertices; use at most {meta.num_nodes}"
            )
        #: Whether the validation and test masks select any vertex: an empty split has no
        #: accuracy (None), and without validation the summary's test accuracy is the
        #: last evaluation's.
        self.has_split = {split: meta.split_sizes[split] > 0 for split in ("val", "test")}
        target_split = cfg.train.target_metric.removesuffix("_acc")
        if cfg.train.target_acc is not None and not self.has_split.get(target_split, True):
            raise ConfigError(
                f"train.target_metric: {cfg.train.target_metric!r}, but the {target_split}_mask "
                f"of {meta.name!r} selects no vertex; choose another target_metric or unset "
                "train.target_acc"
            )
        consequence = {
            "val": "no model is selected on validation: the summary gives the test accuracy "
            "of the last evaluation",
            "test": "no test accuracy is reported",
        }
        for split, present in self.has_split.items():
            if not present:
                metrics.note(
                    f"dataset {meta.name!r}: {split}_mask selects no vertex; {consequence[split]}"
                )
        for note in label_notes(meta.name, meta.label_facts):  # one class, untrained, overlaps
            metrics.note(note)
        self.cfg, self.runtime, self.metrics = cfg, runtime, metrics
        self.grid = runtime.grid
        self.device = torch.device(device)
        #: The prepared graph, memory-mapped (what a neighbourhood evaluation reads).
        self.graph = graph
        #: This rank's batches: the sampler and its share of the graph (the store).
        self.batches = MiniBatches(
            graph,
            self.grid,
            cfg.model.layers,
            cfg.sampling.batch_size,
            kind=layer_kind(cfg.model),
            seed=cfg.sampling.seed,
            method=cfg.sampling.method,
            spmm_kernel=cfg.parallel.spmm_kernel,
            device=self.device,
            profiler=runtime.profiler,
        )
        self.sampler, self.store = self.batches.sampler, self.batches.store
        self.model = ParallelScaleGNN(
            cfg.model,
            in_features=meta.num_features,
            num_classes=meta.num_classes,
            runtime=runtime,
            seed=cfg.train.seed,
            fuse=cfg.parallel.fuse,
            native=cfg.parallel.native_kernels,
        ).to(self.device)
        self.objective = Objective(runtime, multilabel=meta.multilabel)
        #: How evaluations run: ``train.evaluation`` as asked (``auto``: layer-wise) until
        #: :meth:`choose_evaluation` decides.
        self.evaluator: Evaluator = (
            NeighbourhoodEvaluation(self.model, graph)
            if cfg.train.evaluation == "neighbourhood"
            else LayerwiseEvaluation(self.model, self.store, self.objective)
        )
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        self.steps_per_epoch = self.batches.steps_per_epoch
        #: The run's planned steps (the learning-rate schedule's horizon, unless
        #: ``train.max_train_s`` sets it in seconds).
        self.total_steps = cfg.train.max_steps or cfg.train.epochs * self.steps_per_epoch
        self.progress = _Progress()
        self._prefetcher: Prefetcher[RankBatch] | None = None
        #: Signals received (:mod:`~dgl_scalegnn.train.preemption`), and the request the
        #: ranks agreed on in the last step.
        self.requests = SignalRequests()
        self._request = Request.NONE
        self.checkpoints = Path(cfg.output.dir) / "checkpoints" if cfg.output.dir else None
        self._checkpoints = None
        if self.checkpoints is not None:
            self._checkpoints = Checkpoints(
                self.checkpoints, self.grid, self.model, self.optimizer, cfg.to_dict(), meta
            )
        if cfg.output.resume:
            self._resume()
        #: The training seconds the ranks agreed on in their last step (the slowest
        #: rank's): what ``train.max_train_s`` and its cosine schedule read.
        self.agreed_train_s = self.progress.train_seconds

    # --------------------------------------------------------------- checkpoints
    def _resume(self) -> None:
        resumed = self._checkpoints.resume()  # every rank reads the same files
        if resumed is None:
            self.metrics.note(
                f"--resume: no checkpoint in {self.checkpoints} yet; starting at step 0"
            )
            return
        if resumed.note is not None:
            self.metrics.note(resumed.note)  # the newer checkpoints refused, and why
        self.progress = _Progress(**resumed.progress)
        self.metrics.write(
            "resume",
            checkpoint=str(resumed.path),
            step=self.progress.global_step,
            refused=resumed.refused,
        )

    @property
    def _on_disk(self) -> tuple[int, Path] | None:
        """(global step, directory) of the checkpoint that holds this process's state."""
        return None if self._checkpoints is None else self._checkpoints.on_disk

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (collective); returns its directory.

        A no-op without output.dir (returns ``None``), and when this step's state is
        already on disk: saved, or resumed from, and not trained since.
        """
        if self._checkpoints is None:
            return None
        return self._checkpoints.save(asdict(self.progress))

    # ------------------------------------------------------------------ one step
    def _batch(self, global_step: int) -> RankBatch:
        """The batch of ``global_step``: from the prefetcher when prefetch is on."""
        if self._prefetcher is not None:
            return self._prefetcher.get(global_step)
        return self.sample(global_step)

    def sample(self, global_step: int) -> RankBatch:
        """This rank's batch of ``global_step`` (no communication)."""
        return self.batches[global_step]

    def train_step(self, batch: RankBatch, started: float | None = None) -> float:
        """Forward, backward, DP average, the ranks' agreement and one optimizer step;
        returns the mean loss.

        The agreement is one all-reduce (maximum) over every rank of three values: a
        non-finite loss or gradient anywhere (every rank then skips the step, or stops
        with :class:`NonFiniteError`, by ``train.on_nonfinite``), a signal's request
        (:mod:`~dgl_scalegnn.train.preemption`, acted on at the end of the step) and the
        training seconds with this step's so far (it began at ``started``, a
        ``time.perf_counter()``), so that every rank stops at the same step of a
        ``train.max_train_s`` budget and sets the same rate. The step reads the device
        once (loss and agreement together).
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        logits, spec = self.model(batch)
        loss = self.objective.loss(logits, spec, batch, "train")
        loss.backward()
        spent = self.progress.train_seconds
        if started is not None:
            spent += time.perf_counter() - started
        agreed = agree_on_step(self.model, loss, self.runtime, self.requests.take(), spent)
        mean_loss, self.agreed_train_s, self._request = (
            agreed.loss,
            agreed.train_seconds,
            agreed.request,
        )
        if agreed.nonfinite:
            self._on_nonfinite(batch.step)
            return mean_loss
        optim = self.cfg.optim
        budget_s = self.cfg.train.max_train_s
        lr = learning_rate(
            optim.lr,
            batch.step,
            self.total_steps,
            optim.lr_schedule,
            optim.warmup_steps,
            done=None if budget_s is None else self.agreed_train_s / budget_s,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return mean_loss

    def _on_nonfinite(self, global_step: int) -> None:
        """Skip the step (counted, said on its first time) or stop, naming the step and
        the checkpoint to resume from: a checkpoint of this very step would replay it,
        so it is set aside (:func:`~dgl_scalegnn.train.checkpoint.set_aside_nonfinite`)."""
        progress = self.progress
        where = f"epoch {progress.epoch} step {progress.step_in_epoch} (global step {global_step})"
        if self.cfg.train.on_nonfinite == "skip":
            progress.skipped_steps += 1
            self.metrics.write("nonfinite", step=global_step, action="skipped")
            if progress.skipped_steps == 1:
                self.metrics.note(
                    f"non-finite loss or gradient at {where}: step skipped "
                    "(train.on_nonfinite: skip); the summary counts every skipped step"
                )
            return
        resume = [""]
        if self.checkpoints is not None:
            if self.grid.rank == 0:
                resume = [" " + set_aside_nonfinite(self.checkpoints, global_step)]
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.broadcast_object_list(resume, src=0)  # every rank agreed: all are here
        raise NonFiniteError(
            f"non-finite loss or gradient at {where}; training stopped.{resume[0]} Lower "
            "optim.lr, or set train.on_nonfinite=skip to skip such steps"
        )

    # ---------------------------------------------------------------- evaluation
    def choose_evaluation(self, local_ranks: int = 1) -> str:
        """Decide, before the first step, how this run evaluates (``train.evaluation``:
        :func:`~dgl_scalegnn.evaluation.evaluator.choose_evaluator`, against the memory
        each rank has: a GPU's free memory, or the host's shared by its ``local_ranks``
        ranks), say why where ``auto`` fell back, and return the engine's name (also
        :attr:`evaluation`).

        Raises
        ------
        ConfigError
            ``layerwise`` was asked for and does not fit.
        """

        def available() -> tuple[int, str]:
            where = (
                "its GPU"
                if self.device.type == "cuda"
                else f"each of the {local_ranks} ranks sharing its host's available memory"
            )
            return agreed_available_bytes(self.device, local_ranks), where

        asked = self.cfg.train.evaluation
        if self.cfg.train.evaluate:
            choice = choose_evaluator(
                asked, self.model, self.store, self.graph, self.objective, available
            )
            if choice.note is not None:
                self.metrics.note(choice.note)
            self.evaluator = choice.evaluator
        return self.evaluation

    @property
    def evaluation(self) -> str:
        """The engine :attr:`evaluator` runs: ``layerwise`` or ``neighbourhood``."""
        return self.evaluator.name

    def evaluate(self) -> dict[str, float | None]:
        """Full-graph accuracy per split (collective), by :attr:`evaluator`."""
        return self.evaluator.accuracies()

    # ----------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train until the target accuracy, the last epoch, ``max_steps``, ``max_train_s``
        or a stop signal; returns the summary."""
        cfg, progress = self.cfg, self.progress
        self._announce()
        # every rank starts the clock together: the last to finish loading would
        # otherwise count its wait against the others' first step (train.max_train_s)
        agree_on(0.0, dist.ReduceOp.SUM, self.device)
        reached = False
        preempted: Preempted | None = None
        if cfg.sampling.prefetch:
            self._prefetcher = Prefetcher(self.sample, self.runtime.profiler, self.device)
        try:
            with self.requests.installed(), TrainingHeap() as self.heap:
                while progress.epoch < cfg.train.epochs and not reached:
                    reached = self._run_epoch()
                    if self._budget_spent():
                        break
                if cfg.train.evaluate and progress.evaluated_step != progress.global_step:
                    self._evaluate_and_record()  # the last step is always evaluated
                if cfg.output.checkpoint_every:
                    self.save()
        except Preempted as stop:
            preempted = stop
        finally:
            if self._prefetcher is not None:
                self._prefetcher.close()
                self._prefetcher = None
        summary = {
            # None where nothing was evaluated, or nothing could be selected on
            "best_val_acc": progress.best_val if progress.best_val >= 0 else None,
            # None also for a checkpoint written before the step was kept
            "best_val_step": progress.best_val_step if progress.best_val_step >= 0 else None,
            "best_val_epoch": progress.best_val_step // self.steps_per_epoch
            if progress.best_val_step >= 0
            else None,
            "test_at_best_val": progress.test_at_best_val if progress.evaluated_step >= 0 else None,
            "time_to_target_s": progress.time_to_target,
            "epochs": progress.epoch,
            "steps": progress.global_step,
            "train_s": progress.train_seconds,
            "skipped_steps": progress.skipped_steps,
            "max_rss_mb": self._peak_memory_per_rank(),
            "checkpoint": None if self._on_disk is None else str(self._on_disk[1]),
        }
        if progress.skipped_steps:
            self.metrics.note(
                f"skipped {progress.skipped_steps} of {progress.global_step} steps for a "
                "non-finite loss or gradient (train.on_nonfinite: skip)"
            )
        if preempted is not None:
            self.metrics.note(str(preempted))
            summary["preempted"] = {
                "step": progress.global_step,
                "checkpoint": preempted.checkpoint,
            }
        self.metrics.write("summary", **summary)
        return summary

    def _peak_memory_per_rank(self) -> list[float]:
        """Peak resident memory of every rank so far, in MB (one gather over the world)."""
        peak = torch.tensor([peak_rss_mb()], dtype=torch.float64)
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return peak.tolist()
        # NCCL gathers device tensors; gloo host tensors: the model's device suits both.
        peak = peak.to(self.device)
        gathered = [torch.empty_like(peak) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, peak)
        return [float(rank_peak) for rank_peak in torch.cat(gathered).cpu()]

    def _steps_schedule(self) -> bool:
        """Whether evaluation follows steps (``eval_every_steps``, ``eval_at_steps``)
        instead of epochs."""
        return bool(self.cfg.train.eval_every_steps or self.cfg.train.eval_at_steps)

    def _budget_spent(self) -> bool:
        """Whether ``train.max_steps`` steps have run, or the ranks have agreed that
        ``train.max_train_s`` training seconds have."""
        train = self.cfg.train
        steps_spent = train.max_steps is not None and self.progress.global_step >= train.max_steps
        seconds = train.max_train_s
        return steps_spent or (seconds is not None and self.agreed_train_s >= seconds)

    def _run_epoch(self) -> bool:
        """Train the rest of the current epoch (or until ``max_steps`` or ``max_train_s``);
        returns whether the target was reached."""
        progress = self.progress
        while not self._budget_spent():
            self._train_one_step()
            epoch_ended = progress.step_in_epoch >= self.steps_per_epoch
            if epoch_ended:
                progress.epoch += 1
                progress.step_in_epoch = 0
            reached = self._step_boundary(epoch_ended)
            if reached or epoch_ended:
                return reached
        return False

    def _train_one_step(self) -> None:
        """Sample (or take the prefetched batch), train, record the step's metrics."""
        progress = self.progress
        profiler = self.runtime.profiler
        profiler.reset()
        start = time.perf_counter()
        batch = self._batch(progress.global_step)
        sample_seconds = time.perf_counter() - start
        loss = self.train_step(batch, start)
        self.heap.after_step()
        step_seconds = time.perf_counter() - start
        progress.train_seconds += step_seconds
        breakdown = profiler.snapshot(reset=True)
        self.metrics.write(
            "step",
            epoch=progress.epoch,
            step=progress.global_step,
            loss=loss,
            step_s=step_seconds,
            sample_s=sample_seconds,
            seconds=breakdown["seconds"],
            bytes=breakdown["bytes"],
        )
        progress.global_step += 1
        progress.step_in_epoch += 1

    def _step_boundary(self, epoch_ended: bool) -> bool:
        """Between two steps: evaluate if due, checkpoint if due, then act on the signal
        request the ranks agreed on in the step (so one that came during the evaluation
        or the checkpoint is honoured right after it). Returns whether the target was
        reached."""
        cfg, progress = self.cfg, self.progress
        if self._steps_schedule():
            every_steps = cfg.train.eval_every_steps
            due = progress.global_step in cfg.train.eval_at_steps or bool(
                every_steps and progress.global_step % every_steps == 0
            )
        else:
            due = epoch_ended and (
                progress.epoch % cfg.train.eval_every == 0 or progress.epoch == cfg.train.epochs
            )
        due = due and cfg.train.evaluate
        reached = due and self._evaluate_and_record()
        every = cfg.output.checkpoint_every
        checkpoint_due = bool(every and progress.global_step % every == 0)
        if checkpoint_due:
            self.save()
        if due or checkpoint_due:  # a signal may have come meanwhile: agree again
            late = agree_on(self.requests.take(), dist.ReduceOp.MAX, self.device)
            self._request = max(self._request, Request(int(late)))
        self._act_on_request()
        return reached

    def _act_on_request(self) -> None:
        """Checkpoint for ``SIGUSR1``; checkpoint and stop (:class:`Preempted`) for
        ``SIGTERM`` / ``SIGUSR2`` / ``SIGINT``. Every rank holds the same agreed request."""
        request, self._request = self._request, Request.NONE
        if request == Request.NONE:
            return
        step = self.progress.global_step
        written = self.save()
        if written is None:
            where = "nothing was saved (output.dir is not set)"
        else:
            where = f"checkpoint of global step {step} in {written}"
        if request == Request.CHECKPOINT:
            self.metrics.note(f"SIGUSR1: {where}; training goes on")
            return
        raise Preempted(
            f"stopped by SIGTERM/SIGUSR2/SIGINT after global step {step}: {where}; continue "
            f"with --resume (exit code {PREEMPTED_EXIT_CODE})",
            None if written is None else str(written),
        )

    def _evaluate_and_record(self) -> bool:
        cfg, progress = self.cfg, self.progress
        # the peaks before and after tell training's memory from the evaluation's
        peak_before = self._peak_memory_per_rank()
        start = time.perf_counter()
        with self.heap.evaluating():  # the evaluator sets its own heap phase
            accuracy = self.evaluate()
        eval_seconds = time.perf_counter() - start
        if not self.has_split["val"]:
            progress.test_at_best_val = accuracy["test_acc"]  # no selection: the latest
        elif accuracy["val_acc"] > progress.best_val:
            progress.best_val, progress.test_at_best_val = accuracy["val_acc"], accuracy["test_acc"]
            progress.best_val_step = progress.global_step
        target = cfg.train.target_acc
        reached = target is not None and accuracy[cfg.train.target_metric] >= target
        if reached and progress.time_to_target is None:
            progress.time_to_target = progress.train_seconds
        progress.evaluated_step = progress.global_step
        self.metrics.write(
            "eval",
            epoch=progress.global_step // self.steps_per_epoch,  # epochs completed
            step=progress.global_step,
            **accuracy,
            eval_s=eval_seconds,
            elapsed_train_s=progress.train_seconds,
            max_rss_mb_before=peak_before,
            max_rss_mb=self._peak_memory_per_rank(),
        )
        return reached

    def _announce(self) -> None:
        """The ``start`` event: the graph, the batch and steps, where output goes."""
        cfg, meta = self.cfg, self.store.meta
        train = cfg.train
        if train.eval_every_steps or train.eval_at_steps:
            every = f"every {train.eval_every_steps} steps" if train.eval_every_steps else ""
            listed = f"after steps {list(train.eval_at_steps)}" if train.eval_at_steps else ""
            evaluation = " and ".join(part for part in (every, listed) if part)
        else:
            evaluation = (
                "every epoch" if train.eval_every == 1 else f"every {train.eval_every} epochs"
            )
        if not train.evaluate:
            evaluation = "off (train.evaluate: false)"
        else:
            evaluation = f"{self.evaluation} {evaluation}"
        checkpoints = None
        if self.checkpoints is not None:
            every = cfg.output.checkpoint_every
            when = (
                f"every {every} steps" if every else "on signals only (output.checkpoint_every 0)"
            )
            checkpoints = f"{self.checkpoints} {when}"
        self.metrics.write(
            "start",
            dataset=meta.name,
            num_nodes=meta.num_nodes,
            nnz=meta.nnz,
            num_features=meta.num_features,
            num_classes=meta.num_classes,
            splits=dict(meta.split_sizes),
            batch_size=cfg.sampling.batch_size,
            steps_per_epoch=self.steps_per_epoch,
            total_steps=self.total_steps,
            max_train_s=cfg.train.max_train_s,
            first_step=self.progress.global_step,
            evaluation=f"{evaluation}, and after the last step",
            metrics=None if self.metrics.path is None else str(self.metrics.path),
            checkpoints=checkpoints,
        )
