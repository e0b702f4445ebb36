"""Per-step sampling time: Algorithm 2 against DGL's node_subgraph and SAINTSampler.

On the synthetic graph (1M vertices, about 20M directed edges; smaller in quick mode)
with B = 1%, 5% and 10% of N, in one run, median of repeats:

- ``ours_whole``: one rank holding the whole graph (grid 1x1x1x1): sample S, build
  its block of Ã_S with rescaling, slice features and labels;
- ``ours_rank_of_8_L1``: rank 0 of a 2x2x2 grid, one adjacency plane (as for L = 1);
- ``ours_rank_of_8``: rank 0 of a 2x2x2 grid, three adjacency planes (as for L >= 3);
- ``dgl_node_subgraph``: the same S, ``dgl.node_subgraph`` plus the same rescaling and
  feature slicing;
- ``dgl_saint_node``: ``dgl.dataloading.SAINTSampler(mode="node", budget=B)``.

Run: ``python -m benchmarks.bench_sampling`` (``--full`` for the full size).
"""

from __future__ import annotations

import torch

from benchmarks.common import (
    grouped_bars,
    median_seconds,
    prepared_dgl_graph,
    pyplot,
    save_plot,
    write_results,
)
from benchmarks.harness import full_mode
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import (
    inclusion_probability,
    rescale_off_diagonal,
    sample_vertices,
)


def _dgl_graph(prepared) -> dgl.DGLGraph:
    graph = prepared_dgl_graph(prepared)
    graph.ndata["feat"] = torch.from_numpy(prepared.features)
    graph.ndata["label"] = torch.from_numpy(prepared.labels)
    graph.create_formats_()
    return graph


def _measure(
    graph: dgl.DGLGraph, stores: tuple[RankStore, RankStore], batch: int, repeats: int
) -> dict:
    """Median seconds per step of the four samplers at batch size ``batch``."""
    num_nodes = graph.num_nodes()
    features, labels = graph.ndata["feat"], graph.ndata["label"]
    p = inclusion_probability(num_nodes, batch)
    seeds = iter(range(10_000))

    def ours(store: RankStore) -> None:
        store.batch(sample_vertices(num_nodes, batch, next(seeds)), 0)

    def node_subgraph() -> None:
        sample = sample_vertices(num_nodes, batch, next(seeds))
        sub = dgl.node_subgraph(graph, sample, store_ids=False)
        src, dst = sub.edges()
        sub.edata["w"] = rescale_off_diagonal(sub.edata["w"], src == dst, p)
        features[sample], labels[sample]

    saint = dgl.dataloading.SAINTSampler(mode="node", budget=batch)
    return {
        **{
            name: median_seconds(lambda s=store: ours(s), repeats) for name, store in stores.items()
        },
        "dgl_node_subgraph": median_seconds(node_subgraph, repeats),
        "dgl_saint_node": median_seconds(lambda: saint.sample(graph, None), repeats),
    }


def main(quick: bool = True) -> dict:
    num_nodes = 200_000 if quick else 1_000_000
    repeats = 5 if quick else 9
    dataset = generate(SyntheticConfig(num_nodes=num_nodes, avg_degree=20.0, num_features=64))
    prepared = prepare_in_memory(dataset, permutation_seed=0)
    del dataset
    graph = _dgl_graph(prepared)
    eight = GridShape.parse("1x2x2x2")
    stores = {
        "ours_whole": RankStore(prepared, Grid4D.view(GridShape.parse("1x1x1x1"), 0), num_layers=1),
        "ours_rank_of_8_L1": RankStore(prepared, Grid4D.view(eight, 0), num_layers=1),
        "ours_rank_of_8": RankStore(prepared, Grid4D.view(eight, 0), num_layers=3),
    }
    rows = []
    for fraction in (0.01, 0.05, 0.10):
        batch = int(fraction * num_nodes)
        timings = _measure(graph, stores, batch, repeats)
        ratio = timings["ours_whole"] / timings["dgl_node_subgraph"]
        rank_ratio = timings["ours_rank_of_8"] / timings["dgl_node_subgraph"]
        rank_l1_ratio = timings["ours_rank_of_8_L1"] / timings["dgl_node_subgraph"]
        rows.append(
            {
                "batch_fraction": fraction,
                "batch_size": batch,
                **timings,
                "ratio_whole_vs_node_subgraph": ratio,
                "ratio_rank_of_8_vs_node_subgraph": rank_ratio,
                "ratio_rank_of_8_L1_vs_node_subgraph": rank_l1_ratio,
            }
        )
        print(
            f"B={batch:>7} ({fraction:.0%}): ours whole {timings['ours_whole'] * 1e3:7.1f} ms, "
            f"rank of 8 (L1/L3) {timings['ours_rank_of_8_L1'] * 1e3:6.1f}/"
            f"{timings['ours_rank_of_8'] * 1e3:6.1f} ms, node_subgraph "
            f"{timings['dgl_node_subgraph'] * 1e3:7.1f} ms, SAINT node "
            f"{timings['dgl_saint_node'] * 1e3:7.1f} ms | ours/node_subgraph {ratio:.2f}x, "
            f"rank/node_subgraph {rank_l1_ratio:.2f}x (L1) {rank_ratio:.2f}x (L3)",
            flush=True,
        )
    path = write_results(
        "bench_sampling",
        {
            "num_nodes": num_nodes,
            "nnz": prepared.meta.nnz,
            "repeats": repeats,
            "quick": quick,
            "rows": rows,
        },
    )
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    keys = (
        "ours_whole",
        "ours_rank_of_8_L1",
        "ours_rank_of_8",
        "dgl_node_subgraph",
        "dgl_saint_node",
    )
    labels = [f"{r['batch_fraction']:.0%}" for r in rows]
    grouped_bars(axis, rows, keys, lambda row, key: row[key] * 1e3, labels)
    axis.set_xlabel("batch size (fraction of N)")
    axis.set_ylabel("ms per step (median)")
    axis.set_title(f"Sampling, N={num_nodes:,}, nnz={prepared.meta.nnz:,}")
    axis.legend()
    save_plot(figure, path)
    return {"num_nodes": num_nodes, "rows": rows}


if __name__ == "__main__":
    main(not full_mode(__doc__))
