"""Tests of the synthetic graph generator (:mod:`dgl_scalegnn.data.synthetic`)."""

from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ConfigError, SyntheticConfig
from dgl_scalegnn.data import synthetic
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.data.synthetic import FEATURELESS_CLASSES, FEATURELESS_DIM, generate

SMALL = SyntheticConfig(num_nodes=4000, num_features=16, num_classes=4, seed=3)
NDATA = ("feat", "label", "train_mask", "val_mask", "test_mask")
#: Largest gap allowed between the measured edge homophily and the model's expectation
#: ``h + (1 - h) * sum_c s_c**2`` (``s_c``: class share of the degree sum). Merging
#: parallel edges removes slightly more same-class draws, so the measured value sits
#: about 0.01 below the expectation at the defaults.
HOMOPHILY_TOLERANCE = 0.03


@pytest.fixture(scope="module")
def default_data() -> NodeDataset:
    return generate(SyntheticConfig())


@pytest.fixture(scope="module")
def featureless_data() -> NodeDataset:
    return generate(dataclasses.replace(SMALL, featureless=True))


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: the models are small, and on a shared 2-core machine a
    second OpenMP thread competing with other processes slows training several-fold."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _edge_keys(graph: dgl.DGLGraph) -> np.ndarray:
    src, dst = (t.numpy() for t in graph.edges())
    return src * graph.num_nodes() + dst


def _degrees(graph: dgl.DGLGraph) -> np.ndarray:
    return np.bincount(graph.edges()[0].numpy(), minlength=graph.num_nodes())


def _edge_homophily(data: NodeDataset) -> tuple[float, float]:
    """Measured fraction of same-class edges and the generator's expectation for it."""
    src, dst = data.graph.edges()
    label = data.graph.ndata["label"]
    measured = (label[src] == label[dst]).double().mean().item()
    degree = torch.from_numpy(_degrees(data.graph)).double()
    share = torch.bincount(label, weights=degree, minlength=data.num_classes) / degree.sum()
    return measured, float((share**2).sum())


def test_docstring_example_runs():
    assert doctest.testmod(synthetic, raise_on_error=True).attempted > 0


def test_same_config_gives_identical_dataset():
    first, second = generate(SMALL), generate(SMALL)
    assert first.name == "synthetic" and first.num_classes == SMALL.num_classes
    assert np.array_equal(_edge_keys(first.graph), _edge_keys(second.graph))
    for key in NDATA:
        assert torch.equal(first.graph.ndata[key], second.graph.ndata[key]), key
    other = generate(dataclasses.replace(SMALL, seed=SMALL.seed + 1))
    assert not torch.equal(first.graph.ndata["feat"], other.graph.ndata["feat"])


def test_dtypes_and_shapes():
    data = generate(SMALL)
    ndata = data.graph.ndata
    assert ndata["feat"].dtype == torch.float32
    assert tuple(ndata["feat"].shape) == (SMALL.num_nodes, SMALL.num_features)
    assert ndata["label"].dtype == torch.int64
    assert set(ndata["label"].unique().tolist()) == set(range(SMALL.num_classes))
    assert data.graph.idtype == torch.int64


def test_edges_are_symmetric_simple_and_about_the_requested_count(default_data):
    graph, cfg = default_data.graph, SyntheticConfig()
    src, dst = (t.numpy() for t in graph.edges())
    keys = _edge_keys(graph)
    assert not np.any(src == dst), "self loops are dropped"
    assert np.unique(keys).size == keys.size, "parallel edges are merged"
    assert np.array_equal(np.sort(keys), np.sort(dst * graph.num_nodes() + src))
    mean_degree = graph.num_edges() / graph.num_nodes()
    assert 0.9 * cfg.avg_degree <= mean_degree <= cfg.avg_degree


def test_degrees_are_heavy_tailed(default_data):
    degree = np.sort(_degrees(default_data.graph))[::-1]
    assert degree[0] > 10 * degree.mean()
    top_percent = degree[: degree.size // 100].sum() / degree.sum()
    assert top_percent > 0.1, "the top 1% of vertices hold over 10% of the edge ends"


@pytest.mark.parametrize("homophily", [0.0, 0.3, SyntheticConfig().homophily])
def test_edge_homophily_matches_the_model(homophily):
    data = generate(dataclasses.replace(SMALL, homophily=homophily))
    measured, chance = _edge_homophily(data)
    expected = homophily + (1 - homophily) * chance
    assert abs(measured - expected) < HOMOPHILY_TOLERANCE


def test_full_homophily_keeps_every_edge_inside_its_class():
    measured, _ = _edge_homophily(generate(dataclasses.replace(SMALL, homophily=1.0)))
    assert measured == 1.0


def test_masks_are_disjoint_cover_and_have_the_fractions(default_data):
    cfg, ndata = SyntheticConfig(), default_data.graph.ndata
    masks = torch.stack([ndata[key] for key in ("train_mask", "val_mask", "test_mask")])
    assert torch.equal(masks.sum(0), torch.ones(cfg.num_nodes, dtype=torch.int64))
    counts = masks.sum(1).tolist()
    assert counts[0] == round(cfg.train_fraction * cfg.num_nodes)
    assert counts[1] == round(cfg.val_fraction * cfg.num_nodes)


def test_featureless_has_random_features_and_degree_bucket_classes(featureless_data):
    data = featureless_data
    assert data.name == "synthetic-featureless"
    assert data.num_features == FEATURELESS_DIM and data.num_classes == FEATURELESS_CLASSES
    label = data.graph.ndata["label"].numpy()
    sizes = np.bincount(label, minlength=FEATURELESS_CLASSES)
    assert sizes.size == FEATURELESS_CLASSES
    assert sizes.max() - sizes.min() <= 1
    degree = _degrees(data.graph)
    highest = np.array([degree[label == c].max() for c in range(FEATURELESS_CLASSES)])
    lowest = np.array([degree[label == c].min() for c in range(FEATURELESS_CLASSES)])
    assert np.all(highest[:-1] <= lowest[1:]), "a higher class never has a lower degree"
    assert np.corrcoef(label, np.argsort(np.argsort(degree)))[0, 1] > 0.9


def test_featureless_keeps_the_graph(featureless_data):
    assert np.array_equal(_edge_keys(featureless_data.graph), _edge_keys(generate(SMALL).graph))


@pytest.mark.parametrize(
    ("key", "value"),
    [("avg_degree", 0.0), ("degree_exponent", 1.0), ("homophily", 1.5), ("feature_noise", -1.0)],
)
def test_unusable_parameters_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        generate(dataclasses.replace(SMALL, **{key: value}))


class _GCN(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = dgl.nn.GraphConv(in_dim, hidden, norm="both", activation=F.relu)
        self.conv2 = dgl.nn.GraphConv(hidden, classes, norm="both")

    def forward(self, graph: dgl.DGLGraph, feat: torch.Tensor) -> torch.Tensor:
        return self.conv2(graph, self.conv1(graph, feat))


class _MLP(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, graph: dgl.DGLGraph, feat: torch.Tensor) -> torch.Tensor:
        return self.layers(feat)


def _accuracies(model: nn.Module, graph: dgl.DGLGraph) -> tuple[float, float]:
    """Validation and test accuracy of ``model`` in evaluation mode."""
    ndata = graph.ndata
    model.eval()
    with torch.no_grad():
        correct = model(graph, ndata["feat"]).argmax(1) == ndata["label"]
    model.train()
    val, test = (correct[ndata[key]].double().mean().item() for key in ("val_mask", "test_mask"))
    return val, test


def _test_accuracy(model: nn.Module, graph: dgl.DGLGraph, epochs: int = 100) -> float:
    """Full-graph Adam training on the train mask; test accuracy at the best validation
    accuracy (checked every 10 epochs), so that neither model is judged overfitted."""
    ndata = graph.ndata
    feat, label, train = ndata["feat"], ndata["label"], ndata["train_mask"]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, test_at_best = -1.0, 0.0
    for epoch in range(1, epochs + 1):
        loss = F.cross_entropy(model(graph, feat)[train], label[train])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if epoch % 10 == 0:
            val, test = _accuracies(model, graph)
            if val > best_val:
                best_val, test_at_best = val, test
    return test_at_best


@pytest.mark.usefixtures("one_torch_thread")
def test_gcn_beats_mlp_on_the_default_graph(default_data):
    graph = dgl.add_self_loop(default_data.graph)
    sizes = (default_data.num_features, 64, default_data.num_classes)
    accuracy = {}
    for name, model_class in (("gcn", _GCN), ("mlp", _MLP)):
        torch.manual_seed(0)
        accuracy[name] = _test_accuracy(model_class(*sizes), graph)
    chance = 1 / default_data.num_classes
    assert accuracy["gcn"] >= accuracy["mlp"] + 0.10, accuracy
    assert chance + 0.4 < accuracy["gcn"] < 0.97, accuracy
    assert chance + 0.1 < accuracy["mlp"] < 0.9, accuracy
