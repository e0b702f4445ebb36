"""The single-process oracle of the parallel model, and assembly of rank shards."""

from __future__ import annotations

import torch
from sklearn.metrics import accuracy_score, f1_score

from benchmarks.common import prepared_dgl_graph
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.seeds import step_seed
from dgl_scalegnn.data.prepared import PreparedGraph
from dgl_scalegnn.model.reference import ScaleGNN
from dgl_scalegnn.model.stack import layer_kind
from dgl_scalegnn.sampling.dgl_loader import UniformVertexSampler, norm_graph
from dgl_scalegnn.sampling.uniform import sample_vertices


def reference_step(
    prepared: PreparedGraph, model: ModelConfig, batch_size: int, dp_rank: int = 0
) -> dict:
    """The reference model's logits, loss and gradients on DP group ``dp_rank``'s batch
    of step 0 (seed 0, as the trainer draws it); cross-entropy, or binary cross-entropy
    for a multi-label graph."""
    meta = prepared.meta
    reference = ScaleGNN(model, in_features=meta.num_features, num_classes=meta.num_classes, seed=0)
    sample = sample_vertices(meta.num_nodes, batch_size, step_seed(0, dp_rank, 0))
    graph = norm_graph(prepared_dgl_graph(prepared), layer_kind(model).normalisation)
    subgraph = UniformVertexSampler().sample(graph, sample)
    index = sample.numpy()
    features = torch.from_numpy(prepared.features[index])
    labels = torch.from_numpy(prepared.labels[index])
    mask = torch.from_numpy(prepared.train_mask[index])
    logits = reference(subgraph, features, vertex_ids=sample, step=0)
    if not mask.any():
        loss = logits.sum() * 0
    elif meta.multilabel:  # mean over the labelled rows and every class
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[mask], labels[mask])
    else:
        loss = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
    loss.backward()
    return {
        "sample": sample,
        "scores": _split_scores(prepared, index, logits.detach(), labels),
        "logits": logits.detach(),
        "loss": loss.item(),
        "grads": {n: p.grad.clone() for n, p in reference.params.items()},
        "params": {n: p.detach().clone() for n, p in reference.params.items()},
    }


def _split_scores(
    prepared: PreparedGraph, index, logits: torch.Tensor, labels: torch.Tensor
) -> dict[str, float]:
    """Accuracy (single-label) or micro-F1 (multi-label, logit > 0) per split of the batch,
    by scikit-learn."""
    scores = {}
    for split in ("train", "val", "test"):
        mask = torch.from_numpy(getattr(prepared, f"{split}_mask")[index])
        if not mask.any():
            continue
        if prepared.meta.multilabel:
            predicted = (logits[mask] > 0).int().numpy()
            scores[split] = f1_score(labels[mask].int().numpy(), predicted, average="micro")
        else:
            scores[split] = accuracy_score(labels[mask].numpy(), logits[mask].argmax(1).numpy())
    return scores


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
