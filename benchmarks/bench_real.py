"""``make bench-real``: every real graph against DGL's recipes, 10 seeds, one table.

For every graph of :mod:`benchmarks.real_graphs` (saved with ``dgl.save_graphs``, as a
user would hand it over) and seeds 0-9, test accuracy at the best validation epoch and
training time (evaluation excluded) of:

``ours, defaults``
    ``scalegnn train --data GRAPH.bin`` in this process: a config with only ``data``,
    so every setting is the one derived from the graph (:mod:`dgl_scalegnn.train.defaults`).
``ours, paper model``
    The same with the paper's model as ``yaml/cora-paper.yaml`` shapes and regularises
    it (input projection, RMSNorm with ``rms_eps`` 1, the aggregated residual, head,
    biases; dropout 0.7 and input dropout 0.9, weight decay 2e-3, lr 0.005 cosine),
    the batch and epochs still derived.
``DGL GraphConv``, ``DGL SAGEConv``
    DGL's standard full-batch recipes (:mod:`benchmarks.baselines.dgl_recipes`).
``GraphSAINT-node``
    :mod:`benchmarks.baselines.graphsaint` on rows scaled to sum 1, its budget and its
    ``normalization`` (``"estimator"`` or ``"global"``) swept on every graph (seeds 0-2,
    best mean validation) before the 10 seeds.
``ours SAGE, defaults``, ``ours GIN, defaults``, ``ours GAT, defaults``
    The defaults with ``model.conv: sage`` / ``gin`` / ``gat`` (not in the default run:
    ``make bench-real-layers`` runs the first two on Planetoid's Cora and Citeseer,
    beside ``DGL SAGEConv mean`` and ``DGL GINConv``, DGL's full-batch trainers of the
    same layers, and writes ``bench_real_layers.{md,json}``).
``ours GAT, GAT recipe``, ``DGL GATConv``
    The published GAT recipe (Veličković et al.) in our settings (:data:`GAT_RECIPE`:
    8 heads of 8 columns, one output head, dropout 0.6 on the features and the
    attention, lr 0.005, weight decay 5e-4, :data:`GAT_RECIPE_EPOCHS` epochs; ReLU
    where the recipe has ELU, which our layers lack), the same on every graph, and
    DGL's ``GATConv`` trained with it, early stopping included
    (:mod:`benchmarks.baselines.gat_recipe`). ``make bench-real-gat`` runs them on Cora
    and Citeseer and writes ``bench_real_gat.{md,json}``.

Runs go two at a time, one core each. Writes ``benchmarks/results/bench_real.{md,json}``.
``python -m benchmarks.bench_real [--seeds 0 1 ...] [--graphs cora ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

import yaml
from benchmarks import real_graphs
from benchmarks.baselines import dgl_recipes, gat_recipe, graphsaint, training
from benchmarks.common import RESULTS, write_results
from benchmarks.harness import one_core_pool
from dgl_scalegnn.config import config_from_mapping

__all__ = ["PAPER_MODEL", "GAT_RECIPE", "METHODS", "saint_grid", "main"]

_CORA_PAPER = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "yaml" / "cora-paper.yaml").read_text()
)
#: ``model`` and ``optim`` of the paper's model, as yaml/cora-paper.yaml gives them.
PAPER_MODEL: dict[str, dict[str, Any]] = {s: _CORA_PAPER[s] for s in ("model", "optim")}

#: Epochs of our GAT recipe: about those DGL's early stopping trains (its best
#: validation epoch, then its patience of 100).
GAT_RECIPE_EPOCHS = 300
#: The published GAT recipe in our settings (``model``, ``optim``, ``train``).
GAT_RECIPE: dict[str, dict[str, Any]] = {
    "model": {
        "conv": "gat",
        "hidden": 64,
        "gat_heads": 8,
        "dropout": 0.6,
        "input_dropout": 0.6,
        "gat_attn_dropout": 0.6,
    },
    "optim": {"lr": 0.005, "weight_decay": 5e-4},
    "train": {"epochs": GAT_RECIPE_EPOCHS},
}
#: Epochs DGL's GAT recipe may train before its early stopping ends it.
GAT_PEER_MAX_EPOCHS = 1000

#: The methods of ``make bench-real``.
METHODS = ("ours, defaults", "ours, paper model", "DGL GraphConv", "DGL SAGEConv", "GraphSAINT")
#: The other layer types and DGL's trainers of the same layers.
LAYER_METHODS = (
    "ours SAGE, defaults",
    "DGL SAGEConv mean",
    "ours GIN, defaults",
    "DGL GINConv",
    "ours GAT, defaults",
    "ours GAT, GAT recipe",
    "DGL GATConv",
)
#: The reference of the goal: the defaults reach its mean test accuracy minus this.
GOAL_POINTS = 1.0
#: The goals, ``(ours, reference)``: the first pair whose methods ran is the table's.
GOALS = (("ours, defaults", "DGL GraphConv"), ("ours GAT, GAT recipe", "DGL GATConv"))


def saint_grid(num_nodes: int) -> list[dict[str, Any]]:
    """GraphSAINT-node's settings to sweep on a graph of ``num_nodes`` vertices: budgets
    of a third and two thirds of the vertices, ``normalization`` ``"estimator"`` and
    ``"global"``; hidden 64, dropout 0.2, lr 0.01, weight decay 5e-4 (its best on Cora)."""
    return [
        {
            "budget": max(1, round(num_nodes * share)),
            "normalization": normalization,
            "hidden": 64,
            "dropout": 0.2,
            "lr": 0.01,
            "weight_decay": 5e-4,
        }
        for share in (1 / 3, 2 / 3)
        for normalization in ("estimator", "global")
    ]


def _ours(path: str, seed: int, extra: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``scalegnn train --data path`` (plus the keys of ``extra``'s sections) with seed
    ``seed``."""
    from dgl_scalegnn.train.run import run_training

    mapping: dict[str, dict[str, Any]] = {
        "data": {"name": "dgl", "path": path},
        "train": {"seed": seed, "progress": False},
        "sampling": {"seed": seed},
    }
    for section, values in extra.items():  # beside the seeds, not over them
        mapping[section] = {**mapping.get(section, {}), **values}
    with contextlib.redirect_stdout(io.StringIO()):
        summary = run_training(config_from_mapping(mapping))
    return {
        "val": summary["best_val_acc"],
        "test": summary["test_at_best_val"],
        "train_s": summary["train_s"],
    }


def _peer(
    method: training.Method,
    graph: str,
    settings: Mapping[str, Any],
    seed: int,
    norm: str | None = None,
    max_epochs: int = 200,
) -> dict[str, Any]:
    dataset = real_graphs.load(graph)
    if norm is not None:
        dataset = real_graphs.scaled(dataset, norm)
    result = method.train(dataset, settings, seed, max_epochs=max_epochs)
    return {
        "val": result["best_val_acc"],
        "test": result["test_at_best_val"],
        "train_s": result["history"][-1]["train_s"],
    }


def _saint(graph: str, settings: Mapping[str, Any], seed: int) -> dict[str, Any]:
    return _peer(graphsaint.PEER, graph, settings, seed, norm="row")


def _planned(method: str, graph: str, seed: int, file: str):
    """The function and arguments of one run of ``method`` (GraphSAINT's are chosen later)."""
    if method == "ours, defaults":
        return _ours, (file, seed, {})
    if method == "ours, paper model":
        return _ours, (file, seed, PAPER_MODEL)
    if method == "ours GAT, GAT recipe":
        return _ours, (file, seed, GAT_RECIPE)
    if method == "DGL GATConv":
        return _peer, (gat_recipe.GAT_RECIPE, graph, {}, seed, None, GAT_PEER_MAX_EPOCHS)
    layer_type = {
        "ours SAGE, defaults": "sage",
        "ours GIN, defaults": "gin",
        "ours GAT, defaults": "gat",
    }
    if method in layer_type:
        return _ours, (file, seed, {"model": {"conv": layer_type[method]}})
    recipe = {
        "DGL GraphConv": dgl_recipes.GRAPHCONV,
        "DGL SAGEConv": dgl_recipes.SAGECONV,
        "DGL SAGEConv mean": dgl_recipes.SAGECONV_MEAN,
        "DGL GINConv": dgl_recipes.GINCONV,
    }
    return _peer, (recipe[method], graph, {}, seed)


def _read_log(log: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The runs a previous invocation logged, by ``(graph, method, seed)``."""
    runs = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        key = (record.pop("graph"), record.pop("method"), record.pop("seed"))
        runs[key] = record
    return runs


def _summarise(runs: Mapping[tuple[str, str, int], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for (graph, method, _), result in sorted(runs.items()):
        table.setdefault(graph, {}).setdefault(method, []).append(result)
    return {
        graph: {
            method: {
                "seeds": len(results),
                **{
                    key: training.mean_std([r[key] for r in results])
                    for key in ("val", "test", "train_s")
                },
            }
            for method, results in methods.items()
        }
        for graph, methods in table.items()
    }


def _markdown(
    summary: Mapping[str, Any],
    saint: Mapping[str, Any],
    seeds: Sequence[int],
    time: str,
    methods_run: Sequence[str],
) -> str:
    ours, reference = next((pair for pair in GOALS if set(pair) <= set(methods_run)), GOALS[0])
    lines = [
        "# Real graphs: our defaults against DGL's recipes",
        "",
        f"`make bench-real` (`python -m benchmarks.bench_real`): seeds {seeds[0]}-{seeds[-1]}, "
        "test accuracy at the best validation epoch (mean ± std, %) and training seconds "
        "(evaluation excluded, one core each, two runs at a time on 2 cores). Goal: "
        f"{ours} reaches {reference}'s mean test accuracy minus {GOAL_POINTS:g} point.",
        "",
        "| graph | " + " | ".join(methods_run) + f" | {ours} − {reference} | goal |",
        "|---|" + "---|" * (len(methods_run) + 2),
    ]
    for graph, methods in summary.items():
        cells = [
            f"{100 * methods[m]['test']['mean']:.1f} ± {100 * methods[m]['test']['std']:.1f} "
            f"({methods[m]['train_s']['mean']:.1f} s)"
            + ("" if methods[m]["seeds"] == len(seeds) else f", {methods[m]['seeds']} seeds")
            if m in methods
            else "-"
            for m in methods_run
        ]
        if {ours, reference} <= set(methods):
            gap = 100 * (methods[ours]["test"]["mean"] - methods[reference]["test"]["mean"])
            goal = f"{gap:+.1f} | " + ("met" if gap >= -GOAL_POINTS else "**missed**")
        else:
            goal = "- | -"
        lines.append(f"| {graph} | " + " | ".join(cells) + f" | {goal} |")
    lines += [
        "",
        "Validation accuracy (mean, %):",
        "",
        "| graph | " + " | ".join(methods_run) + " |",
        "|---|" + "---|" * len(methods_run),
    ]
    for graph, methods in summary.items():
        lines.append(
            f"| {graph} | "
            + " | ".join(
                f"{100 * methods[m]['val']['mean']:.1f}" if m in methods else "-"
                for m in methods_run
            )
            + " |"
        )
    if saint:
        lines += [
            "",
            "GraphSAINT-node's settings (best mean validation of its sweep, seeds 0-2):",
            "",
        ]
        lines += [f"- {graph}: `{settings}`" for graph, settings in saint.items()]
    lines += ["", time]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--graphs", nargs="+", default=list(real_graphs.GRAPHS))
    parser.add_argument(
        "--methods", nargs="+", default=list(METHODS), choices=METHODS + LAYER_METHODS
    )
    parser.add_argument("--name", default="bench_real", help="results file name (no suffix)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="keep the runs already logged")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    log = RESULTS / f"{args.name}.jsonl.tmp"
    runs = _read_log(log) if args.resume else {}
    os.environ.setdefault("SCALEGNN_CACHE_DIR", tempfile.mkdtemp(prefix="scalegnn-cache-"))
    pool = one_core_pool(args.workers)
    saint: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-real-") as work,
        log.open("a" if args.resume else "w") as handle,
    ):

        def submit(key: tuple[str, str, int], fn, fargs) -> None:
            if key not in runs and key not in futures:
                futures[key] = pool.submit(fn, *fargs)

        def collect(key: tuple[str, str, int]) -> dict[str, Any]:
            if key not in runs:
                runs[key] = futures.pop(key).result()
                graph, method, seed = key
                handle.write(
                    json.dumps({"graph": graph, "method": method, "seed": seed, **runs[key]}) + "\n"
                )
                handle.flush()
                print(
                    f"{graph:14s} {method:20s} seed {seed}: val {runs[key]['val']:.4f} "
                    f"test {runs[key]['test']:.4f} ({runs[key]['train_s']:.1f} s)",
                    flush=True,
                )
            return runs[key]

        futures: dict[tuple[str, str, int], Future] = {}
        files = {g: str(real_graphs.save(g, Path(work) / f"{g}.bin")) for g in args.graphs}
        grids = {g: saint_grid(real_graphs.load(g).num_nodes) for g in args.graphs}
        try:
            if "GraphSAINT" in args.methods:
                for graph, grid in grids.items():
                    for index, settings in enumerate(grid):
                        for seed in args.seeds[:3]:
                            submit(
                                (graph, f"GraphSAINT sweep {index}", seed),
                                _saint,
                                (graph, settings, seed),
                            )
            for seed in args.seeds:  # seed by seed: a run cut short has every graph's first
                for graph in args.graphs:
                    for method in args.methods:
                        if method != "GraphSAINT":
                            submit(
                                (graph, method, seed), *_planned(method, graph, seed, files[graph])
                            )
            if "GraphSAINT" in args.methods:
                for graph, grid in grids.items():
                    val = [
                        np.mean(
                            [
                                collect((graph, f"GraphSAINT sweep {i}", s))["val"]
                                for s in args.seeds[:3]
                            ]
                        )
                        for i in range(len(grid))
                    ]
                    best = int(np.argmax(val))
                    saint[graph] = grid[best]
                    for seed in args.seeds:  # the sweep's seeds are runs of the same setting
                        swept = (graph, f"GraphSAINT sweep {best}", seed)
                        if swept in runs:
                            runs.setdefault((graph, "GraphSAINT", seed), runs[swept])
                        submit((graph, "GraphSAINT", seed), _saint, (graph, saint[graph], seed))
            for key in list(futures):
                collect(key)
        finally:
            pool.shutdown(cancel_futures=True)
    chosen = {
        key: result
        for key, result in runs.items()
        if key[0] in args.graphs and key[1] in args.methods and key[2] in args.seeds
    }
    summary = _summarise(chosen)
    minutes = (time.perf_counter() - start) / 60
    training_minutes = sum(result["train_s"] for result in runs.values()) / 60
    took = (
        f"{len(runs)} runs (GraphSAINT's sweep included), {training_minutes:.1f} minutes of "
        f"training in all, one core each; this invocation: {minutes:.1f} minutes on 2 cores"
        + (", resuming a log of earlier runs." if args.resume else ".")
    )
    write_results(
        args.name,
        {
            "seeds": args.seeds,
            "summary": summary,
            "graphsaint": saint,
            "paper_model": PAPER_MODEL,
            "minutes": minutes,
            "training_minutes": training_minutes,
            "runs": len(runs),
        },
    )
    text = _markdown(summary, saint, args.seeds, took, args.methods)
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
