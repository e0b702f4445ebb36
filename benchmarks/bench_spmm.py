"""Local SpMM kernels on real mini-batch blocks: forward plus backward time.

Blocks come from Algorithm 2 on the synthetic graph (one rank holding the whole graph,
and rank 0 of a 2x2x2 grid), B = 5% and 10% of N, feature width D. Kernels:

- ``torch-csr``: ``torch.sparse`` CSR products (the default, chosen from this benchmark);
- ``dgl-scaled``: the block kept unweighted, normalisation as row and column scalings
  around ``dgl.ops.copy_u_sum``;
- ``dgl-weighted``: ``dgl.ops.u_mul_e_sum`` with the stored values (the peer).

Printed as ratios to ``dgl-weighted`` (forward + backward) with each kernel's build time;
saved as JSON and a PNG. Target: the default at most 0.5x ``dgl-weighted``.
"""

from __future__ import annotations

import torch

from benchmarks.common import grouped_bars, median_seconds, pyplot, save_plot, write_results
from benchmarks.harness import full_mode
from dgl_scalegnn.config import SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.parallel.spmm import SPMM_KERNELS, build_local_spmm
from dgl_scalegnn.sampling.blocks import extract_block
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import inclusion_probability, sample_vertices


def _fwd_bwd(spmm, features: torch.Tensor, grads: torch.Tensor) -> None:
    spmm.matmul(features)
    spmm.matmul_t(grads)


def _measure(block, width: int, repeats: int) -> dict[str, float]:
    """Median forward+backward and build seconds of every kernel on ``block``."""
    features = torch.randn(block.num_cols, width)
    grads = torch.randn(block.num_rows, width)
    row = {}
    for kernel in SPMM_KERNELS:
        spmm = build_local_spmm(block, kernel)
        row[f"{kernel}_s"] = median_seconds(lambda s=spmm: _fwd_bwd(s, features, grads), repeats)
        row[f"{kernel}_build_s"] = median_seconds(
            lambda k=kernel: build_local_spmm(block, k), repeats
        )
    for kernel in SPMM_KERNELS:
        row[f"{kernel}_vs_weighted"] = row[f"{kernel}_s"] / row["dgl-weighted_s"]
    return row


def main(quick: bool = True) -> dict:
    num_nodes, width, repeats = (200_000, 128, 7) if quick else (1_000_000, 128, 11)
    prepared = prepare_in_memory(generate(SyntheticConfig(num_nodes=num_nodes, avg_degree=20.0)), 0)
    rows = []
    for where, shape in (("whole graph", "1x1x1x1"), ("rank 0 of 2x2x2", "1x2x2x2")):
        store = RankStore(prepared, Grid4D.view(GridShape.parse(shape), 0), num_layers=1)
        csr = next(iter(store.blocks.values()))
        for fraction in (0.05, 0.10):
            batch = int(fraction * num_nodes)
            sample = sample_vertices(num_nodes, batch, seed=1)
            block = extract_block(csr, sample, inclusion_probability(num_nodes, batch))
            row = {"block": where, "batch_fraction": fraction, "nnz": block.nnz, "width": width}
            row.update(_measure(block, width, repeats))
            rows.append(row)
            print(
                f"{where:>16}, B={fraction:.0%}, nnz={block.nnz:>9,}: "
                + ", ".join(
                    f"{k} {row[f'{k}_s'] * 1e3:7.2f} ms ({row[f'{k}_vs_weighted']:.2f}x,"
                    f" build {row[f'{k}_build_s'] * 1e3:.2f} ms)"
                    for k in SPMM_KERNELS
                ),
                flush=True,
            )
    path = write_results("bench_spmm", {"num_nodes": num_nodes, "quick": quick, "rows": rows})
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    labels = [f"{r['block']}\nB={r['batch_fraction']:.0%}" for r in rows]
    grouped_bars(axis, rows, SPMM_KERNELS, lambda row, k: row[f"{k}_s"] * 1e3, labels, fontsize=8)
    axis.set_ylabel("forward + backward, ms (median)")
    axis.set_title(f"Local SpMM, N={num_nodes:,}, D={width}")
    axis.legend()
    save_plot(figure, path)
    return {"num_nodes": num_nodes, "rows": rows}


if __name__ == "__main__":
    main(not full_mode(__doc__))
