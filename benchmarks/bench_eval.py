"""``make bench-eval``: full-graph evaluation against DGL's plain full-graph forward, on
the forward's own model and on ours.

DGL's forward (two ``SAGEConv`` mean calls over the whole graph, hidden 128: what a
user with enough memory runs to evaluate; :func:`benchmarks.methods.run_forward`)
is set beside, each in its own process on one core pair, timed :data:`ROUNDS` times with
its peak resident memory (imports included):

``dgl_scalegnn, the forward's model``
    our layer-wise evaluation in row chunks of the same model (:data:`FORWARD_MODEL`:
    ``model.conv sage``, two layers, hidden 128, biases; no input projection, norm,
    residual or head), untrained weights, one process. It separates the engine from the
    model: ``make bench-growth`` compares the forward with our preset's model, which does
    about twice its arithmetic;
``dgl_scalegnn, preset model``
    the same evaluation of the preset's model (``yaml/synthetic-1m.yaml``,
    ``yaml/products-like-1m.yaml``), as ``make bench-growth`` runs it.

The fastest round is reported (DGL's first builds the graph's sparse formats; ours
touches fresh pages; and every round's fresh whole-graph buffers cost what the kernel
takes to find them huge pages, which varied 0.05-0.6 s a round for one 512 MB buffer
here), for every method alike. Graphs: the presets of
:mod:`benchmarks.scale_presets`, generated and prepared once as ``make bench-growth``
does (:func:`benchmarks.graphs.setup_graph`).

Settings: :class:`EvalSettings` (``--help``; ``make bench-eval BENCH_ARGS="..."``).
Outputs: ``benchmarks/results/bench_eval.json`` and ``bench_eval.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, write_results
from benchmarks.graphs import Graph, Size, parse_sizes, setup_graph
from benchmarks.harness import BenchError, argument, parse_args, work_dir
from benchmarks.methods import run_forward, run_our_evaluation

__all__ = ["EvalSettings", "FORWARD_MODEL", "main"]

DEFAULT_SIZES = "sparse=1000000,3000000;products-like=1000000"
#: DGL's forward as our model: ``SAGEConv(in, 128, 'mean')``, ReLU, ``SAGEConv(128,
#: classes, 'mean')``, both with their bias.
FORWARD_MODEL = {
    "model.conv": "sage",
    "model.layers": 2,
    "model.hidden": 128,
    "model.input_projection": "false",
    "model.head": "false",
    "model.norm": "false",
    "model.residual": "false",
    "model.final_norm": "false",
    "model.bias": "true",
    "model.dropout": 0,
}
#: Rounds of each method: on 2 noisy cores the fastest of three moved by up to 10% from
#: one run to the next (ours at sparse 1M: 0.68-0.72 s).
ROUNDS = 5
METHODS = (
    "DGL full-graph forward",
    "dgl_scalegnn, the forward's model",
    "dgl_scalegnn, preset model",
)


@dataclass(frozen=True)
class EvalSettings:
    """What ``make bench-eval`` runs (its command line; the module docstring)."""

    sizes: tuple[Size, ...] = parse_sizes(DEFAULT_SIZES)
    work: Path | None = None

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> EvalSettings:
        parser = argparse.ArgumentParser(prog="bench_eval", description=__doc__.split("\n")[0])
        parser.add_argument(
            "--sizes",
            type=argument(parse_sizes),
            default=cls.sizes,
            help=f"preset=N,N;preset=N (default {DEFAULT_SIZES})",
        )
        parser.add_argument("--work", type=Path, help="keep the graphs here (bench-growth's do)")
        args = parse_args(parser, argv)
        return cls(args.sizes, args.work)


def run_method(method: str, graph: Graph, size: Size, log_dir: Path) -> dict[str, Any]:
    """One of :data:`METHODS` on ``graph``, in its own process."""
    if method == METHODS[0]:
        return run_forward(graph, f"forward-{size.name}", log_dir, ROUNDS)
    if method == METHODS[1]:
        return run_our_evaluation(graph, FORWARD_MODEL, f"sage-{size.name}", log_dir, ROUNDS)
    return run_our_evaluation(graph, {}, f"preset-{size.name}", log_dir, ROUNDS)


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The markdown table of ``rows``, each method against DGL's forward at its size.

    >>> rows = [
    ...     {"size": "sparse-1000000", "method": METHODS[0], "eval_s": 0.7,
    ...      "eval_s_rounds": [0.8, 0.7], "max_rss_mb": [2700.0]},
    ...     {"size": "sparse-1000000", "method": METHODS[1], "eval_s": 0.35,
    ...      "eval_s_rounds": [0.4, 0.35], "max_rss_mb": [1080.0]},
    ... ]
    >>> print("\\n".join(table(rows)[2:]))
    | sparse-1000000 | DGL full-graph forward | 0.80, 0.70 | 2,700 | 1.00x | 1.00x |
    | sparse-1000000 | dgl_scalegnn, the forward's model | 0.40, 0.35 | 1,080 | 0.50x | 0.40x |
    """
    lines = [
        "| graph | method | s per round, in order | peak MB | time / forward's "
        "| memory / forward's |",
        "|---|---|---|---|---|---|",
    ]
    forward = {r["size"]: r for r in rows if r["method"] == METHODS[0] and "error" not in r}
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['size']} | {row['method']} | failed: {row['error'][-120:]} |||")
            continue
        peak = max(row["max_rss_mb"])
        rounds = ", ".join(f"{s:.2f}" for s in row["eval_s_rounds"])
        ratios = "| |"
        if (base := forward.get(row["size"])) is not None:
            time_ratio = row["eval_s"] / base["eval_s"]
            memory_ratio = peak / max(base["max_rss_mb"])
            ratios = f"| {time_ratio:.2f}x | {memory_ratio:.2f}x |"
        lines.append(f"| {row['size']} | {row['method']} | {rounds} | {peak:,.0f} {ratios}")
    return lines


def main(settings: EvalSettings | None = None) -> dict[str, Any]:
    """Every size, every method of ``settings`` (by default the command line's); write
    the JSON and the markdown."""
    settings = settings or EvalSettings.from_argv()
    rows = []
    with work_dir(settings.work) as work:
        log_dir = work / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        for size in settings.sizes:
            print(f"[{size.name}] preparing", flush=True)
            graph, _ = setup_graph(size, work, ["generate"])
            for method in METHODS:
                try:
                    row = run_method(method, graph, size, log_dir)
                except (BenchError, OSError) as error:
                    row = {"error": str(error)[-1500:]}
                rows.append({"size": size.name, "method": method, **row})
                print(f"[{size.name}] {method}: {row.get('eval_s_rounds', row.get('error'))}")
    payload = {
        "sizes": [s.name for s in settings.sizes],
        "forward_model": FORWARD_MODEL,
        "rows": rows,
    }
    path = write_results("bench_eval", payload)
    text = [
        "# Full-graph evaluation against DGL's full-graph forward (`make bench-eval`)",
        "",
        "One process each, 2 cores; peak resident memory with imports. The forward's "
        "model: two SAGE-mean layers, hidden 128, biases. The ratios take the fastest "
        "round of each.",
        "",
        *table(rows),
        "",
    ]
    (RESULTS / "bench_eval.md").write_text("\n".join(text))
    print(f"wrote {path} and bench_eval.md", flush=True)
    return payload


if __name__ == "__main__":
    main()
