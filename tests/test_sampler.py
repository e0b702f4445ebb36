"""Sampling is one unit: ``sampling.method`` picks a sampler from the registry, and the
sampler alone decides the vertices of a step and the scaling of their blocks."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from dgl_scalegnn.cli import main
from dgl_scalegnn.config import (
    SAMPLING_METHODS,
    ConfigError,
    SamplingConfig,
    config_from_mapping,
)
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.core.seeds import step_seed
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.sampling.sampler import SAMPLERS, build_sampler
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import sample_vertices
from tests.helpers import random_dataset
from tests.test_conv_and_sampler import _rescaled_node_subgraph

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "dgl_scalegnn"


@pytest.fixture(scope="module")
def prepared():
    return prepare_in_memory(random_dataset(num_nodes=97, num_edges=500), permutation_seed=1)


def test_an_unknown_method_is_refused_in_one_line_naming_the_choices(capsys):
    refusal = "sampling.method: got 'importance'; allowed values are uniform"
    with pytest.raises(ConfigError) as error:
        config_from_mapping({"sampling": {"method": "importance"}})
    assert str(error.value) == refusal
    assert main(["train", "--set", "sampling.method=importance"]) == 2
    assert capsys.readouterr().err == f"scalegnn: error: {refusal}\n"
    assert config_from_mapping({"sampling": {"method": "uniform"}}).sampling.method == "uniform"
    assert SamplingConfig().method == "uniform"
    assert set(SAMPLERS) == set(SAMPLING_METHODS)


def test_the_uniform_sampler_draws_the_trainers_historic_samples():
    """Same vertices as before the sampler was a unit: ``(seed, group, step)`` seeds them."""
    sampler = build_sampler(SamplingConfig(batch_size=13, seed=4), num_nodes=97, group=2)
    for step in range(3):
        expected = sample_vertices(97, 13, step_seed(4, 2, step))
        assert torch.equal(sampler.draw(step), expected)


@pytest.mark.parametrize(("batch_size", "seed"), [(2, 0), (13, 1), (61, 2), (97, 3)])
def test_the_registrys_sampler_scales_the_blocks_as_the_dense_oracle(prepared, batch_size, seed):
    """The store's block, cut from the sampler's vertices with the sampler's scaling,
    equals DGL's induced subgraph with the off-diagonal weights divided by p."""
    n = prepared.meta.num_nodes
    sampler = build_sampler(SamplingConfig(batch_size=batch_size, seed=seed), n)
    store = RankStore(prepared, Grid4D.view(GridShape.parse("1x1x1x1"), 0), num_layers=1)
    vertices = sampler.draw(0)
    batch = store.batch(vertices, 0, sampler.scaling())
    (spmm,) = batch.adjacency.values()
    dense = spmm.matmul(torch.eye(batch_size))
    assert torch.equal(dense, _rescaled_node_subgraph(prepared, vertices))


def _names(path: pathlib.Path) -> set[str]:
    """The names a module reads or imports."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    return {node.id for node in nodes if isinstance(node, ast.Name)} | {
        node.name for node in nodes if isinstance(node, ast.alias)
    }


def test_only_the_uniform_sampler_computes_the_inclusion_probability():
    """No module but ``sampling/uniform.py`` computes p or applies it by hand."""
    formula = {"inclusion_probability", "rescale_off_diagonal"}
    users = sorted(
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if _names(path) & formula
    )
    assert users == ["sampling/uniform.py"]
