"""Where normalisation costs accuracy on a small citation graph: the paper's model part by part.

Full-batch training (every vertex every epoch, the limit of ``B = N``) of a 2-layer model
in plain PyTorch on the GCN-normalised adjacency, so that forms the engine does not offer
(a per-column or a global RMS, a norm of the aggregated input) can be tried beside the
ones it does. Each form changes one thing from Kipf & Welling's GCN
(:math:`\\hat A\\, \\mathrm{ReLU}(\\hat A X W_0) W_1`, no biases); the hidden activation
:math:`Y = \\hat A X W_0` (or :math:`\\hat A X W_{in} W_0` with the projection) is
normalised as

- ``row`` (the paper's RMSNorm):
  :math:`Y_{i\\cdot} / \\sqrt{\\overline{Y_{i\\cdot}^2} + \\epsilon}`,
- ``column``: :math:`Y_{\\cdot j} / \\sqrt{\\overline{Y_{\\cdot j}^2} + \\epsilon}` (over the
  vertices, as a batch norm without centring),
- ``global``: :math:`Y / \\sqrt{\\overline{Y^2} + \\epsilon}` (one scalar),
- ``aggregated``: :math:`\\mathrm{RMSNorm}(\\hat A X) W` instead of
  :math:`\\mathrm{RMSNorm}(\\hat A X W)`,

each times a learnt gain. Adam with the settings of yaml/cora.yaml (lr 0.005 on a cosine
decay, weight decay 5e-4 on every parameter, dropout 0.5 on the input and the hidden
layer, hidden 128, 200 epochs); test accuracy at the best validation epoch.

The second table splits the test vertices by the hidden RMS of the trained GCN
(:math:`\\sqrt{\\overline{Y_{i\\cdot}^2}}`, quartiles) and by degree, and gives the accuracy
of the GCN and of the GCN with the paper's RMSNorm after the last epoch, over the same
seeds.

Usage: ``python -m benchmarks.bench_norm_forms [--dataset cora] [--seeds 5]``; writes
``benchmarks/results/norm_forms_<dataset>.md`` (Planetoid files under
``$SCALEGNN_DATA_ROOT/planetoid``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.nn import functional

from dgl_scalegnn.config import DataConfig
from dgl_scalegnn.data.datasets import load_dataset
from dgl_scalegnn.sampling.dgl_loader import norm_graph

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Form:
    """One model form: the normalisation and which of the paper's parts are on."""

    norm: str = "none"
    eps: float = 1e-6
    residual: bool = False
    head: bool = False
    projection: bool = False
    hidden: int = 128
    dropout: float = 0.5
    lr: float = 0.005
    weight_decay: float = 5e-4
    epochs: int = 200


GCN = Form()
FORMS: dict[str, Form] = {
    "GCN (yaml/cora.yaml without biases)": GCN,
    "RMSNorm per row (the paper's)": replace(GCN, norm="row"),
    "RMSNorm per row, eps 1e-3": replace(GCN, norm="row", eps=1e-3),
    "RMSNorm per row, eps 1": replace(GCN, norm="row", eps=1.0),
    "RMS per column": replace(GCN, norm="column"),
    "one global RMS": replace(GCN, norm="global"),
    "RMSNorm of the aggregated input": replace(GCN, norm="aggregated"),
    "RMSNorm per row, lr 0.01": replace(GCN, norm="row", lr=0.01),
    "RMSNorm per row, weight decay 5e-3": replace(GCN, norm="row", weight_decay=5e-3),
    "RMSNorm per row, hidden dropout 0.3": replace(GCN, norm="row", dropout=0.3),
    "residual + head": replace(GCN, residual=True, head=True),
    "residual + head + projection": replace(GCN, residual=True, head=True, projection=True),
    "the paper's model (RMSNorm, residual, head, projection)": replace(
        GCN, norm="row", residual=True, head=True, projection=True
    ),
}


@dataclass(frozen=True)
class Graph:
    """The normalised adjacency, features, labels and split of a node-classification graph."""

    adjacency: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    degree: torch.Tensor
    num_classes: int

    @classmethod
    def load(cls, name: str) -> Graph:
        dataset = load_dataset(DataConfig(name=name))
        graph = norm_graph(dataset.graph)
        src, dst = graph.edges()
        n = graph.num_nodes()
        adjacency = torch.sparse_coo_tensor(
            torch.stack([dst, src]), graph.edata["w"].float(), (n, n)
        ).coalesce()
        masks = (graph.ndata[f"{split}_mask"] for split in ("train", "val", "test"))
        degree = torch.bincount(dst, minlength=n) - 1  # without the self loop
        return cls(
            adjacency,
            graph.ndata["feat"],
            graph.ndata["label"],
            *masks,
            degree,
            dataset.num_classes,
        )


def rms_scale(y: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """``y`` divided by its RMS over each row, each column, or all of it."""
    if norm in ("row", "aggregated"):
        mean_square = y.pow(2).mean(1, keepdim=True)
    elif norm == "column":
        mean_square = y.pow(2).mean(0, keepdim=True)
    else:
        mean_square = y.pow(2).mean()
    return y * torch.rsqrt(mean_square + eps)


class FullBatchModel(torch.nn.Module):
    """Input projection (optional), one hidden GCN layer with its tail, and the output:
    a second GCN layer to the classes, or with ``head`` a second hidden layer with a
    residual and a linear head (the paper's model at ``L = 2``)."""

    def __init__(self, form: Form, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.form = form
        hidden = form.hidden
        width_in = hidden if form.projection else in_features
        shapes = {"first": (width_in, hidden)}
        if form.projection:
            shapes["projection"] = (in_features, hidden)
        if form.head:
            shapes |= {"second": (hidden, hidden), "head": (hidden, num_classes)}
        else:
            shapes["second"] = (hidden, num_classes)
        self.weights = torch.nn.ParameterDict(
            {
                name: torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(shape)))
                for name, shape in shapes.items()
            }
        )
        gains = {"first": width_in if form.norm == "aggregated" else hidden}
        if form.head:
            gains["second"] = hidden
        self.gains = torch.nn.ParameterDict(
            {name: torch.nn.Parameter(torch.ones(width)) for name, width in gains.items()}
        )

    def hidden_layer(self, name: str, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        """:math:`\\mathrm{Dropout}(\\mathrm{ReLU}(\\mathrm{Norm}(\\hat A X W)))` (plus the
        layer input with a residual where the widths agree); also returns the
        pre-normalisation activation."""
        form, weight, gain = self.form, self.weights[name], self.gains[name]
        if form.norm == "aggregated":
            y = (rms_scale(adjacency @ x, form.norm, form.eps) * gain) @ weight
        else:
            y = adjacency @ (x @ weight)
            if form.norm != "none":
                y = rms_scale(y, form.norm, form.eps) * gain
        out = functional.dropout(torch.relu(y), form.dropout, self.training)
        if form.residual and x.shape[1] == out.shape[1]:
            out = out + x
        return out

    def forward(self, graph: Graph) -> torch.Tensor:
        form = self.form
        x = functional.dropout(graph.features, form.dropout, self.training)
        if form.projection:
            x = x @ self.weights["projection"]
        x = self.hidden_layer("first", x, graph.adjacency)
        if form.head:
            return self.hidden_layer("second", x, graph.adjacency) @ self.weights["head"]
        return graph.adjacency @ (x @ self.weights["second"])

    @torch.no_grad()
    def first_activation_rms(self, graph: Graph) -> torch.Tensor:
        """Per vertex, the RMS of the first layer's :math:`\\hat A X W_0` (no dropout)."""
        x = graph.features
        if self.form.projection:
            x = x @ self.weights["projection"]
        return (graph.adjacency @ (x @ self.weights["first"])).pow(2).mean(1).sqrt()


def train(form: Form, graph: Graph, seed: int) -> tuple[float, float, FullBatchModel]:
    """Validation and test accuracy at the best validation epoch, and the last model."""
    torch.manual_seed(seed)
    model = FullBatchModel(form, graph.features.shape[1], graph.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=form.lr, weight_decay=form.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, form.epochs)
    best = (-1.0, 0.0)
    for _ in range(form.epochs):
        model.train()
        optimizer.zero_grad()
        logits = model(graph)
        functional.cross_entropy(logits[graph.train], graph.labels[graph.train]).backward()
        optimizer.step()
        schedule.step()
        correct = predictions_correct(model, graph)
        val, test = correct[graph.val].mean().item(), correct[graph.test].mean().item()
        if val > best[0]:
            best = (val, test)
    return best[0], best[1], model


@torch.no_grad()
def predictions_correct(model: FullBatchModel, graph: Graph) -> torch.Tensor:
    """1.0 where the model (in evaluation mode) predicts a vertex's label, else 0.0."""
    model.eval()
    return (model(graph).argmax(1) == graph.labels).float()


def mean_std(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f} %"


def breakdown_rows(graph: Graph, seeds: list[int]) -> list[str]:
    """Test accuracy of the GCN and of the GCN with the paper's RMSNorm, by the GCN's
    first-layer RMS quartile and by degree (last-epoch models, mean over seeds)."""
    correct, activation_rms = {}, []
    for name, form in (("gcn", GCN), ("row", FORMS["RMSNorm per row (the paper's)"])):
        runs = []
        for seed in seeds:
            model = train(form, graph, seed)[2]
            runs.append(predictions_correct(model, graph))
            if name == "gcn":
                activation_rms.append(model.first_activation_rms(graph))
        correct[name] = torch.stack(runs).mean(0)
    test = graph.test.nonzero().squeeze(1)
    rms = torch.stack(activation_rms).mean(0)[test]
    quartiles = torch.quantile(rms, torch.tensor([0.25, 0.5, 0.75])).tolist()
    bins = [-float("inf"), *quartiles, float("inf")]
    rows = []
    for index, (low, high) in enumerate(itertools.pairwise(bins)):
        rows.append((f"GCN hidden RMS, quartile {index + 1}", test[(rms >= low) & (rms < high)]))
    degree = graph.degree[test]
    for low, high in ((1, 2), (2, 3), (3, 5), (5, 10)):
        label = f"degree {low}" if high == low + 1 else f"degree {low}-{high - 1}"
        rows.append((label, test[(degree >= low) & (degree < high)]))
    rows.append(("degree >= 10", test[degree >= 10]))
    median, top, largest = torch.quantile(rms.pow(2), torch.tensor([0.5, 0.99, 1.0])).tolist()
    lines = []
    for label, vertices in rows:
        gcn, row = (100 * correct[key][vertices].mean().item() for key in ("gcn", "row"))
        lines.append(
            f"| {label} | {len(vertices)} | {gcn:.1f} % | {row:.1f} % | {row - gcn:+.1f} |"
        )
    lines += [
        "",
        "Mean square of the trained GCN's first-layer activation per test vertex (what an",
        f"RMSNorm divides by, before epsilon): median {median:.2g}, 99th percentile {top:.2g},",
        f"max {largest:.2g}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--forms", nargs="*", default=list(FORMS), help="names of FORMS")
    args = parser.parse_args()
    torch.set_num_threads(1)
    graph = Graph.load(args.dataset)
    seeds = list(range(args.seeds))
    lines = [
        f"# {args.dataset}: the paper's model part by part, full batch, seeds 0-{seeds[-1]}",
        "",
        f"`python -m benchmarks.bench_norm_forms --dataset {args.dataset} --seeds {args.seeds}`"
        " (what each form is: the module docstring).",
        "",
        "| form | validation | test at best validation |",
        "|---|---|---|",
    ]
    for name in args.forms:
        runs = [train(FORMS[name], graph, seed)[:2] for seed in seeds]
        row = f"| {name} | {mean_std([v for v, _ in runs])} | {mean_std([t for _, t in runs])} |"
        print(row, flush=True)
        lines.append(row)
    lines += [
        "",
        "Test accuracy after the last epoch by vertex group: the GCN against the GCN with",
        "the paper's RMSNorm.",
        "",
        "| test vertices | count | GCN | RMSNorm per row | difference |",
        "|---|---|---|---|---|",
        *breakdown_rows(graph, seeds),
    ]
    path = RESULTS / f"norm_forms_{args.dataset}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
