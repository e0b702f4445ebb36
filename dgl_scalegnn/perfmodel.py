"""A communication, computation and memory model of one rank of the 4D algorithm.

Given the workload (``N``, ``nnz``, ``B``, dimensions and the model's config, whose
layer type :mod:`~dgl_scalegnn.model.convs` describes) and the grid
``Gd x Gx x Gy x Gz``, :func:`step_collectives` lists every collective a rank runs in
one training step, with its group kind, group size and payload, from the cost
function each parallel operator has beside it (composed by the model's layers);
:func:`step_bytes` sums the payloads per group kind (the same accounting as
:class:`~dgl_scalegnn.profiling.Profiler`). Batch rows split by vertex ranges, so a
part of ``n`` vertices holds ``B n / N`` rows in expectation.
:func:`step_time` turns payloads and flops into seconds for a :class:`Hardware`
(ring all-reduce: :math:`2 (g-1)/g \\cdot b / \\beta + 2 (g-1) \\alpha`, all-to-all:
:math:`b / \\beta + (g-1) \\alpha`, with :math:`\\alpha, \\beta` of the group's
operation and size where the hardware was measured so; a GEMM at the slower of its
flops and its bytes), the sampler's work where it shares the rank's cores
(:class:`SamplingCost`: CPU ranks), and :func:`memory_bytes` predicts what a rank
holds, the evaluation's whole-graph matrices included.

A full-graph evaluation runs in row chunks, each with its own collectives:
:func:`eval_stages` lists them per chunk and stage, :func:`eval_bytes` sums them, and
:func:`eval_time` adds their latency (what many small chunks pay) to the forward's
kernels; :func:`eval_chunk_rows` gives the chunk rows a GPU's free memory allows.

Example
-------
>>> from dgl_scalegnn.distributed.grid import GridShape
>>> from dgl_scalegnn.config import ModelConfig
>>> work = Workload(num_nodes=10_000, nnz=210_000, batch_size=2_000, in_features=64,
...                 num_classes=8, model=ModelConfig(hidden=128, layers=3))
>>> sorted(step_bytes(work, GridShape.parse("1x2x2x2"), rank=0))
['tp', 'x', 'y', 'z']
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.cost import DATA_PARALLEL, TP_GRID, CollectiveCost, LocalSizes
from dgl_scalegnn.core.grid_shape import Coords, GridShape
from dgl_scalegnn.core.layout import INPUT_LAYOUT, Axis, Layout, block_range
from dgl_scalegnn.core.schedule import (
    LayerKind,
    adjacency_planes,
    layer_layouts,
    layer_widths,
    logits_layout,
    steps_per_epoch,
)
from dgl_scalegnn.evaluation.buffer_plan import BufferPlan, Matrix
from dgl_scalegnn.evaluation.chunks import chunk_count
from dgl_scalegnn.evaluation.memory import (
    ChunkMemory,
    default_chunk_rows,
    largest_part_rows,
    widest_local_cols,
)
from dgl_scalegnn.model.layers import Head, InputFeatures, InputProjection
from dgl_scalegnn.model.objective import Objective
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.model.stack import conv_layer, parameter_shards
from dgl_scalegnn.parallel.data_parallel import average_gradients_cost
from dgl_scalegnn.sampling.uniform import UniformSampler

__all__ = [
    "Workload",
    "Hardware",
    "SamplingCost",
    "Collective",
    "step_collectives",
    "step_bytes",
    "step_time",
    "epoch_time",
    "memory_bytes",
    "EvalStage",
    "eval_stages",
    "eval_bytes",
    "eval_time",
    "eval_seconds",
    "eval_chunk_rows",
    "eval_buffer_bytes",
    "eval_memory_bytes",
]

_FLOAT = 4


@dataclass(frozen=True)
class Workload:
    """What one training step computes: global sizes and the model's config (its layer
    type, widths and switches are read from the config and the layer registry)."""

    num_nodes: int
    nnz: int  # entries of the normalised adjacency, self loops included
    batch_size: int
    in_features: int
    num_classes: int
    model: ModelConfig
    bf16_comm: bool = False

    @property
    def layers(self) -> int:
        return self.model.layers

    @property
    def hidden(self) -> int:
        return self.model.hidden

    @property
    def kind(self) -> LayerKind:
        """The layer type's schedule (layouts, normalisation)."""
        return conv_layer(self.model).kind

    @property
    def batch_nnz(self) -> float:
        """Expected entries of a sampled block: off-diagonal pairs kept with prob p, plus
        ``B`` self loops in the symmetric normalisation (the others have none)."""
        p = UniformSampler(self.num_nodes, self.batch_size).scaling().p
        loops = self.batch_size if self.kind.normalisation == "symmetric" else 0
        return loops + (self.nnz - self.num_nodes) * self.batch_size / self.num_nodes * p

    def steps_per_epoch(self, dp: int) -> int:
        return steps_per_epoch(self.num_nodes, self.batch_size, dp)


@dataclass(frozen=True)
class SamplingCost:
    """Seconds of a rank's sampler work on the step's path: ``vertex_s`` per vertex of
    the group's batch (every rank draws it and gathers its feature rows) and
    ``entry_s`` per adjacency entry its block extraction gathers (the sampled rows'
    entries within the block's columns)."""

    vertex_s: float
    entry_s: float


@dataclass(frozen=True)
class Hardware:
    """Rates seen by one rank.

    ``bandwidth`` maps a group kind (``x``, ``y``, ``z``, ``tp``, ``dp``) to the
    bytes/s its collectives get; ``latency_s`` per message step; ``gemm_flops`` the
    dense float32 rate; ``memory_bw`` bytes/s of element-wise kernels and of the
    sparse ones unless ``spmm_bw`` gives those. ``links`` maps ``(operation, group
    size)`` to the ``(latency_s, bytes/s)`` measured for it, which take the place of
    the two above (:mod:`~dgl_scalegnn.train.calibrate`). ``sampling``: the sampler's
    cost where it takes the rank's own cores (``None``: prefetched off the path, as on
    a GPU).
    """

    bandwidth: dict[str, float]
    latency_s: float
    gemm_flops: float
    memory_bw: float
    spmm_bw: float | None = None
    links: dict[tuple[str, int], tuple[float, float]] | None = None
    sampling: SamplingCost | None = None


@dataclass(frozen=True)
class Collective:
    """One collective of a step: its group kind and size, payload bytes and operation."""

    kind: str
    group_size: int
    payload: float
    operation: str  # "all_reduce" or "all_to_all"


class _Rank:
    """Expected local sizes of one rank."""

    sampled = True

    def __init__(self, work: Workload, shape: GridShape, coords: Coords) -> None:
        self.work, self.shape, self.coords = work, shape, coords

    def vertex_range(self, axis: Axis, index: int | None = None) -> tuple[int, int]:
        index = self.coords.along(axis) if index is None else index
        return block_range(self.work.num_nodes, self.shape.size(axis), index)

    def rows(self, axis: Axis, scale_to: int | None = None) -> float:
        """Expected batch rows of this rank's part along ``axis`` (of ``scale_to`` sampled)."""
        start, stop = self.vertex_range(axis)
        sampled = self.work.batch_size if scale_to is None else scale_to
        return sampled * (stop - start) / self.work.num_nodes

    def cols(self, width: int, axis: Axis, index: int | None = None) -> int:
        index = self.coords.along(axis) if index is None else index
        start, stop = block_range(width, self.shape.size(axis), index)
        return stop - start

    def sent(self, src: Layout, dst: Layout, width: int) -> float:
        """Expected elements this rank sends to the others when a matrix moves src -> dst:
        to each TP peer with its coordinate along ``src.rep``, the rows and columns their
        blocks share. That sum over the peers is a product of one sum per axis (a sum of
        overlaps with every block of an axis is this rank's own extent), less this
        rank's own term: no loop over the TP grid."""
        shape, me, work = self.shape, self.coords, self.work
        my_rows = self.vertex_range(src.rows)
        my_cols = block_range(width, shape.size(src.cols), me.along(src.cols))
        peers, own = 1, 1
        for axis in Axis:
            index = me.along(axis)
            here = 1  # the factor of the peer at this rank's index along the axis
            if axis == dst.rows:
                here = _overlap(my_rows, self.vertex_range(dst.rows, index))
            elif axis == dst.cols:
                here = _overlap(my_cols, block_range(width, shape.size(dst.cols), index))
            own *= here
            if axis == src.rep:
                peers *= here
            elif axis == dst.rows:
                peers *= my_rows[1] - my_rows[0]
            elif axis == dst.cols:
                peers *= my_cols[1] - my_cols[0]
            else:
                peers *= shape.size(axis)
        return work.batch_size * (peers - own) / work.num_nodes


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def _group_size(shape: GridShape, group: Axis | str) -> int:
    if group == TP_GRID:
        return shape.tp_size
    if group == DATA_PARALLEL:
        return shape.dp
    return shape.size(group)


def step_collectives(work: Workload, shape: GridShape, rank: int) -> list[Collective]:
    """Every collective ``rank`` runs in one training step (size-1 groups are skipped).

    Read from the operators' cost functions through the model, the objective and the
    DP gradient average (:mod:`dgl_scalegnn.core.cost`), at this rank's expected sizes.
    """
    me = _Rank(work, shape, shape.coords(rank))
    cfg = work.model
    costs = ParallelScaleGNN.cost(cfg, work.in_features, work.num_classes, me)
    costs += Objective.loss_cost(
        logits_layout(cfg.layers, cfg.head, work.kind), me, multilabel=False
    )
    costs += average_gradients_cost(_parameter_elements(work, shape, me.coords))
    return _collectives(costs, work, shape)


def _collectives(costs: list[CollectiveCost], work: Workload, shape: GridShape) -> list[Collective]:
    """The costs as collectives with payload bytes (size-1 groups run none)."""
    calls = []
    for cost in costs:
        size = _group_size(shape, cost.group)
        if size > 1:
            element_bytes = 2 if cost.low_precision and work.bf16_comm else _FLOAT
            calls.append(
                Collective(str(cost.group), size, cost.elements * element_bytes, cost.operation)
            )
    return calls


def _parameter_elements(work: Workload, shape: GridShape, coords: Coords) -> int:
    total = 0
    for shard in parameter_shards(work.model, work.in_features, work.num_classes).values():
        total += math.prod(s.stop - s.start for s in shard.local_slices(shape, coords))
    return total


def step_bytes(work: Workload, shape: GridShape, rank: int) -> dict[str, float]:
    """Expected payload bytes per group kind that ``rank`` sends in one training step."""
    out: dict[str, float] = defaultdict(float)
    for call in step_collectives(work, shape, rank):
        out[call.kind] += call.payload
    return dict(out)


def _collective_seconds(call: Collective, hardware: Hardware) -> float:
    bandwidth = hardware.bandwidth.get(call.kind, min(hardware.bandwidth.values()))
    latency = hardware.latency_s
    if hardware.links and (call.operation, call.group_size) in hardware.links:
        latency, bandwidth = hardware.links[(call.operation, call.group_size)]
    steps = call.group_size - 1
    if call.operation == "all_to_all":
        return call.payload / bandwidth + steps * latency
    return 2 * steps / call.group_size * call.payload / bandwidth + 2 * steps * latency


def step_time(
    work: Workload, shape: GridShape, hardware: Hardware, rank: int = 0
) -> dict[str, float]:
    """Seconds per component of one step of ``rank``; ``sampling`` where the hardware
    puts the sampler on the step's path (:class:`SamplingCost`)."""
    me = _Rank(work, shape, shape.coords(rank))
    seconds: dict[str, float] = defaultdict(float)
    for call in step_collectives(work, shape, rank):
        seconds[_component(call)] += _collective_seconds(call, hardware)
    for component, value in _compute_seconds(me, hardware, forward_only=False).items():
        seconds[component] += value
    if hardware.sampling is not None:
        seconds["sampling"] = _sampling_seconds(me, hardware.sampling)
    return dict(seconds)


def _sampling_seconds(me: _Rank, cost: SamplingCost) -> float:
    """The sampler's seconds of one step of ``me``: the group's batch drawn, and per
    adjacency plane the entries of the rank's sampled rows within its block's columns
    (``nnz / N`` a row, times the share of the columns the block holds)."""
    work = me.work
    entries = sum(
        me.rows(plane.rows) * work.nnz / work.num_nodes * me.rows(plane.cols, 1)
        for plane in adjacency_planes(work.layers, work.kind)
    )
    return work.batch_size * cost.vertex_s + entries * cost.entry_s


def _component(call: Collective) -> str:
    return {"dp": "dp_allreduce", "tp": "redistribute"}.get(call.kind, "tp_allreduce")


def _compute_seconds(me: _Rank, hardware: Hardware, forward_only: bool) -> dict[str, float]:
    """Seconds of the GEMMs, SpMMs and element-wise kernels of ``me``'s rows: forward and
    backward of a step, or (``forward_only``) an evaluation's forward."""
    work = me.work
    cfg, hidden = work.model, work.hidden
    states = layer_layouts(cfg.layers, work.kind)
    widths = layer_widths(cfg, work.in_features, work.num_classes)
    seconds: dict[str, float] = defaultdict(float)
    # Every matrix parameter is one GEMM over the rows of its map's input (a layer's
    # products read the aggregated rows, split like the layer input's replicated axis):
    # forward, then dX (not for the features) and dW.
    shards = parameter_shards(cfg, work.in_features, work.num_classes)
    conv = conv_layer(cfg)
    gemms = [(me.rows(INPUT_LAYOUT.rows), shards["input_proj"], 2)] if cfg.input_projection else []
    for state, width in zip(states, widths):
        matrices = conv.parameter_shards(state, width, cfg).values()
        gemms += [(me.rows(state.rep), m, 3) for m in matrices if len(m.global_shape) == 2]
    if cfg.head:
        gemms.append((me.rows(states[-1].rows), shards["head"], 3))
    for rows, shard, products in gemms:
        (width_in, width_out), (axis_in, axis_out) = shard.global_shape, shard.axes
        cols_in, cols_out = me.cols(width_in, axis_in), me.cols(width_out, axis_out)
        flops = 2 * rows * cols_in * cols_out
        # each product reads two of the three matrices and writes the third
        moved = _FLOAT * (rows * cols_in + rows * cols_out + cols_in * cols_out)
        one = max(flops / hardware.gemm_flops, moved / hardware.memory_bw)
        seconds["gemm"] += (1 if forward_only else products) * one
    spmm_bw = hardware.spmm_bw or hardware.memory_bw
    for state, layer in zip(states, widths):
        plane = state.spmm_plane()
        share = me.rows(plane.rows, 1) * me.rows(plane.cols, 1)  # fraction of Ã_S entries
        entries = work.batch_nnz * share
        moved = entries * (8 + _FLOAT * me.cols(layer.width_in, state.cols))  # index+value, row
        seconds["spmm"] += (1 if forward_only else 2) * moved / spmm_bw
        if not layer.outputs_classes:
            activations = me.rows(state.rep) * me.cols(hidden, state.rows) * _FLOAT
            # norm, relu, dropout, residual: about 4 passes forward, 12 with backward
            passes = 4 if forward_only else 12
            seconds["elementwise"] += passes * activations / hardware.memory_bw
    return dict(seconds)


def epoch_time(work: Workload, shape: GridShape, hardware: Hardware) -> float:
    """Seconds per epoch: steps per epoch times the slowest rank's step."""
    slowest = max(sum(step_time(work, shape, hardware, r).values()) for r in range(shape.tp_size))
    return work.steps_per_epoch(shape.dp) * slowest


@dataclass(frozen=True)
class EvalStage:
    """A chunked stage of a full-graph evaluation
    (:func:`~dgl_scalegnn.evaluation.layerwise.full_graph_forward`): the row
    axis its chunks split, how many chunks the rank runs of the ``total_chunks`` its
    data-parallel replicas share, the collectives of one chunk (payloads of the average
    chunk: the stage's rows over its chunks), and ``shared``: the all-reduce over the
    replicas that completes the stage's output on each, once after its chunks."""

    name: str
    axis: Axis
    chunks: int
    collectives: tuple[Collective, ...]
    total_chunks: int
    shared: tuple[Collective, ...] = ()


class _ChunkSizes:
    """Local sizes of the average chunk of a stage: ``whole``'s rows (every vertex a row)
    shared out over ``chunks``."""

    sampled = False

    def __init__(self, whole: _Rank, chunks: int) -> None:
        self.whole, self.chunks = whole, chunks

    def rows(self, axis: Axis) -> float:
        return self.whole.rows(axis) / self.chunks

    def cols(self, width: int, axis: Axis) -> int:
        return self.whole.cols(width, axis)

    def sent(self, src: Layout, dst: Layout, width: int) -> float:
        return self.whole.sent(src, dst, width) / self.chunks


def _whole_graph(work: Workload, shape: GridShape, rank: int) -> _Rank:
    """``rank``'s sizes when the batch is every vertex (``p = 1``: ``Ã`` itself)."""
    return _Rank(dataclasses.replace(work, batch_size=work.num_nodes), shape, shape.coords(rank))


def _forward(costs: list[CollectiveCost]) -> list[CollectiveCost]:
    """The collectives of an evaluation's forward: those not marked ``backward``."""
    return [cost for cost in costs if not cost.backward]


def eval_stages(work: Workload, shape: GridShape, rank: int, chunk_rows: int) -> list[EvalStage]:
    """The stages of one full-graph evaluation of ``rank`` in chunks of ``chunk_rows``
    output rows per rank, with the forward collectives of one chunk each (from the
    operators' cost functions); one TP rank runs none in a chunk. The data-parallel
    replicas share each stage's chunks, and one all-reduce over them completes its output.

    >>> from dgl_scalegnn.distributed.grid import GridShape
    >>> from dgl_scalegnn.config import ModelConfig
    >>> work = Workload(num_nodes=10_000, nnz=210_000, batch_size=2_000, in_features=64,
    ...                 num_classes=8, model=ModelConfig(hidden=128, layers=2))
    >>> [(s.name, s.chunks, len(s.collectives))
    ...  for s in eval_stages(work, GridShape.parse("1x2x2x2"), 0, chunk_rows=1000)]
    [('input', 5, 1), ('layer0', 5, 4), ('layer1', 5, 5)]
    >>> [(s.name, s.chunks, s.total_chunks, len(s.shared))  # replica 1 of 2
    ...  for s in eval_stages(work, GridShape.parse("2x2x2x1"), 4, chunk_rows=1000)]
    [('input', 2, 5, 1), ('layer0', 5, 10, 1), ('layer1', 2, 5, 1)]
    """
    whole, cfg = _whole_graph(work, shape, rank), work.model
    layer = conv_layer(cfg)
    replica = shape.coords(rank).d
    plan = _plan(work, shape)
    first, owned = plan.first.layout, plan.owned
    outputs = [(matrix.layout, matrix.width) for matrix in plan.outputs]

    def stage(name: str, axis: Axis, costs_of, output: tuple[Layout, int] | None) -> EvalStage:
        """A stage of row chunks that the replicas share, completing ``output``; the
        head alone on the whole input (``output`` None) is one piece on every replica."""
        total = 1 if output is None else chunk_count(work.num_nodes, shape.size(axis), chunk_rows)
        costs = costs_of(_ChunkSizes(whole, total))
        chunks = total if output is None else len(range(replica, total, shape.dp))
        shared = []
        if output is not None:
            layout, width = output
            elements = whole.rows(layout.rows) * whole.cols(width, layout.cols)
            shared = _collectives([CollectiveCost(DATA_PARALLEL, elements)], work, shape)
        collectives = tuple(_collectives(costs, work, shape))
        return EvalStage(name, axis, chunks, collectives, total, tuple(shared))

    def input_costs(sizes: LocalSizes) -> list[CollectiveCost]:
        if shape.tp_size == 1:  # every layout is the whole matrix
            return []
        if cfg.input_projection:
            return _forward(InputProjection.cost(cfg, work.in_features, sizes))
        return _forward(InputFeatures.cost(work.in_features, sizes))

    def head_costs(layout: Layout, sizes: LocalSizes) -> list[CollectiveCost]:
        return _forward(Head.cost(layout, cfg, work.num_classes, sizes))

    stages = [stage("input", first.rows, input_costs, (first, plan.first.width))] if owned else []
    if not cfg.layers:  # the head on the whole input, in one piece
        return [*stages, stage("head", first.rows, lambda z: head_costs(first, z), None)]
    layouts = layer_layouts(cfg.layers, layer.kind)
    for layout, widths, output in zip(
        layouts, layer_widths(cfg, work.in_features, work.num_classes), outputs
    ):
        out = layer.kind.output_layout(layout)

        def layer_costs(sizes: LocalSizes, layout=layout, widths=widths, out=out):
            costs = _forward(layer.cost(layout, widths, cfg, sizes, needs_dx=False))
            if widths.index == cfg.layers - 1 and cfg.head:
                costs += head_costs(out, sizes)
            return costs

        stages.append(stage(f"layer{widths.index}", out.rows, layer_costs, output))
    return stages


def _plan(work: Workload, shape: GridShape) -> BufferPlan:
    """The :class:`~dgl_scalegnn.evaluation.buffer_plan.BufferPlan` of ``work``'s model
    on ``shape``: the whole-graph matrices the engine holds."""
    return BufferPlan.of(work.model, work.in_features, work.num_classes, shape)


def eval_bytes(work: Workload, shape: GridShape, rank: int, chunk_rows: int) -> dict[str, float]:
    """Payload bytes per group kind that ``rank`` sends in one full-graph evaluation."""
    out: dict[str, float] = defaultdict(float)
    for stage in eval_stages(work, shape, rank, chunk_rows):
        for call in stage.collectives:
            out[call.kind] += stage.chunks * call.payload
        for call in stage.shared:
            out[call.kind] += call.payload
    return dict(out)


def eval_time(
    work: Workload, shape: GridShape, hardware: Hardware, chunk_rows: int, rank: int = 0
) -> dict[str, float]:
    """Seconds per component of one full-graph evaluation of ``rank``: every chunk's
    collectives (their latency is what many small chunks pay) and the forward's kernels
    over the whole graph."""
    seconds: dict[str, float] = defaultdict(float)
    stages = eval_stages(work, shape, rank, chunk_rows)
    for stage in stages:
        for call in stage.collectives:
            seconds[_component(call)] += stage.chunks * _collective_seconds(call, hardware)
        for call in stage.shared:
            seconds[_component(call)] += _collective_seconds(call, hardware)
    # the data-parallel replicas share the chunks
    share = sum(s.chunks for s in stages) / max(1, sum(s.total_chunks for s in stages))
    whole = _whole_graph(work, shape, rank)
    for component, value in _compute_seconds(whole, hardware, forward_only=True).items():
        seconds[component] += share * value
    return dict(seconds)


def eval_seconds(work: Workload, shape: GridShape, hardware: Hardware, chunk_rows: int) -> float:
    """Seconds of one full-graph evaluation: the slowest rank's."""
    return max(
        sum(eval_time(work, shape, hardware, chunk_rows, r).values()) for r in range(shape.tp_size)
    )


def _chunk_memory(work: Workload, shape: GridShape, rank: int = 0) -> ChunkMemory:
    """What an evaluation's chunks take on ``rank`` (float32 features, int32 indices):
    :class:`~dgl_scalegnn.evaluation.memory.ChunkMemory` beside the whole-graph
    matrices of :func:`eval_buffer_bytes` and the ids of every vertex (int64)."""
    me = _Rank(work, shape, shape.coords(rank))
    n = work.num_nodes
    entries_per_row = max(
        work.nnz * me.rows(plane.cols, n) / n**2
        for plane in adjacency_planes(work.layers, work.kind)
    )
    widths = (work.in_features, work.hidden, work.num_classes)
    return ChunkMemory.of(
        widest_cols=widest_local_cols(shape, widths),
        entries_per_row=entries_per_row,
        reserved_bytes=eval_buffer_bytes(work, shape, rank) + 8 * n,
    )


def eval_chunk_rows(work: Workload, shape: GridShape, free_bytes: float) -> int:
    """Chunk rows the GPU rule (:meth:`~dgl_scalegnn.evaluation.memory.ChunkMemory.rows_within`)
    gives a rank of ``shape`` with ``free_bytes`` free on its device (float32 features,
    int32 indices), at most the rows it holds of a layer's matrix."""
    most = largest_part_rows(work.num_nodes, shape)
    return min(most, _chunk_memory(work, shape).rows_within(free_bytes))


def eval_buffer_bytes(work: Workload, shape: GridShape, rank: int = 0) -> float:
    """Peak bytes of the whole-graph matrices a full-graph evaluation holds on ``rank``
    (:func:`~dgl_scalegnn.evaluation.buffer_plan.buffer_peak` of the first layer's input
    and each layer's output, float32): on one TP rank the first layer reads the
    features in place and projects its aggregation, and a layer that narrows takes its
    input times its weight in the input's place (made chunk by chunk by the layer before;
    a first layer holds both for a while); elsewhere the input (projected or moved to the
    first layer's layout) is a matrix of its own.

    >>> from dgl_scalegnn.distributed.grid import GridShape
    >>> from dgl_scalegnn.config import ModelConfig
    >>> work = Workload(num_nodes=1000, nnz=11_000, batch_size=100, in_features=64,
    ...                 num_classes=8, model=ModelConfig(hidden=128, layers=2))
    >>> eval_buffer_bytes(work, GridShape.parse("1x1x1x1"))  # (1000 x 128) + (1000 x 8)
    544000.0
    >>> eval_buffer_bytes(work, GridShape.parse("1x2x2x2"))  # 2 x (500 x 64)
    256000.0
    """
    me = _whole_graph(work, shape, rank)

    def size(matrix: Matrix) -> float:
        return me.rows(matrix.layout.rows) * me.cols(matrix.width, matrix.layout.cols) * _FLOAT

    return _plan(work, shape).peak_bytes(size)


def eval_memory_bytes(work: Workload, shape: GridShape, rank: int = 0) -> float:
    """Bytes a full-graph evaluation adds on ``rank``: its whole-graph matrices
    (:func:`eval_buffer_bytes`) and one chunk's temporaries at the CPU's chunk rows
    (:func:`~dgl_scalegnn.evaluation.memory.default_chunk_rows`, at most the rows a
    rank holds of a layer's matrix; a GPU sizes its chunks to what is free)."""
    memory = _chunk_memory(work, shape, rank)
    rows = min(default_chunk_rows(shape.tp_size), largest_part_rows(work.num_nodes, shape))
    return memory.reserved_bytes + rows * memory.row_bytes


def memory_bytes(work: Workload, shape: GridShape, rank: int = 0) -> dict[str, float]:
    """Bytes a rank holds at its peak: graph share, model state, one step's batch and
    activations, and ``evaluation``: what a full-graph evaluation
    (:func:`eval_memory_bytes`) needs beyond the step's batch and activations, whose
    memory it reuses."""
    me = _Rank(work, shape, shape.coords(rank))
    n = work.num_nodes
    graph = 0.0
    for plane in adjacency_planes(work.layers, work.kind):
        rows, cols = (me.rows(axis, n) for axis in (plane.rows, plane.cols))
        # int32 column indices and int64 row pointers; values are r_i c_j, not stored
        graph += work.nnz * rows * cols / n**2 * 4 + (rows + 1) * 8
        graph += (rows + cols) * _FLOAT + cols * 8  # degree scalings, column map
    graph += me.rows(INPUT_LAYOUT.rows, n) * me.cols(work.in_features, INPUT_LAYOUT.cols) * _FLOAT
    graph += me.rows(logits_layout(work.layers, kind=work.kind).rows, n) * (8 + 3)  # labels, masks
    model = 4 * _parameter_elements(work, shape, me.coords) * _FLOAT  # weights, grads, Adam
    batch = 0.0
    activations = 0.0
    for state in layer_layouts(work.layers, work.kind)[: work.layers]:
        plane = state.spmm_plane()
        batch += work.batch_nnz * me.rows(plane.rows, 1) * me.rows(plane.cols, 1) * 2 * (8 + _FLOAT)
        per_layer = me.rows(state.rep) * me.cols(work.hidden, state.rows) * _FLOAT
        activations += 6 * per_layer  # saved for backward: H, C, norm input, masks, residual
    evaluation = max(0.0, eval_memory_bytes(work, shape, rank) - batch - activations)
    return {
        "graph": graph,
        "model": model,
        "batch": batch,
        "activations": activations,
        "evaluation": evaluation,
    }
