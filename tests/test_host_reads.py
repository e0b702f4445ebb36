"""What the evaluation counts and the multi-label loss make the host wait for.

On a GPU each read-back of device data (``float(t)``, ``.tolist()``, boolean indexing)
stops the host until the device has caught up. The evaluation's counts are accumulated
on the device and read once per evaluation, however many chunks it runs (layer-wise) or
pieces (neighbourhoods); the multi-label loss sums its masked entries without boolean
indexing, so that a training step reads the device once, as the single-label one does;
the ids of every vertex an evaluation takes are made on the device.
Counted on CPU tensors (:class:`~tests.gpu.host_syncs.HostSyncCounter`), where every
read a GPU would wait for is seen; the counts themselves are checked against the
logits of one whole forward.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.evaluation.layerwise import full_graph_counts, full_graph_forward
from dgl_scalegnn.evaluation.neighbourhood import NeighbourhoodEvaluator
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.gpu.host_syncs import HostSyncCounter
from tests.helpers import random_dataset

NUM_NODES = 600
LAYERS = 2
#: Chunks of 53 rows: 12 per layer.
CHUNK_ROWS = 53


def _trainer(multilabel: bool) -> Trainer:
    cfg = config_from_mapping(
        {
            "model": {"hidden": 8, "layers": LAYERS},
            "sampling": {"batch_size": 200},
            "train": {"progress": False},
        }
    )
    dataset = random_dataset(num_nodes=NUM_NODES, num_edges=3000, multilabel=multilabel)
    graph = prepare_in_memory(dataset, 0)
    return Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))


@pytest.fixture(scope="module", params=[False, True], ids=["single-label", "multi-label"])
def trainer(request) -> Trainer:
    trainer = _trainer(request.param)
    trainer.train_step(trainer.sample(0))
    trainer.model.eval()
    return trainer


def _counted(trainer: Trainer, chunk_rows: int) -> tuple[dict, int]:
    graph = trainer.store.full_graph()
    with HostSyncCounter() as syncs:
        counts = full_graph_counts(trainer.model, graph, trainer.objective, chunk_rows)
    return counts, syncs.total


def test_layerwise_counts_read_the_device_once_per_evaluation(trainer):
    """One read per layer (its chunks' CSR entry ranges together) and one for the counts
    of every chunk: the same with 12 chunks a layer as with one."""
    chunked, chunked_reads = _counted(trainer, CHUNK_ROWS)
    whole, whole_reads = _counted(trainer, NUM_NODES)
    assert chunked_reads == whole_reads == LAYERS + 1, (chunked_reads, whole_reads)
    graph = trainer.store.full_graph()
    logits, spec = full_graph_forward(trainer.model, graph, NUM_NODES)
    expected = trainer.objective.counts(logits, spec, graph)
    assert chunked == whole == expected


def test_counting_one_batch_reads_the_device_once(trainer):
    graph = trainer.store.full_graph()
    logits, spec = full_graph_forward(trainer.model, graph, NUM_NODES)
    with HostSyncCounter() as syncs:
        trainer.objective.counts(logits, spec, graph)
    assert dict(syncs.calls) == {"tolist": 1}


def test_neighbourhood_counts_read_the_device_once_for_all_their_pieces(trainer):
    """Pieces of 10, 40 and 200 vertices, their logits computed beforehand (what the
    logits of a piece read is the neighbourhood's, not the counting's): the counts are
    read back once, and equal the layer-wise ones."""
    evaluator = NeighbourhoodEvaluator(trainer.model, trainer.graph)
    layerwise = _counted(trainer, NUM_NODES)[0]
    for piece in (10, 40, 200):
        computed = {}
        for start in range(0, NUM_NODES, piece):
            targets = np.arange(start, min(start + piece, NUM_NODES))
            computed[start] = evaluator.logits(targets)
        precomputed = mock.patch.object(
            evaluator, "logits", lambda targets, known=computed: known[targets[0]]
        )
        with precomputed, HostSyncCounter() as syncs:
            counts = evaluator.counts((0, NUM_NODES), chunk_rows=piece)
        assert dict(syncs.calls) == {"tolist": 1}, piece
        assert counts == layerwise, piece


def test_a_multilabel_training_step_reads_the_device_once():
    """The binary cross-entropy of the labelled rows without boolean indexing: the step's
    one read is the loss with the non-finite flag, as for a single-label graph."""
    trainer = _trainer(multilabel=True)
    trainer.train_step(trainer.sample(0))  # creates Adam's state
    steps = [state["step"] for state in trainer.optimizer.state.values()]
    batch = trainer.sample(1)
    with HostSyncCounter(host_resident=steps) as syncs:
        trainer.train_step(batch)
    assert dict(syncs.calls) == {"tolist": 1}
    # the loss alone reads nothing, and is the mean over the labelled rows and classes
    logits, spec = trainer.model(batch)
    with HostSyncCounter() as syncs:
        loss = trainer.objective.loss(logits, spec, batch)
    assert syncs.total == 0, dict(syncs.calls)
    mask = batch.masks["train"]
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[mask], batch.labels[mask].to(logits.dtype)
    )
    assert loss.item() == pytest.approx(float(expected), rel=1e-6)


class _Copies(TorchDispatchMode):
    """The copies between tensors (and devices) of the operators under it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.copy_):
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_full_graph_ids_are_made_on_the_device(trainer, monkeypatch):
    """Every evaluation takes the ids of all vertices (0.9 GB at 111M vertices): made
    where the store keeps its share ("meta" stands in for a GPU), never copied there,
    their split found from the range without reading anything back."""
    on_cpu = trainer.store.full_graph().rows
    monkeypatch.setattr(trainer.store, "device", torch.device("meta"))
    with _Copies() as copies, HostSyncCounter() as syncs:
        rows = trainer.store.full_graph().rows
    assert copies.calls == [] and syncs.total == 0, (copies.calls, dict(syncs.calls))
    assert rows.vertex_ids.device == torch.device("meta")
    assert rows.vertex_ids.shape == on_cpu.vertex_ids.shape == (NUM_NODES,)
    assert rows.bounds == on_cpu.bounds
    assert torch.equal(on_cpu.vertex_ids, torch.arange(NUM_NODES))
