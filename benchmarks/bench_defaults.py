"""The sweep that chose the defaults for a user's graph, on validation accuracy only.

Every setting of :data:`SETTINGS` trains dgl_scalegnn (the real trainer, through
:mod:`benchmarks.ours`) full batch on every graph of :mod:`benchmarks.real_graphs`,
with a few seeds; each run reports the validation accuracy at its best validation epoch
(and the test accuracy there, which chooses nothing). A setting is scored over all the
graphs at once, never per graph: by its mean validation accuracy over the graphs and by
its mean rank among the settings (rank 1 is the best mean validation on that graph).

Each setting is one change from the first, DGL's standard GCN recipe run through the
engine (full batch, Kipf & Welling's GCN with biases, hidden 64, dropout 0.5 between the
layers, weight decay 5e-4, Adam at 0.01 constant, 200 epochs, rows scaled to sum 1 as
DGL's Planetoid classes scale them), then combinations of the changes that helped.

Run ``python -m benchmarks.bench_defaults [--seeds 0 1] [--settings NAME ...]``; two
runs at a time, one core each. Writes ``benchmarks/results/defaults_sweep.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks import ours, real_graphs
from benchmarks.common import RESULTS, write_results
from benchmarks.harness import one_core_pool

__all__ = ["RECIPE", "SETTINGS", "train_one", "score", "main"]

#: DGL's standard GCN recipe through the engine (the settings every other one changes).
RECIPE: dict[str, Any] = {
    "feature_norm": "row",
    "hidden": 64,
    "layers": 2,
    "dropout": 0.5,
    "input_dropout": 0.0,
    "norm": False,
    "residual": False,
    "input_projection": False,
    "head": False,
    "bias": True,
    "lr": 0.01,
    "weight_decay": 5e-4,
    "lr_schedule": "constant",
    "epochs": 200,
}

#: The paper's model as yaml/cora-paper.yaml shapes it (on top of the recipe).
PAPER = {
    "norm": True,
    "rms_eps": 1.0,
    "residual": True,
    "residual_from": "aggregated",
    "input_projection": True,
    "head": True,
}

SETTINGS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "features none": {"feature_norm": "none"},
    "features standardize": {"feature_norm": "standardize"},
    "hidden 128": {"hidden": 128},
    "input dropout 0.5": {"input_dropout": 0.5},
    "weight decay 5e-3": {"weight_decay": 5e-3},
    "no bias": {"bias": False},
    "lr 0.005 cosine": {"lr": 0.005, "lr_schedule": "cosine"},
    "lr 0.01 cosine": {"lr_schedule": "cosine"},
    "hidden 128, input dropout 0.5": {"hidden": 128, "input_dropout": 0.5},
    "hidden 128, input dropout 0.5, lr 0.01 cosine": {
        "hidden": 128,
        "input_dropout": 0.5,
        "lr_schedule": "cosine",
    },
    "paper model": PAPER,
    "paper model, cora-paper regularisation": {
        **PAPER,
        "hidden": 128,
        "dropout": 0.7,
        "input_dropout": 0.9,
        "weight_decay": 2e-3,
        "lr": 0.005,
        "lr_schedule": "cosine",
    },
}


def train_one(graph: str, settings: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """One full-batch run of dgl_scalegnn on ``graph`` with ``settings`` over :data:`RECIPE`."""
    merged = {**RECIPE, **settings}
    dataset = real_graphs.scaled(real_graphs.load(graph), merged.pop("feature_norm"))
    merged["batch_size"] = dataset.num_nodes
    start = time.perf_counter()
    result = ours.PEER.train(dataset, merged, seed, max_epochs=merged["epochs"])
    return {
        "graph": graph,
        "seed": seed,
        "val": result["best_val_acc"],
        "test": result["test_at_best_val"],
        "train_s": result["history"][-1]["train_s"],
        "wall_s": time.perf_counter() - start,
    }


def score(runs: Mapping[str, list[dict[str, Any]]], graphs: Sequence[str]) -> list[dict[str, Any]]:
    """Per setting: mean validation and test per graph, their means over the graphs and the
    mean rank of the validation (rank 1 best; ties share the lower rank)."""
    table = {}
    for name, results in runs.items():
        per_graph = {}
        for graph in graphs:
            mine = [r for r in results if r["graph"] == graph]
            per_graph[graph] = {
                "val": float(np.mean([r["val"] for r in mine])),
                "test": float(np.mean([r["test"] for r in mine])),
            }
        table[name] = per_graph
    ranks = {name: [] for name in table}
    for graph in graphs:
        values = {name: table[name][graph]["val"] for name in table}
        for name, value in values.items():
            ranks[name].append(1 + sum(other > value + 1e-12 for other in values.values()))
    rows = [
        {
            "setting": name,
            "per_graph": table[name],
            "mean_val": float(np.mean([table[name][g]["val"] for g in graphs])),
            "mean_test": float(np.mean([table[name][g]["test"] for g in graphs])),
            "mean_rank": float(np.mean(ranks[name])),
        }
        for name in table
    ]
    return sorted(rows, key=lambda row: -row["mean_val"])


def _markdown(rows: list[dict[str, Any]], graphs: Sequence[str], seeds: Sequence[int]) -> str:
    lines = [
        "# Defaults sweep: validation accuracy over every real graph",
        "",
        f"`python -m benchmarks.bench_defaults` (seeds {', '.join(map(str, seeds))}; full batch;",
        "each setting is one change from DGL's GCN recipe through the engine, see the",
        "module docstring). Cells: mean validation accuracy at the best validation epoch,",
        "% (test accuracy there in brackets: it chooses nothing). Sorted by the mean",
        "validation accuracy over the graphs.",
        "",
        "| setting | mean val | mean rank | mean test | " + " | ".join(graphs) + " |",
        "|---|---|---|---|" + "---|" * len(graphs),
    ]
    for row in rows:
        cells = [
            f"{100 * row['per_graph'][g]['val']:.1f} ({100 * row['per_graph'][g]['test']:.1f})"
            for g in graphs
        ]
        lines.append(
            f"| {row['setting']} | {100 * row['mean_val']:.2f} | {row['mean_rank']:.2f} | "
            f"{100 * row['mean_test']:.2f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--graphs", nargs="+", default=list(real_graphs.GRAPHS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--resume", action="store_true", help="keep the runs of the last sweep's log"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.settings}
    log = RESULTS / "defaults_sweep.jsonl.tmp"
    done = set()
    if args.resume and log.exists():
        for line in log.read_text().splitlines():
            record = json.loads(line)
            name = record.pop("setting")
            if name in runs:
                runs[name].append(record)
                done.add((name, record["graph"], record["seed"]))
    jobs = [
        (name, graph, seed)
        for graph in args.graphs  # the large graphs first: the pool ends on small runs
        for name in args.settings
        for seed in args.seeds
        if (name, graph, seed) not in done
    ]
    pool = one_core_pool(args.workers)
    try:
        futures = {job: pool.submit(train_one, job[1], SETTINGS[job[0]], job[2]) for job in jobs}
        with log.open("a" if args.resume else "w") as handle:
            for (name, graph, seed), future in futures.items():
                result = future.result()
                runs[name].append(result)
                handle.write(json.dumps({"setting": name, **result}) + "\n")
                handle.flush()
                print(
                    f"{name:40s} {graph:14s} seed {seed}: val {result['val']:.4f} "
                    f"test {result['test']:.4f} ({result['wall_s']:.1f} s)",
                    flush=True,
                )
    finally:
        pool.shutdown(cancel_futures=True)
    rows = score(runs, args.graphs)
    minutes = (time.perf_counter() - start) / 60
    write_results(
        "defaults_sweep",
        {
            "seeds": args.seeds,
            "recipe": RECIPE,
            "settings": {n: SETTINGS[n] for n in args.settings},
            "rows": rows,
            "runs": runs,
            "minutes": minutes,
        },
    )
    text = _markdown(rows, args.graphs, args.seeds)
    (RESULTS / "defaults_sweep.md").write_text(text + f"\n{minutes:.1f} minutes on 2 cores.\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
