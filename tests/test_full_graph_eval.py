"""Layer-wise full-graph evaluation in row chunks equals the whole-graph forward.

Oracles: DGL's reference model on the whole normalised graph (dense-free, one process)
with the trained weights gathered from the ranks, and, on every rank, the training
forward on a whole-graph batch (the evaluation it replaces); the cost model's count of
the evaluation's whole-graph matrices on every rank. N = 97 and chunks of 7 rows
split unevenly over every grid axis; the last chunk of a part is short and some parts
run empty chunks.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn.config import ModelConfig, config_from_mapping
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import Axis, Plane
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.tiles import release_pages
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.evaluation.chunks import CSRRows, row_chunks
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.model.stack import layer_kind, parameter_shards
from dgl_scalegnn.parallel import cpu_kernels
from dgl_scalegnn.perfmodel import Workload, eval_buffer_bytes
from dgl_scalegnn.sampling.blocks import full_block
from dgl_scalegnn.sampling.dgl_loader import norm_graph
from dgl_scalegnn.sampling.store import RankStore
from tests.helpers import random_dataset, relative_error
from tests.oracle import assemble
from tests.ranks import spawn_ranks

GRAPH = {"num_nodes": 97, "num_edges": 400, "num_features": 11, "num_classes": 5}
BARE = {"hidden": 13, "layers": 2, "dropout": 0.3, "norm": False, "residual": False}
BARE |= {"input_projection": False, "head": False}
VARIANTS = {
    "gcn2": {"hidden": 13, "layers": 2, "dropout": 0.3, "norm": False, "residual": False},
    "paper4": {"hidden": 13, "layers": 4, "dropout": 0.3, "input_dropout": 0.2},
    "kipf2": {
        "hidden": 13,
        "layers": 2,
        "dropout": 0.3,
        "norm": False,
        "residual": False,
        "input_projection": False,
        "head": False,
    },
    # narrower than the features: on one TP rank a batch multiplies by the weight first
    "kipf2-narrow": {
        "hidden": 4,
        "layers": 2,
        "dropout": 0.3,
        "norm": False,
        "residual": False,
        "input_projection": False,
        "head": False,
        "bias": True,
    },
    "paper3-aggregated-final-norm": {
        "hidden": 13,
        "layers": 3,
        "dropout": 0.3,
        "residual_from": "aggregated",
        "final_norm": True,
    },
    # biases everywhere: on one TP rank the projection's bias enters the folded first
    # layer as (A 1) b_in, and its residual as X W_in + b_in
    "paper3-bias": {"hidden": 13, "layers": 3, "dropout": 0.3, "bias": True},
    "paper3-bare": {
        "hidden": 13,
        "layers": 3,
        "dropout": 0.3,
        "input_projection": False,
        "head": False,
    },
    # DGL's two SAGEConv layers: the second narrows (13 -> 5), so on one TP rank every
    # chunk aggregates its input times the weight, which the first layer makes chunk by
    # chunk
    "sage2-narrow": {"conv": "sage", **BARE, "bias": True},
}
CHUNK_ROWS = 7
TOLERANCE = 1e-5
GRIDS = ["1x1x1x1", "2x1x2x1", "1x2x2x2", "1x1x3x2"]


@pytest.fixture(scope="module")
def prepared():
    return prepare_in_memory(random_dataset(**GRAPH), permutation_seed=3)


def test_chunks_cover_every_vertex_once_with_one_count_per_rank():
    shape = GridShape.parse("1x3x2x1")
    for axis in (Axis.X, Axis.Y):
        counts, covered = set(), []
        for rank in range(shape.world_size):
            coords = shape.coords(rank)
            chunks = list(row_chunks(GRAPH["num_nodes"], axis, shape, coords, CHUNK_ROWS))
            counts.add(len(chunks))
            part_start = chunks[0].rows.range(axis, coords.along(axis))[0]
            for chunk in chunks:
                mine = chunk.rows.ids(axis, coords.along(axis))
                assert mine.numel() == chunk.stop - chunk.start
                if coords.along(Axis.Y if axis is Axis.X else Axis.X) == 0:
                    covered.append(mine)
            assert chunks[-1].stop - part_start >= 0
        assert len(counts) == 1
        assert torch.equal(torch.sort(torch.cat(covered)).values, torch.arange(GRAPH["num_nodes"]))


@pytest.mark.parametrize("native", [False, True], ids=["torch CSR", "native loop"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_csr_row_chunks_multiply_like_the_dense_block(prepared, monkeypatch, native, index_dtype):
    """Both kernels of :class:`CSRRows` against the dense block, with 32- and 64-bit
    column indices; the native loop runs exactly when asked for."""
    native_calls = []
    kernel = cpu_kernels.csr_scaled_rows
    monkeypatch.setattr(
        cpu_kernels, "csr_scaled_rows", lambda *args: native_calls.append(1) or kernel(*args)
    )
    shape = GridShape.parse("1x2x3x1")
    grid = Grid4D.view(shape, shape.rank_of(Coords(0, 1, 2, 0)))
    store = RankStore(prepared, grid, num_layers=2)
    products = 0
    for block in store.blocks.values():
        block = dataclasses.replace(block, indices=block.indices.to(index_dtype))
        dense = full_block(block).dense()
        features = torch.randn(dense.shape[1], 4)
        expected = dense @ features
        rows = block.row_stop - block.row_start
        for start in range(0, rows + 1, 5):
            stop = min(rows, start + 5)
            chunk = CSRRows(block, start, stop, native=native)
            got = chunk.matmul(features)
            torch.testing.assert_close(got, expected[start:stop])
            products += chunk.entries[0] < chunk.entries[1]  # an empty chunk needs no kernel
    assert products > 0 and len(native_calls) == (products if native else 0)


@pytest.mark.parametrize("native", [False, True], ids=["torch CSR", "native loop"])
@pytest.mark.parametrize("kind", ["gcn", "sum"])
def test_products_with_an_operand_in_pieces_are_the_whole_product(prepared, native, kind):
    """:meth:`CSRRows.matmul_pieces` (the streamed evaluation's SpMM, the operand read a
    piece of rows at a time) against the dense block, over pieces of one row to more
    than the operand; natively, the bits of :meth:`CSRRows.matmul` on the whole operand."""
    grid = Grid4D.view(
        GridShape.parse("1x2x3x1"), GridShape.parse("1x2x3x1").rank_of(Coords(0, 1, 2, 0))
    )
    model = ModelConfig(conv="sage") if kind == "sum" else ModelConfig()
    store = RankStore(prepared, grid, num_layers=2, kind=layer_kind(model))
    for block in store.blocks.values():
        assert block.unit_scales is (kind == "sum")
        dense = full_block(block).dense()
        features = torch.randn(dense.shape[1], 5)
        rows = block.row_stop - block.row_start
        chunk = CSRRows(block, 3, rows - 2, native=native)
        whole = chunk.matmul(features)
        for piece_rows in (1, 4, dense.shape[1], dense.shape[1] + 3):
            pieces = (
                (lo, features[lo : lo + piece_rows].clone())
                for lo in range(0, dense.shape[1], piece_rows)
            )
            got = chunk.matmul_pieces(pieces, torch.float32)
            torch.testing.assert_close(got, (dense @ features)[3 : rows - 2])
            assert torch.equal(got, whole) or not native, piece_rows


def test_sum_blocks_skip_their_unit_scales(prepared, monkeypatch):
    """The store marks the sum normalisation's blocks (ones for scales), and only those;
    their native products and row sums skip the scales (``None``), with the dense
    block's values."""
    passed_scales = []
    kernel = cpu_kernels.csr_scaled_rows

    def recording(indptr, indices, row_scale, col_scale, *args):
        passed_scales.append(row_scale is None and col_scale is None)
        return kernel(indptr, indices, row_scale, col_scale, *args)

    monkeypatch.setattr(cpu_kernels, "csr_scaled_rows", recording)
    grid = Grid4D.view(GridShape.parse("1x1x1x1"), 0)
    for kind, unit in (
        (layer_kind(ModelConfig(conv="sage")), True),
        (layer_kind(ModelConfig()), False),
    ):
        block = next(iter(RankStore(prepared, grid, num_layers=2, kind=kind).blocks.values()))
        assert block.unit_scales is unit
        assert unit == bool((block.row_scale == 1).all() and (block.col_scale == 1).all())
        dense = full_block(block).dense()
        features = torch.randn(dense.shape[1], 6)
        chunk = CSRRows(block, 4, 40, native=True)
        torch.testing.assert_close(chunk.matmul(features), (dense @ features)[4:40])
        torch.testing.assert_close(chunk.row_sums(features)[:, 0], dense.sum(1)[4:40])
        assert passed_scales[-1] is unit


def test_one_process_keeps_one_block_for_all_planes(prepared):
    store = RankStore(prepared, Grid4D.view(GridShape.parse("1x1x1x1"), 0), 3)
    blocks = list(store.blocks.values())
    assert len(blocks) == 3 and all(b is blocks[0] for b in blocks)
    assert store.nbytes() < 2 * blocks[0].nbytes() + store.features.numel() * 4 + 10_000


def _reference_logits(prepared, model: dict, params: dict) -> torch.Tensor:
    meta = prepared.meta
    reference = ScaleGNN(
        ModelConfig(**model), in_features=meta.num_features, num_classes=meta.num_classes, seed=0
    )
    with torch.no_grad():
        for name, value in params.items():
            reference.params[name].copy_(value)
        reference.eval()
        features = torch.from_numpy(np.asarray(prepared.features))
        graph = norm_graph(prepared_dgl_graph(prepared), layer_kind(reference.cfg).normalisation)
        return reference(graph, features)


@pytest.mark.parametrize("grid", GRIDS)
def test_layerwise_evaluation_matches_whole_graph(grid, prepared, tmp_path):
    shape = GridShape.parse(grid)
    spec = {
        "grid": grid,
        "graph": GRAPH,
        "variants": VARIANTS,
        "batch_size": 61,
        "chunk_rows": CHUNK_ROWS,
        "out": str(tmp_path),
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    spawn_ranks(shape.world_size, "tests.workers.full_graph_eval:main", [str(spec_path)], tmp_path)
    for name, model in VARIANTS.items():
        records = [torch.load(tmp_path / f"rank{r}_{name}.pt") for r in range(shape.world_size)]
        shards = parameter_shards(ModelConfig(**model), GRAPH["num_features"], GRAPH["num_classes"])
        work = Workload(
            num_nodes=GRAPH["num_nodes"],
            nnz=prepared.meta.nnz,
            batch_size=61,
            in_features=GRAPH["num_features"],
            num_classes=GRAPH["num_classes"],
            model=ModelConfig(**model),
        )
        for record in records:
            record["coords"] = Coords(*record["coords"])
            # the layer-wise forward against the one it replaces, on every rank
            assert relative_error(record["logits"], record["batch_logits"]) < TOLERANCE
            assert record["counts"] == record["batch_counts"]
            assert record["chunk_counts"] == record["counts"]  # logits never whole
            assert record["accuracy"] == records[0]["accuracy"]
            # the cost model's whole-graph matrices are the ones the evaluation makes
            rank = shape.rank_of(record["coords"])
            assert record["buffer_bytes"] == eval_buffer_bytes(work, shape, rank), rank
        params = {
            n: assemble(
                records,
                lambda r, n=n, s=s: (
                    s.local_slices(shape, r["coords"]),
                    r["params"][n],
                ),
                s.global_shape,
            )
            for n, s in shards.items()
        }
        expected = _reference_logits(prepared, model, params)
        for dp_rank in range(shape.dp):
            group = [r for r in records if r["coords"].d == dp_rank]
            logits = assemble(
                group,
                lambda r: ((slice(*r["logit_rows"]), slice(*r["logit_cols"])), r["logits"]),
                expected.shape,
            )
            assert relative_error(logits, expected) < TOLERANCE
        labels = torch.from_numpy(np.asarray(prepared.labels))
        correct = expected.argmax(1) == labels
        for split in ("train", "val", "test"):
            mask = torch.from_numpy(np.asarray(getattr(prepared, f"{split}_mask")))
            accuracy = float((correct & mask).sum()) / float(mask.sum())
            assert records[0]["accuracy"][f"{split}_acc"] == pytest.approx(accuracy)


def test_multilabel_counts_chunk_by_chunk_equal_those_of_the_whole_logits(tmp_path):
    """Multi-label micro-F1 terms, the classes split over two ranks and two data-parallel
    replicas each counting its own chunks: :func:`full_graph_counts` (logits never
    whole) gives on every rank the counts of the whole logits, which are the training
    forward's."""
    grid = "2x2x1x1"
    spec = {
        "grid": grid,
        "graph": {**GRAPH, "multilabel": True},
        "variants": {"gcn2": VARIANTS["gcn2"]},
        "batch_size": 61,
        "chunk_rows": CHUNK_ROWS,
        "out": str(tmp_path),
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    world = GridShape.parse(grid).world_size
    spawn_ranks(world, "tests.workers.full_graph_eval:main", [str(spec_path)], tmp_path)
    records = [torch.load(tmp_path / f"rank{r}_gcn2.pt") for r in range(world)]
    assert len({tuple(record["logit_cols"]) for record in records}) == 2  # classes split
    for record in records:
        assert record["chunk_counts"] == record["counts"] == record["batch_counts"]
        assert record["counts"]["val"][1] > 0  # micro-F1 terms were counted
        assert record["accuracy"] == records[0]["accuracy"]


def test_a_narrowing_layer_aggregates_its_input_times_its_weight(prepared, monkeypatch):
    """One TP rank, chunks of 7 rows, DGL's two SAGE layers: the layer 11 -> 13 aggregates
    its 11 columns, the layer 13 -> 5 its input times its weight, 5 columns, in every
    chunk. The first layer multiplies each 7-row chunk of its output by ``[W | W_self]``
    (10 columns) as it is made, so its 13-column output is never whole: the whole-graph
    matrices made are 10 then 5 columns wide, and each chunk's output is freed by the
    time the second layer runs. The neighbour counts are the blocks' row sums, never an
    SpMM. Switched off, the second layer aggregates 13 columns of a whole 13-column
    output, and the logits agree."""
    from dgl_scalegnn.distributed.comm import Runtime
    from dgl_scalegnn.evaluation import layerwise as full_graph
    from dgl_scalegnn.model.convs import base, sage
    from dgl_scalegnn.train.metrics import MetricsWriter
    from dgl_scalegnn.train.trainer import Trainer

    model_cfg = {"conv": "sage", **BARE, "bias": True}
    cfg = config_from_mapping({"model": model_cfg, "sampling": {"batch_size": 61}})
    trainer = Trainer(cfg, prepared, Runtime.single_process(), MetricsWriter(None, enabled=False))
    trainer.train_step(trainer.sample(0))
    model, graph = trainer.model.eval(), trainer.store.full_graph()
    widths: list[int] = []
    made_widths: list[int] = []
    narrowed_shapes: list[tuple[int, ...]] = []
    row_sums: list[int] = []

    def spy(module):
        spmm = module.parallel_spmm

        def recording(x, *args):
            widths.append(x.shape[1])
            return spmm(x, *args)

        monkeypatch.setattr(module, "parallel_spmm", recording)

    spy(base)
    spy(sage)
    narrowed_input, counted = sage.SAGELayer.narrowed_input, CSRRows.row_sums
    product, inputs_alive = sage.SAGELayer.product, []
    narrowed_inputs: list[weakref.ref] = []
    by_row_chunks = full_graph._by_row_chunks

    def narrowing(layer, x, *args):
        out = narrowed_input(layer, x, *args)
        if out is not None:
            narrowed_shapes.append(tuple(out.shape))
            narrowed_inputs.append(weakref.ref(x))
        return out

    def producing(layer, inputs):
        if inputs.x is None:  # narrowed: every chunk of its input is freed by now
            inputs_alive.append(any(ref() is not None for ref in narrowed_inputs))
        return product(layer, inputs)

    def counting(rows, like):
        row_sums.append(rows.num_rows)
        return counted(rows, like)

    def making(model, spec, *args):
        made_widths.append(spec.num_cols)
        return by_row_chunks(model, spec, *args)

    monkeypatch.setattr(sage.SAGELayer, "narrowed_input", narrowing)
    monkeypatch.setattr(sage.SAGELayer, "product", producing)
    monkeypatch.setattr(CSRRows, "row_sums", counting)
    monkeypatch.setattr(full_graph, "_by_row_chunks", making)
    chunks = -(-GRAPH["num_nodes"] // CHUNK_ROWS)
    last_rows = GRAPH["num_nodes"] - (chunks - 1) * CHUNK_ROWS
    with torch.no_grad():
        narrowed, _ = full_graph.full_graph_forward(model, graph, CHUNK_ROWS)
        assert widths == [11] * chunks + [5] * chunks
        assert narrowed_shapes == [(CHUNK_ROWS, 10)] * (chunks - 1) + [(last_rows, 10)]
        assert made_widths == [10, 5]
        assert inputs_alive == [False] * chunks
        assert len(row_sums) == 2 * chunks and sum(row_sums) == 2 * GRAPH["num_nodes"]
        widths.clear()
        made_widths.clear()
        monkeypatch.setattr(sage.SAGELayer, "narrowing_weights", ())
        whole, _ = full_graph.full_graph_forward(model, graph, CHUNK_ROWS)
    assert widths == [11] * chunks + [13] * chunks
    assert made_widths == [13, 5]
    assert relative_error(narrowed, whole) < TOLERANCE


def test_store_plane_sharing_depends_on_ranges_only(prepared):
    shape = GridShape.parse("1x2x2x2")
    for rank in range(shape.world_size):
        coords = shape.coords(rank)
        store = RankStore(prepared, Grid4D.view(shape, rank), num_layers=2)
        zx, yz = store.blocks[Plane(Axis.Z, Axis.X)], store.blocks[Plane(Axis.Y, Axis.Z)]
        same = coords.z == coords.y and coords.x == coords.z
        assert (zx is yz) == same
        assert torch.equal(full_block(zx).dense(), full_block(yz).dense()) or not same


def _resident_file_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssFile in /proc/self/status")


def test_released_pages_leave_the_resident_set_and_read_back(tmp_path):
    expected = np.arange(8 * 2**20 // 4, dtype=np.int32)  # 8 MB
    np.save(tmp_path / "a.npy", expected)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert int(mapped.sum(dtype=np.int64)) == int(expected.sum(dtype=np.int64))  # touch all
    before = _resident_file_mb()
    release_pages(mapped)
    assert before - _resident_file_mb() > 6
    assert np.array_equal(mapped, expected)
    release_pages(expected)  # not mapped: nothing to do
