"""Every layer type beyond GCN on the 3D PMM grid equals DGL's own module (GraphSAGE-mean:
``SAGEConv('mean')``; GIN: ``GINConv``; GAT: ``GATConv``, its heads as DGL's GAT example
joins them).

Oracle: a stack of DGL's modules (:data:`DGL_MODULES`) holding the same global weights,
on the graph the prepared dataset describes (symmetrised, deduplicated, no self loops),
full batch (so :math:`p = 1`): the grid's logits, loss, every gradient and its chunked full-graph
evaluation must equal the stack's, on 1x1x1x1, 1x2x2x2, 2x1x2x1 (data parallel) and
1x1x3x2 (97 rows in three uneven parts). The paper's model (projection, RMSNorm,
residual, head) with each layer type is checked on a sampled batch against the
single-process reference, whose adjacency carries the sampler's :math:`1/p`. The
estimator of the neighbour mean under uniform vertex sampling is tested for bias.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ConfigError, ModelConfig, config_from_mapping
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.model.convs.gat import attention_keep
from dgl_scalegnn.model.convs.gin import GINLayer, degree_mean
from dgl_scalegnn.model.convs.sage import SAGELayer, neighbour_mean
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.model.stack import parameter_shards
from dgl_scalegnn.parallel.spmm import build_local_spmm
from dgl_scalegnn.sampling.blocks import full_block
from dgl_scalegnn.sampling.dgl_loader import norm_graph
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import EdgeScaling, UniformSampler
from tests.helpers import random_dataset, relative_error
from tests.oracle import assemble, reference_step
from tests.ranks import spawn_ranks

GRAPH = {"num_nodes": 97, "num_edges": 400, "num_features": 11, "num_classes": 5}
TOLERANCE = 1e-5
#: DGL's form: the layers alone, biases, no norm, residual or dropout.
DGL_FORM = {
    "hidden": 13,
    "layers": 3,
    "dropout": 0.0,
    "norm": False,
    "residual": False,
    "input_projection": False,
    "head": False,
    "bias": True,
}
PAPER_FORM = {"hidden": 13, "layers": 3, "dropout": 0.3, "bias": True}
GIN = {"conv": "gin", "gin_eps": 0.1, "gin_learn_eps": True}
#: Three hidden heads of 5 columns (a head's columns split over two ranks on 1x2x2x2), two
#: averaged output heads.
GAT = {"conv": "gat", "hidden": 15, "gat_heads": 3, "gat_out_heads": 2}
CASES = {
    "sage_dgl": {"model": {**DGL_FORM, "conv": "sage"}, "batch_size": 97, "chunk_rows": 7},
    "sage_sampled": {"model": {**PAPER_FORM, "conv": "sage"}, "batch_size": 61},
    "gin_dgl": {"model": {**DGL_FORM, **GIN}, "batch_size": 97, "chunk_rows": 7},
    "gin_sampled": {
        "model": {**PAPER_FORM, **GIN, "residual_from": "aggregated"},
        "batch_size": 61,
    },
    # X W narrowed on every grid; DGL's residual (res_fc, identity, res_fc) read from the
    # input's rows; attention dropout by the hash DGL's module is given too
    "gat_dgl": {"model": {**DGL_FORM, **GAT}, "batch_size": 97, "chunk_rows": 7},
    "gat_dgl_residual": {
        "model": {**DGL_FORM, **GAT, "gat_residual": True, "gat_negative_slope": 0.1},
        "batch_size": 97,
        "chunk_rows": 7,
    },
    "gat_dgl_dropout": {
        "model": {**DGL_FORM, **GAT, "gat_attn_dropout": 0.5},
        "batch_size": 97,
        "dgl": True,
    },
    "gat_sampled": {
        "model": {**PAPER_FORM, "conv": "gat", "hidden": 15, "gat_heads": 3, "gat_residual": True},
        "batch_size": 61,
    },
}
GRIDS = ["1x1x1x1", "1x2x2x2", "2x1x2x1", "1x1x3x2"]


@pytest.fixture(scope="module")
def prepared():
    return prepare_in_memory(random_dataset(**GRAPH), permutation_seed=3)


def _sage(cfg: ModelConfig, p: dict[str, torch.Tensor], index: int) -> nn.Module:
    """DGL's ``SAGEConv('mean')`` holding layer ``index``'s global weights ``p``."""
    width_in, width_out = p["weight"].shape
    module = dgl.nn.SAGEConv(width_in, width_out, "mean")
    module.fc_self.weight = nn.Parameter(p["self_weight"].detach().t().clone())
    module.fc_neigh.weight = nn.Parameter(p["weight"].detach().t().clone())
    module.fc_self.bias = nn.Parameter(p["bias"].detach().clone())  # DGL's bias
    return module


def _sage_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {
        "self_weight": module.fc_self.weight.grad.t(),
        "weight": module.fc_neigh.weight.grad.t(),
        "bias": module.fc_self.bias.grad,
    }


def _gin(cfg: ModelConfig, p: dict[str, torch.Tensor], index: int) -> nn.Module:
    """DGL's ``GINConv`` (sum, two-layer MLP) holding layer ``index``'s global weights ``p``."""
    (width_in, hidden), width_out = p["hidden_weight"].shape, p["weight"].shape[1]
    mlp = nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, width_out))
    mlp[0].weight = nn.Parameter(p["hidden_weight"].detach().t().clone())
    mlp[0].bias = nn.Parameter(p["hidden_bias"].detach().clone())
    mlp[2].weight = nn.Parameter(p["weight"].detach().t().clone())
    mlp[2].bias = nn.Parameter(p["bias"].detach().clone())
    return dgl.nn.GINConv(mlp, "sum", init_eps=cfg.gin_eps, learn_eps=cfg.gin_learn_eps)


def _gin_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    mlp = module.apply_func
    return {
        "hidden_weight": mlp[0].weight.grad.t(),
        "hidden_bias": mlp[0].bias.grad,
        "weight": mlp[2].weight.grad.t(),
        "bias": mlp[2].bias.grad,
        "eps": module.eps.grad.reshape(()),
    }


class _Dropped(nn.Module):
    """DGL's ``attn_drop`` replaced by a given mask and scale ``(E, H, 1)``."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, attention: torch.Tensor) -> torch.Tensor:
        return attention * self.scale


class _GATHeads(nn.Module):
    """DGL's ``GATConv`` on the graph with one self loop a vertex (the structure of our
    blocks), its heads joined (hidden) or averaged (the output) as DGL's GAT example
    does; its attention dropout is our hash of step 0 and layer ``index`` (the only part
    of ours it reads: the mask of each edge and head)."""

    def __init__(self, conv: nn.Module, mean: bool, index: int, rate: float) -> None:
        super().__init__()
        self.conv, self.mean, self.index, self.rate = conv, mean, index, rate

    def forward(self, graph: dgl.DGLGraph, x: torch.Tensor) -> torch.Tensor:
        graph = dgl.add_self_loop(graph)
        if self.rate:
            src, dst = graph.edges()
            key = mix_seed(0, 0, self.index)  # train.seed 0, step 0
            keep = attention_keep(key, dst, src, self.conv._num_heads, self.rate)
            self.conv.attn_drop = _Dropped(keep.unsqueeze(-1) * (1.0 / (1.0 - self.rate)))
        out = self.conv(graph, x)
        return out.mean(dim=1) if self.mean else out.flatten(1)


def _gat(cfg: ModelConfig, p: dict[str, torch.Tensor], index: int) -> nn.Module:
    """DGL's ``GATConv`` holding layer ``index``'s global weights ``p``: a hidden layer's
    bias is DGL's, the output layer's (the heads' mean) is every head's bias."""
    width_in, width = p["weight"].shape
    width_out = p["bias"].numel()
    mean = width_out != cfg.hidden  # the layer that outputs the classes
    heads = width // width_out if mean else cfg.gat_heads
    head_width = width // heads
    conv = dgl.nn.GATConv(
        width_in,
        head_width,
        heads,
        negative_slope=cfg.gat_negative_slope,
        residual=cfg.gat_residual,
    )
    conv.fc.weight = nn.Parameter(p["weight"].detach().t().clone())
    conv.attn_l = nn.Parameter(p["attn_l"].detach().view(1, heads, head_width).clone())
    conv.attn_r = nn.Parameter(p["attn_r"].detach().view(1, heads, head_width).clone())
    bias = nn.Parameter(p["bias"].detach().repeat(heads if mean else 1).clone())
    if "residual_weight" in p:  # DGL's res_fc holds the bias then
        conv.res_fc.weight = nn.Parameter(p["residual_weight"].detach().t().clone())
        conv.res_fc.bias = bias
    else:
        conv.bias = bias
    return _GATHeads(conv, mean, index, cfg.gat_attn_dropout)


def _gat_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    conv = module.conv
    bias = conv.res_fc.bias if conv.has_linear_res else conv.bias
    grads = {
        "weight": conv.fc.weight.grad.t(),
        "attn_l": conv.attn_l.grad.reshape(-1),
        "attn_r": conv.attn_r.grad.reshape(-1),
        "bias": bias.grad.view(-1, conv._out_feats).sum(0) if module.mean else bias.grad,
    }
    if conv.has_linear_res:
        grads["residual_weight"] = conv.res_fc.weight.grad.t()
    return grads


#: Each layer type's DGL module (from global weights) and its gradients by our names.
DGL_MODULES = {
    "sage": (_sage, _sage_grads),
    "gin": (_gin, _gin_grads),
    "gat": (_gat, _gat_grads),
}


def dgl_oracle(prepared, model: dict) -> dict:
    """Logits, loss and gradients of DGL's stack on the whole graph (train-mask loss)."""
    cfg = ModelConfig(**model)
    meta = prepared.meta
    reference = ScaleGNN(cfg, in_features=meta.num_features, num_classes=meta.num_classes, seed=0)
    build, grads_of = DGL_MODULES[cfg.conv]
    modules = [
        build(cfg, {k.removeprefix(f"layer{i}_"): v for k, v in reference.params.items()}, i)
        for i in range(cfg.layers)
    ]
    graph = norm_graph(prepared_dgl_graph(prepared), "sum")  # the edges, no self loops
    hidden = torch.from_numpy(prepared.features[:])
    for index, module in enumerate(modules):
        hidden = module(graph, hidden)
        if index < len(modules) - 1:
            hidden = torch.relu(hidden)
    mask = torch.from_numpy(prepared.train_mask[:])
    loss = nn.functional.cross_entropy(hidden[mask], torch.from_numpy(prepared.labels[:])[mask])
    loss.backward()
    grads = {
        f"layer{i}_{name}": grad
        for i, module in enumerate(modules)
        for name, grad in grads_of(module).items()
    }
    return {"logits": hidden.detach(), "loss": loss.item(), "grads": grads}


def _global(records: list[dict], key: str, shape: tuple[int, ...]) -> torch.Tensor:
    return assemble(
        records,
        lambda r: ((slice(*r[key]["rows"]), slice(*r[key]["cols"])), r[key]["value"]),
        shape,
    )


@pytest.mark.parametrize("grid", GRIDS)
def test_each_layer_type_matches_dgls_module_on_every_grid(grid, prepared, tmp_path):
    shape = GridShape.parse(grid)
    spec = {"grid": grid, "graph": GRAPH, "cases": CASES, "out": str(tmp_path)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    spawn_ranks(
        shape.world_size, "tests.workers.conv_oracle:main", [str(tmp_path / "spec.json")], tmp_path
    )
    for name, case in CASES.items():
        records = [torch.load(tmp_path / f"rank{r}_{name}.pt") for r in range(shape.world_size)]
        for record in records:
            record["coords"] = Coords(*record["coords"])
        cfg = ModelConfig(**case["model"])
        shards = parameter_shards(cfg, GRAPH["num_features"], GRAPH["num_classes"])
        if "chunk_rows" in case or case.get("dgl"):  # DGL's modules, full batch: every
            expected = dgl_oracle(prepared, case["model"])  # DP group alike
            expected_grads = expected["grads"]
            groups = {d: expected for d in range(shape.dp)}
            if "chunk_rows" in case:  # no dropout: the evaluation's logits are the step's
                evaluated = _global(records, "eval", expected["logits"].shape)
                assert relative_error(evaluated, expected["logits"]) < TOLERANCE, name
        else:  # the reference on each DP group's sampled batch, gradients averaged
            groups = {
                d: reference_step(prepared, cfg, case["batch_size"], d) for d in range(shape.dp)
            }
            expected_grads = {
                n: sum(groups[d]["grads"][n] for d in groups) / shape.dp for n in shards
            }
        assert set(expected_grads) == set(shards), name
        for d, expected in groups.items():
            group = [r for r in records if r["coords"].d == d]
            logits = _global(group, "logits", expected["logits"].shape)
            assert relative_error(logits, expected["logits"]) < TOLERANCE, name
            assert all(r["loss"] == pytest.approx(expected["loss"], rel=TOLERANCE) for r in group)
        for param, shard in shards.items():
            grad = assemble(
                records,
                lambda r, s=shard, n=param: (s.local_slices(shape, r["coords"]), r["grads"][n]),
                shard.global_shape,
            )
            error = relative_error(grad, expected_grads[param])
            assert error < TOLERANCE, f"{name}: gradient of {param}, relative error {error:.1e}"


def _moments_over_samples(
    estimates: Callable[[torch.Tensor, EdgeScaling], dict[str, torch.Tensor]],
    n: int,
    batch: int,
    steps: int,
) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Each estimator's mean and mean square per vertex over the ``steps`` uniform
    samples of ``batch`` of ``n`` vertices (seed 5) that contain it, with how many
    contained it (``(n, 1)``): ``estimates(sample, scaling)`` gives each estimator's
    rows of the sampled vertices."""
    sampler = UniformSampler(n, batch, seed=5)
    drawn, values = [], {}
    for step in range(steps):
        sample = sampler.draw(step)
        for name, estimate in estimates(sample, sampler.scaling()).items():
            values.setdefault(name, []).append(estimate)
        drawn.append(sample)
    vertices = torch.cat(drawn)
    counts = torch.bincount(vertices, minlength=n).double()[:, None]
    moments = {}
    for name, rows in values.items():
        rows = torch.cat(rows)
        mean = rows.new_zeros(n, rows.shape[1]).index_add_(0, vertices, rows) / counts
        square = rows.new_zeros(n, rows.shape[1]).index_add_(0, vertices, rows**2) / counts
        moments[name] = (mean, square)
    return counts, moments


def test_sage_estimators_bias_and_agreement_with_full_graph_evaluation(prepared):
    """The two estimators of the neighbour mean under uniform vertex sampling, averaged
    over the samples that contain ``v``, against the full mean (the full-graph
    evaluation's value): the unbiased one (sum over the sampled neighbours divided by the
    full degree and ``p``) is within sampling noise, the mean z-score of its error that
    of a standard normal (about 0.8); SAGE's (the mean over the sampled neighbours) is
    biased, off by more than its noise. With every vertex in the batch both are exact."""
    n, batch, steps = prepared.meta.num_nodes, 30, 2000
    store = RankStore(prepared, Grid4D.view(GridShape.parse("1x1x1x1"), 0), 1, kind=SAGELayer.kind)
    features = torch.from_numpy(prepared.features[:]).double()
    ones = torch.ones(n, 1, dtype=torch.float64)
    plane = next(iter(store.blocks))
    full = build_local_spmm(full_block(store.full_graph().blocks[plane]))
    degrees = full.matmul(ones)
    exact = neighbour_mean(full.matmul(features), degrees)

    def estimates(sample: torch.Tensor, scaling) -> dict[str, torch.Tensor]:
        adjacency = store.batch(sample, 0, scaling).adjacency[plane]  # A_S / p off-diagonal
        summed = adjacency.matmul(features.index_select(0, sample))
        return {
            "unbiased": neighbour_mean(summed, degrees.index_select(0, sample)),
            "sage": neighbour_mean(summed, adjacency.matmul(ones[: sample.numel()])),
        }

    counts, moments = _moments_over_samples(estimates, n, batch, steps)
    connected = degrees.squeeze(1) > 0
    z_scores = {}
    for name, (mean, square) in moments.items():
        standard_error = ((square - mean**2).clamp(min=1e-12) / counts).sqrt()
        z_scores[name] = ((mean - exact).abs() / standard_error)[connected].mean().item()
    print(f"mean |z| of the neighbour-mean estimators: {z_scores}")
    assert 0.5 < z_scores["unbiased"] < 1.2
    assert z_scores["sage"] > 1.5  # biased: twice the noise of an unbiased estimator
    everything = torch.arange(n)
    for estimate in estimates(everything, UniformSampler(n, n).scaling()).values():
        assert torch.allclose(estimate, exact, rtol=1e-6, atol=1e-9)


def test_gin_sum_estimators_bias_and_variance_against_the_full_graph_sum(prepared):
    """The two estimators of GIN's neighbour sum under uniform vertex sampling at small p
    (B = 3 of 97, p = 0.021, as B = N/40 at 1M vertices), averaged over the samples that
    contain ``v``, against the full sum :math:`S_v` (the full-graph evaluation's, from
    the whole block). The unbiased one (the sampled neighbours' sum over p) is within
    sampling noise of :math:`S_v`: the mean z-score of its error is a standard normal's
    (about 0.8). ``degree_mean`` (the full degree, the block's row length before
    sampling, times the sampled neighbours' mean) is unbiased for :math:`(1 - q_v) S_v`,
    :math:`q_v` the hypergeometric chance that no neighbour of ``v`` is drawn (given a
    neighbour, the sampled ones are a uniform subset of them), so far from :math:`S_v`;
    its variance relative to :math:`|S_v|^2` is a small fraction of the unbiased one's.
    With every vertex in the batch both are the exact sum."""
    n, batch, steps = prepared.meta.num_nodes, 3, 3000
    store = RankStore(prepared, Grid4D.view(GridShape.parse("1x1x1x1"), 0), 1, kind=GINLayer.kind)
    features = torch.from_numpy(prepared.features[:]).double()
    ones = torch.ones(n, 1, dtype=torch.float64)
    plane = next(iter(store.blocks))
    full = build_local_spmm(full_block(store.full_graph().blocks[plane]))
    degrees = full.matmul(ones)
    exact = full.matmul(features)
    # q_v = C(N - 1 - d_v, B - 1) / C(N - 1, B - 1): none of v's d_v neighbours among the
    # B - 1 other vertices of a batch that holds v
    others = torch.arange(batch - 1, dtype=torch.float64)
    missed = ((n - 1 - degrees - others) / (n - 1 - others)).clamp(min=0).prod(1, keepdim=True)
    expected = {"unbiased": exact, "degree_mean": (1 - missed) * exact}

    def estimates(sample: torch.Tensor, scaling) -> dict[str, torch.Tensor]:
        adjacency = store.batch(sample, 0, scaling).adjacency[plane]  # A_S / p off-diagonal
        assert torch.equal(adjacency.row_lengths.double(), degrees[sample, 0])
        summed = adjacency.matmul(features.index_select(0, sample))
        count = adjacency.row_sums(ones[: sample.numel()])
        return {
            "unbiased": summed,
            "degree_mean": degree_mean(summed, count, adjacency.row_lengths.double()[:, None]),
        }

    counts, moments = _moments_over_samples(estimates, n, batch, steps)
    connected = degrees.squeeze(1) > 0
    size = exact[connected].square().sum(1)  # |S_v|^2

    def z_score(mean: torch.Tensor, target: torch.Tensor, error: torch.Tensor) -> float:
        return ((mean - target).abs() / error)[connected].mean().item()

    figures = {}
    for name, (mean, square) in moments.items():
        variance = (square - mean**2).clamp(min=1e-12)
        error = (variance / counts).sqrt()
        figures[name] = {
            "z to the sum": z_score(mean, exact, error),
            "z to its expectation": z_score(mean, expected[name], error),
            "relative bias": ((expected[name] - exact)[connected].square().sum(1) / size)
            .sqrt()
            .mean()
            .item(),
            "relative variance": (variance[connected].sum(1) / size).mean().item(),
        }
    print(f"GIN sum estimators at p = {UniformSampler(n, batch).scaling().p:.3f}: {figures}")
    unbiased, by_degree = figures["unbiased"], figures["degree_mean"]
    assert 0.5 < unbiased["z to the sum"] < 1.2
    assert 0.5 < by_degree["z to its expectation"] < 1.2
    assert by_degree["z to the sum"] > 3  # biased: many times its noise
    assert by_degree["relative variance"] < unbiased["relative variance"] / 20
    everything = torch.arange(n)
    for estimate in estimates(everything, UniformSampler(n, n).scaling()).values():
        assert torch.equal(estimate, exact)


def test_gin_settings_on_another_layer_type_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"^model.gin_learn_eps set with model.conv: sage, but"):
        config_from_mapping({"model": {"conv": "sage", "gin_learn_eps": True}})
    with pytest.raises(ConfigError, match=r"^model.gin_eps / model.gin_sum set with"):
        config_from_mapping({"model": {"conv": "gcn", "gin_eps": 0.5, "gin_sum": "unbiased"}})
    assert config_from_mapping({"model": {"conv": "gin", "gin_eps": 0.5}}).model.gin_eps == 0.5
    assert ModelConfig(conv="gin").gin_sum == "degree_mean"
