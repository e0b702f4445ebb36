"""Tables, ratios and plots of :mod:`benchmarks.bench_scale` (all computed within one run).

:func:`analyse` turns one graph's runs into the figures of the report: targets at 95%
and 99% of the best validation accuracy any method reached (time to target is read on
it, :mod:`benchmarks.harness`); per method the final accuracy,
time and steps to each target, seconds per step, evaluation per round and peak memory
per rank; and the ratios the paper claims. :func:`write` renders
``bench_scale.md`` and one PNG per graph (validation accuracy against training seconds).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.baselines.training import mean_std
from benchmarks.common import pyplot
from benchmarks.harness import TARGET_METRIC, first_at_target

__all__ = ["TARGET_FRACTIONS", "best_accuracy", "analyse", "markdown", "write"]

#: Targets, as fractions of the best validation accuracy of any method.
TARGET_FRACTIONS = (0.95, 0.99)
#: The paper: at least this much faster to target than the fastest peer ...
PAPER_SPEEDUP = 1.4
#: ... and at least this much faster evaluation than neighbour-sampled evaluation.
PAPER_EVAL_SPEEDUP = 20.0


def best_accuracy(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> float:
    """The best :data:`~benchmarks.harness.TARGET_METRIC` any method reached, each
    method's runs averaged over their seeds: what the targets are fractions of.

    >>> best_accuracy({"a": [{"history": [{"val_acc": 0.7}, {"val_acc": 0.8}]}]})
    0.8
    """
    return max(
        statistics.fmean(max(record[TARGET_METRIC] for record in run["history"]) for run in method)
        for method in runs.values()
    )


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _method_figures(runs: Sequence[Mapping[str, Any]], targets: Mapping[str, float]) -> dict:
    to_target = {}
    for label, target in targets.items():
        hits = [first_at_target(run["history"], target) for run in runs]
        reached = [hit for hit in hits if hit is not None]
        to_target[label] = {
            "seconds": _mean([hit["train_s"] for hit in reached]),
            "steps": _mean([hit["step"] for hit in reached]),
            "epochs": _mean([hit["epoch"] for hit in reached]),
            "reached": f"{len(reached)}/{len(runs)}",
        }
    ranks = max(len(run["max_rss_mb"]) for run in runs)
    peak = [max(run["max_rss_mb"][rank] for run in runs) for rank in range(ranks)]
    sampled = [run["sampled_eval_s"] for run in runs if "sampled_eval_s" in run]
    losses = [run["history"][-1].get("train_loss") for run in runs]
    return {
        "test_acc": mean_std([run["test_at_best_val"] for run in runs]),
        "final_test_acc": mean_std([run["history"][-1]["test_acc"] for run in runs]),
        "final_train_loss": _mean([loss for loss in losses if loss is not None]),
        "train_s": _mean([run["history"][-1]["train_s"] for run in runs]),
        "steps": _mean([run["history"][-1]["step"] for run in runs]),
        "step_s": _mean([run["step_s"] for run in runs]),
        "eval_s_per_round": _mean([run["eval_s_per_round"] for run in runs]),
        "first_eval_s": _mean([run["history"][0]["eval_s"] for run in runs]),
        "sampled_eval_s": _mean(sampled),
        "setup_s": _mean([run["setup_s"] for run in runs if "setup_s" in run]),
        "first_step_s": _mean([run["first_step_s"] for run in runs if "first_step_s" in run]),
        "max_rss_mb": peak,
        "to_target": to_target,
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def analyse(report: Mapping[str, Any]) -> dict[str, Any]:
    """Targets, per-method figures and ratios of one graph's runs."""
    runs = report["runs"]
    best = best_accuracy(runs)
    targets = {f"{f:.0%}": f * best for f in TARGET_FRACTIONS}
    figures = {
        method: _method_figures(method_runs, targets) for method, method_runs in runs.items()
    }
    methods = list(runs)
    ours_1, ours_8 = methods[0], methods[1]
    peers_1, peer_8 = methods[2:5], methods[5]
    speedups = {}
    for label in targets:
        seconds = {m: figures[m]["to_target"][label]["seconds"] for m in methods}
        reached_1 = [m for m in peers_1 if seconds[m] is not None]
        fastest_1 = min(reached_1, key=lambda m: seconds[m]) if reached_1 else None
        peer_1_s = seconds[fastest_1] if fastest_1 else None
        speedups[label] = {
            "1 process": {
                "fastest_peer": fastest_1,
                "ratio": _ratio(peer_1_s, seconds[ours_1]),
                "peer_s": peer_1_s,
                "ours_s": seconds[ours_1],
            },
            "8 processes": {
                "fastest_peer": peer_8,
                "ratio": _ratio(seconds[peer_8], seconds[ours_8]),
                "peer_s": seconds[peer_8],
                "ours_s": seconds[ours_8],
            },
        }
    # dgl_scalegnn's other layer types against DGL's trainer of the same layer (one
    # process each): GraphSAGE's, or the report's pairs
    same_layer = report.get("same_layer") or {m: methods[4] for m in methods[6:]}
    layer_types = {
        method: {
            "peer": peer,
            **{
                label: {
                    "ratio": _ratio(seconds[peer], seconds[method]),
                    "peer_s": seconds[peer],
                    "ours_s": seconds[method],
                }
                for label, seconds in (
                    (label, {m: figures[m]["to_target"][label]["seconds"] for m in methods})
                    for label in targets
                )
            },
        }
        for method, peer in same_layer.items()
        if method in runs and peer in runs
    }
    sage = figures[methods[4]]
    ours_eval = figures[ours_1]["eval_s_per_round"]
    evaluation = {
        "layer-wise full-neighbour (GraphSAGE) / ours": _ratio(sage["eval_s_per_round"], ours_eval),
        "neighbour-sampled (GraphSAGE) / ours": _ratio(sage["sampled_eval_s"], ours_eval),
        "DistDGL layer-wise, 8 trainers / ours 1x2x2x2": _ratio(
            figures[peer_8]["eval_s_per_round"], figures[ours_8]["eval_s_per_round"]
        ),
    }
    return {
        "best_val_acc": best,
        "targets": targets,
        "methods": figures,
        "speedup_to_target": speedups,
        "layer_types_vs_dgl": layer_types,
        "eval_speedup": evaluation,
    }


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _ratio_text(value: float | None, claim: float) -> str:
    if value is None:
        return "not reached"
    verdict = "meets" if value >= claim else ("slower" if value < 1 else "below")
    return f"{value:.2f}x ({verdict}; paper >= {claim:g}x)"


def _speedup_text(entry: Mapping[str, Any]) -> str:
    """The time-to-target ratio, or who reached the target when not both did."""
    if entry["ratio"] is not None:
        return _ratio_text(entry["ratio"], PAPER_SPEEDUP)
    if entry["ours_s"] is not None:
        return f"only dgl_scalegnn reached it ({entry['ours_s']:.1f} s)"
    if entry["peer_s"] is not None:
        return f"dgl_scalegnn did not reach it (peer {entry['peer_s']:.1f} s)"
    return "neither reached it"


def _memory(peaks: Sequence[float]) -> str:
    if len(peaks) == 1:
        return f"{peaks[0]:.0f}"
    return f"max {max(peaks):.0f} ({len(peaks)} ranks, sum {sum(peaks):.0f})"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return out + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def markdown(payload: Mapping[str, Any]) -> str:
    """``bench_scale.md``: per graph the main table, the ratios and the sweeps."""
    plan = payload["plan"]
    lines = [
        "# Scale benchmark: test accuracy against training seconds",
        "",
        f"{plan['num_nodes']:,} vertices per graph, B = {plan['batch_size']:,} unless "
        "dgl_scalegnn's sweep chose another (final settings below each table); "
        f"{plan['budget_s']:.0f} s of training per run (evaluation excluded), seeds "
        f"{list(plan['seeds'])}; quick mode: {plan.get('quick')}; run time "
        f"{payload['minutes']:.1f} min. Made by `make bench-scale` (benchmarks/bench_scale.py).",
    ]
    for name, report in payload["graphs"].items():
        analysis = payload["analysis"][name]
        targets = analysis["targets"]
        lines += ["", f"## {name} ({report['config']})", ""]
        lines += [
            f"Best validation accuracy {analysis['best_val_acc']:.4f}; targets "
            + ", ".join(f"{label}: {value:.4f}" for label, value in targets.items())
            + f". Set-up: {report['setup_s']}. Plot: bench_scale_{name}.png.",
            "",
        ]
        reused = report.get("reused", {}).get("methods", [])
        if reused:
            lines += [
                f"Rows marked (earlier run) are {report['reused']['from']}'s, not run here "
                "(`--reuse`): their times were measured in that run.",
                "",
            ]
        headers = ["method", "procs", "test acc", "train loss", "steps", "s/step"]
        for label in targets:
            headers += [f"to {label}: s (steps)"]
        headers += ["eval/round, s (first)", "peak RSS/rank, MB"]
        rows = []
        for method, fig in analysis["methods"].items():
            row = [
                f"{method} (earlier run)" if method in reused else method,
                len(fig["max_rss_mb"]),
                f"{fig['test_acc']['mean']:.4f} ± {fig['test_acc']['std']:.4f}",
                _num(fig.get("final_train_loss"), 3),
                _num(fig["steps"], 0),
                _num(fig["step_s"], 3),
            ]
            for label in targets:
                hit = fig["to_target"][label]
                row.append(
                    "not reached"
                    if hit["seconds"] is None
                    else f"{hit['seconds']:.1f} ({hit['steps']:.0f}; {hit['reached']})"
                )
            row += [
                f"{_num(fig['eval_s_per_round'])} ({_num(fig['first_eval_s'])})",
                _memory(fig["max_rss_mb"]),
            ]
            rows.append(row)
        lines += _table(headers, rows)
        lines += ["", "Final settings:", ""]
        lines += [
            f"- {method}: `{runs[0].get('settings', {})}`"
            for method, runs in report["runs"].items()
            if runs
        ]
        warmups = [
            f"{method}: {fig['first_step_s']:.2f} s"
            for method, fig in analysis["methods"].items()
            if fig["first_step_s"] is not None
        ]
        if warmups:
            lines += [
                "",
                "First step of dgl_scalegnn (one-off warm-up, included in its training time): "
                + "; ".join(warmups)
                + ".",
            ]
        lines += ["", "Time to target, fastest peer / dgl_scalegnn at the same process count:", ""]
        ratio_rows = [
            [label, procs, entry["fastest_peer"] or "-", _speedup_text(entry)]
            for label, by_procs in analysis["speedup_to_target"].items()
            for procs, entry in by_procs.items()
        ]
        lines += _table(["target", "processes", "fastest peer", "ratio"], ratio_rows)
        layer_rows = [
            [
                method,
                by_target["peer"],
                label,
                f"{analysis['methods'][method]['test_acc']['mean']:.4f} / "
                f"{analysis['methods'][by_target['peer']]['test_acc']['mean']:.4f}",
                _speedup_text(entry),
            ]
            for method, by_target in analysis.get("layer_types_vs_dgl", {}).items()
            for label, entry in by_target.items()
            if label != "peer"
        ]
        if layer_rows:
            lines += [
                "",
                "dgl_scalegnn's layer types against DGL's trainer of the same layer: test "
                "accuracy and time to target, DGL's / ours:",
                "",
            ]
            headers = ["dgl_scalegnn", "DGL's trainer", "target", "test acc, ours / DGL's"]
            lines += _table([*headers, "ratio"], layer_rows)
        lines += ["", "Evaluation per round, other / dgl_scalegnn:", ""]
        eval_rows = [
            [what, _ratio_text(value, PAPER_EVAL_SPEEDUP if "sampled" in what else 1.0)]
            for what, value in analysis["eval_speedup"].items()
        ]
        lines += _table(["comparison", "ratio"], eval_rows)
        lines += ["", "Sweeps (short budget; best validation accuracy kept):", ""]
        for method, rows_ in report["sweeps"].items():
            for row in rows_:
                result = row["result"]
                lines.append(
                    f"- {method}: `{row['settings']}`: val {result['best_val_acc']:.4f}, "
                    f"test {result['test_at_best_val']:.4f}, {result['step_s']:.3f} s/step"
                )
    return "\n".join(lines) + "\n"


def write(payload: Mapping[str, Any], results_path: Path) -> None:
    """Write ``bench_scale.md`` and the PNGs beside ``results_path``."""
    (results_path.parent / "bench_scale.md").write_text(markdown(payload))
    plt = pyplot()
    for name, report in payload["graphs"].items():
        figure, axis = plt.subplots(figsize=(7, 4.5))
        for index, (method, runs) in enumerate(report["runs"].items()):
            for seed_index, run in enumerate(runs):
                history = run["history"]
                axis.plot(
                    [r["train_s"] for r in history],
                    [r[TARGET_METRIC] for r in history],
                    "o-" if "scalegnn" in method else "s--",
                    color=f"C{index}",
                    alpha=1.0 if seed_index == 0 else 0.4,
                    markersize=3,
                    label=method if seed_index == 0 else None,
                )
        axis.set_xscale("log")
        for label, target in payload["analysis"][name]["targets"].items():
            axis.axhline(target, color="grey", linewidth=0.6, linestyle=":")
            axis.annotate(
                f"{label} of best",
                (0.0, target),
                xycoords=("axes fraction", "data"),
                fontsize=7,
                va="bottom",
            )
        axis.set_xlabel("training seconds (evaluation excluded)")
        axis.set_ylabel("validation accuracy")
        axis.set_title(f"{name}, {report['num_nodes']:,} vertices")
        axis.legend(fontsize=7)
        figure.tight_layout()
        png = results_path.with_name(f"bench_scale_{name}.png")
        figure.savefig(png, dpi=120)
        plt.close(figure)
        print(f"wrote {png}", flush=True)
