"""The 3D-parallel model equals the single-process DGL oracle on every grid shape.

N = 97, d_in = 11, hidden = 13, classes = 5 are divisible by none of the axis sizes;
dropout is on; L = 1..4 crosses the layer-rotation period. Ranks are real processes
talking over gloo. The paper's model (RMSNorm, residual) runs on every grid; the GCN
stack (no norm, no residual, input dropout), the models without input projection or
head, the aggregated residual with the final norm, and multi-label data (binary
cross-entropy) each on one grid of four ranks or eight (1x2x2x2; 2x1x2x1 has Gd = 2).
"""

from __future__ import annotations

import json

import pytest
import torch

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.model.stack import parameter_shards
from tests.helpers import random_dataset, relative_error
from tests.oracle import assemble, reference_step
from tests.ranks import spawn_ranks

GRAPH = {"num_nodes": 97, "num_edges": 400, "num_features": 11, "num_classes": 5}
MODEL = {"hidden": 13, "dropout": 0.3}
BATCH = 61
LAYERS = [1, 2, 3, 4]
TOLERANCE = 1e-5
GRIDS = ["1x1x1x1", "1x2x1x1", "1x1x2x1", "1x1x1x2", "1x2x2x1", "1x2x2x2", "1x1x3x2", "2x1x2x1"]


def _oracle(graph: dict, model: dict, layers: list[int]) -> dict:
    prepared = prepare_in_memory(random_dataset(**graph), permutation_seed=3)
    return {
        (L, d): reference_step(prepared, ModelConfig(layers=L, **model), BATCH, d)
        for L in layers
        for d in (0, 1)
    }


@pytest.fixture(scope="module")
def oracle():
    return _oracle(GRAPH, MODEL, LAYERS)


@pytest.mark.parametrize("grid", GRIDS)
def test_grid_matches_single_process(grid, oracle, tmp_path):
    _check_grid(grid, GRAPH, MODEL, LAYERS, oracle, tmp_path)


#: The other models and data the engine trains, each against its own oracle.
VARIANTS = {
    "gcn stack, input dropout": (
        GRAPH,
        {"hidden": 13, "dropout": 0.3, "input_dropout": 0.2, "norm": False, "residual": False},
    ),
    "multi-label": ({**GRAPH, "multilabel": True}, MODEL),
    # Kipf & Welling's GCN: the first layer reads the features (redistributed to its
    # layout), the last outputs the classes (no tail, no head)
    "gcn without projection and head": (
        GRAPH,
        {
            "hidden": 13,
            "dropout": 0.3,
            "input_dropout": 0.2,
            "norm": False,
            "residual": False,
            "input_projection": False,
            "head": False,
        },
    ),
    # residual only where the widths agree: not on layer 0 (11 -> 13) nor the classes layer
    "paper model without projection and head": (
        GRAPH,
        {"hidden": 13, "dropout": 0.3, "input_projection": False, "head": False},
    ),
    # biases (each completed over its rows' axis), the last one on the classes layer
    "paper model with biases, no head": (
        GRAPH,
        {"hidden": 13, "dropout": 0.3, "bias": True, "head": False},
    ),
    # the residual taken after the aggregation (another layout than the layer input's)
    # and an RMSNorm of the head's input
    "paper model, aggregated residual, final norm": (
        GRAPH,
        {"hidden": 13, "dropout": 0.3, "residual_from": "aggregated", "final_norm": True},
    ),
}


#: Each variant on one grid (every grid shape runs the paper's model above): 1x2x2x2
#: has every parallel axis, 2x1x2x1 data parallelism, 1x2x2x1 and 1x1x2x2 two TP axes.
VARIANT_GRIDS = {
    "gcn stack, input dropout": "2x1x2x1",
    "multi-label": "1x1x2x2",
    "gcn without projection and head": "1x2x2x1",
    "paper model without projection and head": "2x1x2x1",
    "paper model with biases, no head": "2x1x2x1",
    "paper model, aggregated residual, final norm": "1x2x2x2",
}


@pytest.mark.parametrize(("variant", "grid"), sorted(VARIANT_GRIDS.items()))
def test_model_variants_match_single_process(variant, grid, tmp_path):
    graph, model = VARIANTS[variant]
    layers = [2, 3]
    _check_grid(grid, graph, model, layers, _oracle(graph, model, layers), tmp_path)


def _check_grid(
    grid: str, graph: dict, model: dict, layers_list: list[int], oracle: dict, tmp_path
) -> None:
    shape = GridShape.parse(grid)
    spec = {
        "grid": grid,
        "layers": layers_list,
        "graph": graph,
        "model": model,
        "batch_size": BATCH,
        "steps": 5,
        "out": str(tmp_path),
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    spawn_ranks(shape.world_size, "tests.workers.grid_equivalence:main", [str(spec_path)], tmp_path)
    worst = 0.0
    for layers in layers_list:
        records = [torch.load(tmp_path / f"rank{r}_L{layers}.pt") for r in range(shape.world_size)]
        for record in records:
            record["coords"] = Coords(*record["coords"])
        shards = parameter_shards(
            ModelConfig(layers=layers, **model), graph["num_features"], graph["num_classes"]
        )
        expected_grads = {
            name: sum(oracle[(layers, d)]["grads"][name] for d in range(shape.dp)) / shape.dp
            for name in shards
        }
        for dp_rank in range(shape.dp):
            group = [r for r in records if r["coords"].d == dp_rank]
            expected = oracle[(layers, dp_rank)]
            assert all(torch.equal(r["sample"], expected["sample"]) for r in group)
            logits = assemble(
                group,
                lambda r: ((slice(*r["logit_rows"]), slice(*r["logit_cols"])), r["logits"]),
                expected["logits"].shape,
            )
            worst = max(worst, relative_error(logits, expected["logits"]))
            for r in group:
                assert r["loss"] == pytest.approx(expected["loss"], rel=TOLERANCE)
                # accuracy or micro-F1 of the batch per split, from the grid's counts
                scores = {k: hit / total for k, (hit, total) in r["counts"].items() if total}
                assert scores == pytest.approx(expected["scores"], abs=1e-12), layers
        for name, shard in shards.items():
            slicer = lambda r, s=shard, n=name: (  # noqa: E731
                s.local_slices(shape, r["coords"]),
                r["grads"][n],
            )
            grad = assemble(records, slicer, shard.global_shape)
            error = relative_error(grad, expected_grads[name])
            assert error < TOLERANCE, f"L={layers} grad of {name}: relative error {error:.2e}"
            worst = max(worst, error)
            # One Adam step applied shard by shard equals Adam on the whole gathered gradient.
            param = oracle[(layers, 0)]["params"][name].clone().requires_grad_()
            param.grad = grad
            torch.optim.Adam([param], lr=0.01).step()
            step1 = assemble(
                records,
                lambda r, s=shard, n=name: (
                    s.local_slices(shape, r["coords"]),
                    r["params_step1"][n],
                ),
                shard.global_shape,
            )
            assert torch.allclose(step1, param.detach(), rtol=0, atol=1e-6)
            # Replicas stay bit-identical after the optimizer steps (asserted in assemble):
            # five for the deepest model, one for the others.
            assemble(
                records,
                lambda r, s=shard, n=name: (
                    s.local_slices(shape, r["coords"]),
                    r["params_final"][n],
                ),
                shard.global_shape,
            )
    assert worst < TOLERANCE
    print(f"grid {grid}: largest relative error {worst:.2e}")
