"""The data-parallel gradient average, with the loss and a non-finite flag riding in it.

After backward every rank of a DP group holds the gradient of its own batch for the
same parameter shards; one all-reduce over the group averages them. The step's loss
and this rank's non-finite flag are appended to the same buffer, so finding a NaN
anywhere in the group costs no collective of its own.
"""

from __future__ import annotations

import torch

from dgl_scalegnn.core.cost import DATA_PARALLEL, CollectiveCost
from dgl_scalegnn.distributed.comm import Runtime, all_reduce

__all__ = ["average_gradients", "average_gradients_cost"]

#: Values appended to the gradients: the loss and the non-finite flag.
_STATUS_ELEMENTS = 2


def _nonfinite_flag(loss: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    """0-dim float: 1 if ``loss`` or a gradient is NaN or infinite, else 0."""
    # The norm of all gradients is finite exactly when every entry is (one fused pass).
    norm = torch.nn.utils.get_total_norm(grads) if grads else loss.new_zeros(())
    return (~(torch.isfinite(loss.detach()) & torch.isfinite(norm))).float().reshape(())


def average_gradients(
    parameters: list[torch.nn.Parameter], loss: torch.Tensor, runtime: Runtime
) -> torch.Tensor:
    """Average the gradients of ``parameters`` over the DP group in place.

    Returns ``[mean loss, non-finite flag]`` (float32, on the device): the flag is
    non-zero on every rank of the group as soon as one of them saw a non-finite loss
    or gradient.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    status = torch.stack((loss.detach().float().reshape(()), _nonfinite_flag(loss, grads)))
    dp = runtime.grid.dp_group
    if dp.size == 1:
        return status
    flat = torch.cat([g.reshape(-1) for g in grads] + [status])
    flat = all_reduce(flat, dp, runtime.profiler, component="dp_allreduce")
    flat /= dp.size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    return flat[offset:].float()


def average_gradients_cost(parameter_elements: int) -> list[CollectiveCost]:
    """Collective of :func:`average_gradients`: one float32 all-reduce over the DP group
    of the rank's parameter shards plus the loss and the flag."""
    return [CollectiveCost(DATA_PARALLEL, parameter_elements + _STATUS_ELEMENTS)]
