"""The single-process oracle of the parallel model, and assembly of rank shards."""

from __future__ import annotations

import torch

from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.seeds import step_seed
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.sampling.uniform import UniformVertexSampler, sample_vertices


def reference_step(
    prepared: PreparedGraph, model: ModelConfig, batch_size: int, dp_rank: int = 0
) -> dict:
    """The reference model's logits, loss and gradients on DP group ``dp_rank``'s batch
    of step 0 (seed 0, as the trainer draws it)."""
    meta = prepared.meta
    reference = ScaleGNN(model, in_features=meta.num_features, num_classes=meta.num_classes, seed=0)
    sample = sample_vertices(meta.num_nodes, batch_size, step_seed(0, dp_rank, 0))
    subgraph = UniformVertexSampler().sample(prepared_dgl_graph(prepared), sample)
    index = sample.numpy()
    features = torch.from_numpy(prepared.features[index])
    labels = torch.from_numpy(prepared.labels[index])
    mask = torch.from_numpy(prepared.train_mask[index])
    logits = reference(subgraph, features, vertex_ids=sample, step=0)
    loss = (
        torch.nn.functional.cross_entropy(logits[mask], labels[mask])
        if mask.any()
        else logits.sum() * 0
    )
    loss.backward()
    return {
        "sample": sample,
        "logits": logits.detach(),
        "loss": loss.item(),
        "grads": {n: p.grad.clone() for n, p in reference.params.items()},
        "params": {n: p.detach().clone() for n, p in reference.params.items()},
    }


def assemble(records: list, slicer, shape: tuple[int, ...]) -> torch.Tensor:
    """Global tensor from shards; every replica of a slice must be bit-identical."""
    out = torch.full(shape, float("nan"))
    for record in records:
        index, local = slicer(record)
        existing = out[index]
        filled = ~torch.isnan(existing)
        if filled.any():
            assert torch.equal(existing[filled], local[filled]), "replicas differ"
        out[index] = local
    assert not torch.isnan(out).any(), "some part of the tensor is held by no rank"
    return out
