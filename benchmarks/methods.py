"""Every method of the comparisons, each run by one function in its own process(es).

:func:`run_ours`
    ``scalegnn train`` on a grid (one process, or ranks through ``mpirun``) from the
    graph's ``scalegnn prepare`` directory; the engine's own figures from its metrics.
:func:`run_peer`
    GraphSAINT-node (``graphsaint``), or GraphSAGE, GIN or GAT with DGL's neighbour
    sampler (``graphsage``, ``dgl-gin-ns``, ``dgl-gat-ns``) for a budget of training
    seconds, evaluated at given training times.
:func:`run_distdgl`
    DistDGL's GraphSAGE, 8 trainers, on the graph's partitions.
:func:`run_forward`
    DGL's full-graph forward, two ``SAGEConv`` (mean) calls over the whole graph (hidden
    128), as a user with enough memory evaluates: evaluation rounds only.
:func:`run_our_evaluation`
    Our layer-wise full-graph evaluation of a model on one process: rounds only.

A training run returns the result format of :mod:`benchmarks.baselines.training`: a
``history`` of evaluation records (``step``, ``epoch``, ``train_s``, ``val_acc``,
``test_acc``, ``eval_s``, ``train_loss``) with ``steps``, ``step_s`` and ``max_rss_mb``
(per rank); an evaluation run its ``eval_s_rounds``, ``eval_s`` (the fastest), ``loaded_mb`` and
``max_rss_mb``. Each child is ``python -m benchmarks.methods COMMAND SPEC.json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.baselines import distdgl, graphsage, graphsaint, neighbour_sampled, training
from benchmarks.graphs import BATCH_FRACTION, Graph, load_saved
from benchmarks.harness import BenchError, budget_timeout_s, mpirun, run_child, run_process
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.train.metrics import read_metrics

#: ``train.epochs`` (and ``train.max_steps``) of a run that stops at its step count or
#: its budget of seconds: never reached.
STEP_CAP = 10**6
_MODULE = "benchmarks.methods"  # the children's command: python -m benchmarks.methods
_PEERS = {
    "graphsaint": graphsaint.PEER,
    "graphsage": graphsage.PEER,
    "dgl-gin-ns": neighbour_sampled.GIN_PEER,
    "dgl-gat-ns": neighbour_sampled.GAT_PEER,
}


def step_schedule(max_steps: int, eval_at_steps: Sequence[int], seed: int = 0) -> dict[str, Any]:
    """The ``--set`` overrides of a run of ``max_steps`` steps evaluated after the steps
    ``eval_at_steps`` (and its last) only, none at the config's cadence, seeded ``seed``."""
    return {
        "sampling.seed": seed,
        "train.seed": seed,
        "train.epochs": STEP_CAP,
        "train.max_steps": max_steps,
        "train.eval_every_steps": "",  # none: the config's cadence would add evaluations
        "train.eval_at_steps": json.dumps(sorted(set(eval_at_steps))),
    }


def run_ours(
    graph: Graph,
    settings: Mapping[str, Any],
    log_dir: Path,
    timeout_s: float,
    grid: str = "1x1x1x1",
    watch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """``scalegnn train`` of ``graph``'s config with ``settings`` (``--set`` overrides,
    ``sampling.batch_size`` among them) on the ranks of ``grid``.

    Returns the result format (a run with ``train.evaluate false`` has no history) with
    the engine's ``first_step_s`` (one-off warm-up), ``steady_step_s`` (the later
    steps), ``seconds_per_step_breakdown``, ``bytes_per_step`` (rank 0, by group kind),
    ``epochs``, ``max_rss_mb`` and ``train_max_rss_mb`` (each rank's peak before the
    first evaluation). ``watch`` as for :func:`~benchmarks.harness.run_process`.

    Raises
    ------
    BenchError
        If the run fails; its ``metrics`` is the metrics file the run wrote.
    """
    processes = GridShape.parse(grid).world_size
    tag = f"ours-{graph.name}-{grid}-{len(list(log_dir.glob('ours-*.jsonl')))}"
    metrics = log_dir / f"{tag}.jsonl"
    argv = [sys.executable, "-m", "dgl_scalegnn.cli", "train", "--config", graph.config_file]
    argv += ["--metrics", str(metrics), "--grid", grid]
    prepared = {} if graph.prepared is None else {"data.prepared": graph.prepared}
    for key, value in {**prepared, "train.progress": "false", **settings}.items():
        argv += ["--set", f"{key}={value}"]
    if processes > 1:
        argv = [*mpirun(processes), *argv]
    threads = max(1, training.machine_cores() // processes)
    try:
        wall = run_process(argv, log_dir / f"{tag}.log", threads, timeout_s, watch)
    except BenchError as error:
        error.metrics = metrics  # what the run wrote before it failed
        raise
    events = read_metrics(metrics)
    batch = int(settings["sampling.batch_size"])
    steps = [e for e in events if e["event"] == "step"]
    history = [
        {
            "step": e["step"],
            "epoch": e["step"] * batch / graph.num_nodes,
            "train_s": e["elapsed_train_s"],
            "val_acc": e["val_acc"],
            "test_acc": e["test_acc"],
            "eval_s": e["eval_s"],
            # the steps since the previous evaluation (a step event holds its 0-based
            # index, an evaluation the steps done)
            "train_loss": training.mean_loss(
                s["loss"] for s in steps if previous <= s["step"] < e["step"]
            ),
        }
        for previous, e in zip(
            [0, *(e["step"] for e in events if e["event"] == "eval")],
            [e for e in events if e["event"] == "eval"],
        )
    ]
    summary = next(e for e in events if e["event"] == "summary")
    later = steps[1:]  # the first step carries one-off warm-up (many seconds in "elementwise")
    breakdown: dict[str, float] = {}
    for event in later:
        for part, seconds in event.get("seconds", {}).items():
            breakdown[part] = breakdown.get(part, 0.0) + seconds / max(1, len(later))
    kinds = sorted({kind for event in steps for kind in event.get("bytes", {})})
    return {
        **(training.summarise(history, None) if history else {"history": []}),
        "steps": summary["steps"],
        "epochs": summary["epochs"],
        "step_s": summary["train_s"] / max(1, summary["steps"]),  # everything booked
        "first_step_s": steps[0]["step_s"] if steps else None,  # none: resumed at its end
        "steady_step_s": sum(e["step_s"] for e in later) / max(1, len(later)),
        "seconds_per_step_breakdown": breakdown,
        "bytes_per_step": {
            kind: sum(e["bytes"].get(kind, 0) for e in steps) / len(steps) for kind in kinds
        },
        "max_rss_mb": summary["max_rss_mb"],
        "train_max_rss_mb": train_peak_mb(events),
        "wall_s": wall,
    }


def train_peak_mb(events: Sequence[Mapping[str, Any]]) -> list[float] | None:
    """Each rank's peak before the run's first evaluation (training's alone), where the
    metrics ``events`` reached one."""
    return next((e["max_rss_mb_before"] for e in events if e["event"] == "eval"), None)


def run_peer(
    graph: Graph,
    method: str,
    settings: Mapping[str, Any],
    seed: int,
    budget_s: float,
    eval_at_s: Sequence[float],
    log_dir: Path,
    sampled_eval: bool = False,
) -> dict[str, Any]:
    """One run of peer ``method`` (a name of :func:`run_peer`'s peers) of ``budget_s``
    training seconds in its own process (:func:`peer_main`), evaluated at the training
    times ``eval_at_s``; ``sampled_eval``: also one neighbour-sampled evaluation after
    training, timed (``sampled_eval_s``)."""
    tag = f"{method}-{graph.name}-s{seed}-{len(list(log_dir.glob(f'{method}-*.log')))}"
    spec = {
        "method": method,
        "graph": str(graph.dgl_file),
        "name": graph.name,
        "num_classes": graph.num_classes,
        "settings": dict(settings),
        "seed": seed,
        "budget_s": budget_s,
        "eval_at_s": list(eval_at_s),
        "sampled_eval": sampled_eval,
    }
    timeout_s = budget_timeout_s(budget_s)
    return run_child(_MODULE, "peer", tag, spec, log_dir, training.machine_cores(), timeout_s)


def peer_main(spec_path: str) -> int:
    """Inside the peer's process: load the graph, train for the budget, write the result."""
    from dgl_scalegnn.train.trainer import peak_rss_mb

    spec = json.loads(Path(spec_path).read_text())
    dataset = load_saved(spec["graph"], spec["name"], int(spec["num_classes"]))
    peer, seed = _PEERS[spec["method"]], int(spec["seed"])
    options = {}
    if peer is graphsaint.PEER:  # runs at one budget share the pre-sampled normalisation
        chosen = training.merge_settings(peer.defaults, spec["settings"], peer.name)
        name = f"saint-norm-b{chosen['budget']}-c{chosen['norm_coverage']}-s{seed}.pt"
        options["norm_cache"] = Path(spec["graph"]).parent / name
    baseline, settings, setup_s = peer.build(dataset, spec["settings"], seed, **options)
    training.seed_everything(seed)  # training draws the same with or without the cache
    steps_per_epoch = getattr(baseline, "steps_per_epoch", None) or len(baseline.loader)
    result = training.run_for_seconds(
        baseline, float(spec["budget_s"]), spec["eval_at_s"], steps_per_epoch
    )
    if spec["sampled_eval"]:
        result["sampled_eval_s"] = _sampled_eval_seconds(baseline, settings)
    last = result["history"][-1]
    result.update(
        method=peer.name,
        settings=settings,
        seed=spec["seed"],
        setup_s=setup_s,
        steps=last["step"],
        step_s=last["train_s"] / last["step"],
        max_rss_mb=[peak_rss_mb()],
    )
    Path(spec["result_path"]).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _sampled_eval_seconds(baseline: Any, settings: Mapping[str, Any]) -> float:
    """One neighbour-sampled evaluation of the validation and test vertices (GraphSAGE)."""
    import torch

    ids = torch.cat((baseline.val_ids, baseline.test_ids))
    start = time.perf_counter()
    baseline.model.eval()
    with torch.no_grad():
        graphsage.sampled_inference(
            baseline.model,
            baseline.graph,
            baseline.features,
            ids,
            graphsage.resolve_fanouts(settings),
            int(settings["eval_batch_size"]),
        )
    return time.perf_counter() - start


def run_distdgl(
    graph: Graph,
    settings: Mapping[str, Any],
    seed: int,
    budget_s: float,
    eval_at_s: Sequence[float],
    log_dir: Path,
) -> dict[str, Any]:
    """DistDGL's GraphSAGE with ``settings`` (a global batch), 8 trainers on the graph's
    partitions (8 of them: a machine each; one: one machine), for ``budget_s`` training
    seconds evaluated at ``eval_at_s``."""
    cfg = distdgl.LaunchConfig(
        settings=dict(settings),
        seed=seed,
        budget_s=budget_s,
        eval_at_s=tuple(eval_at_s),
        timeout_s=budget_timeout_s(budget_s),
    )
    topology = "machines" if graph.part_config.parent.name == "parts8" else "single"
    work = log_dir / f"distdgl-{graph.name}-s{seed}"
    result = distdgl.launch(graph.part_config, 8, graph.num_classes, cfg, topology, work)
    last = result["history"][-1]
    return {**result, "steps": last["step"], "step_s": last["train_s"] / last["step"]}


def run_forward(graph: Graph, tag: str, log_dir: Path, rounds: int) -> dict[str, Any]:
    """DGL's full-graph forward of ``graph.dgl_file`` timed ``rounds`` times in its own
    process (:func:`forward_main`)."""
    spec = {"graph": str(graph.dgl_file), "name": graph.name, "num_classes": graph.num_classes}
    spec["rounds"] = rounds
    return _rounds(run_child(_MODULE, "forward", tag, spec, log_dir, training.machine_cores()))


def run_our_evaluation(
    graph: Graph, model: Mapping[str, Any], tag: str, log_dir: Path, rounds: int
) -> dict[str, Any]:
    """Our layer-wise evaluation of ``model`` (config overrides; none: the preset's) on
    ``graph``, untrained, timed ``rounds`` times in its own process
    (:func:`evaluation_main`)."""
    spec = {
        "config": str(graph.config_file),
        "prepared": str(graph.prepared),
        "model": dict(model),
        "batch_size": max(1, graph.num_nodes // BATCH_FRACTION),
        "rounds": rounds,
    }
    return _rounds(run_child(_MODULE, "evaluate", tag, spec, log_dir, training.machine_cores()))


def _rounds(result: Mapping[str, Any]) -> dict[str, Any]:
    """The row of an evaluation-only run: its fastest round is its ``eval_s``."""
    kept = ("eval_s_rounds", "loaded_mb", "max_rss_mb")
    return {"processes": 1, "eval_s": min(result["eval_s_rounds"]), **{k: result[k] for k in kept}}


def _time_rounds(spec: Mapping[str, Any], evaluate: Callable[[], None]) -> int:
    """Inside a child: ``evaluate()`` timed ``spec["rounds"]`` times; the seconds, the
    peak after loading and the peak after the rounds go to the spec's ``result_path``."""
    from dgl_scalegnn.train.trainer import peak_rss_mb

    loaded_mb = peak_rss_mb()
    rounds = []
    for _ in range(int(spec["rounds"])):
        start = time.perf_counter()
        evaluate()
        rounds.append(time.perf_counter() - start)
    result = {"eval_s_rounds": rounds, "loaded_mb": loaded_mb, "max_rss_mb": [peak_rss_mb()]}
    Path(spec["result_path"]).write_text(json.dumps(result))
    return 0


def forward_main(spec_path: str) -> int:
    """Inside a child: DGL's two ``SAGEConv`` calls over the whole saved graph."""
    import torch

    from dgl_scalegnn._dgl import dgl

    spec = json.loads(Path(spec_path).read_text())
    dataset = load_saved(spec["graph"], spec["name"], int(spec["num_classes"]))
    graph, features = dataset.graph, dataset.graph.ndata["feat"]
    layers = [
        dgl.nn.SAGEConv(dataset.num_features, 128, "mean"),
        dgl.nn.SAGEConv(128, dataset.num_classes, "mean"),
    ]

    def forward() -> None:
        with torch.no_grad():
            layers[1](graph, torch.relu(layers[0](graph, features)))

    return _time_rounds(spec, forward)


def evaluation_main(spec_path: str) -> int:
    """Inside a child: the trainer's evaluation of the spec's model on one process."""
    from dgl_scalegnn.config import load_config
    from dgl_scalegnn.data.prepared import open_prepared
    from dgl_scalegnn.distributed.comm import Runtime
    from dgl_scalegnn.train.metrics import MetricsWriter
    from dgl_scalegnn.train.trainer import Trainer

    spec = json.loads(Path(spec_path).read_text())
    settings = {
        **spec["model"],
        "data.prepared": spec["prepared"],
        "sampling.batch_size": spec["batch_size"],  # the trainer's; no step runs
        "train.evaluation": "layerwise",
    }
    cfg = load_config(spec["config"], [f"{key}={value}" for key, value in settings.items()])
    graph = open_prepared(cfg.data.prepared)
    trainer = Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    return _time_rounds(spec, trainer.evaluate)


if __name__ == "__main__":
    commands = {"peer": peer_main, "forward": forward_main, "evaluate": evaluation_main}
    sys.exit(commands[sys.argv[1]](sys.argv[2]))
