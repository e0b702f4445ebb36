"""Class weights and label smoothing in the parallel losses equal PyTorch's.

Each rank of a grid computes the loss of its logits shard (the classes split along an
axis, the rows along another, replicas holding copies); the shards put together give the
batch's logits, whose ``torch.nn.functional.cross_entropy(weight=, label_smoothing=)``
(or ``binary_cross_entropy_with_logits(weight=)`` with smoothed targets, multi-label) is
the oracle for the loss on every rank and for each shard's gradient.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.ranks import spawn_ranks
from tests.workers.weighted_losses import SMOOTHING


def _assembled(records: list[dict]) -> tuple[torch.Tensor, ...]:
    """The batch's logits, gradient, labels and mask, from every rank's shard (its rows
    are vertex ids: each rank holds a range of the batch's vertices)."""
    ids = torch.unique(torch.cat([r["rows"].long() for r in records]))  # the batch's vertices
    num_rows = ids.numel()
    num_classes = max(r["cols"][1] for r in records)
    first = records[0]
    logits = torch.full((num_rows, num_classes), torch.nan)
    grad = torch.full_like(logits, torch.nan)
    labels = torch.zeros((num_rows, *first["labels"].shape[1:]), dtype=first["labels"].dtype)
    mask = torch.zeros(num_rows, dtype=torch.bool)
    for record in records:
        rows, (start, stop) = torch.searchsorted(ids, record["rows"].long()), record["cols"]
        logits[rows, start:stop] = record["logits"]
        grad[rows, start:stop] = record["grad"]
        labels[rows], mask[rows] = record["labels"], record["mask"]
    assert not logits.isnan().any()
    return logits, grad, labels, mask


@pytest.mark.parametrize("multilabel", [False, True], ids=["cross-entropy", "multi-label"])
@pytest.mark.parametrize("grid", ["1x1x1x1", "1x2x2x1", "2x1x1x2"])
def test_weights_and_smoothing_equal_pytorchs_loss_and_gradient(grid, multilabel, tmp_path):
    world = torch.tensor([int(g) for g in grid.split("x")]).prod().item()
    spawn_ranks(world, "tests.workers.weighted_losses:main", [grid, multilabel, str(tmp_path)],
                tmp_path / "logs")  # fmt: skip
    records = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for group in {r["group"] for r in records}:  # each data-parallel group has its batch
        _check_group([r for r in records if r["group"] == group], multilabel)


def _check_group(records: list[dict], multilabel: bool) -> None:
    logits, grad, labels, mask = _assembled(records)
    leaf = logits[mask].clone().requires_grad_()
    weights = 1 + torch.arange(logits.shape[1], dtype=torch.float32) / logits.shape[1]
    if multilabel:
        targets = labels[mask].float() * (1 - SMOOTHING) + SMOOTHING / 2
        expected = F.binary_cross_entropy_with_logits(leaf, targets, weight=weights)
    else:
        expected = F.cross_entropy(leaf, labels[mask].long(), weight=weights,
                                   label_smoothing=SMOOTHING)  # fmt: skip
    expected.backward()
    for record in records:
        torch.testing.assert_close(record["loss"], expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad[mask], leaf.grad, rtol=1e-4, atol=1e-6)
    assert (grad[~mask] == 0).all()
