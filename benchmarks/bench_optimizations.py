"""The paper's optimisation ablation on this machine: epoch time and its breakdown as
prefetching, BF16 communication, kernel fusion and communication overlap are added
cumulatively, on a 2x2x2 grid (8 processes) and, in full mode, a 2x2x2x2 grid (16).

Each grid is one ``mpirun`` job (the real launcher); every variant runs in the same
processes after warm-up steps, and rank 0's per-component timers give the breakdown.
Sampling counts towards the step only when it is not prefetched (then the wait for the
prefetched batch counts instead). Results: ``results/bench_optimizations.json`` and a
stacked-bar PNG. The 2 cores here are oversubscribed 4-8x, so communication waits are
inflated against a GPU cluster; the cumulative ratios are what to read.

Run: ``python -m benchmarks.bench_optimizations`` (``--full`` for the full sizes).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.common import pyplot, save_plot, write_results
from benchmarks.harness import full_mode, mpirun, run_process
from dgl_scalegnn.profiling import COMPONENTS

VARIANTS = [
    ("baseline", {"parallel": {"fuse": False}}),  # fuse: auto would compile on a GPU
    ("+prefetch", {"sampling": {"prefetch": True}}),
    ("+bf16 comm", {"parallel": {"bf16_comm": True}}),
    ("+fusion", {"parallel": {"fuse": True}}),
    ("+overlap", {"parallel": {"overlap": True}}),
]


def _config(num_nodes: int, grid: str) -> dict:
    return {
        "data": {"name": "synthetic", "synthetic": {"num_nodes": num_nodes, "num_features": 64}},
        "model": {"hidden": 128, "layers": 3, "dropout": 0.2},
        "sampling": {"batch_size": num_nodes // 10},
        "train": {"epochs": 1000, "eval_every": 1000, "progress": False},
        "parallel": {"grid": grid},
    }


def worker(config_path: str, out_path: str, steps: int, warmup: int) -> None:
    """One mpirun rank: every variant, cumulatively, in this process."""
    from dgl_scalegnn.config import config_from_mapping
    from dgl_scalegnn.data.prepared import prepare_in_memory
    from dgl_scalegnn.data.synthetic import generate
    from dgl_scalegnn.distributed.comm import CommOptions
    from dgl_scalegnn.train.metrics import MetricsWriter
    from dgl_scalegnn.train.run import end_session, start_session
    from dgl_scalegnn.train.trainer import Trainer

    base = json.loads(Path(config_path).read_text())
    session = start_session(config_from_mapping(base).parallel)
    results = {}
    try:
        graph = prepare_in_memory(generate(config_from_mapping(base).data.synthetic), 0)
        mapping = json.loads(json.dumps(base))
        for name, overrides in VARIANTS:
            for section, values in overrides.items():
                mapping[section].update(values)
            mapping["train"]["max_steps"] = warmup + steps
            cfg = config_from_mapping(mapping)
            options = CommOptions(bf16=cfg.parallel.bf16_comm, overlap=cfg.parallel.overlap)
            runtime = dataclasses.replace(session.runtime, options=options)
            metrics = MetricsWriter(None, enabled=True)
            trainer = Trainer(cfg, graph, runtime, metrics)
            trainer.fit()
            measured = [e for e in metrics.events if e["event"] == "step"][warmup:]
            results[name] = {
                "step_s": sum(e["step_s"] for e in measured) / len(measured),
                "seconds": {
                    c: sum(e["seconds"].get(c, 0.0) for e in measured) / len(measured)
                    for c in COMPONENTS
                },
                "prefetch": cfg.sampling.prefetch,
                "steps_per_epoch": trainer.steps_per_epoch,
                "loss": measured[-1]["loss"],
            }
        if session.runtime.grid.rank == 0:
            Path(out_path).write_text(json.dumps(results))
    finally:
        end_session(session)


def _breakdown(result: dict) -> dict[str, float]:
    """Per-step seconds on the critical path, ``other`` being what the timers miss."""
    parts = {
        c: v for c, v in result["seconds"].items() if not (c == "sampling" and result["prefetch"])
    }
    parts["other"] = max(0.0, result["step_s"] - sum(parts.values()))
    return parts


def _run_grid(grid: str, processes: int, num_nodes: int, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch, "config.json")
        config.write_text(json.dumps(_config(num_nodes, grid)))
        out = Path(scratch, "out.json")
        command = [*mpirun(processes), sys.executable, "-m", "benchmarks.bench_optimizations"]
        command += ["--worker", str(config), str(out), str(steps), str(warmup)]
        seconds = run_process(command, Path(scratch, "mpirun.log"), 1, 3600)
        print(f"{grid}: {seconds:.0f} s", flush=True)
        return json.loads(out.read_text())


def main(quick: bool = True) -> dict:
    num_nodes, steps, warmup = (30_000, 6, 2) if quick else (200_000, 10, 3)
    grids = {"1x2x2x2": 8} if quick else {"1x2x2x2": 8, "2x2x2x2": 16}
    report = {}
    for grid, processes in grids.items():
        results = _run_grid(grid, processes, num_nodes, steps, warmup)
        baseline = results["baseline"]["step_s"]
        for name, result in results.items():
            result["epoch_s"] = result["step_s"] * result["steps_per_epoch"]
            result["speedup_vs_baseline"] = baseline / result["step_s"]
            result["breakdown"] = _breakdown(result)
            print(
                f"  {grid} {name:>12}: {result['epoch_s']:7.2f} s/epoch, "
                f"{result['speedup_vs_baseline']:.2f}x cumulative",
                flush=True,
            )
        report[grid] = results
    path = write_results(
        "bench_optimizations", {"num_nodes": num_nodes, "quick": quick, "grids": report}
    )
    _plot(report, path)
    return report


def _plot(report: dict, results_path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(1, len(report), figsize=(6 * len(report), 4.5), squeeze=False)
    for axis, (grid, results) in zip(axes[0], report.items()):
        names = list(results)
        bottom = [0.0] * len(names)
        for component in (*COMPONENTS, "other"):
            heights = [
                results[n]["breakdown"].get(component, 0.0) * results[n]["steps_per_epoch"]
                for n in names
            ]
            axis.bar(names, heights, bottom=bottom, label=component)
            bottom = [b + h for b, h in zip(bottom, heights)]
        axis.set_title(f"grid {grid}")
        axis.set_ylabel("epoch time, s")
        axis.tick_params(axis="x", rotation=20)
    axes[0][-1].legend(fontsize=7)
    save_plot(figure, results_path)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main(not full_mode(__doc__))
