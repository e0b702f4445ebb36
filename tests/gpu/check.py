"""``make gpu-check``: one unattended check of a GPU machine, one JSON report.

Run as ``python -m tests.gpu.check --out gpu-check.json`` (the Makefile's
``gpu-check`` target). First it decides whether a GPU is usable (torch's CUDA build, the
driver, the devices, their compute capability, NCCL, and one kernel actually run);
where none is, it writes the report with the reason and exits 3, or, told that none is
expected (``--no-gpu-expected``), marks every check skipped. Otherwise it runs the checks
below on ``cuda:0``. It exits 0 when every check passed (or was skipped) and every fact
of the environment was found, 1 when one failed. The report is written whatever fails:
each fact of the environment (DGL's import among them) and each check has its own status
and error. The report's fields are described in ``docs/gpu-check.md``.

Checks (each a function of the device, so that the CPU tests run them on the CPU; the
CUDA suite, ``tests/gpu``, asserts the same functions):

``one_rank_vs_cpu``
    One rank on the device against the CPU on a small synthetic graph, with prefetch,
    overlap and fusion on: step losses within 1e-4 relative, accuracies within one
    vertex per split, the fused kernels really compiled (the layer tail's count of
    compiled calls, :attr:`~dgl_scalegnn.parallel.elementwise.LayerTail.calls`), and
    the steps' products and sampling timed.
``chunked_eval``
    Full-graph evaluation of a 20k-vertex graph in 997-row chunks (unaligned; a short
    last chunk) on the device against one chunk on the CPU: logits within 1e-4 of the
    largest, accuracies within one vertex per split; host synchronisations counted.
``host_syncs``
    Host synchronisations of one training step (``torch.cuda.set_sync_debug_mode``), at
    most one; those of one batch build, reported.
``large_run``
    The sparse synthetic preset at 1M vertices (``yaml/synthetic-1m.yaml``) for 30
    steps and one evaluation: seconds per step and its breakdown, evaluation seconds,
    ``torch.cuda.max_memory_allocated``, with the run's TF32 setting (``auto``: on).
``torchrun_grid``
    With 2 or more GPUs, ``launch/torchrun.sh`` (run by this interpreter) on 1x2x2x2
    (8 GPUs; 1x1x2x2 with 4, 1x2x1x1 with 2) on NCCL against the same grid on gloo:
    step losses within 1e-4 (:func:`nccl_against_gloo`).

Float32 products are compared exactly (TF32 off) in the checks that compare devices or
backends.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import logging
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import dgl_scalegnn
import yaml
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import Config, config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import PreparedGraph, prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.comm import CommOptions, Runtime
from dgl_scalegnn.distributed.devices import (
    cuda_environment,
    cuda_problem,
    driver_version,
    gpus,
    use_tf32,
)
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.evaluation.chunks import chunk_count
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.evaluation.memory import full_graph_chunk_rows
from dgl_scalegnn.native import c_compiler, compiler_version
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.train.metrics import MetricsWriter, read_metrics
from dgl_scalegnn.train.trainer import Trainer

__all__ = [
    "REPORT_FORMAT",
    "CHECKS",
    "CheckSkipped",
    "Outcome",
    "FACTS",
    "gpu_problem",
    "environment",
    "count_host_syncs",
    "training_syncs",
    "relative_difference",
    "nccl_against_gloo",
    "one_rank_vs_cpu",
    "chunked_eval",
    "host_syncs",
    "large_run",
    "torchrun_grid",
    "run_checks",
    "make_report",
    "main",
]

#: Version of the report's layout (``docs/gpu-check.md``): 2 gives each fact of the
#: environment its status and error.
REPORT_FORMAT = 2
#: Exit status: every check passed (or none ran: no GPU, and none expected).
PASSED = 0
#: Exit status: a check failed.
FAILED = 1
#: Exit status: no usable GPU where one was expected.
NO_GPU = 3

#: The small graph and model of the device-against-CPU checks (three steps, one evaluation).
SMALL = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 1500, "num_features": 20}},
    "model": {"hidden": 24, "layers": 3, "dropout": 0.2},
    "sampling": {"batch_size": 500},
    "train": {"epochs": 1, "progress": False},
}
#: :data:`SMALL` with prefetch and overlap on, as the checks run it.
_SWITCHED = {
    **SMALL,
    "sampling": {"batch_size": 500, "prefetch": True},
    "parallel": {"overlap": True},
}
#: What every step of a training run times (CUDA events on a GPU).
TIMED = ("spmm", "gemm", "sampling")
#: Step losses of two devices (or two backends) agree within this, relative, with float32
#: products in float32 on both (TF32 rounds a product's inputs to 10 mantissa bits).
LOSS_TOLERANCE = 1e-4
#: What makes a launch's float32 products exact (``parallel.tf32`` is ``auto``, on with
#: CUDA, by default).
EXACT_PRODUCTS = ("--set", "parallel.tf32=false")
#: Logits of a chunked evaluation agree with the CPU's within this, relative to the largest.
LOGIT_TOLERANCE = 1e-4
#: The chunked evaluation: vertices and rows per chunk (unaligned, a short last chunk).
EVAL_NODES = 20_000
EVAL_CHUNK_ROWS = 997
#: The large run's config (from the project's root) and its steps.
LARGE_CONFIG = "yaml/synthetic-1m.yaml"
LARGE_STEPS = 30
#: Steps of the large run left out of its seconds per step (allocator, compiler, caches).
WARM_UP_STEPS = 5
#: The torchrun check's grid by the GPUs present (one GPU per rank).
TORCHRUN_GRIDS = {8: "1x2x2x2", 4: "1x1x2x2", 2: "1x2x1x1"}
#: Seconds one torchrun launch may take before it is stopped.
LAUNCH_TIMEOUT_S = 240

_ELEMENTWISE_LOG = "dgl_scalegnn.parallel.elementwise"


class CheckSkipped(Exception):
    """A check that cannot run here; the message says why."""


@dataclass
class Outcome:
    """What a check measured, and what it found wrong (none: it passed)."""

    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)


# ------------------------------------------------------------------- environment


def _kernel_problem(device: torch.device) -> str | None:
    """Why a small kernel does not run on ``device`` (e.g. no kernel image for its
    architecture); ``None`` when it ran and gave the right answer."""
    try:
        value = torch.arange(4, device=device).mul_(3).sum().item()
    except RuntimeError as error:
        return f"a kernel on {device} failed: {str(error).splitlines()[0]}"
    return None if value == 18 else f"a kernel on {device} computed {value}, expected 18"


def gpu_problem() -> str | None:
    """Why no GPU is usable here (torch's CUDA build, the driver, the devices, their
    compute capability, NCCL, or a kernel that does not run), with torch's CUDA version,
    the driver's and the GPUs' compute capabilities, or what deciding it raised; ``None``
    where one is."""
    try:
        problem = cuda_problem() or _kernel_problem(torch.device("cuda", 0))
        return None if problem is None else f"{problem} ({cuda_environment()})"
    except Exception as error:  # a broken driver or device: still a reason
        return f"deciding whether a GPU is usable raised {_error_line(error)}"


def _version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _c_compiler() -> str | None:
    """The first line of the C compiler's ``--version``: what builds the native code
    (:func:`~dgl_scalegnn.native.c_compiler`) and torch.compile's CPU code."""
    compiler = c_compiler()
    lines = compiler_version(compiler).strip().splitlines() if compiler else []
    return lines[0] if lines else None


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


#: The facts of a report's environment, each found by its own function: versions and
#: devices, what the figures were measured with.
FACTS: dict[str, Callable[[], Any]] = {
    "python": platform.python_version,
    "platform": platform.platform,
    "dgl_scalegnn": lambda: dgl_scalegnn.__version__,
    "torch": lambda: torch.__version__,
    "torch_cuda": lambda: torch.version.cuda,
    "driver": driver_version,
    "cuda_environment": cuda_environment,
    "devices": lambda: gpus() if torch.cuda.is_available() else [],
    "nccl": lambda: _nccl_version() if torch.cuda.is_available() else None,
    "triton": lambda: _version_of("triton"),
    "dgl": lambda: dgl.__version__,  # imports DGL (and scipy, requests, tqdm, libdgl)
    "c_compiler": _c_compiler,
    "cpu_count": os.cpu_count,
}


def _error_line(error: BaseException) -> str:
    """``error`` in one line: its type and the first line of its message."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


def environment(facts: dict[str, Callable[[], Any]] = FACTS) -> dict[str, dict[str, Any]]:
    """Each fact of ``facts`` with its status: ``found`` and its ``value``, or ``failed``
    and its ``error`` (a fact that fails, DGL's import say, leaves the others found)."""
    found = {}
    for name, find in facts.items():
        try:
            found[name] = {"status": "found", "value": find(), "error": None}
        except Exception as error:  # an unattended run reports every failure and goes on
            found[name] = {"status": "failed", "value": None, "error": _error_line(error)}
    return found


# -------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _float32_precision(precision: str | None = None) -> Iterator[None]:
    """Float32 products of cuBLAS and cuDNN in ``precision`` (``"ieee"``: float32;
    ``"tf32"``) inside, as they were after (also what is set inside, as :func:`use_tf32`
    does). Only torch's ``fp32_precision`` settings are read and written: once one is set,
    reading the legacy ``allow_tf32`` raises."""
    settings = (torch.backends.cuda.matmul, torch.backends.cudnn)
    saved = [setting.fp32_precision for setting in settings]
    try:
        if precision is not None:
            for setting in settings:
                setting.fp32_precision = precision
        yield
    finally:
        for setting, value in zip(settings, saved):
            setting.fp32_precision = value


class _Messages(logging.Handler):
    """The log records of one logger while installed (the layer tail's fallback line)."""

    def __init__(self, logger: str) -> None:
        super().__init__(logging.WARNING)
        self.logger, self.lines = logging.getLogger(logger), []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> _Messages:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


def _config(mapping: dict, **switches: Any) -> Config:
    """``mapping`` with ``parallel`` switches set (one process)."""
    parallel = {**mapping.get("parallel", {}), "grid": "1x1x1x1", **switches}
    return config_from_mapping({**mapping, "parallel": parallel})


def _trainer(cfg: Config, graph: PreparedGraph, device: torch.device) -> Trainer:
    """A one-process trainer on ``device`` that keeps its metrics in memory."""
    runtime = Runtime(
        Grid4D.single_process(), CommOptions.from_config(cfg.parallel), Profiler(device=device)
    )
    return Trainer(cfg, graph, runtime, MetricsWriter(None, enabled=True), device)


def _losses(events: list[dict]) -> list[float]:
    return [e["loss"] for e in events if e["event"] == "step"]


def relative_difference(a: list[float], b: list[float]) -> float:
    """Largest element-wise difference relative to ``b`` (infinite if the lengths differ)."""
    if len(a) != len(b) or not a:
        return math.inf
    x, y = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-6)))


def _accuracies(events: list[dict]) -> dict[str, float]:
    last = [e for e in events if e["event"] == "eval"][-1]
    return {key: last[key] for key in ("train_acc", "val_acc", "test_acc")}


def _one_vertex(graph: PreparedGraph) -> dict[str, float]:
    """One vertex of each split, as an accuracy (a near tie may flip one)."""
    return {f"{s}_acc": 1.0 / max(1, graph.meta.split_sizes[s]) for s in ("train", "val", "test")}


def _expect_same_accuracies(
    outcome: Outcome, graph: PreparedGraph, got: dict, expected: dict
) -> None:
    for key, slack in _one_vertex(graph).items():
        outcome.expect(
            got[key] is not None and abs(got[key] - expected[key]) <= slack * 1.001,
            f"{key} {got[key]} on the device against {expected[key]} on the CPU (more than "
            "one vertex apart)",
        )


def count_host_syncs(work: Callable[[], Any], device: torch.device) -> int | None:
    """How many times ``work`` made the host wait for ``device``
    (``torch.cuda.set_sync_debug_mode``); ``None`` off CUDA, where nothing waits."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def training_syncs(trainer: Trainer, device: torch.device) -> tuple[int | None, int | None]:
    """Host synchronisations (:func:`count_host_syncs`) of one training step and of one
    batch build on ``device``, after a warm-up step (allocator, compiler, kernels)."""
    trainer.train_step(trainer.sample(0))
    batch = trainer.sample(1)
    step = count_host_syncs(lambda: trainer.train_step(batch), device)
    return step, count_host_syncs(lambda: trainer.sample(2), device)


# --------------------------------------------------------------------- checks


def one_rank_vs_cpu(device: torch.device, fuse: bool = True) -> Outcome:
    """:data:`SMALL` on ``device`` with prefetch, overlap and ``fuse`` against the CPU's
    eager kernels: step losses, accuracies, and (with ``fuse``) compiled tail calls."""
    graph = prepare_in_memory(generate(_config(SMALL).data.synthetic), 0)
    with _float32_precision("ieee"), _Messages(_ELEMENTWISE_LOG) as messages:
        on_device = _trainer(_config(_SWITCHED, fuse=fuse), graph, device)
        on_device.fit()
    on_cpu = _trainer(_config(_SWITCHED, fuse=False), graph, torch.device("cpu"))
    on_cpu.fit()
    device_events, cpu_events = on_device.metrics.events, on_cpu.metrics.events
    calls = dict(on_device.model.layer_tail.calls)
    difference = relative_difference(_losses(device_events), _losses(cpu_events))
    outcome = Outcome(
        {
            "fuse": fuse,
            "losses_device": _losses(device_events),
            "losses_cpu": _losses(cpu_events),
            "max_relative_difference": difference,
            "accuracy_device": _accuracies(device_events),
            "accuracy_cpu": _accuracies(cpu_events),
            "tail_calls": calls,
        }
    )
    outcome.expect(
        difference <= LOSS_TOLERANCE,
        f"step losses differ by {difference:.3g} relative (at most {LOSS_TOLERANCE:g})",
    )
    _expect_same_accuracies(
        outcome, graph, outcome.figures["accuracy_device"], outcome.figures["accuracy_cpu"]
    )
    if fuse:
        why = "; ".join(messages.lines) or "no compiler error was logged"
        outcome.expect(
            calls["compiled"] > 0,
            f"parallel.fuse is on but no compiled tail kernel ran (calls {calls}): {why}",
        )
    steps = [e["seconds"] for e in device_events if e["event"] == "step"]
    untimed = [part for part in TIMED if sum(s.get(part, 0.0) for s in steps) <= 0]
    outcome.expect(not untimed, f"the steps on the device timed no {', '.join(untimed)}")
    return outcome


def chunked_eval(
    device: torch.device, num_nodes: int = EVAL_NODES, chunk_rows: int = EVAL_CHUNK_ROWS
) -> Outcome:
    """Full-graph evaluation on ``device`` in ``chunk_rows``-row chunks against one chunk
    on the CPU, the same weights: logits, accuracies, and host syncs per chunk."""
    mapping = {**_SWITCHED, "data": {"name": "synthetic", "synthetic": {"num_nodes": num_nodes}}}
    cfg = _config(mapping)
    graph = prepare_in_memory(generate(cfg.data.synthetic), 0)
    with _float32_precision("ieee"):
        device_logits, device_acc, device_syncs = _evaluate(cfg, graph, device, chunk_rows)
        cpu_logits, cpu_acc, _ = _evaluate(cfg, graph, torch.device("cpu"), num_nodes)
    error = float((device_logits - cpu_logits).abs().max() / cpu_logits.abs().max())
    chunks = cfg.model.layers * chunk_count(num_nodes, 1, chunk_rows)
    outcome = Outcome(
        {
            "num_nodes": num_nodes,
            "chunk_rows": chunk_rows,
            "chunks": chunks,
            "logits_relative_error": error,
            "accuracy_device": device_acc,
            "accuracy_cpu": cpu_acc,
            "host_syncs": device_syncs,
        }
    )
    outcome.expect(
        error <= LOGIT_TOLERANCE,
        f"logits differ by {error:.3g} of the largest (at most {LOGIT_TOLERANCE:g})",
    )
    _expect_same_accuracies(outcome, graph, device_acc, cpu_acc)
    outcome.expect(
        device_syncs is None or device_syncs <= chunks,
        f"{device_syncs} host synchronisations in {chunks} chunks (at most one per chunk)",
    )
    return outcome


def _evaluate(
    cfg: Config, graph: PreparedGraph, device: torch.device, chunk_rows: int
) -> tuple[torch.Tensor, dict[str, float], int | None]:
    """Logits (on the CPU), accuracies and host syncs of a full-graph evaluation of the
    initial weights (the seed's: the same on every device) on ``device``."""
    trainer = _trainer(cfg, graph, device)
    trainer.model.eval()
    full = trainer.store.full_graph()
    result = []

    def evaluate() -> None:
        with torch.no_grad():
            result.append(full_graph_forward(trainer.model, full, chunk_rows))

    syncs = count_host_syncs(evaluate, device)
    if syncs is None:
        evaluate()
    ((logits, spec),) = result
    counts = trainer.objective.counts(logits, spec, full)
    accuracy = {f"{split}_acc": c / total for split, (c, total) in counts.items()}
    return logits.cpu(), accuracy, syncs


def host_syncs(device: torch.device) -> Outcome:
    """Host synchronisations of one training step (at most one: the loss and the flags
    read back together) and of one batch build, after a warm-up step."""
    if device.type != "cuda":
        raise CheckSkipped(f"host synchronisations are counted on CUDA only, not on {device}")
    graph = prepare_in_memory(generate(_config(SMALL).data.synthetic), 0)
    step, build = training_syncs(_trainer(_config(_SWITCHED, fuse=True), graph, device), device)
    outcome = Outcome({"train_step": step, "batch_build": build})
    outcome.expect(step <= 1, f"{step} host synchronisations in one training step (at most 1)")
    return outcome


def _breakdown(steps: list[dict]) -> dict[str, float]:
    """Mean seconds per component over ``steps``."""
    components = sorted({c for s in steps for c in s["seconds"]})
    return {c: statistics.fmean(s["seconds"].get(c, 0.0) for s in steps) for c in components}


def large_run(
    device: torch.device,
    config: dict | None = None,
    steps: int = LARGE_STEPS,
    fuse: bool | None = None,
) -> Outcome:
    """``config`` (by default :data:`LARGE_CONFIG`) on one rank of ``device`` for
    ``steps`` steps and one evaluation, with float32 products as the run sets them
    (``parallel.tf32``; ``auto``: TF32 on CUDA, as a training run has them); ``fuse``
    defaults to on with CUDA."""
    if config is None:
        config = yaml.safe_load(Path(LARGE_CONFIG).read_text())
    fuse = device.type == "cuda" if fuse is None else fuse
    # one evaluation: after the last step (an epoch never ends on an evaluation)
    train = {**config.get("train", {}), "max_steps": steps, "epochs": steps, "progress": False}
    train.update(eval_every=steps + 1, eval_every_steps=None, eval_at_steps=[], target_acc=None)
    cfg = _config({**config, "train": train}, fuse=fuse)
    started = time.perf_counter()
    graph = prepare_in_memory(generate(cfg.data.synthetic), 0)
    prepare_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with _float32_precision():
        tf32 = use_tf32(cfg.parallel.tf32, device)
        trainer = _trainer(cfg, graph, device)
        summary = trainer.fit()
        chunk_rows = full_graph_chunk_rows(trainer.model, trainer.store.full_graph())
    events = trainer.metrics.events
    step_events = [e for e in events if e["event"] == "step"]
    timed = step_events[WARM_UP_STEPS:] or step_events
    (evaluation,) = [e for e in events if e["event"] == "eval"]
    figures = {
        "num_nodes": graph.meta.num_nodes,
        "nnz": graph.meta.nnz,
        "batch_size": cfg.sampling.batch_size,
        "fuse": fuse,
        "tf32": tf32,
        "prepare_s": prepare_s,
        "steps": len(step_events),
        "first_step_s": step_events[0]["step_s"],
        "seconds_per_step": statistics.median(e["step_s"] for e in timed),
        "breakdown_s": _breakdown(timed),
        "eval_s": evaluation["eval_s"],
        "eval_chunk_rows": chunk_rows,
        "accuracy": _accuracies(events),
        "final_loss": step_events[-1]["loss"],
        "peak_rss_mb": max(summary["max_rss_mb"]),
        "max_memory_allocated_gib": (
            torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        ),
    }
    outcome = Outcome(figures)
    outcome.expect(len(step_events) == steps, f"{len(step_events)} steps ran, {steps} asked for")
    outcome.expect(math.isfinite(figures["final_loss"]), "the last loss is not finite")
    return outcome


#: The launch scripts beside the package (in the project's checkout).
LAUNCH = Path(dgl_scalegnn.__file__).resolve().parents[1] / "launch"


def _torchrun(directory: Path) -> Path:
    """A ``torchrun`` in ``directory`` that is this interpreter's
    (``python -m torch.distributed.run``): one on the PATH, or beside another
    interpreter, would run another Python and another torch than the one checked."""
    script = directory / "torchrun"
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run "$@"\n'
    )
    script.chmod(0o755)
    return script


def _launch(
    script: str, grid: str, config: Path, backend: str, switches: Sequence[str], timeout_s: float
) -> list[dict]:
    """``launch/<script>`` on ``grid`` with ``backend`` and ``switches`` (``--set``
    options), by this interpreter's torchrun; its metrics events."""
    world = GridShape.parse(grid).world_size
    metrics = config.with_name(f"{backend}.jsonl")
    argv = [str(LAUNCH / script), str(world), grid, str(config), "--metrics", str(metrics)]
    argv += ["--set", f"parallel.backend={backend}", *switches]
    env = {**os.environ, "TORCHRUN": str(_torchrun(config.parent))}
    with subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a timeout stops every rank
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise RuntimeError(f"{script} {grid} did not end within {timeout_s} s") from None
    if process.returncode != 0:
        raise RuntimeError(f"{script} {grid} exited {process.returncode}: {output[-2000:]}")
    return read_metrics(metrics)


def nccl_against_gloo(
    grid: str,
    script: str = "torchrun.sh",
    switches: Sequence[str] = EXACT_PRODUCTS,
    tolerance: float = LOSS_TOLERANCE,
    config: dict = SMALL,
    timeout_s: float = LAUNCH_TIMEOUT_S,
) -> Outcome:
    """``config`` launched by ``launch/<script>`` on ``grid`` with ``switches`` (``--set``
    options) on NCCL (one GPU per rank) against the same on gloo: each on the backend it
    was given, step losses within ``tolerance`` relative."""
    if not (LAUNCH / script).exists():
        raise RuntimeError(
            f"{script} not found beside the package: run make gpu-check from the project's checkout"
        )
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        path = Path(work, "config.yaml")
        path.write_text(yaml.safe_dump(config))
        nccl, gloo = (
            _launch(script, grid, path, backend, switches, timeout_s)
            for backend in ("nccl", "gloo")
        )
    difference = relative_difference(_losses(nccl), _losses(gloo))
    backends = [nccl[0].get("backend"), gloo[0].get("backend")]
    outcome = Outcome(
        {
            "grid": grid,
            "losses_nccl": _losses(nccl),
            "losses_gloo": _losses(gloo),
            "max_relative_difference": difference,
            "backends": backends,
        }
    )
    outcome.expect(backends == ["nccl", "gloo"], f"{grid} ran on {backends}, not nccl and gloo")
    outcome.expect(
        difference <= tolerance,
        f"{grid}: NCCL and gloo losses differ by {difference:.3g} relative (at most {tolerance:g})",
    )
    return outcome


def torchrun_grid(gpu_count: int) -> Outcome:
    """:func:`nccl_against_gloo` under torchrun on the largest grid of
    :data:`TORCHRUN_GRIDS` that ``gpu_count`` GPUs hold, float32 products exact on both
    (:data:`EXACT_PRODUCTS`)."""
    fitting = [count for count in TORCHRUN_GRIDS if count <= gpu_count]
    if not fitting:
        raise CheckSkipped(
            f"needs 2 or more GPUs (one per rank); this machine has {gpu_count}: run on a "
            "machine with 2, 4 or 8 GPUs for the multi-process check"
        )
    return nccl_against_gloo(TORCHRUN_GRIDS[max(fitting)], config=_SWITCHED)


#: Every check in the order it runs, as a function of the device.
CHECKS: dict[str, Callable[[torch.device], Outcome]] = {
    "one_rank_vs_cpu": one_rank_vs_cpu,
    "chunked_eval": chunked_eval,
    "host_syncs": host_syncs,
    "large_run": large_run,
    "torchrun_grid": lambda device: torchrun_grid(torch.cuda.device_count()),
}


# --------------------------------------------------------------------- report


def _entry(status: str, seconds: float, outcome: Outcome | None, reason: str | None) -> dict:
    return {
        "status": status,
        "seconds": round(seconds, 3),
        "figures": {} if outcome is None else outcome.figures,
        "reason": reason,
    }


def _run_one(check: Callable[[torch.device], Outcome], device: torch.device) -> dict:
    """One check's report entry; an exception fails it with its message and traceback."""
    started = time.perf_counter()
    try:
        outcome = check(device)
    except CheckSkipped as skipped:
        return _entry("skipped", time.perf_counter() - started, None, str(skipped))
    except Exception as error:  # an unattended run reports every failure and goes on
        entry = _entry("failed", time.perf_counter() - started, None, f"{error!r}")
        entry["traceback"] = traceback.format_exc()[-4000:]
        return entry
    status = "failed" if outcome.problems else "passed"
    reason = "; ".join(outcome.problems) or None
    return _entry(status, time.perf_counter() - started, outcome, reason)


def run_checks(
    device: torch.device,
    checks: dict[str, Callable[[torch.device], Outcome]] = CHECKS,
    entries: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """Every check on ``device``, in order, printing one line each; each entry goes into
    ``entries`` (a new dictionary by default) as soon as its check ends."""
    entries = {} if entries is None else entries
    for name, check in checks.items():
        print(f"gpu-check: {name} ...", flush=True)
        entries[name] = _run_one(check, device)
        entry = entries[name]
        said = f": {entry['reason']}" if entry["reason"] else ""
        print(f"gpu-check: {name} {entry['status']} ({entry['seconds']:.1f} s){said}", flush=True)
    return entries


def _verdict(
    problem: str | None, gpu_expected: bool, facts: dict[str, dict], checks: dict[str, dict]
) -> tuple[str, str | None]:
    """The report's status and reason: ``no-gpu`` where a GPU was expected and none is
    usable (``problem``), else ``failed`` where a fact or a check failed, else
    ``skipped`` (no GPU, none expected) or ``passed``."""
    failed = [
        f"environment {name} ({fact['error']})"
        for name, fact in facts.items()
        if fact["status"] == "failed"
    ]
    failed += [name for name, entry in checks.items() if entry["status"] == "failed"]
    said = [f"no usable GPU: {problem}"] if problem is not None else []
    said += [f"failed: {', '.join(failed)}"] if failed else []
    reason = "; ".join(said) or None
    if problem is not None and gpu_expected:
        return "no-gpu", reason
    if failed:
        return "failed", reason
    return ("skipped" if problem is not None else "passed"), reason


def make_report(
    status: str,
    reason: str | None,
    gpu_expected: bool,
    facts: dict[str, Any],
    checks: dict,
    seconds: float,
) -> dict:
    """The report (``docs/gpu-check.md``) of a run in environment ``facts``
    (:func:`environment`) whose checks gave ``checks``."""
    return {
        "format": REPORT_FORMAT,
        "status": status,
        "reason": reason,
        "gpu_expected": gpu_expected,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": facts,
        "checks": checks,
        "seconds": round(seconds, 3),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.gpu.check",
        description="Check this machine's GPU path and write one JSON report (docs/gpu-check.md).",
    )
    parser.add_argument("--out", default="gpu-check.json", help="the report (JSON)")
    parser.add_argument(
        "--no-gpu-expected",
        action="store_true",
        help="where no GPU is usable, write a skipped report and exit 0 instead of 3",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Decide whether a GPU is usable, run the checks, write the report (also when a fact,
    a check or the run itself fails); the exit status is :data:`PASSED`, :data:`FAILED`
    or :data:`NO_GPU`."""
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    gpu_expected = not args.no_gpu_expected
    problem = gpu_problem()
    facts = environment()  # before the checks: a broken device may not answer after them
    checks: dict[str, dict] = {}
    status, reason = "failed", "the run stopped before its checks ended"
    try:
        if problem is None:
            run_checks(torch.device("cuda", 0), entries=checks)
        else:
            checks.update(
                {name: _entry("skipped", 0.0, None, f"no usable GPU: {problem}") for name in CHECKS}
            )
        status, reason = _verdict(problem, gpu_expected, facts, checks)
    finally:  # the report, whatever failed (an interrupt too): the checks not run say so
        for name in CHECKS:
            checks.setdefault(name, _entry("failed", 0.0, None, reason))
        seconds = time.perf_counter() - started
        report = make_report(status, reason, gpu_expected, facts, checks, seconds)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if status == "no-gpu":
        print(
            f"gpu-check: {reason}. Report: {args.out}. Where no GPU is expected, run "
            "make gpu-check GPU_EXPECTED=0",
            file=sys.stderr,
        )
        return NO_GPU
    print(f"gpu-check: {status}{f' ({reason})' if reason else ''}; report: {args.out}")
    return FAILED if status == "failed" else PASSED


if __name__ == "__main__":
    sys.exit(main())
