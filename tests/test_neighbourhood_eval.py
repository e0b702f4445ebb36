"""Evaluation in neighbourhoods computes what the layer-wise evaluation computes.

Oracles: the tiled adjacency's own entries (for the row-ordered copy), the one-process
layer-wise evaluation (:func:`~dgl_scalegnn.evaluation.layerwise.full_graph_forward`, itself
checked against DGL's modules in test_full_graph_eval) and DGL's reference model on the
whole graph for GCN, with random values in every parameter (biases and gains included);
for a job of four ranks, the layer-wise evaluation of the same run on one process.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn.config import ModelConfig, config_from_mapping
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.data.prepared import open_prepared, prepare_in_memory, write_prepared
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.evaluation import hops
from dgl_scalegnn.evaluation import neighbourhood as module
from dgl_scalegnn.evaluation.hops import read_rows
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.evaluation.neighbourhood import NeighbourhoodEvaluator, one_rank_copy
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.model.stack import layer_kind, parameter_shards
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.train.metrics import read_metrics
from dgl_scalegnn.train.run import run_training
from tests.helpers import random_dataset, relative_error
from tests.oracle import assemble
from tests.ranks import spawn_ranks

GRAPH = {"num_nodes": 97, "num_edges": 400, "num_features": 11, "num_classes": 5}
VARIANTS = {
    "paper2": {"hidden": 13, "layers": 2},
    "paper3-aggregated-final-norm-bias": {
        "hidden": 13,
        "layers": 3,
        "residual_from": "aggregated",
        "final_norm": True,
        "bias": True,
    },
    "kipf2-bare": {
        "hidden": 13,
        "layers": 2,
        "norm": False,
        "residual": False,
        "input_projection": False,
        "head": False,
        "bias": True,
    },
    "head-only": {"hidden": 13, "layers": 0},
}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def prepared():
    return prepare_in_memory(random_dataset(**GRAPH), permutation_seed=3, tile_count=4)


def test_read_rows_gives_each_rows_stored_entries(prepared, tmp_path):
    """Any rows, unsorted and repeated, in memory and memory-mapped: each row's entries
    are the tiles' entries of that row, columns ascending."""
    adjacency = prepared.adjacency
    rows, cols = np.asarray(adjacency.rows), np.asarray(adjacency.cols)
    mapped = open_prepared(write_prepared(prepared, tmp_path / "graph"))
    vertices = np.array([96, 0, 5, 5, 40, 7])
    for graph in (prepared, mapped):
        indptr, indices = read_rows(graph.adjacency, vertices, graph.verify)
        for position, vertex in enumerate(vertices):
            expected = np.sort(cols[rows == vertex])
            got = indices[indptr[position] : indptr[position + 1]]
            assert got.tolist() == expected.tolist(), vertex
        assert read_rows(graph.adjacency, np.zeros(0, np.int64))[0].tolist() == [0]


def test_rows_are_read_from_the_files_without_mapping_them(prepared, tmp_path, monkeypatch):
    """A memory-mapped graph's rows are read with pread (natively, and by the Python loop
    where the library does not load), never through the map: the same rows, and no
    page of the map touched."""
    from dgl_scalegnn.data import row_reads

    mapped = open_prepared(write_prepared(prepared, tmp_path / "graph"))
    vertices = np.array([96, 0, 5, 5, 40, 7])
    expected = np.asarray(prepared.features)[vertices]
    assert row_reads.LIBRARY.load() is not None  # the native reads run first
    for native in (True, False):
        if not native:
            monkeypatch.setattr(row_reads.LIBRARY, "load", lambda: None)
        monkeypatch.setattr(
            type(mapped.features), "__getitem__", lambda *a: pytest.fail("read through the map")
        )
        got = hops.read_vertex_rows(mapped.features, vertices)
        indptr, cols = read_rows(mapped.adjacency, vertices, mapped.verify)
        monkeypatch.undo()
        assert np.array_equal(got, expected), native
        assert indptr.tolist() == read_rows(prepared.adjacency, vertices)[0].tolist()
        assert cols.tolist() == read_rows(prepared.adjacency, vertices)[1].tolist()


def _randomised(model: ParallelScaleGNN, seed: int) -> ParallelScaleGNN:
    """``model`` with random values in every parameter: a zero bias or a unit gain would
    hide a term the neighbourhood forward drops."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5 + 0.1)
    return model.eval()


#: (piece entries, hub cache bytes): whole pieces and no hubs; pieces of a few rows with
#: a few hubs kept; every vertex kept (the layer-wise evaluation's memory).
SETTINGS = {"whole": (10**9, 0), "pieces-hubs": (24, 8 * 4 * 13 * 2), "all-kept": (50, 10**9)}


def _model(prepared, cfg: ModelConfig, seed: int) -> ParallelScaleGNN:
    meta = prepared.meta
    return _randomised(
        ParallelScaleGNN(
            cfg,
            in_features=meta.num_features,
            num_classes=meta.num_classes,
            runtime=Runtime.single_process(),
            seed=0,
        ),
        seed=seed,
    )


def _layerwise_logits(prepared, model: ParallelScaleGNN) -> torch.Tensor:
    grid = Grid4D.view(GridShape.parse("1x1x1x1"), 0)
    store = RankStore(prepared, grid, model.cfg.layers, kind=layer_kind(model.cfg))
    return full_graph_forward(model, store.full_graph(), chunk_rows=7)[0]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("conv", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_neighbourhood_logits_match_the_layerwise_evaluation(prepared, conv, variant, setting):
    cfg = ModelConfig(conv=conv, **VARIANTS[variant])
    model = _model(prepared, cfg, seed=len(variant))
    expected = _layerwise_logits(prepared, model)
    piece_entries, hub_bytes = SETTINGS[setting]
    evaluator = NeighbourhoodEvaluator(one_rank_copy(model), prepared, piece_entries, hub_bytes)
    assert (evaluator.hubs.size > 0) == (hub_bytes > 0 and cfg.layers > 1)
    num_nodes = prepared.meta.num_nodes
    for targets in (np.arange(num_nodes), np.array([0, 3, 4, 50, 96]), np.array([17])):
        got, _ = evaluator.logits(targets)
        assert relative_error(got, expected[targets]) < TOLERANCE, targets
    if conv == "gcn" and setting == "whole":  # and DGL's message passing on the whole graph
        meta = prepared.meta
        reference = ScaleGNN(
            cfg, in_features=meta.num_features, num_classes=meta.num_classes, seed=0
        )
        with torch.no_grad():
            for name, param in model.sharded_state_dict().items():
                reference.params[name].copy_(param)
        reference.eval()
        features = torch.from_numpy(np.asarray(prepared.features))
        whole = reference(prepared_dgl_graph(prepared), features).detach()
        assert relative_error(evaluator.logits(np.arange(num_nodes))[0], whole) < TOLERANCE


def test_kept_hubs_are_read_not_recomputed(prepared, monkeypatch):
    """The switch acts: with the hubs' hidden rows kept, the pieces of the last layer
    expand fewer rows (every hub is counted once, when it is kept)."""
    model = one_rank_copy(_model(prepared, ModelConfig(hidden=13, layers=2), seed=2))
    expanded, real = {}, module.hop
    for name, hub_bytes in (("none", 0), ("kept", 20 * 4 * 13)):
        rows: list[int] = []

        def counted(graph, vertices, normalisation, rows=rows):
            rows.append(vertices.size)
            return real(graph, vertices, normalisation)

        monkeypatch.setattr(module, "hop", counted)
        evaluator = NeighbourhoodEvaluator(model, prepared, 10**9, hub_bytes)
        before = sum(rows)
        evaluator.logits(np.arange(prepared.meta.num_nodes))
        expanded[name] = (evaluator.hubs.size, before, sum(rows) - before)
    assert expanded["none"][:2] == (0, 0)
    hubs, kept_rows, later_rows = expanded["kept"]
    assert 0 < hubs <= 20 and kept_rows == hubs
    assert later_rows < expanded["none"][2]


def test_counts_over_chunks_are_the_layerwise_counts(prepared):
    """Chunks of 10 vertices (the last one short) over a range that starts mid-graph add
    up to the layer-wise evaluation's counts of that range."""
    model = _model(prepared, ModelConfig(hidden=13, layers=2), seed=1)
    predicted = _layerwise_logits(prepared, model).argmax(1).numpy()
    evaluator = NeighbourhoodEvaluator(one_rank_copy(model), prepared, 30, 4 * 13 * 5)
    counts = evaluator.counts((30, 97), chunk_rows=10)
    for split in ("train", "val", "test"):
        mask = np.asarray(getattr(prepared, f"{split}_mask"))[30:97]
        hits = (predicted[30:97] == np.asarray(prepared.labels)[30:97]) & mask
        assert counts[split] == (float(hits.sum()), float(mask.sum())), split


def test_ranks_share_the_kept_hubs_and_gather_the_global_parameters(prepared, tmp_path):
    """Three ranks (1x1x3x1) after a training step: the gathered copy holds the global
    parameters (assembled from the shards, replicas bit-identical), and ten hubs split
    4, 3, 3 among the ranks (the all-gather pads the short parts) give the logits of a
    one-process evaluator that keeps them all itself."""
    model = {"hidden": 13, "layers": 2, "bias": True}
    spec = {
        "grid": "1x1x3x1",
        "graph": GRAPH,
        "model": model,
        "batch_size": 61,
        "piece_entries": 40,
        "hub_bytes": 10 * 4 * 13,
        "out": str(tmp_path),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    shape = GridShape.parse(spec["grid"])
    spawn_ranks(
        3, "tests.workers.neighbourhood_share:main", [str(tmp_path / "spec.json")], tmp_path
    )
    records = [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]
    meta = prepared.meta
    shards = parameter_shards(ModelConfig(**model), meta.num_features, meta.num_classes)
    for record in records:
        record["coords"] = Coords(*record["coords"])
    params = {
        name: assemble(
            records,
            lambda r, n=name, s=shard: (s.local_slices(shape, r["coords"]), r["shards"][n]),
            shard.global_shape,
        )
        for name, shard in shards.items()
    }
    alone = _model(prepared, ModelConfig(**model), seed=0)
    with torch.no_grad():
        for name, param in alone.sharded_state_dict().items():
            param.copy_(params[name])
    evaluator = NeighbourhoodEvaluator(alone.eval(), prepared, 40, 10 * 4 * 13)
    expected, _ = evaluator.logits(np.arange(meta.num_nodes))
    assert evaluator.hubs.size == 10  # no tie at the cut
    for record in records:
        for name, value in record["copy"].items():
            assert torch.equal(value, params[name]), name
        assert record["hubs"].tolist() == evaluator.hubs.tolist()
        assert relative_error(record["logits"], expected) < TOLERANCE


CONFIG = {
    "data": {"name": "synthetic", "synthetic": {"num_nodes": 3000, "num_features": 16}},
    "model": {"hidden": 32, "layers": 2, "bias": True},
    "sampling": {"batch_size": 300},
    "train": {"epochs": 1, "max_steps": 3, "progress": False},
}


def test_a_run_evaluated_in_neighbourhoods_reports_the_layerwise_accuracies(tmp_path):
    """The switch acts (the start event names the evaluation) and changes no figure."""
    accuracies = {}
    for mode in ("layerwise", "neighbourhood"):
        cfg = config_from_mapping({**CONFIG, "train": {**CONFIG["train"], "evaluation": mode}})
        path = tmp_path / f"{mode}.jsonl"
        run_training(cfg, str(path))
        events = read_metrics(path)
        assert next(e for e in events if e["event"] == "start")["evaluation"].startswith(mode)
        (evaluation,) = [e for e in events if e["event"] == "eval"]
        accuracies[mode] = [evaluation[f"{s}_acc"] for s in ("train", "val", "test")]
    assert accuracies["neighbourhood"] == accuracies["layerwise"]
