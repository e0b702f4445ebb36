"""Shared helpers of the benchmarks: timing, results files, plots."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.prepared import PreparedGraph

RESULTS = Path(__file__).resolve().parent / "results"


def quick_mode() -> bool:
    """``SCALEGNN_BENCH_QUICK=1`` (the default of ``make bench``) shrinks every benchmark."""
    return os.environ.get("SCALEGNN_BENCH_QUICK", "1") != "0"


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(figure, results_path: Path) -> None:
    """Save ``figure`` as the PNG beside ``results_path`` (its JSON) and say where both are."""
    figure.tight_layout()
    figure.savefig(results_path.with_suffix(".png"), dpi=120)
    print(f"wrote {results_path} and {results_path.with_suffix('.png')}", flush=True)


def prepared_dgl_graph(prepared: PreparedGraph) -> dgl.DGLGraph:
    """The prepared normalised adjacency as a DGLGraph (edge col -> row, weight ``w``)."""
    adjacency = prepared.adjacency
    rows = torch.from_numpy(np.asarray(adjacency.rows, dtype=np.int64))
    cols = torch.from_numpy(np.asarray(adjacency.cols, dtype=np.int64))
    graph = dgl.graph((cols, rows), num_nodes=prepared.meta.num_nodes)
    graph.edata["w"] = torch.from_numpy(np.asarray(adjacency.values))
    return graph
