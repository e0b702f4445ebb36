"""Convergence per step at equal B: sampler and model swapped independently.

Separates what uniform vertex sampling costs per step from what the model costs, on a
scale preset at a size one process trains quickly, with the batch fraction of the scale
benchmark (B = N / 40 by default, as the sweep chose at 1M vertices). Four runs, each
from the same seed, Adam at the same learning rate, test accuracy of a full-graph
evaluation after each listed step:

- samplers: ``uniform`` (the paper's: B vertices uniformly, off-diagonal values / p,
  mean loss over the labelled vertices of the batch) and ``saint`` (DGL's SAINTSampler,
  node mode, budget B, GraphSAINT's aggregator and loss normalisations);
- models: ``graphconv`` (two weighted GraphConv layers with bias, dropout 0.2: the
  GraphSAINT peer's model) and ``stack`` (dgl_scalegnn's model as configured in the
  preset's yaml), with any ``model.*`` key changed after a second colon, e.g.
  ``uniform:stack:input_projection=true,head=false``.

Run ``python -m benchmarks.bench_convergence --preset products-like --nodes 200000``;
prints a Markdown table (and writes it with ``--out``); ``--runs`` takes the runs
separated by ``;``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.baselines import training
from benchmarks.baselines.graphsaint import SaintGCN, estimate_norm, gcn_graph
from benchmarks.scale_presets import CONFIG_FILES, preset
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig, load_config
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.sampling.dgl_loader import UniformVertexSampler
from dgl_scalegnn.sampling.uniform import sample_vertices

__all__ = ["main"]

CHECKPOINTS = (3, 5, 10, 20, 40, 80)


def _accuracy(model: torch.nn.Module, graph: dgl.DGLGraph, forward: Callable) -> float:
    model.eval()
    with torch.no_grad():
        predicted = forward(graph, graph.edata["w"]).argmax(1)
    model.train()
    test = graph.ndata["test_mask"]
    return float((predicted[test] == graph.ndata["label"][test]).float().mean())


def run(
    graph: dgl.DGLGraph,
    sampler: str,
    model_name: str,
    model_cfg: ModelConfig,
    batch: int,
    lr: float,
    steps: int,
    seed: int,
) -> dict[int, float]:
    """Test accuracy after each of :data:`CHECKPOINTS` (up to ``steps``)."""
    training.seed_everything(seed)
    features, labels = graph.ndata["feat"], graph.ndata["label"]
    num_classes = int(labels.max()) + 1
    if model_name == "graphconv":
        model = SaintGCN(features.shape[1], 128, num_classes, layers=2, dropout=0.2)

        def forward(subgraph, weight):
            return model(subgraph, subgraph.ndata["feat"], weight)
    else:
        model = ScaleGNN(
            model_cfg, in_features=features.shape[1], num_classes=num_classes, seed=seed
        )

        def forward(subgraph, weight):
            subgraph.edata["_weight"] = weight
            return model(subgraph, subgraph.ndata["feat"], weight="_weight")

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    train_mask = graph.ndata["train_mask"]
    if sampler == "saint":
        saint = dgl.dataloading.SAINTSampler(mode="node", budget=batch)
        norm = estimate_norm(graph, saint, math.ceil(10 * graph.num_nodes() / batch), train_mask)
    uniform = UniformVertexSampler()
    accuracies = {}
    for step in range(1, steps + 1):
        if sampler == "saint":
            subgraph = saint.sample(graph, None)
            weight = subgraph.edata["w"] * norm.aggr_norm[subgraph.edata[dgl.EID]]
            loss_norm = norm.loss_norm[subgraph.ndata[dgl.NID]]
        else:
            ids = sample_vertices(graph.num_nodes(), batch, seed * 1_000_003 + step)
            subgraph = uniform.sample(graph, ids)
            weight = subgraph.edata["w"]
        logits = forward(subgraph, weight)
        labelled = subgraph.ndata["train_mask"]
        targets = labels[subgraph.ndata[dgl.NID]][labelled]
        per_vertex = F.cross_entropy(logits[labelled], targets, reduction="none")
        # GraphSAINT's estimate of the mean loss; ours: the batch's labelled mean
        saint_loss = sampler == "saint"
        loss = (per_vertex * loss_norm[labelled]).sum() if saint_loss else per_vertex.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in CHECKPOINTS:
            accuracies[step] = _accuracy(model, graph, forward)
    return accuracies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="products-like")
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--batch-fraction", type=float, default=1 / 40)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--runs", default="saint:graphconv;uniform:graphconv;saint:stack;uniform:stack"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    dataset = generate(preset(args.preset, args.nodes))
    graph = gcn_graph(dataset.graph)
    batch = round(args.nodes * args.batch_fraction)
    steps = [s for s in CHECKPOINTS if s <= args.steps]
    lines = [
        f"{args.preset}, {args.nodes:,} vertices, B = {batch:,}, lr {args.lr}, "
        f"seed {args.seed}; test accuracy after k steps",
        "",
        "| sampler + model | " + " | ".join(map(str, steps)) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for spec in args.runs.split(";"):
        sampler, model_name, *changes = spec.split(":")
        overrides = [f"model.{change}" for change in ",".join(changes).split(",") if change]
        model_cfg = load_config(CONFIG_FILES[args.preset], overrides).model
        result = run(graph, sampler, model_name, model_cfg, batch, args.lr, args.steps, args.seed)
        cells = " | ".join(f"{100 * result[s]:.1f}" for s in steps)
        name = f"{sampler} + {model_name}" + (f" ({', '.join(overrides)})" if overrides else "")
        row = f"| {name} | {cells} |"
        lines.append(row)
        print(row, flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
