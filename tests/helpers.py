"""Test helpers: local multi-process launches and small graphs with awkward shapes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.data.prepared import PreparedGraph

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SHARED_DATA = ROOT.parent / "shared" / "datasets"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """Environment of a spawned rank: one thread each (2 cores, many ranks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def run_ranks(
    world_size: int, argv: list[str], timeout: float = 600, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """Start ``world_size`` processes as torchrun would (RANK, WORLD_SIZE, MASTER_*), wait.

    Raises AssertionError with every rank's output when any rank fails.
    """
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        rank_env = child_env(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            **(env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                cwd=ROOT,
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise AssertionError(f"rank {rank} timed out after {timeout} s") from None
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    failed = [r for r in results if r.returncode != 0]
    if failed:
        report = "\n".join(
            f"--- rank {i} exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            for i, r in enumerate(results)
        )
        raise AssertionError(f"{len(failed)} of {world_size} ranks failed:\n{report}")
    return results


def random_dataset(
    num_nodes: int = 97,
    num_edges: int = 400,
    num_features: int = 11,
    num_classes: int = 5,
    seed: int = 0,
    isolated: int = 3,
) -> NodeDataset:
    """A random directed multigraph with duplicate edges, self loops and isolated vertices."""
    rng = np.random.default_rng(seed)
    connected = num_nodes - isolated
    src = rng.integers(0, connected, num_edges)
    dst = rng.integers(0, connected, num_edges)
    src = np.concatenate((src, src[:10], [0, 1]))  # duplicates and self loops
    dst = np.concatenate((dst, dst[:10], [0, 1]))
    graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=num_nodes)
    graph.ndata["feat"] = torch.from_numpy(rng.standard_normal((num_nodes, num_features))).float()
    graph.ndata["label"] = torch.from_numpy(rng.integers(0, num_classes, num_nodes))
    split = rng.random(num_nodes)
    graph.ndata["train_mask"] = torch.from_numpy(split < 0.6)
    graph.ndata["val_mask"] = torch.from_numpy((split >= 0.6) & (split < 0.8))
    graph.ndata["test_mask"] = torch.from_numpy(split >= 0.8)
    return NodeDataset("random", graph, num_classes)


def prepared_dgl_graph(prepared: PreparedGraph) -> dgl.DGLGraph:
    """The prepared normalised adjacency as a DGLGraph (edge col -> row, weight ``w``)."""
    adjacency = prepared.adjacency
    rows = torch.from_numpy(np.asarray(adjacency.rows, dtype=np.int64))
    cols = torch.from_numpy(np.asarray(adjacency.cols, dtype=np.int64))
    graph = dgl.graph((cols, rows), num_nodes=prepared.meta.num_nodes)
    graph.edata["w"] = torch.from_numpy(np.asarray(adjacency.values))
    return graph


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().clamp(min=1e-12)
    return float((actual - expected).abs().max() / scale)
