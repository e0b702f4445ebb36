"""Measuring this machine for the cost model: ``scalegnn plan --calibrate``.

On CPUs the rates a rank sees depend on the machine and on how many ranks share its
cores. :func:`calibrate` starts ``ranks`` local processes at once (each with the
threads a launch gives it: the cores over the ranks, at least one), joined by gloo,
and, where ``ranks`` is more than one, one process alone with every core; each
measures, within about a minute in all, every rank starting each measurement at once
(a barrier) so that they share the cores as a step's ranks do:

- float32 GEMMs of a batch's shapes, element-wise kernels and the local SpMM
  (:func:`~dgl_scalegnn.parallel.spmm.build_local_spmm`), as work per second of the
  wall clock;
- the sampler's work: the draw of a batch with its feature rows, and the block
  extraction (:func:`~dgl_scalegnn.sampling.blocks.extract_block`), as seconds per
  vertex and per gathered entry;
- all-reduces and all-to-alls in groups of every size that divides ``ranks``, every
  group at once (as a grid axis runs them): the latency of a message step (small
  payloads, the median) and the payload bytes a second (large payloads).

Wall-clock rates are what a step sees, oversubscription and whatever else runs on the
machine included: calibrate on the machine as it will train (the load average before
the measurement is kept beside it). :meth:`RankRates.hardware` turns one measurement
into the :class:`~dgl_scalegnn.perfmodel.Hardware` a rank sees, the sampler's work on
the step's path (a prefetch thread takes the same cores).

:class:`Calibration` holds both measurements and the machine's identity (host name,
processor, cores, torch); :func:`save_calibration` keeps it as JSON in the cache
directory (``plan/calibration.json``, one entry per rank count) and
:func:`load_calibration` returns it for this machine only.

Example
-------
>>> rates = RankRates(ranks=8, threads=1, cores=2, gemm_flops=1.25e10, elementwise_bw=5e9,
...                   spmm_bw=5e8, sample_vertex_s=2e-6, sample_entry_s=4e-8,
...                   links={"all_reduce": {2: Link(1e-3, 5e8)}})
>>> hardware = rates.hardware()
>>> hardware.gemm_flops, hardware.sampling.vertex_s
(12500000000.0, 2e-06)
>>> hardware.links[("all_reduce", 2)]  # latency, bytes/s
(0.001, 500000000.0)
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import platform
import socket
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dgl_scalegnn.config import ConfigError
from dgl_scalegnn.perfmodel import Hardware, SamplingCost

__all__ = [
    "CALIBRATION_VERSION",
    "MAX_CALIBRATE_RANKS",
    "Link",
    "RankRates",
    "Calibration",
    "MeasureSizes",
    "DEFAULT_SIZES",
    "machine_identity",
    "calibrate",
    "calibration_path",
    "save_calibration",
    "load_calibration",
    "read_calibrations",
]

#: Bumped when what is measured changes: an older file is measured again.
CALIBRATION_VERSION = 2
#: The longest a calibration's processes may run before it is given up.
TIMEOUT_S = 300.0
#: The most local ranks :func:`calibrate` starts: beyond them one host is not what the
#: job runs on.
MAX_CALIBRATE_RANKS = 64
_FLOAT = 4


@dataclass(frozen=True)
class Link:
    """A collective among a group of ranks: ``latency_s`` of one message step and
    ``bandwidth``, the payload bytes a second (as the cost model counts payloads)."""

    latency_s: float
    bandwidth: float


@dataclass(frozen=True)
class RankRates:
    """What each of ``ranks`` processes (``threads`` threads each) measured at once on a
    machine of ``cores`` cores, per second of the wall clock with every rank at work,
    and the collectives ``links`` by operation (``all_reduce``, ``all_to_all``) and
    group size."""

    ranks: int
    threads: int
    cores: int
    gemm_flops: float  # float32 flops a second
    elementwise_bw: float  # bytes a second of element-wise kernels
    spmm_bw: float  # bytes a second of the SpMM, as the cost model counts them
    sample_vertex_s: float  # seconds per sampled vertex (the draw, its features)
    sample_entry_s: float  # seconds per adjacency entry gathered by the extraction
    links: dict[str, dict[int, Link]] = dataclasses.field(default_factory=dict)

    def hardware(self) -> Hardware:
        """The rates one rank sees (see the module docstring): a group kind's bandwidth
        and the latency, where no measured link names its operation and size, are the
        slowest measured."""
        links = {
            (operation, size): (link.latency_s, link.bandwidth)
            for operation, sizes in self.links.items()
            for size, link in sizes.items()
        }
        slowest = min((bw for _, bw in links.values()), default=math.inf)
        return Hardware(
            bandwidth=dict.fromkeys(("x", "y", "z", "tp", "dp"), slowest),
            latency_s=max((latency for latency, _ in links.values()), default=0.0),
            gemm_flops=self.gemm_flops,
            memory_bw=self.elementwise_bw,
            spmm_bw=self.spmm_bw,
            links=links,
            sampling=SamplingCost(self.sample_vertex_s, self.sample_entry_s),
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["links"] = {
            operation: {str(size): dataclasses.asdict(link) for size, link in sizes.items()}
            for operation, sizes in self.links.items()
        }
        return out

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> RankRates:
        links = {
            operation: {int(size): Link(**link) for size, link in sizes.items()}
            for operation, sizes in record["links"].items()
        }
        return cls(**{**record, "links": links})


@dataclass(frozen=True)
class Calibration:
    """One calibration of this machine for ``ranks`` local ranks: their rates measured
    at once (``shared``) and one process's alone with every core (``alone``)."""

    machine: dict[str, Any]
    ranks: int
    shared: RankRates
    alone: RankRates
    measured_at: str
    seconds: float
    load_average: float  # the machine's 1-minute load average before the measurement
    version: int = CALIBRATION_VERSION

    def rates(self, local_ranks: int) -> RankRates:
        """The rates of ``local_ranks`` on this host: one process alone or the ``ranks``."""
        return self.alone if local_ranks == 1 else self.shared

    def describe(self) -> str:
        shared = self.shared
        pair = shared.links.get("all_reduce", {})
        size = min(pair, default=None)
        link = (
            f", all-reduce of {size}: {pair[size].latency_s * 1e3:.2g} ms a message step"
            if size
            else ""
        )
        return (
            f"calibrated {self.measured_at[:10]} ({self.seconds:.0f} s, "
            f"load {self.load_average:.1f}): "
            f"{shared.ranks} ranks of {shared.threads} thread{'s' if shared.threads > 1 else ''} "
            f"on {shared.cores} cores, {shared.gemm_flops / 1e9:.3g} GFLOP/s a rank{link}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "machine": self.machine,
            "ranks": self.ranks,
            "shared": self.shared.to_json(),
            "alone": self.alone.to_json(),
            "measured_at": self.measured_at,
            "seconds": self.seconds,
            "load_average": self.load_average,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Calibration:
        return cls(
            machine=record["machine"],
            ranks=record["ranks"],
            shared=RankRates.from_json(record["shared"]),
            alone=RankRates.from_json(record["alone"]),
            measured_at=record["measured_at"],
            seconds=record["seconds"],
            load_average=record["load_average"],
            version=record["version"],
        )


def machine_identity() -> dict[str, Any]:
    """What says that a calibration was made here: host name, processor, usable cores,
    memory and torch's version."""
    processor = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            names = [
                line.split(":", 1)[1].strip() for line in info if line.startswith("model name")
            ]
        processor = names[0] if names else processor
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "processor": processor,
        "cores": _cores(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "torch": torch.__version__,
    }


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class MeasureSizes:
    """How much each measurement runs: ``repeats`` of each kernel and collective, on
    matrices of ``rows`` rows (the tests pass a tiny one)."""

    repeats: int = 20
    rows: int = 8192
    width: int = 128
    degree: int = 16
    large_bytes: int = 8 << 20
    small_bytes: int = 1 << 10


#: What :func:`calibrate` measures unless told: about half a minute on 2 cores.
DEFAULT_SIZES = MeasureSizes()
#: The rounds each kernel's and collective's repeats are timed in.
ROUNDS = 5

# ------------------------------------------------------------------ one rank's work


def _seconds(work: Callable[[], object], repeats: int, together: Callable[[], None]) -> float:
    """Wall-clock seconds of one call of ``work``: the median over :data:`ROUNDS` rounds
    of ``repeats / ROUNDS`` calls (a burst of other work on the host moves one round, not
    the figure), every rank starting each round at once (``together``: a barrier, or
    nothing), after one warm-up call."""
    work()
    calls = max(1, repeats // ROUNDS)
    rounds = []
    for _ in range(ROUNDS):
        together()
        start = time.perf_counter()
        for _ in range(calls):
            work()
        rounds.append((time.perf_counter() - start) / calls)
    return statistics.median(rounds)


def _gemm_flops(sizes: MeasureSizes, together: Callable[[], None]) -> float:
    """Flops a second of a layer's three products: ``H W``, ``G W^T``, ``H^T G``."""
    rows, width = sizes.rows, sizes.width
    h, w, g = torch.randn(rows, width), torch.randn(width, width), torch.randn(rows, width)

    def products() -> None:
        torch.mm(h, w)
        torch.mm(g, w.t())
        torch.mm(h.t(), g)

    return 3 * 2 * rows * width * width / _seconds(products, sizes.repeats, together)


def _elementwise_bw(sizes: MeasureSizes, together: Callable[[], None]) -> float:
    """Bytes a second of ``z = x + y`` over a batch's activations (12 bytes an element),
    as the cost model counts element-wise passes."""
    x, y = torch.randn(sizes.rows, sizes.width), torch.randn(sizes.rows, sizes.width)
    z = torch.empty_like(x)
    seconds = _seconds(lambda: torch.add(x, y, out=z), 4 * sizes.repeats, together)
    return 3 * x.numel() * _FLOAT / seconds


def _random_csr(rows: int, degree: int, generator: torch.Generator):
    """A random ``rows x rows`` CSR block of ``degree`` sorted entries a row (self loop
    included), with its scalings."""
    from dgl_scalegnn.sampling.blocks import CSRBlock

    cols = torch.randint(rows, (rows, degree - 1), generator=generator)
    cols = torch.cat([cols, torch.arange(rows).unsqueeze(1)], 1).sort(1).values
    indptr = torch.arange(0, rows * degree + 1, degree, dtype=torch.int64)
    scale = torch.rand(rows, generator=generator) + 0.5
    return CSRBlock(
        row_start=0,
        row_stop=rows,
        col_start=0,
        col_stop=rows,
        indptr=indptr,
        indices=cols.reshape(-1).to(torch.int32),
        row_scale=scale,
        col_scale=scale,
    )


def _sampler_costs(sizes: MeasureSizes, together: Callable[[], None]) -> tuple[float, float, float]:
    """Seconds per sampled vertex (its draw and a feature row) and per gathered entry
    (the block extraction), and the SpMM's bytes a second on the extracted block, for
    batches of ``rows / 2`` vertices of a random graph 100 times larger (``degree``
    entries a row): the ``B = N / 100`` of the shipped configs."""
    from dgl_scalegnn.parallel.spmm import build_local_spmm
    from dgl_scalegnn.sampling.blocks import ColumnMap, extract_block
    from dgl_scalegnn.sampling.uniform import UniformSampler, sample_vertices

    generator = torch.Generator().manual_seed(0)
    batch = max(2, sizes.rows // 2)
    num_nodes = 100 * batch
    csr = _random_csr(num_nodes, sizes.degree, generator)
    features = torch.randn(8 * batch, 64)  # the rows are read at random, as a rank's share
    column_map = ColumnMap(num_nodes)
    p = UniformSampler(num_nodes, batch).scaling().p
    steps = iter(range(1 << 30))
    sample = sample_vertices(num_nodes, batch, 0)

    def draw() -> None:
        nonlocal sample
        sample = sample_vertices(num_nodes, batch, next(steps))
        features.index_select(0, sample % features.shape[0])

    vertex_s = _seconds(draw, sizes.repeats, together) / batch
    extract = _seconds(lambda: extract_block(csr, sample, p, column_map), sizes.repeats, together)
    block = extract_block(csr, sample, p, column_map)
    spmm = build_local_spmm(block, "torch-csr")
    dense = torch.randn(batch, sizes.width)
    spmm_s = _seconds(lambda: spmm.matmul(dense), 4 * sizes.repeats, together)
    moved = block.nnz * (8 + _FLOAT * sizes.width)  # as the cost model counts them
    return vertex_s, extract / (batch * sizes.degree), moved / spmm_s


def _divisors(count: int) -> list[int]:
    return [k for k in range(2, count + 1) if count % k == 0]


def _links(rank: int, world: int, sizes: MeasureSizes) -> dict[str, dict[int, Link]]:
    """Every group size's all-reduce and all-to-all (every group of the size at once)."""
    import torch.distributed as dist

    links: dict[str, dict[int, Link]] = {"all_reduce": {}, "all_to_all": {}}
    for size in _divisors(world):
        groups = [dist.new_group(list(range(s, s + size))) for s in range(0, world, size)]
        group = groups[rank // size]
        small = torch.zeros(max(size, sizes.small_bytes // _FLOAT))
        large = torch.zeros(sizes.large_bytes // _FLOAT // size * size)

        def all_reduce(tensor: torch.Tensor, group=group) -> None:
            dist.all_reduce(tensor, group=group)

        def all_to_all(tensor: torch.Tensor, group=group) -> None:
            dist.all_to_all_single(torch.empty_like(tensor), tensor, group=group)

        # message steps and payload bytes a rank sends, as the cost model counts them
        for name, run, steps, share in (
            ("all_reduce", all_reduce, 2 * (size - 1), 2 * (size - 1) / size),
            ("all_to_all", all_to_all, size - 1, (size - 1) / size),
        ):
            dist.barrier()
            run(small)
            walls = []
            for _ in range(sizes.repeats):
                start = time.perf_counter()
                run(small)
                walls.append(time.perf_counter() - start)
            latency_s = statistics.median(walls) / steps
            seconds = _seconds(
                lambda run=run, large=large: run(large), max(2, sizes.repeats // 4), dist.barrier
            )
            # the large payload's seconds less its message steps' latency
            moving_s = max(seconds - steps * latency_s, seconds / 2)
            links[name][size] = Link(latency_s, share * large.numel() * _FLOAT / moving_s)
    return links


def measure_rank(rank: int, world: int, threads: int, cores: int, sizes: MeasureSizes) -> RankRates:
    """What one of ``world`` ranks measures (with the others at the same time; a
    process group joins them where ``world`` is above one)."""
    torch.set_num_threads(threads)
    if world > 1:
        import torch.distributed as dist

        together = dist.barrier
    else:
        together = _alone
    vertex_s, entry_s, spmm_bw = _sampler_costs(sizes, together)
    return RankRates(
        ranks=world,
        threads=threads,
        cores=cores,
        gemm_flops=_gemm_flops(sizes, together),
        elementwise_bw=_elementwise_bw(sizes, together),
        spmm_bw=spmm_bw,
        sample_vertex_s=vertex_s,
        sample_entry_s=entry_s,
        links=_links(rank, world, sizes) if world > 1 else {},
    )


def _alone() -> None:
    """No other rank to wait for."""


def _rank_main(
    rank: int, world: int, threads: int, cores: int, sizes: MeasureSizes, directory: str
) -> None:
    """A calibration process: join the others through a file store in ``directory``
    (private to this user), measure, write ``rank<r>.json`` (or the error)."""
    out = Path(directory) / f"rank{rank}.json"
    try:
        if world > 1:
            import torch.distributed as dist

            store = dist.FileStore(str(Path(directory) / "store"), world)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        rates = measure_rank(rank, world, threads, cores, sizes)
        out.write_text(json.dumps(rates.to_json()))
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        raise


def _run_ranks(world: int, threads: int, cores: int, sizes: MeasureSizes) -> list[RankRates]:
    """Start ``world`` calibration processes at once and collect what each measured."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", __name__])
    with tempfile.TemporaryDirectory(prefix="scalegnn-calibrate-") as directory:
        processes = [
            context.Process(target=_rank_main, args=(rank, world, threads, cores, sizes, directory))
            for rank in range(world)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + TIMEOUT_S
        try:
            for process in processes:
                process.join(max(0.0, deadline - time.monotonic()))
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        records = []
        for rank in range(world):
            path = Path(directory) / f"rank{rank}.json"
            record = json.loads(path.read_text()) if path.exists() else {"error": "no result"}
            if "error" in record:
                why = record["error"].strip().splitlines()[-1]
                raise ConfigError(
                    f"--calibrate: calibration process {rank} of {world} failed ({why}); "
                    "run it again on an idle machine"
                )
            records.append(RankRates.from_json(record))
        return records


def _typical(records: list[RankRates]) -> RankRates:
    """One rank's rates from every rank's: the median of each figure."""

    def median(values) -> float:
        return statistics.median(values)

    first = records[0]
    links = {
        operation: {
            size: Link(
                median(r.links[operation][size].latency_s for r in records),
                median(r.links[operation][size].bandwidth for r in records),
            )
            for size in sizes
        }
        for operation, sizes in first.links.items()
    }
    figures = ("gemm_flops", "elementwise_bw", "spmm_bw", "sample_vertex_s", "sample_entry_s")
    return dataclasses.replace(
        first, links=links, **{name: median(getattr(r, name) for r in records) for name in figures}
    )


def calibrate(
    ranks: int,
    sizes: MeasureSizes | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> Calibration:
    """Measure this machine for ``ranks`` local ranks (see the module docstring), saying
    so to ``progress`` once the count is checked.

    Raises
    ------
    ConfigError
        If ``ranks`` is not 1 to :data:`MAX_CALIBRATE_RANKS`, or a calibration process
        fails.
    """
    if not 1 <= ranks <= MAX_CALIBRATE_RANKS:
        raise ConfigError(
            f"--gpus: got {ranks:,}; --calibrate starts every rank on this host: give 1 to "
            f"{MAX_CALIBRATE_RANKS}"
        )
    progress(f"calibrating {ranks} rank{'s' if ranks > 1 else ''} on this host (under a minute)")
    sizes = sizes or DEFAULT_SIZES
    cores = _cores()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    shared = _typical(_run_ranks(ranks, max(1, cores // ranks), cores, sizes))
    alone = shared if ranks == 1 else _typical(_run_ranks(1, cores, cores, sizes))
    return Calibration(
        machine=machine_identity(),
        ranks=ranks,
        shared=shared,
        alone=alone,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        seconds=time.perf_counter() - start,
        load_average=load,
    )


def calibration_path() -> Path:
    """The calibration file in the cache directory."""
    from dgl_scalegnn.cache_dir import default_cache_dir

    return default_cache_dir("plan") / "calibration.json"


def read_calibrations(path: Path) -> list[Calibration]:
    """Every calibration in ``path`` of the current version (none if it is missing or
    unreadable: it is measured again)."""
    try:
        records = json.loads(path.read_text())
        return [
            Calibration.from_json(r) for r in records if r.get("version") == CALIBRATION_VERSION
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def save_calibration(calibration: Calibration, path: Path | None = None) -> Path:
    """Keep ``calibration`` in ``path`` (the cache's by default), replacing an earlier
    one of the same machine and rank count."""
    path = path or calibration_path()
    kept = [
        c
        for c in read_calibrations(path)
        if (c.machine, c.ranks) != (calibration.machine, calibration.ranks)
    ]
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps([c.to_json() for c in [*kept, calibration]], indent=1) + "\n")
    partial.replace(path)
    return path


def load_calibration(ranks: int, path: Path | None = None) -> Calibration | None:
    """The calibration of this machine for ``ranks`` local ranks, if one was made."""
    here = machine_identity()
    found = [
        c
        for c in read_calibrations(path or calibration_path())
        if c.machine == here and c.ranks == ranks
    ]
    return found[-1] if found else None
