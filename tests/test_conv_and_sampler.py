"""GCN convolution against DGL's GraphConv, and the sampler against dgl.node_subgraph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.core.layout import Axis, Layout
from dgl_scalegnn.data.normalize import gcn_normalize, renormalize_block
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.tiles import read_block, tile_adjacency
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.parallel.partition import RowPartition, ShardSpec
from dgl_scalegnn.parallel.products import parallel_linear, parallel_linear_sum, parallel_spmm
from dgl_scalegnn.parallel.spmm import SPMM_KERNELS, build_local_spmm
from dgl_scalegnn.sampling.blocks import extract_block, full_block
from dgl_scalegnn.sampling.dgl_loader import UniformVertexSampler, norm_graph
from dgl_scalegnn.sampling.store import RankStore, load_csr_block
from dgl_scalegnn.sampling.uniform import inclusion_probability, sample_vertices
from tests.helpers import random_dataset

XYZ = Layout(Axis.X, Axis.Y, Axis.Z)


def _graphconv_reference_graph(graph: dgl.DGLGraph) -> dgl.DGLGraph:
    """A + I built with DGL's own transforms: drop loops, add reverse edges, merge, add loops."""
    simple = dgl.to_simple(dgl.add_reverse_edges(dgl.remove_self_loop(graph)))
    return dgl.add_self_loop(simple)


@pytest.mark.parametrize("kernel", SPMM_KERNELS)
def test_gcn_conv_equals_dgl_graphconv(kernel):
    dataset = random_dataset(num_nodes=60, num_edges=200, isolated=5)
    graph = dataset.graph
    n, d_in, d_out = graph.num_nodes(), 7, 5
    src, dst = (t.numpy() for t in graph.edges())
    csr = gcn_normalize(src, dst, n, dtype=np.float64)
    block, _ = load_csr_block(tile_adjacency(csr, tile_count=4), (0, n), (0, n))
    adjacency = build_local_spmm(full_block(block), kernel)

    torch.manual_seed(0)
    features = torch.randn(n, d_in, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(d_in, d_out, dtype=torch.float64, requires_grad=True)
    runtime = Runtime.single_process()
    spec = ShardSpec(XYZ, RowPartition.of(torch.arange(n), n, GridShape(1, 1, 1, 1)), d_in)
    aggregated, spec = parallel_spmm(features, adjacency, spec, runtime)
    ours, _ = parallel_linear(aggregated, weight, spec, d_out, runtime)
    upstream = torch.randn(n, d_out, dtype=torch.float64)
    (ours * upstream).sum().backward()

    conv = dgl.nn.GraphConv(d_in, d_out, norm="both", weight=True, bias=False).double()
    with torch.no_grad():
        conv.weight.copy_(weight)
    ref_features = features.detach().clone().requires_grad_()
    theirs = conv(_graphconv_reference_graph(graph), ref_features)
    (theirs * upstream).sum().backward()

    assert torch.allclose(ours, theirs, rtol=0, atol=1e-8)
    assert torch.allclose(features.grad, ref_features.grad, rtol=0, atol=1e-8)
    assert torch.allclose(weight.grad, conv.weight.grad, rtol=0, atol=1e-8)


@pytest.mark.parametrize("first_needs_grad", [False, True])
def test_parallel_linear_sum_is_the_product_of_the_joined_matrices(first_needs_grad):
    """:math:`X_1 W_1 + X_2 W_2` and its gradients, against autograd through
    :math:`[X_1 | X_2] [W_1; W_2]` (float64), also where the first operand needs none."""
    generator = torch.Generator().manual_seed(0)
    n, widths, d_out = 9, (3, 4), 5
    xs = [torch.randn(n, w, dtype=torch.float64, generator=generator) for w in widths]
    ws = [torch.randn(w, d_out, dtype=torch.float64, generator=generator) for w in widths]
    xs[0].requires_grad_(first_needs_grad)
    xs[1].requires_grad_()
    for w in ws:
        w.requires_grad_()
    runtime = Runtime.single_process()
    spec = ShardSpec(XYZ, RowPartition.of(torch.arange(n), n, GridShape(1, 1, 1, 1)), sum(widths))
    ours, out_spec = parallel_linear_sum(list(zip(xs, ws)), spec, d_out, runtime)
    upstream = torch.randn(n, d_out, dtype=torch.float64, generator=generator)
    ours_grads = torch.autograd.grad(
        (ours * upstream).sum(), [t for t in (*xs, *ws) if t.requires_grad]
    )
    joined = torch.cat(xs, dim=1) @ torch.cat(ws, dim=0)
    theirs_grads = torch.autograd.grad(
        (joined * upstream).sum(), [t for t in (*xs, *ws) if t.requires_grad]
    )
    assert out_spec.layout == XYZ.after_linear() and out_spec.num_cols == d_out
    torch.testing.assert_close(ours, joined, rtol=0, atol=1e-12)
    for got, expected in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bias", [False, True])
def test_model_without_projection_and_head_is_dgls_graphconv_stack(bias):
    """``input_projection: false, head: false`` without norm or residual is Kipf &
    Welling's GCN: DGL's GraphConv (symmetric norm, with or without bias as ``bias``
    says), ReLU, GraphConv."""
    dataset = random_dataset(num_nodes=60, num_edges=200, isolated=5)
    d_in, hidden, classes = 7, 6, 4
    cfg = ModelConfig(
        hidden=hidden,
        layers=2,
        dropout=0.0,
        norm=False,
        residual=False,
        input_projection=False,
        head=False,
        bias=bias,
    )
    model = ScaleGNN(cfg, in_features=d_in, num_classes=classes, seed=0).double()
    weights = ["layer0_weight", "layer1_weight"]
    assert sorted(model.params) == sorted(weights + (["layer0_bias", "layer1_bias"] * bias))
    with torch.no_grad():  # biases start at zero: move them so that a missing one shows
        for name, param in model.params.items():
            if name.endswith("_bias"):
                assert not param.any()
                param.uniform_(-1.0, 1.0)
    features = torch.randn(60, d_in, dtype=torch.float64)
    ours = model(norm_graph(dataset.graph), features)

    convs = [
        dgl.nn.GraphConv(a, b, norm="both", bias=bias).double()
        for a, b in ((d_in, hidden), (hidden, classes))
    ]
    reference_graph = _graphconv_reference_graph(dataset.graph)
    with torch.no_grad():
        for index, conv in enumerate(convs):
            conv.weight.copy_(model.params[f"layer{index}_weight"])
            if bias:
                conv.bias.copy_(model.params[f"layer{index}_bias"])
        theirs = convs[1](reference_graph, torch.relu(convs[0](reference_graph, features)))
    assert ours.shape == (60, classes)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-6)  # float32 edge weights


def _dense_case(d_in: int) -> tuple[dgl.DGLGraph, torch.Tensor, torch.Tensor]:
    """A GCN-normalised random graph of 60 vertices, its dense float64 adjacency (rows:
    destinations) and float64 features of width ``d_in``."""
    dataset = random_dataset(num_nodes=60, num_edges=200, isolated=5)
    graph = norm_graph(dataset.graph)
    src, dst = graph.edges()
    adjacency = torch.zeros(60, 60, dtype=torch.float64)
    adjacency.index_put_((dst, src), graph.edata["w"].double(), accumulate=True)
    return graph, adjacency, torch.randn(60, d_in, dtype=torch.float64)


def test_aggregated_residual_and_final_norm_against_dense_formula():
    """``residual_from: aggregated`` adds A H (not H) after the tail and ``final_norm``
    normalises the head's input: the reference model equals the dense formula, and each
    switch alone changes the logits."""
    d_in, hidden, classes = 7, 6, 4
    graph, adjacency, features = _dense_case(d_in)

    def logits(**switches) -> tuple[torch.Tensor, ScaleGNN]:
        cfg = ModelConfig(hidden=hidden, layers=2, dropout=0.0, **switches)
        model = ScaleGNN(cfg, in_features=d_in, num_classes=classes, seed=0).double()
        with torch.no_grad():  # gains away from 1, so that a missing gain shows
            for name, param in model.params.items():
                if "gain" in name:
                    param.uniform_(0.5, 1.5)
        return model(graph, features), model

    def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * gain

    ours, model = logits(residual_from="aggregated", final_norm=True)
    params = {name: param.detach() for name, param in model.params.items()}
    hidden_rows = features @ params["input_proj"]
    for layer in range(2):
        aggregated = adjacency @ hidden_rows
        out = rms_norm(aggregated @ params[f"layer{layer}_weight"], params[f"layer{layer}_gain"])
        hidden_rows = torch.relu(out) + aggregated
    expected = rms_norm(hidden_rows, params["final_gain"]) @ params["head"]
    assert torch.allclose(ours, expected, rtol=0, atol=1e-5)  # float32 edge weights
    without_final_norm, _ = logits(residual_from="aggregated")
    from_input, _ = logits(final_norm=True)
    for other in (without_final_norm, from_input):
        assert (ours - other).abs().max() > 1e-2


def test_biases_of_the_paper_model_against_dense_formula():
    """``bias: true`` adds a bias to the projection, to each layer before its RMSNorm and
    to the head: the reference model equals the dense formula with every bias."""
    d_in, hidden, classes = 7, 6, 4
    graph, adjacency, features = _dense_case(d_in)
    cfg = ModelConfig(hidden=hidden, layers=2, dropout=0.0, bias=True)
    model = ScaleGNN(cfg, in_features=d_in, num_classes=classes, seed=0).double()
    with torch.no_grad():
        for name, param in model.params.items():
            if name.endswith("_bias"):
                param.uniform_(-1.0, 1.0)
    params = {name: param.detach() for name, param in model.params.items()}
    assert sorted(n for n in params if n.endswith("_bias")) == [
        "head_bias",
        "input_proj_bias",
        "layer0_bias",
        "layer1_bias",
    ]
    hidden_rows = features @ params["input_proj"] + params["input_proj_bias"]
    for layer in range(2):
        out = (
            adjacency @ hidden_rows @ params[f"layer{layer}_weight"] + params[f"layer{layer}_bias"]
        )
        out = (
            out / torch.sqrt(out.pow(2).mean(1, keepdim=True) + 1e-6) * params[f"layer{layer}_gain"]
        )
        hidden_rows = torch.relu(out) + hidden_rows
    expected = hidden_rows @ params["head"] + params["head_bias"]
    assert torch.allclose(model(graph, features), expected, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def prepared():
    return prepare_in_memory(random_dataset(num_nodes=97, num_edges=500), permutation_seed=1)


@pytest.mark.parametrize("normalisation", ["symmetric", "sum"])
@pytest.mark.parametrize(
    "rows, cols", [((0, 97), (0, 97)), ((13, 61), (40, 97)), ((50, 51), (0, 30))]
)
def test_a_block_keeps_no_values_and_gives_the_stored_ones_bit_for_bit(
    prepared, normalisation, rows, cols
):
    """The oracle: the values as prepared and stored in tiles (``read_block``), renormalised
    by :func:`renormalize_block`; the block keeps only the scales and rebuilds them."""
    adjacency = prepared.adjacency
    block, _ = load_csr_block(adjacency, rows, cols, normalisation=normalisation)
    read = read_block(adjacency, rows, cols)
    stored = renormalize_block(
        read.indptr,
        read.indices,
        read.values,
        rows[0],
        adjacency.degrees[rows[0] : rows[1]],
        adjacency.degrees[cols[0] : cols[1]],
        normalisation,
    )
    assert not hasattr(block, "values")
    assert torch.equal(block.indptr, torch.from_numpy(stored.indptr))
    entry_rows = torch.repeat_interleave(torch.arange(rows[1] - rows[0]), torch.diff(block.indptr))
    rebuilt = block.values_at(entry_rows, block.indices)
    assert rebuilt.numel() > 0 and torch.equal(rebuilt, torch.from_numpy(stored.values))
    assert torch.equal(full_block(block).values, rebuilt)


def _rescaled_node_subgraph(prepared, sample: torch.Tensor) -> torch.Tensor:
    """Independent oracle: DGL's induced subgraph, off-diagonal weights divided by p."""
    sub = dgl.node_subgraph(prepared_dgl_graph(prepared), sample)
    src, dst = sub.edges()
    p = (sample.numel() - 1) / (prepared.meta.num_nodes - 1)
    weight = torch.where(src == dst, sub.edata["w"], sub.edata["w"] / p)
    dense = torch.zeros(sample.numel(), sample.numel())
    dense.index_put_((dst, src), weight, accumulate=True)
    return dense


@pytest.mark.parametrize("batch_size", [2, 10, 61, 97])
def test_sampled_block_equals_rescaled_node_subgraph(prepared, batch_size):
    n = prepared.meta.num_nodes
    sample = sample_vertices(n, batch_size, seed=5)
    expected = _rescaled_node_subgraph(prepared, sample)
    block = extract_block(
        load_csr_block(prepared.adjacency, (0, n), (0, n))[0],
        sample,
        inclusion_probability(n, batch_size),
    )
    assert torch.equal(block.dense(), expected)
    # The dgl.dataloading.Sampler gives the same subgraph.
    sub = UniformVertexSampler().sample(prepared_dgl_graph(prepared), sample)
    dense = torch.zeros(batch_size, batch_size)
    src, dst = sub.edges()
    dense.index_put_((dst, src), sub.edata["w"], accumulate=True)
    assert torch.equal(dense, expected)


GRIDS = ["1x1x1x1", "1x2x1x1", "1x1x2x1", "1x1x1x2", "1x2x2x1", "1x2x2x2", "1x1x3x2", "1x3x2x4"]


@pytest.mark.parametrize("grid", GRIDS)
def test_rank_blocks_put_together_equal_the_single_process_subgraph(prepared, grid):
    """Every rank builds its blocks alone; the union over ranks is the whole Ã_S.

    Each rank keeps its column maps across the steps, as in training.
    """
    shape = GridShape.parse(grid)
    n = prepared.meta.num_nodes
    for layers in (1, 3):
        stores = [
            RankStore(prepared, Grid4D.view(shape, r), layers) for r in range(shape.world_size)
        ]
        for step, batch_size in enumerate((13, 50, 97, 2, 13)):
            sample = sample_vertices(n, batch_size, seed=100 + step)
            expected = _rescaled_node_subgraph(prepared, sample)
            rows = RowPartition.of(sample, n, shape)
            p = inclusion_probability(n, batch_size)
            for plane in stores[0].blocks:
                assembled = torch.full((batch_size, batch_size), float("nan"))
                for store in stores:
                    block = extract_block(store.blocks[plane], sample, p, store.column_map(plane))
                    r0, _ = rows.range(plane.rows, store.grid.coord(plane.rows))
                    c0, _ = rows.range(plane.cols, store.grid.coord(plane.cols))
                    local = block.dense()
                    target = assembled[r0 : r0 + local.shape[0], c0 : c0 + local.shape[1]]
                    seen = ~torch.isnan(target)
                    assert torch.equal(target[seen], local[seen])  # replicas agree
                    target.copy_(local)
                assert not torch.isnan(assembled).any()
                assert torch.equal(assembled, expected)


@pytest.mark.parametrize("batch_size", [3, 40])
def test_kernels_agree_on_sampled_blocks(prepared, batch_size):
    n = prepared.meta.num_nodes
    shape = GridShape.parse("1x3x2x1")
    sample = sample_vertices(n, batch_size, seed=11)
    store = RankStore(prepared, Grid4D.view(shape, 4), 2)
    for csr in store.blocks.values():
        block = extract_block(csr, sample, inclusion_probability(n, batch_size))
        dense = block.dense()
        features = torch.randn(block.num_cols, 6)
        grads = torch.randn(block.num_rows, 6)
        for kernel in SPMM_KERNELS:
            spmm = build_local_spmm(block, kernel)
            assert torch.allclose(spmm.matmul(features), dense @ features, atol=1e-5)
            assert torch.allclose(spmm.matmul_t(grads), dense.t() @ grads, atol=1e-5)


def test_sampled_aggregation_is_unbiased():
    """E[(Ã_S x)_v | v in S] = (A x)_v. Tolerance: 5 standard errors of the Monte-Carlo mean.

    Without the 1/p rescaling the same check fails, so the test can tell bias apart.
    """
    dataset = random_dataset(num_nodes=60, num_edges=300, isolated=2, seed=3)
    prepared = prepare_in_memory(dataset, permutation_seed=0)
    n, batch_size, samples = 60, 20, 1500
    csr = load_csr_block(prepared.adjacency, (0, n), (0, n))[0]
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    full = full_block(csr).dense() @ x
    p = inclusion_probability(n, batch_size)
    sums = {True: torch.zeros(n, dtype=torch.float64), False: torch.zeros(n, dtype=torch.float64)}
    squares = {k: torch.zeros(n, dtype=torch.float64) for k in sums}
    counts = torch.zeros(n, dtype=torch.float64)
    for seed in range(samples):
        sample = sample_vertices(n, batch_size, seed)
        for rescaled in (True, False):
            block = extract_block(csr, sample, p if rescaled else 1.0)
            estimate = (block.dense() @ x[sample]).double()
            sums[rescaled][sample] += estimate
            squares[rescaled][sample] += estimate**2
        counts[sample] += 1
    for rescaled, expect_pass in ((True, True), (False, False)):
        mean = sums[rescaled] / counts
        variance = squares[rescaled] / counts - mean**2
        standard_error = (variance.clamp(min=0) / counts).sqrt()
        within = (mean - full.double()).abs() <= 5 * standard_error + 1e-6
        assert bool(within.all()) == expect_pass


def test_sampler_trains_in_a_plain_dgl_loop(prepared):
    """UniformVertexSampler in dgl.dataloading.DataLoader with the single-process model."""
    from dgl_scalegnn.config import ModelConfig
    from dgl_scalegnn.model.reference import ScaleGNN

    graph = prepared_dgl_graph(prepared)
    features = torch.from_numpy(np.asarray(prepared.features))
    labels = torch.from_numpy(np.asarray(prepared.labels))
    train = torch.from_numpy(np.asarray(prepared.train_mask))
    loader = dgl.dataloading.DataLoader(
        graph, torch.arange(graph.num_nodes()), UniformVertexSampler(), batch_size=40, shuffle=True
    )
    model = ScaleGNN(
        ModelConfig(hidden=16, layers=2, dropout=0.0), in_features=11, num_classes=5, seed=0
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(30):
        for subgraph in loader:
            ids = subgraph.ndata[dgl.NID]
            logits = model(subgraph, features[ids], vertex_ids=ids)
            mask = train[ids]
            loss = torch.nn.functional.cross_entropy(logits[mask], labels[ids][mask])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
    assert np.mean(losses[-6:]) < 0.5 * np.mean(losses[:6])
