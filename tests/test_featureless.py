"""``data.featureless``: the paper's recipe for graphs without features, on any dataset."""

from __future__ import annotations

import numpy as np
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import DataConfig, SyntheticConfig
from dgl_scalegnn.data.cache import cache_settings
from dgl_scalegnn.data.datasets import load_dataset
from dgl_scalegnn.data.featureless import FEATURELESS_CLASSES, FEATURELESS_DIM
from tests.helpers import SHARED_DATA


def _star_and_chain(n: int = 640) -> dgl.DGLGraph:
    """Vertex 0 joined to every other vertex, plus a chain: degrees spread widely."""
    hub = torch.zeros(n - 1, dtype=torch.int64)
    rest = torch.arange(1, n)
    src = torch.cat((hub, rest[:-1]))
    dst = torch.cat((rest, rest[1:]))
    graph = dgl.to_bidirected(dgl.graph((src, dst), num_nodes=n))
    split = torch.arange(n) % 3
    for index, key in enumerate(("train_mask", "val_mask", "test_mask")):
        graph.ndata[key] = split == index
    return graph


def test_recipe_labels_a_graph_without_labels_by_degree_quantile(tmp_path):
    graph = _star_and_chain()
    path = tmp_path / "graph.bin"
    dgl.save_graphs(str(path), [graph])  # no feat, no label
    dataset = load_dataset(DataConfig(name="dgl", path=str(path), featureless=True))
    feat, label = dataset.graph.ndata["feat"], dataset.graph.ndata["label"]
    n = graph.num_nodes()
    assert feat.shape == (n, FEATURELESS_DIM) and feat.dtype == torch.float32
    assert abs(float(feat.mean())) < 0.02 and abs(float(feat.std()) - 1.0) < 0.02
    assert dataset.num_classes == FEATURELESS_CLASSES
    counts = torch.bincount(label, minlength=FEATURELESS_CLASSES)
    assert set(counts.tolist()) <= {n // FEATURELESS_CLASSES, -(-n // FEATURELESS_CLASSES)}
    # independent oracle: class = floor(32 * rank / n) of the degree, ties in any order
    degree = (graph.in_degrees() + graph.out_degrees()).numpy()
    for cls in range(FEATURELESS_CLASSES - 1):
        assert degree[label.numpy() == cls].max() <= degree[label.numpy() == cls + 1].min()
    assert label[0] == FEATURELESS_CLASSES - 1  # the hub


def test_recipe_keeps_the_labels_a_graph_has_and_replaces_its_features(monkeypatch):
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(SHARED_DATA))
    cora = load_dataset(DataConfig(name="cora"))
    recipe = load_dataset(DataConfig(name="cora", featureless=True))
    assert torch.equal(recipe.graph.ndata["label"], cora.graph.ndata["label"])
    assert recipe.num_classes == cora.num_classes
    assert recipe.graph.ndata["feat"].shape == (cora.num_nodes, FEATURELESS_DIM)
    again = load_dataset(DataConfig(name="cora", featureless=True))
    assert torch.equal(again.graph.ndata["feat"], recipe.graph.ndata["feat"])
    other = load_dataset(DataConfig(name="cora", featureless=True, permutation_seed=1))
    assert not torch.equal(other.graph.ndata["feat"], recipe.graph.ndata["feat"])


def test_recipe_on_the_generator_is_its_own_featureless_mode():
    synthetic = SyntheticConfig(num_nodes=800, num_features=16)
    via_data = load_dataset(DataConfig(name="synthetic", featureless=True, synthetic=synthetic))
    own = load_dataset(
        DataConfig(
            name="synthetic",
            synthetic=SyntheticConfig(**{**synthetic.__dict__, "featureless": True}),
        )
    )
    for key in ("feat", "label"):
        assert np.array_equal(via_data.graph.ndata[key].numpy(), own.graph.ndata[key].numpy())


def test_recipe_is_part_of_the_cache_key():
    plain = cache_settings(DataConfig(name="cora"))
    recipe = cache_settings(DataConfig(name="cora", featureless=True))
    assert plain != recipe
