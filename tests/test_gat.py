"""GAT under uniform vertex sampling: what the softmax over the sampled neighbours
estimates, against the full-graph attention.

A GAT layer (8 heads of 8 columns, DGL's initialisation) on Cora's features (rows scaled
to sum 1): with a sample :math:`S` of the vertices the layer's output at :math:`v \\in S`
is the attention-weighted mean of :math:`z_u` over :math:`(N(v) \\cap S) \\cup \\{v\\}`,
a ratio estimator of the full graph's :math:`P_v`. The logits :math:`e_{uv}` depend on
the edge's ends alone, not on the sample, so one sample's output is the full graph's
edge weights restricted to the sampled edges (checked against the layer's reference on
the sampled subgraph), and many samples' outputs are computed from them at once.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import real_graphs
from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.schedule import layer_widths
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.model.convs.gat import GATLayer
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.sampling.dgl_loader import UniformVertexSampler, norm_graph
from dgl_scalegnn.sampling.uniform import UniformSampler
from tests.helpers import relative_error

#: DGL's GAT example's hidden layer: 8 heads of 8 columns.
MODEL = ModelConfig(
    conv="gat", hidden=64, gat_heads=8, layers=2, input_projection=False, head=False, norm=False
)


@pytest.fixture(scope="module")
def cora_layer():
    """Cora's graph in GAT's normalisation (one self loop a vertex), its features, and
    the first layer's parameters and widths (double precision)."""
    dataset = real_graphs.scaled(real_graphs.load("cora"), "row")
    prepared = prepare_in_memory(dataset, permutation_seed=3)
    graph = norm_graph(prepared_dgl_graph(prepared), GATLayer.kind.normalisation)
    meta = prepared.meta
    model = ScaleGNN(MODEL, in_features=meta.num_features, num_classes=meta.num_classes, seed=0)
    prefix = GATLayer.prefix(0)
    params = {
        name.removeprefix(prefix): value.detach().double()
        for name, value in model.params.items()
        if name.startswith(prefix)
    }
    widths = layer_widths(MODEL, meta.num_features, meta.num_classes)[0]
    features = torch.from_numpy(prepared.features[:]).double()
    return graph, features, params, widths


def _edge_terms(graph, features, params, widths):
    """Each edge's unnormalised attention :math:`\\exp(e_{uv} - \\max_u e_{uv})` ``(E,
    H)`` and the sources' :math:`z_u` ``(E, H, F)``: what every sample's output is made of."""
    heads = GATLayer.num_heads(widths, MODEL)
    z = (features @ params["weight"]).view(features.shape[0], heads, -1)
    score_l = (z * params["attn_l"].view(1, heads, -1)).sum(-1)
    score_r = (z * params["attn_r"].view(1, heads, -1)).sum(-1)
    src, dst = graph.edges()
    logits = torch.nn.functional.leaky_relu(score_l[src] + score_r[dst], MODEL.gat_negative_slope)
    peak = torch.full((graph.num_nodes(), heads), -torch.inf, dtype=logits.dtype)
    peak = peak.scatter_reduce(0, dst[:, None].expand_as(logits), logits, reduce="amax")
    return (logits - peak[dst]).exp(), z[src], src, dst


def _sampled_output(terms, sample: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """The layer's output (before its bias) at the vertices of ``sample``, in its order:
    the softmax over the edges between sampled vertices."""
    weights, z_src, src, dst = terms
    member = torch.zeros(num_nodes, dtype=torch.bool)
    member[sample] = True
    kept = member[src] & member[dst]
    w, rows = weights[kept], dst[kept]
    numerator = torch.zeros(num_nodes, *z_src.shape[1:], dtype=w.dtype)
    numerator.index_add_(0, rows, w.unsqueeze(-1) * z_src[kept])
    total = torch.zeros(num_nodes, w.shape[1], dtype=w.dtype).index_add_(0, rows, w)
    return (numerator / total.unsqueeze(-1))[sample].flatten(1)


def _figures(
    terms, full: torch.Tensor, own: torch.Tensor, batch: int, steps: int
) -> dict[str, float]:
    """Over ``steps`` samples of ``batch`` vertices: the mean relative error of a sampled
    output, the mean relative bias of its average over the samples holding the vertex,
    the root mean square bias in standard errors of those averages, and how far the
    averages are from the vertices' own ``z_v`` (``own``) against the full outputs."""
    n = full.shape[0]
    sampler = UniformSampler(n, batch, seed=5)
    total, square = torch.zeros_like(full), torch.zeros_like(full)
    counts = torch.zeros(n, 1, dtype=full.dtype)
    errors = []
    size = full.norm(dim=1)
    for step in range(steps):
        sample = sampler.draw(step)
        out = _sampled_output(terms, sample, n)
        total.index_add_(0, sample, out)
        square.index_add_(0, sample, out.square())
        counts[sample] += 1
        errors.append((out - full[sample]).norm(dim=1) / size[sample])
    seen = counts[:, 0] >= 10
    mean = total / counts
    variance = (square / counts - mean.square()).clamp(min=0).sum(1)
    bias = (mean - full).norm(dim=1)
    standard_error = (variance / counts[:, 0]).sqrt()
    return {
        "p": sampler.scaling().p,
        "relative error": torch.cat(errors).mean().item(),
        "relative bias": (bias / size)[seen].mean().item(),
        "bias in standard errors": (bias[seen].square().sum() / standard_error[seen].square().sum())
        .sqrt()
        .item(),
        "distance to z_v, against the full output's": (
            (mean - own).norm(dim=1)[seen].sum() / (full - own).norm(dim=1)[seen].sum()
        ).item(),
    }


def test_gat_attention_over_sampled_neighbours_is_a_biased_ratio_estimator(cora_layer):
    """At p = 0.1 and 0.3 the sampled attention's output is off the full graph's by its
    variance and by a bias many standard errors large, towards the vertex's own
    :math:`z_v`, both shrinking as p grows; with every vertex sampled it is the full
    graph's."""
    graph, features, params, widths = cora_layer
    n = graph.num_nodes()
    full = GATLayer.reference(params, graph, features, "w", widths, MODEL)[0]
    terms = _edge_terms(graph, features, params, widths)
    sample = UniformSampler(n, 271, seed=1).draw(0)
    subgraph = UniformVertexSampler().sample(graph, sample)
    on_subgraph = GATLayer.reference(params, subgraph, features[sample], "w", widths, MODEL)[0]
    assert relative_error(_sampled_output(terms, sample, n), on_subgraph) < 1e-12
    assert relative_error(_sampled_output(terms, torch.arange(n), n), full) < 1e-12

    # each vertex in about 20 samples at either rate
    own = features @ params["weight"]  # z_v, the self loop's term
    figures = {
        share: _figures(terms, full, own, round(share * n), round(20 / share))
        for share in (0.1, 0.3)
    }
    print(f"GAT layer on Cora under uniform vertex sampling: {figures}")
    sparse, dense = figures[0.1], figures[0.3]
    assert dense["relative error"] < sparse["relative error"]
    assert dense["relative bias"] < sparse["relative bias"]
    assert dense["bias in standard errors"] > 3  # biased: many times its noise
    # towards the vertex's own z_v: the self loop's share of the attention is too large
    assert sparse["distance to z_v, against the full output's"] < 0.5
    assert dense["distance to z_v, against the full output's"] < 1
