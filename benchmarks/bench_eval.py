"""Full-graph evaluation: our layer-wise forward in row chunks against DGL's layer-wise inference.

Same process, graph and threads for all. Per evaluation round, in seconds:

- ``ours``: :meth:`Trainer.evaluate` of the GCN stack (input projection, ``layers`` GCN
  layers of width ``hidden``, head), first round and later rounds;
- ``ours_whole_batch``: the evaluation it replaced, the training forward on a whole-graph
  batch (:func:`~dgl_scalegnn.sampling.blocks.full_block` and a torch CSR with its
  transpose), built once as it was cached;
- ``dgl_graphconv``: ``layers`` ``dgl.nn.GraphConv`` layers (``in -> hidden -> ... ->
  classes``) weighted by the normalised adjacency, layer by layer over all vertices with
  their full neighbourhoods (``NeighborSampler([-1])``, 4096 output vertices a batch);
- ``dgl_graphsage``: the GraphSAGE peer's :func:`layerwise_inference` (mean aggregator,
  full neighbourhoods, last layer for the validation and test vertices only).

Usage: ``python -m benchmarks.bench_eval [PREPARED_DIR]`` (default: a synthetic graph of
200k vertices, 1M with ``SCALEGNN_BENCH_QUICK=0``).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.baselines.graphsage import SAGE, layerwise_inference
from benchmarks.common import prepared_dgl_graph, quick_mode, write_results
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import SyntheticConfig, config_from_mapping
from dgl_scalegnn.data.prepared import open_prepared, prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.parallel.spmm import build_local_spmm
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.blocks import full_block
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer

HIDDEN, LAYERS, ROUNDS, EVAL_BATCH = 128, 2, 3, 4096


class GraphConvStack(torch.nn.Module):
    """``GraphConv`` layers on the edge weights ``w`` (ReLU between), for layer-wise use."""

    def __init__(self, widths: list[int]) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            dgl.nn.GraphConv(a, b, norm="none", allow_zero_in_degree=True)
            for a, b in itertools.pairwise(widths)
        )
        self.widths = widths

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def layer_width(self, index: int) -> int:
        return self.widths[index + 1]

    def layer(self, index: int, block: dgl.DGLGraph, h: torch.Tensor) -> torch.Tensor:
        h = self.convs[index](block, h, edge_weight=block.edata["w"])
        return torch.relu(h) if index < self.num_layers - 1 else h


def _rounds(evaluate: Callable[[], object], rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        evaluate()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> dict:
    if len(sys.argv) > 1:
        prepared = open_prepared(sys.argv[1])
    else:
        num_nodes = 200_000 if quick_mode() else 1_000_000
        prepared = prepare_in_memory(generate(SyntheticConfig(num_nodes=num_nodes)), 0)
    meta = prepared.meta
    cfg = config_from_mapping(
        {
            "model": {"hidden": HIDDEN, "layers": LAYERS, "norm": False, "residual": False},
            "train": {"progress": False},
        }
    )
    trainer = Trainer(cfg, prepared, Runtime.single_process(), MetricsWriter(None, enabled=False))
    results = {"ours": _rounds(trainer.evaluate, ROUNDS)}

    def whole_batch_evaluation(batch: RankBatch) -> None:
        trainer.model.eval()
        with torch.no_grad():
            logits, spec = trainer.model(batch)
            trainer.objective.counts(logits, spec, batch)

    graph = trainer.store.full_graph()
    start = time.perf_counter()
    batch = RankBatch(
        step=-1,
        rows=graph.rows,
        adjacency={p: build_local_spmm(full_block(b)) for p, b in graph.blocks.items()},
        features=graph.features,
        labels=graph.labels,
        masks=graph.masks,
    )
    build = time.perf_counter() - start
    results["ours_whole_batch"] = _rounds(lambda b=batch: whole_batch_evaluation(b), ROUNDS)
    results["ours_whole_batch"][0] += build
    del batch, graph  # before the DGL graph: the process holds one copy at a time

    dgl_graph = prepared_dgl_graph(prepared)
    features = torch.from_numpy(np.asarray(prepared.features))
    all_ids = torch.arange(meta.num_nodes)
    evaluated = torch.from_numpy(np.flatnonzero(prepared.val_mask | prepared.test_mask))
    widths = [meta.num_features] + [HIDDEN] * (LAYERS - 1) + [meta.num_classes]
    with torch.no_grad():
        gcn = GraphConvStack(widths).eval()
        results["dgl_graphconv"] = _rounds(
            lambda: layerwise_inference(gcn, dgl_graph, features, all_ids, -1, EVAL_BATCH),
            ROUNDS,
        )
        sage = SAGE(meta.num_features, HIDDEN, meta.num_classes, LAYERS, 0.0).eval()
        results["dgl_graphsage"] = _rounds(
            lambda: layerwise_inference(sage, dgl_graph, features, evaluated, -1, EVAL_BATCH),
            ROUNDS,
        )
    print(
        f"{meta.name}: {meta.num_nodes} vertices, {meta.nnz} entries, hidden {HIDDEN}, "
        f"{LAYERS} layers, {torch.get_num_threads()} threads; seconds per evaluation round"
    )
    for name, seconds in results.items():
        print(f"  {name:18s} " + "  ".join(f"{s:6.2f}" for s in seconds), flush=True)
    payload = {"num_nodes": meta.num_nodes, "hidden": HIDDEN, "layers": LAYERS, **results}
    write_results("eval", payload)
    return payload


if __name__ == "__main__":
    main()
