"""``make bench-growth``: how a step, an evaluation, memory and preparation grow with N.

The presets of :mod:`benchmarks.scale_presets` at several sizes (default: the sparse
graph at 1M, 3M and 10M vertices, the products-like graph at 1M and at ogbn-products'
2,449,029), each generated and prepared once, then every method in its own
process(es), in one run:

``dgl_scalegnn, 1 process`` / ``, 1x2x2x2`` / ``, <plan grid>``
    ``scalegnn train`` with the preset's 1M config (``yaml/synthetic-1m.yaml``,
    ``yaml/products-like-1m.yaml``) at B = N/100, for a training budget that grows with
    the graph (:data:`BUDGET_PER_MILLION_S` seconds per million vertices, given as
    ``train.max_train_s``: one launch, whatever a step costs), evaluated at its end;
    the grid the calibrated cost model prefers for 8 ranks on this host
    (:func:`plan_grid`: the most updates a second) is run too where it is not 1x2x2x2.
    B is an update's: a grid of ``Gd`` data-parallel groups draws ``B / Gd`` in each,
    as ``scalegnn plan`` tells a user to.
    At every size above the smallest, also :data:`TIMING_STEPS` steps at the fixed
    B = :data:`FIXED_BATCH` (step time at fixed B).
``GraphSAINT-node``
    DGL's ``SAINTSampler`` at budget N/100, full-graph evaluation; at the smallest size
    of each preset swept over its normalisations (each sampled subgraph its own GCN
    normalisation, GraphSAINT's estimator, the full graph's weights) and learning rates,
    then the best of those with dropout (:func:`sweep_saint`); the best on validation is
    kept for the larger sizes.
``GraphSAGE``
    DGL's ``NeighborSampler`` (batch 1024, fan-outs 10, 10: the choice of
    ``make bench-scale``'s sweep on both 1M graphs), layer-wise evaluation with all
    neighbours (what DGL users run).
``DGL full-graph forward``
    Evaluation only: two ``SAGEConv`` (mean) calls over the whole graph, one per layer,
    as a user with enough memory evaluates; its seconds and peak memory.
``DistDGL, 8 trainers``
    DGL's distributed GraphSAGE (GraphSAGE's settings, global batch) on 8 random
    partitions, each trainer and server its own process.

Per run: seconds per step and its breakdown (ours: GEMM, SpMM, element-wise,
collectives, sampling, from the engine's metrics) beside the cost model's, calibrated on
this host at the start (:func:`host_calibration`), evaluation seconds per round, peak
resident memory per rank and summed, test accuracy at the end of the budget, and per
size the preparation's seconds and peak memory (``scalegnn prepare``; the peers'
generation and save; DistDGL's partitioning). A run that fails (memory, time-out) is a
row with its error. The report (:mod:`benchmarks.growth_report`) fits how each quantity
grows with N and sets the cost model's prediction beside it.

Settings: :class:`GrowthSettings`, from ``python -m benchmarks.bench_growth --help``
(``make bench-growth BENCH_ARGS="..."``); with ``--work``, graphs, logs and finished runs
are kept and a later run resumes.

Outputs: ``benchmarks/results/bench_growth.json``, ``bench_growth.png`` and
``bench_growth.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import growth_report
from benchmarks.baselines.distdgl import DistDGLError
from benchmarks.common import write_results
from benchmarks.graphs import BATCH_FRACTION, Graph, Size, parse_sizes, setup_graph
from benchmarks.harness import (
    ROOT,
    BenchError,
    ThrashGuard,
    argument,
    budget_timeout_s,
    parse_args,
    work_dir,
)
from benchmarks.methods import (
    STEP_CAP,
    run_distdgl,
    run_forward,
    run_ours,
    run_peer,
    step_schedule,
    train_peak_mb,
)

__all__ = ["GrowthSettings", "METHODS", "main"]

#: Training seconds per million vertices: a budget that grows with the graph.
BUDGET_PER_MILLION_S = 6.0
#: The fixed batch of the step-time runs at fixed B, and their steps.
FIXED_BATCH = 10_000
TIMING_STEPS = 8
#: Resident MB of a process that has imported torch and DGL, before any data (measured
#: here); the cost model counts data and activations only, so predictions add it.
IMPORT_MB = 384.0
GRAPHSAGE = {"batch_size": 1024, "fanouts": [10, 10], "lr": 0.01, "dropout": 0.5}
DEFAULT_SIZES = "sparse=1000000,3000000,10000000;products-like=1000000,2449029"
METHODS = (
    "dgl_scalegnn, 1 process",
    "dgl_scalegnn, 1x2x2x2",
    "dgl_scalegnn, plan grid",
    "GraphSAINT-node",
    "GraphSAGE",
    "DGL full-graph forward",
    "DistDGL, 8 trainers",
)
GRID_8 = "1x2x2x2"


def _methods(text: str) -> tuple[str, ...]:
    """Method names separated by ``;`` (the names hold commas), each one of :data:`METHODS`."""
    wanted = tuple(m.strip() for m in text.split(";") if m.strip())
    if unknown := sorted(set(wanted) - set(METHODS)):
        raise ValueError(f"unknown {unknown}; give some of {list(METHODS)}, separated by ';'")
    return wanted


@dataclass(frozen=True)
class GrowthSettings:
    """What ``make bench-growth`` runs (its command line; the module docstring)."""

    sizes: tuple[Size, ...] = parse_sizes(DEFAULT_SIZES)
    budget_per_million_s: float = BUDGET_PER_MILLION_S
    work: Path | None = None
    methods: tuple[str, ...] = METHODS

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> GrowthSettings:
        parser = argparse.ArgumentParser(prog="bench_growth", description=__doc__.split("\n")[0])
        parser.add_argument(
            "--sizes",
            type=argument(parse_sizes),
            default=cls.sizes,
            help=f"preset=N,N;preset=N, N as 3m, 3e6 or 3000000 (default {DEFAULT_SIZES})",
        )
        parser.add_argument(
            "--budget",
            type=float,
            default=cls.budget_per_million_s,
            help=f"training seconds per million vertices (default {BUDGET_PER_MILLION_S:g})",
        )
        parser.add_argument("--work", type=Path, help="keep graphs, logs and finished runs here")
        parser.add_argument(
            "--methods",
            type=argument(_methods),
            default=METHODS,
            help="some of the methods, separated by ';' (their names hold commas; default all: "
            + "; ".join(METHODS)
            + ")",
        )
        args = parse_args(parser, argv)
        return cls(args.sizes, args.budget, args.work, args.methods)


#: The preparation steps each method needs beyond ``scalegnn prepare``.
_NEEDS = {
    "GraphSAINT-node": ("generate",),
    "GraphSAGE": ("generate",),
    "DGL full-graph forward": ("generate",),
    "DistDGL, 8 trainers": ("generate", "partition"),
}


# ---------------------------------------------------------------- methods


@functools.cache
def host_calibration():
    """This host measured for 8 ranks (:func:`~dgl_scalegnn.train.calibrate.calibrate`,
    what ``scalegnn plan --calibrate`` runs), once a benchmark, at its start, and saved
    for later plans: the plan grid is chosen and every run predicted with it."""
    from dgl_scalegnn.train.calibrate import calibrate, save_calibration

    calibration = calibrate(8, progress=lambda line: print(f"[bench_growth] {line}", flush=True))
    save_calibration(calibration)
    return calibration


def plan_grid(graph: Graph, batch_size: int) -> str:
    """The grid the calibrated cost model ranks first for 8 ranks on this host for
    updates of ``batch_size`` vertices (each of its ``Gd`` groups draws ``batch_size /
    Gd``: :func:`~dgl_scalegnn.train.plan.group_batch`).

    The 8 ranks share one host's memory, so each gets an eighth of what is available
    now: at 10M vertices a rank's share of the total ranked 8x1x1x1 (every rank the
    whole graph) first, which thrashed this host.
    """
    from dgl_scalegnn.train.defaults import available_bytes
    from dgl_scalegnn.train.plan import calibrated_machine, rank_grids

    memory = available_bytes("cpu", local_ranks=8)
    spec = calibrated_machine(host_calibration(), rank_memory=memory)
    return str(rank_grids(_workload(graph, batch_size, spec), 8, spec, tf32=False)[0].grid)


def _workload(graph: Graph, batch_size: int, spec):
    """The cost model's workload of ``graph``'s config at ``batch_size`` on ``spec``."""
    from dgl_scalegnn.config import load_config
    from dgl_scalegnn.train.plan import workload

    cfg = load_config(
        ROOT / graph.config_file,
        [f"data.prepared={graph.prepared}", f"sampling.batch_size={batch_size}"],
    )
    return workload(cfg, spec)[0]


def predict(graph: Graph, grid: str, batch_size: int) -> dict[str, float]:
    """The calibrated cost model's step seconds, evaluation seconds and bytes of rank 0
    for a run of ``graph`` on ``grid`` at ``batch_size`` vertices a group (one process:
    the calibration's process alone; 8 ranks: its ranks at once)."""
    from dgl_scalegnn.core.grid_shape import GridShape
    from dgl_scalegnn.evaluation.memory import default_chunk_rows
    from dgl_scalegnn.perfmodel import eval_time, memory_bytes, step_time
    from dgl_scalegnn.train.plan import calibrated_machine

    shape = GridShape.parse(grid)
    spec = calibrated_machine(host_calibration())
    work = _workload(graph, batch_size, spec)
    hardware = spec.hardware(shape, tf32=False)
    rank_mb = IMPORT_MB + sum(memory_bytes(work, shape).values()) / 1e6
    return {
        "step_s": sum(step_time(work, shape, hardware).values()),
        "eval_s": sum(eval_time(work, shape, hardware, default_chunk_rows(shape.tp_size)).values()),
        "peak_rank_mb": rank_mb,
        "summed_mb": rank_mb * shape.world_size,
    }


def _ours_row(result: Mapping[str, Any], grid: str, batch: int) -> dict[str, Any]:
    history = result["history"]
    last = history[-1] if history else {}
    return {
        "grid": grid,
        "processes": len(result["max_rss_mb"]),
        "batch_size": batch,
        "steps": result["steps"],
        "train_s": last.get("train_s", result["step_s"] * result["steps"]),
        "step_s": result["steady_step_s"],
        "first_step_s": result["first_step_s"],
        "breakdown": result["seconds_per_step_breakdown"],
        "eval_s": last.get("eval_s"),
        # the first round, where a second one ran (the first touches fresh memory)
        "first_eval_s": history[0].get("eval_s") if len(history) > 1 else None,
        "test_acc": last.get("test_acc"),
        "val_acc": last.get("val_acc"),
        "max_rss_mb": result["max_rss_mb"],
        # without an evaluation, the whole run was training
        "train_max_rss_mb": result["train_max_rss_mb"] or result["max_rss_mb"],
    }


#: What ``scalegnn train`` says when its ranks cannot hold a layer-wise evaluation. The
#: runs ask for one (``train.evaluation: layerwise``): where it does not fit, ``auto``
#: would evaluate in neighbourhoods, which at 10M on 8 ranks of 2 cores takes minutes a
#: round (measured apart: docs/results.md), twice a run.
EVALUATION_REFUSED = "a layer-wise evaluation needs"


def evaluate_checkpoint(
    graph: Graph, size: Size, output_dir: Path, step: int, log_dir: Path
) -> dict[str, Any]:
    """Evaluate the checkpoint of ``step`` in ``output_dir`` on one process, as
    docs/configuration.md tells a user whose ranks cannot hold the evaluation (resume
    with ``train.max_steps`` at its step): its accuracy, seconds and peak memory."""
    settings = {
        "output.dir": output_dir,
        "output.resume": "true",
        "train.max_steps": step,
        "sampling.batch_size": size.batch_size,
    }
    result = run_ours(graph, settings, log_dir, 7200)
    (evaluation,) = result["history"]
    return {
        "grid": "1x1x1x1",
        "step": evaluation["step"],
        "eval_s": evaluation["eval_s"],
        "peak_rss_mb": max(result["max_rss_mb"]),
        "val_acc": evaluation["val_acc"],
        "test_acc": evaluation["test_acc"],
    }


def _partial(error: BenchError) -> dict[str, Any]:
    """What a failed dgl_scalegnn run measured before it failed: its steps' seconds and,
    if it got there, each rank's peak before the evaluation."""
    from dgl_scalegnn.train.metrics import read_metrics

    if error.metrics is None or not error.metrics.exists():
        return {}
    events = read_metrics(error.metrics)
    steps = [e for e in events if e["event"] == "step"][1:]  # the first: warm-up
    partial: dict[str, Any] = {}
    if steps:
        partial["step_s_before_failure"] = sum(e["step_s"] for e in steps) / len(steps)
    if (peak := train_peak_mb(events)) is not None:
        partial["train_max_rss_mb"] = peak
    return partial


#: Where no smaller size ran the grid, how a step grows with the batch, from the fixed
#: B to B = N/100 (measured on this host at 3M and 10M: 0.62-0.97, median 0.75).
BATCH_EXPONENT = 0.75


def guess_step_s(
    scaled_s: float | None, fixed_step_s: float | None, batch: int, batch_exponent: float
) -> float | None:
    """A step's seconds at ``batch``, for placing a one-process run's first evaluation
    round near its end: the geometric mean of what is known, ``scaled_s`` (the previous
    size's step grown with N) and ``fixed_step_s`` (this size's at :data:`FIXED_BATCH`)
    grown as ``(batch / FIXED_BATCH) ** batch_exponent``; ``None`` where neither is.
    On one process here it was within 4% of the step measured after.

    >>> round(guess_step_s(0.6, 0.2, 30_000, 1.0), 6)
    0.6
    >>> guess_step_s(None, 0.2, 10_000, 0.85), guess_step_s(None, None, 10_000, 0.85)
    (0.2, None)
    """
    known = [scaled_s] if scaled_s else []
    if fixed_step_s:
        known.append(fixed_step_s * (batch / FIXED_BATCH) ** batch_exponent)
    return math.prod(known) ** (1 / len(known)) if known else None


def batch_exponent(step_s: float, fixed_step_s: float | None, batch: int) -> float | None:
    """How a measured step grew from :data:`FIXED_BATCH` to ``batch`` (``None`` where the
    two batches are one).

    >>> round(batch_exponent(0.4, 0.2, 40_000), 3)
    0.5
    """
    if not fixed_step_s or batch == FIXED_BATCH:
        return None
    return math.log(step_s / fixed_step_s) / math.log(batch / FIXED_BATCH)


#: Where a one-process run's first evaluation round goes: after this share of the steps
#: its guessed step time plans (the second round is the one after its last step). The
#: guess was up to 13% short on this host: at 0.95 the 3M run ended first.
FIRST_ROUND_SHARE = 0.8


def measure_ours(
    graph: Graph,
    size: Size,
    grid: str,
    budget_s: float,
    scaled_s: float | None,
    exponent: float,
    log_dir: Path,
) -> dict[str, Any]:
    """One dgl_scalegnn run at B = N/100 that trains ``budget_s`` seconds
    (``train.max_train_s``: it stops at the step that spends them, its cosine rate
    decayed over them, on any grid), evaluated at its end; with the step time at the
    fixed B beside it (:data:`TIMING_STEPS` steps).

    On one process it is evaluated twice, since the second round is what a run that
    evaluates periodically pays (the first one's buffers come from fresh pages) and
    DGL's forward is timed so: the first round after :data:`FIRST_ROUND_SHARE` of the
    steps that :func:`guess_step_s` plans (of ``scaled_s``, the previous size's step
    grown with N, and the fixed-B run with batch exponent ``exponent``; else of a timing
    run at B = N/100), so that the peak before it is training's. On 8 ranks once: their
    second rounds (6-40 s, 118 s at 10M on the plan grid) would take 4 of the
    benchmark's minutes. Where ``scalegnn train`` refuses the ranks an evaluation (it
    cannot fit their memory), the run trains with ``train.evaluate false`` and its
    checkpoint is evaluated on one process (:func:`evaluate_checkpoint`), as a user is
    told to."""
    from dgl_scalegnn.core.grid_shape import GridShape
    from dgl_scalegnn.train.plan import group_batch

    processes = 1 if grid == "1x1x1x1" else 8
    dp = GridShape.parse(grid).dp
    # B and the fixed B are an update's: each data-parallel group draws its share
    group, fixed_group = group_batch(size.batch_size, dp), group_batch(FIXED_BATCH, dp)
    batch = {"sampling.batch_size": group}
    # Set when the ranks are refused a full-graph evaluation (it cannot fit their memory):
    # the run then trains with train.evaluate false, and is evaluated from its checkpoint
    # on one process.
    elsewhere: dict[str, Any] = {}

    def train(
        overrides: Mapping[str, Any], steps: int | None = None, rounds: Sequence[int] = ()
    ) -> dict[str, Any]:
        """A timing run of ``steps`` steps, not evaluated (at 10M an evaluation on 8
        ranks takes minutes), or (``steps`` None) a run of the budget, evaluated after
        the steps in ``rounds`` and its last."""
        guard = ThrashGuard()
        evaluate = steps is None and not elsewhere
        settings = {
            **step_schedule(steps or STEP_CAP, rounds if evaluate else ()),
            **overrides,
            **({"train.evaluation": "layerwise"} if evaluate else {"train.evaluate": "false"}),
            # the budget, and no evaluation at epoch ends (8x1x1x1 at 1M: every 13 steps)
            **(
                {"train.max_train_s": budget_s, "train.eval_every": STEP_CAP}
                if steps is None
                else {}
            ),
        }
        try:
            return run_ours(graph, settings, log_dir, budget_timeout_s(budget_s), grid, guard)
        except BenchError as error:
            if guard.stopped:
                error.args = (f"stopped: the host thrashed ({error.args[0]})",)
            if elsewhere or EVALUATION_REFUSED not in str(error):
                raise
            why = next(line for line in str(error).splitlines() if EVALUATION_REFUSED in line)
            elsewhere["why"] = why.removeprefix("scalegnn: error: ")
            return train(overrides, steps, rounds)

    fixed: dict[str, Any] | None = None
    if group != fixed_group:
        try:
            fixed = _ours_row(
                train({"sampling.batch_size": fixed_group}, TIMING_STEPS), grid, fixed_group
            )
        except BenchError as error:  # its steps count, if it took them
            partial = _partial(error)
            fixed = {"error": str(error)[-300:], "grid": grid, "batch_size": fixed_group}
            if "step_s_before_failure" in partial:
                fixed["step_s"] = partial["step_s_before_failure"]
    checkpoints = log_dir / f"ckpt-{size.name}-{grid}"
    shutil.rmtree(checkpoints, ignore_errors=True)  # a resume takes the newest
    try:
        guessed: dict[str, Any] = {}
        rounds: list[int] = []
        if processes == 1:
            fixed_s = None if fixed is None else fixed.get("step_s")
            step_guess_s = guess_step_s(scaled_s, fixed_s, size.batch_size, exponent)
            if step_guess_s is None:
                step_guess_s = train(batch, TIMING_STEPS)["steady_step_s"]
            rounds = [max(1, math.floor(FIRST_ROUND_SHARE * budget_s / step_guess_s))]
            guessed = {"step_guess_s": step_guess_s}
        kept = {"output.dir": checkpoints, "output.checkpoint_every": STEP_CAP}
        result = train({**batch, **kept}, rounds=rounds)
        row = {**_ours_row(result, grid, group), **guessed}
        if elsewhere:
            evaluated = evaluate_checkpoint(graph, size, checkpoints, result["steps"], log_dir)
            row.update(test_acc=evaluated["test_acc"], val_acc=evaluated["val_acc"])
            row["evaluated_elsewhere"] = {**evaluated, "why": elsewhere["why"]}
    except BenchError as error:
        failed = {"error": str(error)[-1500:], "grid": grid, "processes": processes}
        return {**failed, **_partial(error), "fixed_batch": fixed}
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    if fixed is None:
        fixed = {key: row[key] for key in ("grid", "step_s", "breakdown", "batch_size")}
    predicted = predict(graph, grid, group)
    predicted["fixed_step_s"] = predict(graph, grid, fixed_group)["step_s"]
    return {**row, "fixed_batch": fixed, "predicted": predicted}


#: GraphSAINT-node's sweep at the smallest size of a preset (chosen on validation
#: accuracy, then kept for the larger sizes), first stage: its three normalisations at two
#: learning rates, without dropout. :func:`sweep_saint` then tries the best of these with
#: dropout :data:`SAINT_DROPOUT`.
SAINT_SWEEP = tuple(
    {"normalization": norm, "lr": lr, "dropout": 0.0}
    for norm in ("subgraph", "estimator", "global")
    for lr in (0.01, 0.03)
)
SAINT_DROPOUT = 0.2


def sweep_saint(run: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """The best GraphSAINT-node row on validation accuracy of a two-stage sweep:
    ``run(choice)`` for every :data:`SAINT_SWEEP` choice, then the best of them with
    dropout :data:`SAINT_DROPOUT`. Seven runs where the full grid would be twelve: each
    costs half a minute at products-like 1M, its full-graph evaluation most of it.

    >>> fake = lambda c: {"val_acc": {"subgraph": 0.8}.get(c["normalization"], 0.7) + c["dropout"]}
    >>> best = sweep_saint(fake)
    >>> best["choice"], len(best["sweep"])
    ({'normalization': 'subgraph', 'lr': 0.01, 'dropout': 0.2}, 7)
    """
    tried = [{**run(choice), "choice": choice} for choice in SAINT_SWEEP]
    best = max(tried, key=lambda row: row["val_acc"])
    choice = {**best["choice"], "dropout": SAINT_DROPOUT}
    tried.append({**run(choice), "choice": choice})
    best = max(tried, key=lambda row: row["val_acc"])
    return {**best, "sweep": tried}


def saint_row(
    graph: Graph, size: Size, choice: Mapping[str, Any], budget_s: float, log_dir: Path
) -> dict[str, Any]:
    """GraphSAINT-node at budget N/100 with ``choice`` (a :data:`SAINT_SWEEP` entry)."""
    settings = {"budget": size.batch_size, "norm_coverage": 10, **choice}
    result = run_peer(graph, "graphsaint", settings, 0, budget_s, [budget_s], log_dir)
    return _peer_row(result, size.batch_size)


def _peer_row(result: Mapping[str, Any], batch: int) -> dict[str, Any]:
    last = result["history"][-1]
    return {
        "processes": len(result["max_rss_mb"]),
        "batch_size": batch,
        "settings": result.get("settings"),
        "steps": last["step"],
        "train_s": last["train_s"],
        "step_s": last["train_s"] / max(1, last["step"]),
        "eval_s": last["eval_s"],
        "test_acc": last["test_acc"],
        "val_acc": last["val_acc"],
        "max_rss_mb": result["max_rss_mb"],
        "setup_s": result.get("setup_s"),
    }


def _record(path: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[f"{row['size']}|{row['method']}"] = row
    return rows


def run_size(
    size: Size,
    budget_per_million_s: float,
    work: Path,
    log_dir: Path,
    done: dict[str, dict[str, Any]],
    record: Callable[[dict[str, Any]], None],
    wanted: Iterable[str],
    carry: dict[str, Any],
) -> None:
    """Every wanted method at ``size`` (skipping those in ``done``), for a training
    budget of ``budget_per_million_s`` seconds per million vertices."""
    print(f"[{size.name}] preparing", flush=True)
    partition_peaks = carry.setdefault("partition_peaks", {})
    steps = {step for method in wanted for step in _NEEDS.get(method, ())}
    graph, setup = setup_graph(size, work, steps, partition_peaks)
    record({"size": size.name, "method": "setup", **setup})
    if "seconds" in setup.get("partition", {}):  # measured: what larger sizes predict from
        partition_peaks.setdefault(size.preset, []).append(
            (size.num_nodes, setup["partition"]["peak_rss_mb"])
        )
    budget = budget_per_million_s * size.num_nodes / 1e6
    guesses = carry.setdefault(f"step_guess-{size.preset}", {})
    grid8 = plan_grid(graph, size.batch_size)
    saint_choice = carry.get(f"saint-{size.preset}")

    def ours(grid: str) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            previous = guesses.get(grid)  # at fixed B/N a step grows about as N
            scaled = None if previous is None else previous[0] * size.num_nodes / previous[1]
            exponent = BATCH_EXPONENT if previous is None or previous[2] is None else previous[2]
            return measure_ours(graph, size, grid, budget, scaled, exponent, log_dir)

        return run

    def saint() -> dict[str, Any]:
        if saint_choice is not None:
            return {**saint_row(graph, size, saint_choice, budget, log_dir), "choice": saint_choice}
        return sweep_saint(lambda choice: saint_row(graph, size, choice, budget, log_dir))

    def sage() -> dict[str, Any]:
        result = run_peer(graph, "graphsage", GRAPHSAGE, 0, budget, [budget], log_dir)
        return _peer_row(result, GRAPHSAGE["batch_size"])

    def distdgl() -> dict[str, Any]:
        settings = {**GRAPHSAGE, "eval_fanout": -1, "eval_batch_size": 4096}
        result = run_distdgl(graph, settings, 0, budget, [budget], log_dir)
        row = _peer_row(result, GRAPHSAGE["batch_size"])
        return {**row, "partitions": "random, 8", "topology": result.get("topology")}

    methods: dict[str, Callable[[], dict[str, Any]]] = {
        METHODS[0]: ours("1x1x1x1"),
        METHODS[1]: ours(GRID_8),
        METHODS[3]: saint,
        METHODS[4]: sage,
        METHODS[5]: lambda: run_forward(graph, f"forward-{size.name}", log_dir, 2),
        METHODS[6]: distdgl,
    }
    if grid8 != GRID_8:
        methods[METHODS[2]] = ours(grid8)
    for method, run in methods.items():
        key = f"{size.name}|{method}"
        if method not in wanted:
            continue
        missing = [step for step in _NEEDS.get(method, ()) if "error" in setup.get(step, {})]
        if key in done:
            row = done[key]
        elif missing:
            failed = setup[missing[0]]
            why = (failed["error"].strip().splitlines() or [""])[-1][:300]
            peak = failed.get("peak_rss_mb")
            ended = "was not run" if "predicted_peak_rss_mb" in failed else "failed"
            row = {
                "size": size.name,
                "method": method,
                "error": f"its {missing[0]} step {ended}"
                + (f" at a peak of {peak:.0f} MB" if peak else "")
                + f": {why}",
            }
            record(row)
        else:
            print(f"[{size.name}] {method}", flush=True)
            start = time.perf_counter()
            try:
                row = run()
            except (BenchError, DistDGLError, OSError) as error:
                row = {"error": str(error)[-1500:]}
            row = {
                "size": size.name,
                "method": method,
                "wall_s": time.perf_counter() - start,
                **row,
            }
            record(row)
        if "step_s" in row and "grid" in row and "error" not in row:
            fixed_s = (row.get("fixed_batch") or {}).get("step_s")
            exponent = batch_exponent(row["step_s"], fixed_s, size.batch_size)
            guesses[row["grid"]] = (row["step_s"], size.num_nodes, exponent)
        if method == METHODS[3] and "choice" in row:
            carry[f"saint-{size.preset}"] = row["choice"]
        print(f"[{size.name}] {method}: {_summary(row)}", flush=True)


def _summary(row: Mapping[str, Any]) -> str:
    if "error" in row:
        return "failed: " + row["error"].splitlines()[-1][:200]
    parts = [
        f"{key} {row[key]:.4g}"
        for key in ("test_acc", "step_s", "eval_s")
        if row.get(key) is not None
    ]
    return ", ".join([*parts, f"peak {max(row['max_rss_mb']):.0f} MB/rank"])


def _minutes(rows: Iterable[Mapping[str, Any]]) -> float:
    """Minutes of every run and preparation step in ``rows``, failed ones included (at
    10M DGL's partitioning runs about 150 s before it is killed for memory).

    >>> setup = {"prepare": {"seconds": 30.0}, "partition": {"seconds_until_failure": 150.0}}
    >>> _minutes([{"method": "setup", **setup}, {"method": "GraphSAGE", "wall_s": 60.0}])
    4.0
    """
    seconds = 0.0
    for row in rows:
        if row["method"] == "setup":
            steps = [v for v in row.values() if isinstance(v, dict)]
            seconds += sum(v.get("seconds", v.get("seconds_until_failure", 0.0)) for v in steps)
        else:
            seconds += row.get("wall_s", 0.0)
    return seconds / 60


def main(settings: GrowthSettings | None = None) -> dict[str, Any]:
    """Every size, every method of ``settings`` (by default the command line's); write
    the JSON, the PNG and the markdown."""
    settings = settings or GrowthSettings.from_argv()
    start = time.perf_counter()
    with work_dir(settings.work) as work:
        log_dir = work / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        rows_path = work / "rows.jsonl"
        done = _record(rows_path)

        def record(row: dict[str, Any]) -> None:
            with open(rows_path, "a") as out:
                out.write(json.dumps(row) + "\n")

        carry: dict[str, Any] = {}
        for size in settings.sizes:
            budget = settings.budget_per_million_s
            run_size(size, budget, work, log_dir, done, record, settings.methods, carry)
        rows = list(_record(rows_path).values())
    payload = {
        "sizes": [dataclasses.asdict(s) for s in settings.sizes],
        "budget_per_million_s": settings.budget_per_million_s,
        "batch_fraction": BATCH_FRACTION,
        "fixed_batch": FIXED_BATCH,
        # every run and preparation step, also of earlier invocations on this work dir
        "minutes": _minutes(rows),
        "this_invocation_minutes": (time.perf_counter() - start) / 60,
        "rows": rows,
    }
    if host_calibration.cache_info().currsize:  # made for this invocation's runs
        payload["calibration"] = host_calibration().to_json()
    payload["analysis"] = growth_report.analyse(payload)
    path = write_results("bench_growth", payload)
    growth_report.write(payload, path)
    return payload


if __name__ == "__main__":
    main()
