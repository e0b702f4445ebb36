"""``make bench``: every benchmark in one run, and a markdown summary of the results.

Quick mode (the default) sizes everything to finish in under 20 minutes on 2 cores;
``--full`` (``make bench BENCH_ARGS=--full``) runs the full sizes. Results
(JSON and PNG) and ``summary.md`` go to ``benchmarks/results/``.

1. accuracy, time to target and evaluation time: dgl_scalegnn, GraphSAINT-node and
   GraphSAGE on Cora and on the synthetic graph, each with the best settings of a small
   sweep, 3 seeds, timed by the same loop;
2. scaling at 1, 2, 4, 8 processes, with DistDGL at the same counts;
3. the optimisation ablation on 2x2x2 (and 2x2x2x2 in full mode);
4. sampling against dgl.node_subgraph / SAINTSampler, and the local SpMM kernels;
5. the performance model's projection to the paper's GPU counts;
6. in full mode, the scale benchmark (``make bench-scale``: accuracy against training
   seconds at 1M vertices), whose epochs to target the projection uses.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks import (
    bench_optimizations,
    bench_projection,
    bench_sampling,
    bench_scale,
    bench_scaling,
    bench_spmm,
    scale_report,
)
from benchmarks.baselines import run_peers
from benchmarks.bench_scale import ScaleSettings
from benchmarks.common import RESULTS, write_results
from benchmarks.harness import full_mode


def _accuracy(quick: bool) -> dict[str, Any]:
    reports = {}
    for name in ("cora", "synthetic"):
        dataset = run_peers.load(name)
        # Cora is seconds per run: its shipped 200 epochs (the cosine horizon) also when quick
        epochs = (
            run_peers.EPOCHS[name]
            if not quick or name == "cora"
            else min(run_peers.EPOCHS[name], 60)
        )
        reports[name] = run_peers.measure(
            dataset, name, list(run_peers.METHODS), [0, 1, 2], epochs, quick=quick
        )
        print(run_peers._format(reports[name]), flush=True)
    write_results("bench_accuracy", reports)
    return reports


def _fmt(stat: dict, scale: float = 1.0, digits: int = 3) -> str:
    if stat["mean"] is None:
        return "not reached"
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def _table(title: str, headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["", f"## {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return out + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f}"


def _accuracy_rows(accuracy: dict) -> list[list[Any]]:
    rows = []
    for name, report in accuracy.items():
        for method, s in report["summary"].items():
            rows.append(
                [
                    f"{name} (target {report['target_acc']:.2f})",
                    method,
                    f"{_fmt(s['test_acc'], 100, 1)} %",
                    f"{_fmt(s['time_to_target_s'], 1, 2)} ({s['reached']})",
                    _fmt(s["eval_s_per_round"], 1, 4),
                    f"`{report['sweeps'][method]['best_settings']}`",
                ]
            )
    return rows


def _scaling_rows(scaling: dict) -> list[list[Any]]:
    rows = []
    for system, series in scaling.items():
        for row in series:
            sent = row.get("bytes_per_step")
            traffic = (
                "-"
                if sent is None
                else ", ".join(f"{k}: {v / 1e6:.2f} MB" for k, v in sent.items())
            )
            rows.append(
                [
                    row["processes"],
                    system,
                    f"{row['epoch_s']:.2f}",
                    _seconds(row["time_to_target_s"]),
                    f"{row['eval_s_per_round']:.3f}",
                    traffic or "0",
                ]
            )
    return rows


def _summary(results: dict[str, Any], minutes: float, quick: bool) -> str:
    lines = [
        "# Benchmark summary",
        "",
        f"Run time {minutes:.1f} min, {os.cpu_count()} cores; quick mode: {quick}.",
    ]
    lines += _table(
        "Accuracy and time to target (1 process each, same timing loop)",
        [
            "dataset",
            "system",
            "test accuracy, 3 seeds",
            "time to target, s",
            "eval per round, s",
            "best settings",
        ],
        _accuracy_rows(results["accuracy"]),
    )
    lines += ["", "Swept settings (the best mean validation accuracy is kept):", ""]
    lines += [f"- {m} on {d}: `{grid}`" for (m, d), grid in run_peers.GRIDS.items()]
    lines += _table(
        "Scaling here, and DistDGL at the same process counts (2 cores, oversubscribed from 4)",
        [
            "processes",
            "system",
            "epoch, s",
            "time to target, s",
            "eval per round, s",
            "bytes per step, rank 0",
        ],
        _scaling_rows(results["scaling"]),
    )
    lines += _table(
        "Optimisations, cumulative",
        ["grid", "variant", "epoch, s", "speedup"],
        [
            [grid, name, f"{r['epoch_s']:.2f}", f"{r['speedup_vs_baseline']:.2f}x"]
            for grid, variants in results["optimizations"].items()
            for name, r in variants.items()
        ],
    )
    lines += _table(
        "Sampling per step (median, ms)",
        [
            "B",
            "ours, whole graph",
            "ours, rank of 8 (L=1 / L=3)",
            "dgl.node_subgraph",
            "SAINTSampler",
            "ours / node_subgraph",
        ],
        [
            [
                f"{r['batch_fraction']:.0%}",
                f"{r['ours_whole'] * 1e3:.1f}",
                f"{r['ours_rank_of_8_L1'] * 1e3:.1f} / {r['ours_rank_of_8'] * 1e3:.1f}",
                f"{r['dgl_node_subgraph'] * 1e3:.1f}",
                f"{r['dgl_saint_node'] * 1e3:.1f}",
                f"{r['ratio_whole_vs_node_subgraph']:.2f}x",
            ]
            for r in results["sampling"]["rows"]
        ],
    )
    lines += _table(
        "Local SpMM, forward + backward (median, ms; build in the prefetch thread, not here)",
        [
            "block",
            "B",
            "torch CSR (default)",
            "copy_u_sum + scalings",
            "u_mul_e_sum",
            "default / u_mul_e_sum",
            "default build",
        ],
        [
            [
                r["block"],
                f"{r['batch_fraction']:.0%}",
                f"{r['torch-csr_s'] * 1e3:.2f}",
                f"{r['dgl-scaled_s'] * 1e3:.2f}",
                f"{r['dgl-weighted_s'] * 1e3:.2f}",
                f"{r['torch-csr_vs_weighted']:.2f}x",
                f"{r['torch-csr_build_s'] * 1e3:.2f}",
            ]
            for r in results["spmm"]["rows"]
        ],
    )
    lines += _table(
        "Projection to the paper's machines (performance model, see bench_projection.py)",
        [
            "dataset",
            "GPUs",
            "grid",
            "projected epoch, ms",
            "paper epoch, ms",
            "projected time to target, s",
            "paper time to target, s",
            "projected speedup",
            "paper",
        ],
        [
            [
                name,
                r["gpus"],
                r["grid"],
                f"{r['projected_epoch_s'] * 1e3:.1f}",
                _scaled(r["paper_epoch_s"], 1e3, 0),
                _scaled(r["projected_time_to_target_s"], 1, 2),
                _scaled(r["paper_time_to_target_s"], 1, 2),
                f"{r['projected_speedup']:.1f}x",
                r["paper"],
            ]
            for name, rows in results["projection"].items()
            for r in rows
        ],
    )
    lines += [
        "",
        "Projected time to target = epochs to target measured by `make bench-scale` (products-"
        "like graph, 1x2x2x2) x projected epoch time: "
        + _epochs_text(results.get("projection_epochs")),
    ]
    if results.get("scale") is not None:
        lines += ["", "#" + scale_report.markdown(results["scale"]).replace("\n#", "\n##")]
    elif (RESULTS / "bench_scale.md").exists():
        lines += [
            "",
            "## Scale benchmark",
            "",
            "See [bench_scale.md](bench_scale.md) (`make bench-scale`).",
        ]
    return "\n".join(lines) + "\n"


def _scaled(value: float | None, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _epochs_text(measured: dict | None) -> str:
    if measured is None:
        return "not measured (run `make bench-scale` first)."
    return (
        f"{measured['epochs']:.2f} epochs to {measured['target_acc']:.4f} validation accuracy "
        f"({measured['reached']} seeds, {measured['num_nodes']:,} vertices)."
    )


def main(argv: list[str] | None = None) -> None:
    quick = not full_mode(__doc__, argv)
    start = time.perf_counter()
    results = {
        "sampling": bench_sampling.main(quick),
        "spmm": bench_spmm.main(quick),
        "accuracy": _accuracy(quick),
        "scaling": bench_scaling.main(quick),
        "optimizations": bench_optimizations.main(quick),
        # full mode: the scale benchmark first, so that the projection uses its epochs
        "scale": None if quick else bench_scale.main(ScaleSettings(full=True)),
        "projection": bench_projection.main(),
        "projection_epochs": bench_projection.measured_epochs_to_target(),
    }
    minutes = (time.perf_counter() - start) / 60
    summary = _summary(results, minutes, quick)
    (RESULTS / "summary.md").write_text(summary)
    print(summary)
    print(f"wrote {RESULTS / 'summary.md'} ({minutes:.1f} min)")


if __name__ == "__main__":
    main()
