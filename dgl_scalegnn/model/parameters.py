"""Parameters sliced from global tensors: every grid initialises the same model.

A parameter is this rank's slice of a tensor initialised from the seed at its *global*
shape, and carries that shape and split as ``param.shard`` (a
:class:`~dgl_scalegnn.core.schedule.ParamShard`), which checkpointing reads.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from dgl_scalegnn.core.schedule import ParamShard
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.parallel.norm import reduce_grad
from dgl_scalegnn.parallel.partition import ShardSpec

__all__ = ["init_global_parameter", "sharded_parameter", "optional_parameter", "add_bias"]


def init_global_parameter(name: str, shard: ParamShard, seed: int) -> torch.Tensor:
    """The full parameter ``name``: ``shard.init`` everywhere when given, else
    Glorot-uniform weights from ``seed`` (vectors with ``shard.fans`` too), unit gains
    and zero biases (``*_bias``).

    >>> init_global_parameter("layer0_eps", ParamShard((), (), init=0.5), seed=0).item()
    0.5
    """
    shape = shard.global_shape
    if shard.init is not None:
        return torch.full(shape, float(shard.init))
    if len(shape) == 1 and shard.fans is None:
        return torch.zeros(shape) if name.endswith("_bias") else torch.ones(shape)
    generator = torch.Generator().manual_seed(mix_seed(seed, zlib.crc32(name.encode())))
    fan_in, fan_out = shape if shard.fans is None else shard.fans
    bound = (6.0 / (fan_in + fan_out)) ** 0.5
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


def sharded_parameter(name: str, shard: ParamShard, runtime: Runtime, seed: int) -> nn.Parameter:
    """This rank's slice of parameter ``name``, with ``shard`` recorded on it.

    >>> from dgl_scalegnn.core.layout import Axis
    >>> param = sharded_parameter("w", ParamShard((6, 4), (Axis.X, Axis.Y)),
    ...                           Runtime.single_process(), seed=0)
    >>> tuple(param.shape), param.shard.global_shape
    ((6, 4), (6, 4))
    """
    grid = runtime.grid
    full = init_global_parameter(name, shard, seed)
    param = nn.Parameter(full[shard.local_slices(grid.shape, grid.coords)].contiguous())
    param.shard = shard
    return param


def optional_parameter(
    name: str, shards: dict[str, ParamShard], runtime: Runtime, seed: int
) -> nn.Parameter | None:
    """:func:`sharded_parameter` ``name`` if the model has it (a gain or a bias), else None."""
    return sharded_parameter(name, shards[name], runtime, seed) if name in shards else None


def add_bias(
    out: torch.Tensor, bias: torch.Tensor | None, spec: ShardSpec, runtime: Runtime
) -> torch.Tensor:
    """``out + bias`` for a linear map's output in ``spec`` (bias ``(cols,)``, this rank's
    columns), the bias's gradient completed over the rows' axis; ``out`` without a bias.
    Without autograd (an evaluation) the bias is added to ``out`` in place: ``out`` is
    the product's own new matrix, and a second one would cost a chunk's allocation."""
    if bias is None:
        return out
    if not torch.is_grad_enabled():
        return out.add_(bias)
    return out + reduce_grad(bias, spec.layout.rows, runtime)
