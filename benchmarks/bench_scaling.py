"""Scaling on this machine, and DistDGL at the same process counts.

On the synthetic graph, for 1, 2, 4 and 8 processes:

- dgl_scalegnn (:func:`benchmarks.methods.run_ours`, ranks through ``mpirun``) on the
  grids 1x1x1x1, 1x1x1x2, 1x1x2x2 and 1x2x2x2: epoch time, per-rank bytes per step (by
  group kind), training time to the target validation accuracy (the time to target of
  :mod:`benchmarks.harness`; training stops there) and evaluation time per round;
- DistDGL (DGL's own distributed GraphSAGE, servers and trainers on loopback,
  :mod:`benchmarks.baselines.distdgl`) on the same graph: time to the same target and
  its (neighbour-sampled) evaluation time per round.

The machine has 2 cores: from 4 processes on, every run is oversubscribed, so these
figures show overheads, not the speedups of a GPU cluster. ``python -m
benchmarks.bench_scaling [--full]``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from benchmarks.common import pyplot, save_plot, write_results
from benchmarks.graphs import Graph
from benchmarks.harness import first_at_target, full_mode
from benchmarks.methods import run_ours
from dgl_scalegnn.config import SyntheticConfig
from dgl_scalegnn.data.synthetic import generate

GRIDS = {1: "1x1x1x1", 2: "1x1x1x2", 4: "1x1x2x2", 8: "1x2x2x2"}


def ours(num_nodes: int, processes: int, target: float, max_epochs: int) -> dict:
    """One ``scalegnn train`` on ``processes`` ranks, stopping at the target."""
    config = {
        "data": {"name": "synthetic", "synthetic": {"num_nodes": num_nodes}},
        # the best settings of the accuracy sweep (benchmarks/baselines/run_peers.py)
        "model": {"hidden": 64, "layers": 2, "dropout": 0.2, "norm": False, "residual": False},
        "sampling": {"prefetch": True},
        "train": {"epochs": max_epochs, "eval_every": 1, "target_acc": target},
        "optim": {"lr": 0.01},
    }
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch, "config.yaml")
        path.write_text(yaml.safe_dump(config))
        graph = Graph("synthetic", str(path), SyntheticConfig.num_classes, num_nodes)
        settings = {"sampling.batch_size": num_nodes // 2}
        result = run_ours(graph, settings, Path(scratch), 3600, GRIDS[processes])
    reached = first_at_target(result["history"], target)
    return {
        "processes": processes,
        "grid": GRIDS[processes],
        "time_to_target_s": None if reached is None else reached["train_s"],
        "epochs": result["epochs"],
        "epoch_s": result["step_s"] * result["steps"] / max(result["epochs"], 1),
        "eval_s_per_round": result["eval_s_per_round"],
        "bytes_per_step": result["bytes_per_step"],
        "best_test_acc": max(record["test_acc"] for record in result["history"]),
    }


def distdgl(num_nodes: int, processes: int, target: float, max_epochs: int) -> dict:
    """DistDGL GraphSAGE at ``processes`` trainers on the same synthetic graph."""
    from benchmarks.baselines import distdgl as peer

    dataset = generate(SyntheticConfig(num_nodes=num_nodes))
    config = peer.LaunchConfig(target_acc=target, max_epochs=max_epochs, stop_at_target=True)
    result = peer.run(dataset, processes, config)
    last = result["history"][-1]
    return {
        "processes": processes,
        "time_to_target_s": result["time_to_target_s"],
        "epochs": last["epoch"],
        "epoch_s": last["train_s"] / last["epoch"],
        "eval_s_per_round": result["eval_s_per_round"],
        "best_test_acc": max(h["test_acc"] for h in result["history"]),
    }


def main(quick: bool = True) -> dict:
    num_nodes, target, max_epochs = (20_000, 0.80, 10) if quick else (50_000, 0.87, 15)
    counts = (1, 2, 4, 8)
    rows = {"dgl_scalegnn": [], "distdgl": []}
    for processes in counts:
        rows["dgl_scalegnn"].append(ours(num_nodes, processes, target, max_epochs))
        rows["distdgl"].append(distdgl(num_nodes, processes, target, max_epochs))
        for system in rows:
            row = rows[system][-1]
            reached = row["time_to_target_s"]
            print(
                f"{system:>12} P={processes}: {row['epoch_s']:.2f} s/epoch, time to {target:.2f}: "
                f"{'not reached' if reached is None else f'{reached:.2f} s'}, "
                f"eval {row['eval_s_per_round']:.3f} s/round",
                flush=True,
            )
    path = write_results(
        "bench_scaling",
        {"num_nodes": num_nodes, "target_acc": target, "quick": quick, "rows": rows},
    )
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for system, series in rows.items():
        left.plot(counts, [r["epoch_s"] for r in series], "o-", label=system)
        right.plot(
            counts, [r["time_to_target_s"] or float("nan") for r in series], "o-", label=system
        )
    left.set_ylabel("epoch time, s")
    right.set_ylabel(f"training time to {target:.2f} validation accuracy, s")
    for axis in (left, right):
        axis.set_xlabel("processes (2 cores)")
        axis.set_xscale("log", base=2)
        axis.legend()
    save_plot(figure, path)
    return rows


if __name__ == "__main__":
    main(not full_mode(__doc__))
