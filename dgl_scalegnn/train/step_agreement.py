"""What every rank agrees on after a step's backward: one read of the device.

The data-parallel average of the gradients
(:func:`~dgl_scalegnn.parallel.data_parallel.average_gradients`) gives the mean loss
and whether any rank of the group saw a non-finite loss or gradient.
One more all-reduce (maximum) over every rank then agrees on three values: a non-finite
step anywhere (every rank skips it, or stops), the strongest signal request any rank
received (:mod:`~dgl_scalegnn.train.preemption`: checkpoint, or checkpoint and stop),
and the slowest rank's training seconds (every rank stops at the same step of a time
budget and sets the same learning rate). A loop that acts only on what the ranks agreed
on never leaves one rank waiting in a collective the others skipped.

Example
-------
>>> from dgl_scalegnn.config import ModelConfig
>>> from dgl_scalegnn.distributed.comm import Runtime
>>> from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
>>> runtime = Runtime.single_process()
>>> model = ParallelScaleGNN(ModelConfig(hidden=8, layers=1), in_features=4, num_classes=2,
...                          runtime=runtime, seed=0)
>>> loss = sum(p.sum() for p in model.parameters())
>>> loss.backward()
>>> agreed = agree_on_step(model, loss, runtime, Request.CHECKPOINT, train_seconds=1.5)
>>> agreed.nonfinite, agreed.request, agreed.train_seconds
(False, <Request.CHECKPOINT: 1>, 1.5)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dgl_scalegnn.distributed.comm import Runtime, reduce_over_world
from dgl_scalegnn.parallel.data_parallel import average_gradients
from dgl_scalegnn.train.preemption import Request

__all__ = ["StepAgreement", "agree_on_step"]


@dataclass(frozen=True)
class StepAgreement:
    """What every rank holds after :func:`agree_on_step`: the step's ``loss`` (the mean
    over the data-parallel groups), whether it was ``nonfinite`` anywhere, the strongest
    signal ``request``, and the slowest rank's ``train_seconds``."""

    loss: float
    nonfinite: bool
    request: Request
    train_seconds: float


def agree_on_step(
    model: torch.nn.Module,
    loss: torch.Tensor,
    runtime: Runtime,
    request: Request = Request.NONE,
    train_seconds: float = 0.0,
) -> StepAgreement:
    """Average ``model``'s gradients over the data-parallel group (in place) and agree
    with every rank on the step (collective; call it after ``loss.backward()``, before
    the optimizer's step): this rank's ``request`` and ``train_seconds`` go in, the
    world's come out. The device is read once."""
    status = average_gradients(list(model.parameters()), loss, runtime)
    flags = torch.stack(
        (status[1], status.new_full((), float(request)), status.new_full((), train_seconds))
    )
    mean_loss, nonfinite, agreed, seconds = torch.cat(
        (status[:1], reduce_over_world(flags, dist.ReduceOp.MAX))
    ).tolist()
    return StepAgreement(mean_loss, bool(nonfinite), Request(int(agreed)), seconds)
