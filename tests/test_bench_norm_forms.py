"""The full-batch model of ``benchmarks/bench_norm_forms.py`` against dense oracles."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn import functional

from benchmarks.bench_norm_forms import GCN, FullBatchModel, Graph, rms_scale


def small_graph(seed: int = 0, n: int = 12, features: int = 5, classes: int = 3) -> Graph:
    """A random symmetric graph with self loops, GCN-normalised densely."""
    generator = torch.Generator().manual_seed(seed)
    upper = torch.rand(n, n, generator=generator).triu(1) < 0.3
    adjacency = (upper | upper.T).float() + torch.eye(n)
    inv_sqrt = adjacency.sum(1).rsqrt()
    normalised = inv_sqrt[:, None] * adjacency * inv_sqrt[None, :]
    split = torch.arange(n) % 3
    return Graph(
        adjacency=normalised.to_sparse(),
        features=torch.rand(n, features, generator=generator),
        labels=torch.randint(classes, (n,), generator=generator),
        train=split == 0,
        val=split == 1,
        test=split == 2,
        degree=adjacency.sum(1).long() - 1,
        num_classes=classes,
    )


def test_rms_scales_match_their_definitions() -> None:
    y = torch.randn(7, 4)
    assert torch.allclose(rms_scale(y, "row", 1e-6), functional.rms_norm(y, (4,), eps=1e-6))
    assert torch.allclose(rms_scale(y, "column", 1e-6), functional.rms_norm(y.T, (7,), eps=1e-6).T)
    assert torch.allclose(rms_scale(y, "global", 0.0), y / y.pow(2).mean().sqrt())


@pytest.mark.parametrize("norm", ["none", "row"])
def test_full_batch_model_matches_the_dense_formula(norm: str) -> None:
    graph = small_graph()
    model = FullBatchModel(replace(GCN, norm=norm, hidden=6), 5, 3).eval()
    a, w0, w1 = graph.adjacency.to_dense(), model.weights["first"], model.weights["second"]
    hidden = a @ graph.features @ w0
    if norm == "row":
        hidden = functional.rms_norm(hidden, (6,), weight=model.gains["first"], eps=1e-6)
    expected = a @ torch.relu(hidden) @ w1
    assert torch.allclose(model(graph), expected, atol=1e-6)


def test_paper_form_adds_the_residual_and_the_head() -> None:
    graph = small_graph()
    form = replace(GCN, norm="row", residual=True, head=True, projection=True, hidden=6)
    model = FullBatchModel(form, 5, 3).eval()
    a, weights, gains = graph.adjacency.to_dense(), model.weights, model.gains
    x = graph.features @ weights["projection"]
    for layer in ("first", "second"):
        y = functional.rms_norm(a @ x @ weights[layer], (6,), weight=gains[layer], eps=1e-6)
        x = torch.relu(y) + x
    assert torch.allclose(model(graph), x @ weights["head"], atol=1e-5)


def test_a_large_epsilon_turns_the_norm_into_a_constant_scale() -> None:
    """The switch acts at the default epsilon, and at one far above the activations' mean
    squares it only divides by its root (the benchmark's ``eps 1`` row)."""
    graph = small_graph()
    outputs = {}
    for norm, eps in (("none", 1e-6), ("row", 1e-6), ("row", 1e6)):
        torch.manual_seed(0)
        model = FullBatchModel(replace(GCN, norm=norm, eps=eps, hidden=6), 5, 3).eval()
        outputs[norm, eps] = model(graph)
    plain = outputs["none", 1e-6]
    assert not torch.allclose(outputs["row", 1e-6], plain, rtol=1e-2)
    assert torch.allclose(outputs["row", 1e6] * 1e3, plain, rtol=1e-4, atol=1e-7)
