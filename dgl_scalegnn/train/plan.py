"""Choosing a grid: every shape ``Gd x Gx x Gy x Gz`` of ``N`` ranks, by the cost model.

What a user wants of a grid is progress in training: updates of the model a second at
the batch they asked for. The config's ``sampling.batch_size`` ``B`` is read as the
global batch of one update: a shape of ``Gd`` data-parallel groups draws
``ceil(B / Gd)`` vertices in each (its ``sampling.batch_size``), so that every shape's
step is one update of about ``B`` vertices and an epoch is about ``N / B`` steps on
every shape. (Ranked by epoch time at ``B`` a group instead, a data-parallel shape
wins by taking ``Gd`` batches a step: fewer updates in the same seconds, which is what
a budget of seconds buys.)

Each shape is costed by :mod:`dgl_scalegnn.perfmodel` on rank 0, which holds the
largest block along every axis (uneven splits give the first blocks the extra rows):
the seconds of a step (its collectives and kernels, the sampler's work where it shares
the cores), of one full-graph evaluation, and the bytes a rank holds. Shapes that fit
the memory of a rank are ranked by updates a second (the fastest step first), then
evaluation time, then memory; the others follow, marked, least memory first (where
none fits, the shape nearest to fitting leads). The sentence under the table says why
the first wins over the next slower one: the component of the step where the
difference lies and the bytes behind it.

The graph's sizes come from ``data.prepared``, else from the prepared copy in the cache
(:mod:`~dgl_scalegnn.data.cache`) when training already made one, else from the file
of ``data.name: dgl`` (its adjacency normalised here), the generator's settings
(``synthetic``: ``avg_degree`` entries a row plus the self loop) or the published sizes
of the public datasets. Settings the config leaves to the graph
(:mod:`~dgl_scalegnn.train.defaults`) are derived as training would, for the memory of
one rank of the machine.

Machines (one rank per GPU, or per core for ``cpu``), rates as a rank sees them, from
published figures:

``a100``
    Perlmutter-like nodes of 4 A100 40 GB: NCCL all-reduce at 150 GB/s over NVLink inside
    a node, 25 GB/s per GPU across nodes (four 25 GB/s NICs), 15 us a message step;
    19.5 TFLOP/s float32 GEMMs (156 with TF32), 1.55 TB/s memory.
``h100``
    DGX-like nodes of 8 H100 80 GB: 350 GB/s over NVLink, 50 GB/s per GPU across nodes
    (one 400 Gb/s NIC each), 10 us; 67 TFLOP/s float32 (495 with TF32), 3.35 TB/s.
``cpu``
    Nodes like this machine, one rank per core and its share of the total memory:
    gloo at 5 GB/s inside a node, 1.25 GB/s across (10 Gb/s Ethernet), 50 us; 50 GFLOP/s
    and 10 GB/s a core. Where this machine was calibrated for the rank count
    (:mod:`~dgl_scalegnn.train.calibrate`, ``scalegnn plan --calibrate``), its measured
    rates take their place, for that many ranks on this host sharing its memory.

Sources of the GPU figures: NVIDIA's A100 datasheet (19.5 TFLOP/s float32, 156 TF32,
1,555 GB/s HBM2 of the 40 GB part, 600 GB/s of NVLink a GPU, both directions) and H100
SXM datasheet (67 TFLOP/s float32, 495 TF32 without sparsity, 3.35 TB/s HBM3, 900 GB/s
of NVLink); NERSC's Perlmutter architecture page (4 A100 a node, four Slingshot NICs of
25 GB/s); NVIDIA's DGX H100 user guide (8 H100 a node, eight 400 Gb/s ConnectX-7). The
NCCL all-reduce rates are about half the NVLink figure (one direction; the bus
bandwidth ``nccl-tests`` reports on such nodes), the latencies those of small NCCL
messages inside a node.

Example
-------
>>> from dgl_scalegnn.perfmodel import Workload
>>> from dgl_scalegnn.config import ModelConfig
>>> work = Workload(num_nodes=20_000, nnz=220_000, batch_size=10_000, in_features=64,
...                 num_classes=8, model=ModelConfig(hidden=128, layers=2))
>>> plans = rank_grids(work, 8, MACHINES["a100"], tf32=True)
>>> len(plans), str(plans[0].grid), plans[0].batch_size
(20, '8x1x1x1', 1250)
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dgl_scalegnn.config import Config, ConfigError, DataConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.featureless import FEATURELESS_CLASSES, FEATURELESS_DIM
from dgl_scalegnn.evaluation.memory import default_chunk_rows
from dgl_scalegnn.perfmodel import (
    Hardware,
    Workload,
    eval_chunk_rows,
    eval_time,
    memory_bytes,
    step_bytes,
    step_time,
)
from dgl_scalegnn.train.defaults import GraphShape, apply_graph_defaults, memory_budget_bytes

if TYPE_CHECKING:
    from dgl_scalegnn.train.calibrate import Calibration

__all__ = [
    "MAX_PLAN_RANKS",
    "Machine",
    "MACHINES",
    "machine",
    "calibrated_machine",
    "group_batch",
    "GridPlan",
    "grid_shapes",
    "plan_grid",
    "rank_grids",
    "why_best",
    "graph_shape",
    "workload",
    "plan_lines",
    "plan_report",
]

#: The share of a rank's memory the model's estimate may take (the rest: allocator
#: slack, the interpreter, communication buffers).
FIT_SHARE = 0.9
#: The most ranks ``scalegnn plan`` ranks the grids of: more GPUs than one job gets on
#: today's largest machines. Every shape is costed, and a count below it has at most
#: 26,880 shapes (60,480 ranks); a power of two, at most 969.
MAX_PLAN_RANKS = 2**16


@dataclass(frozen=True)
class Machine:
    """Rates seen by one rank of ``name`` machines, ``per_node`` ranks a node, or
    (``calibration``) the rates measured on this host for its ranks."""

    name: str
    per_node: int
    node_bandwidth: float  # bytes/s of a collective inside a node
    network_bandwidth: float  # bytes/s per rank across nodes
    latency_s: float
    gemm_flops: float
    tf32_flops: float
    memory_bw: float
    rank_memory: float  # bytes
    calibration: Calibration | None = None

    def hardware(self, shape: GridShape, tf32: bool) -> Hardware:
        """The rates of ``shape``'s groups as rank 0 sees them: calibrated, those measured
        for its rank count; else a group whose ranks share its node gets the node's
        bandwidth (ranks are numbered x fastest, then y, z and d, and fill nodes in
        order: rank 0's group of ``size`` ranks ``span`` apart ends at rank
        ``(size - 1) * span``)."""
        if self.calibration is not None:
            return self.calibration.rates(shape.world_size).hardware()
        span = {"x": 1, "y": shape.x, "z": shape.x * shape.y, "tp": 1, "dp": shape.tp_size}
        size = {"x": shape.x, "y": shape.y, "z": shape.z, "tp": shape.tp_size, "dp": shape.dp}
        bandwidth = {
            kind: self.node_bandwidth
            if (size[kind] - 1) * span[kind] < self.per_node
            else self.network_bandwidth
            for kind in span
        }
        flops = self.tf32_flops if tf32 else self.gemm_flops
        return Hardware(bandwidth, self.latency_s, flops, self.memory_bw)

    def describe(self) -> str:
        if self.calibration is not None:
            return f"all on this host, {self.rank_memory / 1e9:.1f} GB a rank"
        inside, across = self.node_bandwidth / 1e9, self.network_bandwidth / 1e9
        return (
            f"{self.per_node} a node, {inside:g} GB/s inside a node and {across:g} GB/s across, "
            f"{self.rank_memory / 1e9:.1f} GB a rank"
        )


MACHINES = {
    "a100": Machine("a100", 4, 150e9, 25e9, 15e-6, 19.5e12, 156e12, 1.55e12, 40e9),
    "h100": Machine("h100", 8, 350e9, 50e9, 10e-6, 67e12, 495e12, 3.35e12, 80e9),
}


def machine(name: str, ranks: int) -> Machine:
    """The machine ``name`` (``a100``, ``h100`` or ``cpu``: nodes like this one)."""
    if name in MACHINES:
        return MACHINES[name]
    if name != "cpu":
        raise ConfigError(f"--gpu: got {name!r}; choose one of a100, h100, cpu")
    cores = os.cpu_count() or 1
    per_node = min(cores, ranks)
    memory = memory_budget_bytes("cpu", per_node)
    return Machine("cpu", cores, 5e9, 1.25e9, 50e-6, 50e9, 50e9, 10e9, memory)


def calibrated_machine(calibration: Calibration, rank_memory: float | None = None) -> Machine:
    """This host with ``calibration``'s rates: its ranks on this host, each with its share
    of the host's memory (or ``rank_memory`` bytes)."""
    ranks = calibration.ranks
    memory = memory_budget_bytes("cpu", ranks) if rank_memory is None else rank_memory
    default = machine("cpu", ranks)
    return dataclasses.replace(default, per_node=ranks, rank_memory=memory, calibration=calibration)


def group_batch(batch_size: int, dp: int) -> int:
    """The vertices each of ``dp`` data-parallel groups draws for an update of
    ``batch_size`` (at least 2, the least batch a config takes).

    >>> group_batch(10_000, 1), group_batch(10_000, 8), group_batch(10_001, 8), group_batch(6, 8)
    (10000, 1250, 1251, 2)
    """
    return max(2, -(-batch_size // dp))


@dataclass(frozen=True)
class GridPlan:
    """The cost model's figures for one grid shape (rank 0): ``batch_size`` the vertices
    each data-parallel group draws a step."""

    grid: GridShape
    batch_size: int
    steps_per_epoch: int
    step_seconds: dict[str, float]  # per component of one step
    step_bytes: dict[str, float]  # per group kind of one step
    eval_s: float
    memory: float  # bytes a rank holds
    fits: bool

    @property
    def step_s(self) -> float:
        return sum(self.step_seconds.values())

    @property
    def updates_per_s(self) -> float:
        return 1.0 / self.step_s

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.grid.dp

    def sort_key(self) -> tuple:
        # where no shape fits, the one nearest to fitting leads: the fastest of those that
        # do not fit would be the surest to be killed for memory
        speed = (self.step_s, self.eval_s) if self.fits else (self.memory, self.step_s)
        return (not self.fits, *speed, self.memory, str(self.grid))


def _divisors(count: int) -> list[int]:
    """The divisors of ``count``, ascending, by trial division up to its square root.

    >>> _divisors(12), _divisors(1)
    ([1, 2, 3, 4, 6, 12], [1])
    """
    small = [k for k in range(1, math.isqrt(count) + 1) if count % k == 0]
    return small + [count // k for k in reversed(small) if k * k != count]


def grid_shapes(ranks: int) -> list[GridShape]:
    """Every shape ``Gd x Gx x Gy x Gz`` whose product is ``ranks`` (each axis a divisor of
    what the axes before it leave).

    >>> [str(shape) for shape in grid_shapes(2)]
    ['1x1x1x2', '1x1x2x1', '1x2x1x1', '2x1x1x1']
    """
    of_ranks = _divisors(ranks)
    shapes = []
    for dp in of_ranks:
        for x in (k for k in of_ranks if ranks // dp % k == 0):
            rest = ranks // (dp * x)
            shapes += [GridShape(dp, x, y, rest // y) for y in of_ranks if rest % y == 0]
    return shapes


def _eval_chunk_rows(work: Workload, shape: GridShape, spec: Machine, memory: dict) -> int:
    """Chunk rows as an evaluation picks them: a GPU's memory beside the graph share and
    the model; on CPUs the fixed default."""
    if spec.name == "cpu":
        return default_chunk_rows(shape.tp_size)
    return eval_chunk_rows(work, shape, spec.rank_memory - memory["graph"] - memory["model"])


def plan_grid(work: Workload, shape: GridShape, spec: Machine, *, tf32: bool) -> GridPlan:
    """The figures of ``shape`` on ``spec``'s machines (rank 0) for updates of
    ``work.batch_size`` vertices: each data-parallel group draws its
    :func:`group_batch`."""
    hardware = spec.hardware(shape, tf32)
    batch = group_batch(work.batch_size, shape.dp)
    work = dataclasses.replace(work, batch_size=min(batch, work.num_nodes))
    memory = memory_bytes(work, shape)
    chunk_rows = _eval_chunk_rows(work, shape, spec, memory)
    total = sum(memory.values())
    return GridPlan(
        grid=shape,
        batch_size=work.batch_size,
        steps_per_epoch=work.steps_per_epoch(shape.dp),
        step_seconds=step_time(work, shape, hardware),
        step_bytes=step_bytes(work, shape, rank=0),
        eval_s=sum(eval_time(work, shape, hardware, chunk_rows).values()),
        memory=total,
        fits=total <= FIT_SHARE * spec.rank_memory,
    )


def rank_grids(work: Workload, ranks: int, spec: Machine, *, tf32: bool) -> list[GridPlan]:
    """Every grid shape of ``ranks`` ranks, the fitting ones first, most updates a
    second at the global batch ``work.batch_size`` first."""
    plans = [plan_grid(work, shape, spec, tf32=tf32) for shape in grid_shapes(ranks)]
    return sorted(plans, key=GridPlan.sort_key)


#: What each step component of :func:`~dgl_scalegnn.perfmodel.step_time` is, and the
#: group kinds whose bytes it moves.
_COMPONENTS = {
    "dp_allreduce": ("the data-parallel gradient all-reduce", ("dp",)),
    "tp_allreduce": ("the 3D grid's all-reduces", ("x", "y", "z")),
    "redistribute": ("the residuals' redistribution", ("tp",)),
    "gemm": ("dense products", ()),
    "spmm": ("sparse products", ()),
    "elementwise": ("element-wise kernels", ()),
    "sampling": ("the sampler's work", ()),
}


def seconds(value: float) -> str:
    """``value`` seconds in a unit that keeps three digits.

    >>> seconds(0.000412), seconds(0.0412), seconds(41.2)
    ('412 us', '41.2 ms', '41.2 s')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale or unit == "us":
            return f"{value / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def amount(count: float) -> str:
    """``count`` bytes in a unit that keeps three digits.

    >>> amount(5.42e9), amount(688_000), amount(12)
    ('5.42 GB', '688 kB', '12 B')
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1.0)):
        if count >= scale or unit == "B":
            return f"{count / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def _step_bytes(plan: GridPlan, kinds: tuple[str, ...]) -> float:
    return sum(plan.step_bytes.get(kind, 0.0) for kind in kinds)


def _update(plan: GridPlan) -> str:
    """What one step of ``plan`` is: an update of how many vertices, drawn how."""
    split = f" ({plan.grid.dp} groups of {plan.batch_size:,})" if plan.grid.dp > 1 else ""
    return f"{plan.updates_per_s:.3g} updates/s of {plan.global_batch:,} vertices{split}"


def why_best(plans: list[GridPlan], spec: Machine) -> str:
    """One sentence: why the first of ``plans`` (ranked) wins over the next slower one."""
    best = plans[0]
    if not best.fits:
        return (
            f"no grid of {best.grid.world_size} ranks fits: the leanest, "
            f"{min(plans, key=lambda p: p.memory).grid}, needs "
            f"{min(p.memory for p in plans) / 1e9:.1f} GB a rank of {spec.rank_memory / 1e9:.1f}; "
            "use more ranks, a smaller batch or hidden size"
        )
    slower = [p for p in plans[1:] if p.fits and p.step_s > 1.01 * best.step_s]
    ties = [str(p.grid) for p in plans[1:] if p.fits and p.step_s <= 1.01 * best.step_s]
    tied = f" (as fast: {', '.join(ties[:3])})" if ties else ""
    if not slower:
        return f"{best.grid}: {_update(best)}{tied}"
    runner = slower[0]
    step = defaultdict(float)
    for plan, sign in ((runner, 1.0), (best, -1.0)):
        for component, value in plan.step_seconds.items():
            step[component] += sign * value
    component = max(step, key=step.get)
    name, kinds = _COMPONENTS[component]
    sentence = (
        f"{best.grid}: {_update(best)}{tied}; {runner.grid} makes "
        f"{100 * (1 - best.step_s / runner.step_s):.0f}% fewer, its step "
        f"{seconds(step[component])} longer in {name}"
    )
    ours, theirs = _step_bytes(best, kinds), _step_bytes(runner, kinds)
    if kinds and theirs > 1.01 * ours:
        more = "all" if ours == 0 else f"{100 * (theirs / ours - 1):.0f}% more"
        sentence += f" ({more} of its bytes: {amount(theirs)} a step)"
    return sentence


#: Published sizes: vertices, stored adjacency entries (both directions of every edge
#: and a self loop each, duplicates not merged), features, classes.
_PUBLISHED = {
    "cora": (2_708, 10_556 + 2_708, 1_433, 7),
    "citeseer": (3_327, 9_228 + 3_327, 3_703, 6),
    "pubmed": (19_717, 88_651 + 19_717, 500, 3),
    "reddit": (232_965, 114_615_892 + 232_965, 602, 41),
    "ogbn-arxiv": (169_343, 2 * 1_166_243 + 169_343, 128, 40),
    "ogbn-products": (2_449_029, 2 * 61_859_140 + 2_449_029, 100, 47),
    "ogbn-papers100M": (111_059_956, 2 * 1_615_685_872 + 111_059_956, 128, 172),
}


def graph_shape(data: DataConfig) -> tuple[GraphShape, str]:
    """The sizes of ``data``'s graph and where they come from (see the module docstring)."""
    from dgl_scalegnn.data.cache import cache_directory, cache_problem
    from dgl_scalegnn.data.prepared import open_prepared

    prepared = data.prepared
    if prepared is None and data.name != "synthetic":
        cached = cache_directory(data)
        if cached.is_dir() and cache_problem(cached, data) is None:
            prepared = str(cached)
    if prepared is not None:
        meta = open_prepared(prepared).meta
        shape = GraphShape(meta.num_nodes, meta.nnz, meta.num_features, meta.num_classes)
        return shape, f"prepared in {prepared}"
    if data.name == "synthetic":
        gen = data.synthetic
        recipe = gen.featureless or data.featureless
        shape = GraphShape(
            gen.num_nodes,
            round(gen.num_nodes * (gen.avg_degree + 1)),
            FEATURELESS_DIM if recipe else gen.num_features,
            FEATURELESS_CLASSES if recipe else gen.num_classes,
        )
        return shape, "about: the generator's settings"
    if data.name == "dgl":
        from dgl_scalegnn.data.datasets import load_dataset
        from dgl_scalegnn.data.normalize import gcn_normalize

        dataset = load_dataset(dataclasses.replace(data, feature_norm="none"))
        src, dst = (t.numpy() for t in dataset.graph.edges())
        nnz = gcn_normalize(src, dst, dataset.graph.num_nodes()).nnz
        shape = GraphShape(
            dataset.graph.num_nodes(), nnz, dataset.num_features, dataset.num_classes
        )
        return shape, str(data.path)
    return GraphShape(*_PUBLISHED[data.name]), "about: published sizes"


def workload(cfg: Config, spec: Machine) -> tuple[Workload, Config, str]:
    """The workload of ``cfg`` on ``spec``'s ranks (settings the config leaves to the graph
    derived as training would), the resolved config, and one line on the graph."""
    shape, source = graph_shape(cfg.data)
    if cfg.data.name != "synthetic":
        cfg = apply_graph_defaults(cfg, shape, int(spec.rank_memory))[0]
    model = cfg.model
    work = Workload(
        num_nodes=shape.num_nodes,
        nnz=shape.nnz,
        batch_size=min(cfg.sampling.batch_size, shape.num_nodes),
        in_features=shape.num_features,
        num_classes=shape.num_classes,
        model=model,
        bf16_comm=cfg.parallel.bf16_comm,
    )
    line = (
        f"{cfg.data.name}: {shape.num_nodes:,} vertices, {shape.nnz:,} adjacency entries, "
        f"{shape.num_features} features, {shape.num_classes} classes ({source}); batch "
        f"{work.batch_size:,}, {model.layers} layers of {model.hidden}"
    )
    return work, cfg, line


def _row(index: int, plan: GridPlan, spec: Machine) -> str:
    fits = "yes" if plan.fits else f"NO (over {FIT_SHARE * spec.rank_memory / 1e9:.1f} GB)"
    return (
        f"{index:>3}  {plan.grid!s:<11} {plan.batch_size:>9,} {seconds(plan.step_s):>9} "
        f"{plan.updates_per_s:>9.3g} {amount(sum(plan.step_bytes.values())):>9} "
        f"{seconds(plan.eval_s):>9} {amount(plan.memory):>9}  {fits}"
    )


def plan_lines(plans: list[GridPlan], work: Workload, spec: Machine, top: int = 10) -> list[str]:
    """The table of the first ``top`` plans (and how many more, and how many of those do
    not fit), the reason the first wins, and how to train it."""
    shown = plans[:top]
    header = (
        f"{'#':>3}  {'grid':<11} {'batch':>9} {'s/step':>9} {'updates/s':>9} {'sent/step':>9} "
        f"{'eval':>9} {'memory':>9}  fits"
    )
    lines = [header, *(_row(i + 1, p, spec) for i, p in enumerate(shown))]
    hidden = len(plans) - len(shown)
    if hidden:
        unfit = sum(not p.fits for p in plans[top:])
        lines.append(f"  ... {hidden} more grids" + (f" ({unfit} do not fit)" if unfit else ""))
    lines.append(why_best(plans, spec))
    best = plans[0]
    lines.append(
        f"Every step is one update of {work.batch_size:,} vertices (sampling.batch_size): "
        "a grid of Gd groups draws 'batch' in each."
    )
    lines.append(f"train the first: --grid {best.grid} --set sampling.batch_size={best.batch_size}")
    if best.global_batch > 1.01 * work.batch_size:
        lines.append(
            f"{best.grid}'s {best.grid.dp} groups draw at least 2 vertices each: "
            f"{best.global_batch:,} an update, more than the {work.batch_size:,} asked for."
        )
    return lines


def _rates(spec: Machine, ranks: int, calibrate: bool, progress: Callable[[str], None]):
    """``spec`` with this host's calibration for ``ranks`` ranks where ``spec`` is ``cpu``
    (measured now with ``calibrate``, else the saved one, if any), and one line on the
    rates it plans with."""
    from dgl_scalegnn.train import calibrate as measurement

    if spec.name != "cpu":
        return spec, f"rates: published figures of the {spec.name} (no --calibrate)"
    if calibrate:
        calibration = measurement.calibrate(ranks, progress=progress)
        path = measurement.save_calibration(calibration)
        return calibrated_machine(calibration), f"rates: {calibration.describe()}; saved in {path}"
    calibration = measurement.load_calibration(ranks)
    if calibration is None:
        return spec, (
            f"rates: a core's defaults, not measured here; --calibrate measures {ranks} "
            "ranks on this host in under a minute"
        )
    return calibrated_machine(calibration), (
        f"rates: {calibration.describe()}, saved in {measurement.calibration_path()}; "
        "--calibrate measures again"
    )


def plan_report(
    cfg: Config,
    ranks: int,
    machine_name: str | None,
    top: int = 10,
    calibrate: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> list[str]:
    """What ``scalegnn plan`` prints: the machine and its rates, the graph and the model,
    the table of :func:`plan_lines` and the reason the first grid wins.

    ``machine_name`` ``None`` is ``cpu`` with ``calibrate``, else ``a100``; ``cpu`` plans
    with this host's calibration for ``ranks`` ranks, measured now (``calibrate``; its
    progress to ``progress``) or saved before, where one exists.

    Raises
    ------
    ConfigError
        If ``ranks`` or ``top`` is out of range, ``calibrate`` is asked for a GPU, or
        the calibration fails.
    """
    if not 1 <= ranks <= MAX_PLAN_RANKS:
        raise ConfigError(
            f"--gpus: got {ranks:,}; give the number of ranks, 1 to {MAX_PLAN_RANKS:,}"
        )
    if top < 1:
        raise ConfigError(f"--top: got {top}; give how many grids to list, at least 1")
    name = machine_name or ("cpu" if calibrate else "a100")
    if calibrate and name != "cpu":
        raise ConfigError(
            f"--calibrate: measures this host's CPU ranks, not {name} GPUs (their published "
            "figures need none); drop --calibrate or give --gpu cpu"
        )
    spec, rates = _rates(machine(name, ranks), ranks, calibrate, progress)
    work, cfg, graph = workload(cfg, spec)
    setting = cfg.parallel.tf32
    tf32 = spec.name != "cpu" if setting == "auto" else bool(setting)
    unit = "cores" if spec.name == "cpu" else f"{spec.name} GPUs"
    unit = "ranks" if spec.calibration is not None else unit
    return [
        f"{ranks} {unit} ({spec.describe()}){', TF32 products' if tf32 else ''}",
        rates,
        graph,
        *plan_lines(rank_grids(work, ranks, spec, tf32=tf32), work, spec, top),
    ]
