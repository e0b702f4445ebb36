"""Full-graph evaluation in many small, unaligned chunks, as a GPU needs it.

- Every CSR the evaluation hands the SpMM is one of its own: row pointers from 0 and
  column indices and values in fresh allocations (views into the block at a chunk's
  entry offset reach cuSPARSE at 4-byte alignment); the logits equal one chunk's.
- No chunk reads the device: the evaluation waits for it once per layer, however many
  chunks (counted on CPU tensors, where every read-back a GPU would wait for is seen).
- On CUDA the chunk rows come from the device's free memory (``mem_get_info`` stubbed);
  elsewhere the CPU rule stays.
- The cost model lists each chunk's collectives: its counts and bytes per group kind
  equal those of real ranks on an uneven grid; docs/gpu-check.md's papers100M table is
  the model's.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from benchmarks.bench_projection import PAPERS100M, perlmutter
from dgl_scalegnn.config import ModelConfig, SyntheticConfig, config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.evaluation import chunks
from dgl_scalegnn.evaluation.chunks import CSRRows
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.evaluation.memory import (
    FREE_MEMORY_SHARE,
    MIN_CHUNK_ROWS,
    ChunkMemory,
    chunk_rows_for,
    default_chunk_rows,
    full_graph_chunk_rows,
)
from dgl_scalegnn.parallel.spmm import csr_tensor
from dgl_scalegnn.perfmodel import (
    Workload,
    epoch_time,
    eval_bytes,
    eval_chunk_rows,
    eval_seconds,
    eval_stages,
    memory_bytes,
)
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.gpu.host_syncs import HostSyncCounter
from tests.helpers import ROOT, random_dataset, relative_error
from tests.ranks import spawn_ranks

NUM_NODES = 2000
#: Unaligned: chunk boundaries fall at arbitrary entry offsets, and the last chunk is short.
CHUNK_ROWS = 97
LAYERS = 3


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    cfg = config_from_mapping(
        {
            "model": {"hidden": 12, "layers": LAYERS, "bias": True},
            "sampling": {"batch_size": 500},
            "train": {"progress": False},
        }
    )
    graph = prepare_in_memory(random_dataset(num_nodes=NUM_NODES, num_edges=12_000), 0)
    trainer = Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    trainer.train_step(trainer.sample(0))
    trainer.model.eval()
    return trainer


@pytest.fixture(autouse=True)
def cuda_path(trainer, monkeypatch) -> None:
    """Every test here takes the CUDA path (the torch CSR) unless it switches the model's
    native kernels on."""
    monkeypatch.setattr(trainer.model.layer_tail, "native", False)


def _logits(trainer: Trainer, chunk_rows: int) -> torch.Tensor:
    return full_graph_forward(trainer.model, trainer.store.full_graph(), chunk_rows)[0]


def test_native_loop_evaluates_as_the_torch_csr_and_only_when_switched_on(trainer, monkeypatch):
    """The model's native kernels (``parallel.native_kernels``) pick the SpMM of every
    chunk: the native loop (no CSR built) or the torch CSR (one per chunk and product);
    the logits and :meth:`Trainer.evaluate`'s accuracies agree to rounding."""
    built = []
    monkeypatch.setattr(chunks, "csr_tensor", lambda *args: built.append(1) or csr_tensor(*args))
    monkeypatch.setattr(trainer.model.layer_tail, "native", True)
    native = _logits(trainer, CHUNK_ROWS)
    assert not built
    monkeypatch.setattr(trainer.model.layer_tail, "native", False)
    torch_csr = _logits(trainer, CHUNK_ROWS)
    assert len(built) == (LAYERS + 1) * -(-NUM_NODES // CHUNK_ROWS)
    assert relative_error(native, torch_csr) < 1e-5
    accuracies = {}
    for switch in (True, False):
        monkeypatch.setattr(trainer.model.layer_tail, "native", switch)
        built.clear()
        accuracies[switch] = trainer.evaluate()
        assert bool(built) != switch, switch
    assert accuracies[True] == pytest.approx(accuracies[False], abs=1.0 / NUM_NODES)


def test_every_chunk_gets_a_rebased_csr_of_its_own(trainer, monkeypatch):
    block = next(iter(trainer.store.blocks.values()))
    block_storage = {block.indices.untyped_storage().data_ptr()}
    handed = []

    def recording_csr_tensor(crow, cols, values, shape):
        handed.append((crow.clone(), cols, values, shape))
        return csr_tensor(crow, cols, values, shape)

    monkeypatch.setattr(chunks, "csr_tensor", recording_csr_tensor)
    chunked = _logits(trainer, CHUNK_ROWS)
    monkeypatch.undo()
    # each layer's product per chunk, and the first layer's A 1 for the folded bias
    assert len(handed) == (LAYERS + 1) * -(-NUM_NODES // CHUNK_ROWS)
    for crow, cols, values, (rows, _) in handed:
        assert crow[0] == 0 and crow[-1] == cols.numel() == values.numel()
        assert crow.numel() == rows + 1
        for array in (cols, values):
            assert array.storage_offset() == 0
            assert array.untyped_storage().data_ptr() not in block_storage
    assert relative_error(chunked, _logits(trainer, NUM_NODES)) < 1e-5


def _syncs(trainer: Trainer, chunk_rows: int) -> int:
    graph = trainer.store.full_graph()
    with HostSyncCounter() as syncs:
        full_graph_forward(trainer.model, graph, chunk_rows)
    return syncs.total


def test_chunks_never_wait_for_the_device(trainer):
    one_chunk, chunks = _syncs(trainer, NUM_NODES), _syncs(trainer, CHUNK_ROWS)
    assert chunks == one_chunk <= LAYERS, (chunks, one_chunk)


def _stub_free_memory(monkeypatch, free_bytes: int, cached_bytes: int = 0) -> list:
    """The driver reports ``free_bytes`` free; torch's allocator holds ``cached_bytes``
    that no tensor uses (reserved beyond allocated)."""
    asked = []

    def mem_get_info(device=None):
        asked.append(torch.device(device))
        return free_bytes, 2 * free_bytes

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * cached_bytes)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * cached_bytes)
    return asked


def test_chunk_rows_on_cuda_come_from_the_free_memory(monkeypatch):
    asked = _stub_free_memory(monkeypatch, 40 * 2**30, cached_bytes=2 * 2**30)
    memory = ChunkMemory(row_bytes=8192.0, reserved_bytes=2**30)
    rows = chunk_rows_for("cuda:1", tp_size=64, memory=memory)
    assert asked == [torch.device("cuda", 1)]
    assert rows == int(FREE_MEMORY_SHARE * (42 * 2**30 - 2**30) // 8192)
    assert rows > 100 * default_chunk_rows(64)  # the CPU rule's 2048 rows a rank
    _stub_free_memory(monkeypatch, 2**20)
    assert chunk_rows_for("cuda:0", 64, memory) == MIN_CHUNK_ROWS


def test_chunk_rows_elsewhere_keep_the_cpu_rule(monkeypatch):
    asked = _stub_free_memory(monkeypatch, 40 * 2**30)
    assert chunk_rows_for("cpu", 8, ChunkMemory(8192.0, 0.0)) == default_chunk_rows(8)
    assert asked == []


def test_the_model_sizes_its_chunks_from_its_widths_and_the_free_memory(trainer, monkeypatch):
    """The model's rule on a graph whose tensors claim to be on CUDA: 8 rows of the widest
    matrix and 20 bytes for each CSR entry (what building a chunk's CSR holds at once) per
    row; a layer's input and output and the ids of every vertex set aside; at most the
    rows of the graph (one process), however much memory is free."""
    graph = trainer.store.full_graph()
    rows = {}
    for free in (2**21, 2**30):
        _stub_free_memory(monkeypatch, free)
        monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
        rows[free] = full_graph_chunk_rows(trainer.model, graph)
        monkeypatch.undo()
    meta = trainer.store.meta
    widest = max(meta.num_features, 12, meta.num_classes)
    block = next(iter(graph.blocks.values()))
    row_bytes = 8 * widest * 4 + block.nnz / NUM_NODES * 20
    reserved = 2 * NUM_NODES * widest * 4 + NUM_NODES * 8
    assert rows[2**21] == int(FREE_MEMORY_SHARE * (2**21 - reserved) // row_bytes)
    assert MIN_CHUNK_ROWS < rows[2**21] < NUM_NODES
    assert rows[2**30] == NUM_NODES  # room for 1.1M rows: one chunk of every row


class _LiveBytes(TorchDispatchMode):
    """The bytes of the tensors the operators under it make that are alive at once, at
    most (``peak``): each output's storage counts until its tensor is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        # a view holds no storage of its own; a sparse tensor's parts were counted
        for tensor in (t for t in made if t.layout == torch.strided and t._base is None):
            size = tensor.untyped_storage().nbytes()
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(tensor, self._freed, size)
        return out

    def _freed(self, size: int) -> None:
        self.live -= size


def test_the_memory_model_counts_what_a_chunks_csr_holds_per_entry(trainer):
    """Off the native loop a chunk's CSR rows are copied (indices, each entry's row, the
    two gathered scales and their values): the bytes held at once, beyond the product's
    output and its row pointers, per entry, as the chunk memory model counts them."""
    block = next(iter(trainer.store.full_graph().blocks.values()))
    rows = CSRRows(block, 0, NUM_NODES)
    features = torch.randn(NUM_NODES, 4)
    with _LiveBytes() as held:
        out = rows.matmul(features)
    pointers = (NUM_NODES + 1) * (8 + 4)  # rebased, then cast to the indices' dtype
    per_entry = (held.peak - out.numel() * out.element_size() - pointers) / block.nnz
    counted = ChunkMemory.of(widest_cols=0, entries_per_row=1.0, reserved_bytes=0).row_bytes
    assert 16 < per_entry <= counted, (per_entry, counted)


#: Counted on real ranks: N odd and chunks of 37 rows split every axis unevenly, and
#: two data-parallel replicas share them unevenly.
COUNT_GRID = "2x2x1x2"
COUNT_CHUNK_ROWS = 37
COUNT_SYNTHETIC = {"num_nodes": 1001, "num_features": 10, "num_classes": 4}
COUNT_VARIANTS = {
    "paper": {"hidden": 14, "layers": 3},
    "aggregated-final-norm-bias": {
        "hidden": 14,
        "layers": 2,
        "residual_from": "aggregated",
        "final_norm": True,
        "bias": True,
    },
    "kipf": {
        "hidden": 14,
        "layers": 2,
        "norm": False,
        "residual": False,
        "input_projection": False,
        "head": False,
    },
    "sage": {"conv": "sage", "hidden": 14, "layers": 2},
    "gin": {"conv": "gin", "hidden": 14, "layers": 3, "residual_from": "aggregated"},
}


def test_cost_model_counts_each_chunks_collectives(tmp_path):
    """The collectives per group kind and their bytes in one evaluation, as the cost model
    lists them chunk by chunk; and no read-back per chunk on any rank. The replicas of one
    TP rank run different chunks, whose sizes differ (the model counts the average
    chunk): their bytes are compared summed over the replicas."""
    shape = GridShape.parse(COUNT_GRID)
    base = {
        "data": {"name": "synthetic", "synthetic": COUNT_SYNTHETIC},
        "sampling": {"batch_size": 100},
        "train": {"progress": False},
        "parallel": {"grid": COUNT_GRID},
    }
    spawn_ranks(
        shape.world_size,
        "tests.workers.count_eval:main",
        [base, COUNT_VARIANTS, COUNT_CHUNK_ROWS, str(tmp_path)],
        tmp_path,
    )
    nnz = prepare_in_memory(generate(SyntheticConfig(**COUNT_SYNTHETIC)), 0).meta.nnz
    for name, model in COUNT_VARIANTS.items():
        work = Workload(
            num_nodes=COUNT_SYNTHETIC["num_nodes"],
            nnz=nnz,
            batch_size=100,
            in_features=COUNT_SYNTHETIC["num_features"],
            num_classes=COUNT_SYNTHETIC["num_classes"],
            model=ModelConfig(**model),
        )
        counted_bytes = [Counter() for _ in range(shape.tp_size)]
        predicted_bytes = [Counter() for _ in range(shape.tp_size)]
        for rank in range(shape.world_size):
            counted = json.loads((tmp_path / f"eval{rank}_{name}.json").read_text())
            stages = eval_stages(work, shape, rank, COUNT_CHUNK_ROWS)
            predicted_calls: Counter = Counter()
            for stage in stages:
                for call in stage.collectives:
                    predicted_calls[call.kind] += stage.chunks
                for call in stage.shared:
                    predicted_calls[call.kind] += 1
            assert counted["calls"] == dict(predicted_calls), (name, rank)
            assert predicted_calls["dp"] == len(stages)  # each stage's output is shared
            counted_bytes[rank % shape.tp_size].update(counted["bytes"])
            predicted_bytes[rank % shape.tp_size].update(
                eval_bytes(work, shape, rank, COUNT_CHUNK_ROWS)
            )
            assert counted["syncs"] <= model["layers"], (name, rank, counted["syncs"])
        for counted, predicted in zip(counted_bytes, predicted_bytes):
            assert dict(counted) == pytest.approx(dict(predicted), rel=1e-9), name
        assert sum(stage.total_chunks for stage in stages) > 20  # many chunks were counted


def test_the_documented_papers100m_projection_is_the_models():
    """docs/gpu-check.md's evaluation table: chunk rows, chunks and seconds as the cost
    model gives them for ogbn-papers100M (free memory: an A100's 40 GB less the rank's
    graph share and model)."""
    doc = (ROOT / "docs" / "gpu-check.md").read_text()
    for grid in ("1x4x4x4", "4x4x4x4"):
        shape = GridShape.parse(grid)
        held = memory_bytes(PAPERS100M, shape)
        free = 40e9 - held["graph"] - held["model"]
        epoch = epoch_time(PAPERS100M, shape, perlmutter(shape))
        for rows, rule in (
            (default_chunk_rows(shape.tp_size), "CPU rule"),
            (eval_chunk_rows(PAPERS100M, shape, free), "device memory"),
        ):
            chunks = sum(s.chunks for s in eval_stages(PAPERS100M, shape, 0, rows))
            seconds = eval_seconds(PAPERS100M, shape, perlmutter(shape), rows)
            row = (
                f"| {grid} ({shape.world_size}) | {rows:,}: {rule} | {chunks:,} | "
                f"{seconds:.1f} s | {epoch:.2f} s |"
            )
            assert row in doc, row


def test_evaluate_fixes_the_heap_before_its_chunks_and_gives_it_back_after(trainer, monkeypatch):
    """glibc's dynamic mapping threshold mapped a chunk's temporaries afresh chunk after
    chunk (page faults every chunk): the evaluator fixes it first (``return_freed_heap``),
    also when :meth:`Trainer.evaluate` is called on its own, and gives the heap back after."""
    from dgl_scalegnn import heap
    from dgl_scalegnn.evaluation import evaluator

    calls = []
    counts = evaluator.full_graph_counts
    monkeypatch.setattr(heap, "return_freed_heap", lambda: calls.append("fixed"))
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append("released"))
    monkeypatch.setattr(
        evaluator,
        "full_graph_counts",
        lambda *args, **kwargs: calls.append("counted") or counts(*args, **kwargs),
    )
    trainer.evaluate()
    assert calls == ["fixed", "counted", "released"]
