"""Wiring of a training run: launch detection, grid, data, trainer, metrics."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dgl_scalegnn
from dgl_scalegnn.config import Config, ParallelConfig, check_kernel_backend
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.cache import shared_prepared_directory
from dgl_scalegnn.data.datasets import holds_recorded_file, load_dataset
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.data.prepared import GraphMeta, PreparedGraph, open_prepared, prepare_in_memory
from dgl_scalegnn.distributed.comm import CommOptions, Runtime, warm_up_groups
from dgl_scalegnn.distributed.devices import (
    device_for,
    gpu_identity,
    gpu_may_be_shared,
    refuse_shared_gpus,
    resolve_device,
    use_tf32,
)
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.distributed.launch import LaunchInfo, detect_launch
from dgl_scalegnn.distributed.rendezvous import init_distributed
from dgl_scalegnn.distributed.watchdog import Watchdog, is_communication_error
from dgl_scalegnn.errors import InputError, ResourceError
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.train.console import Console
from dgl_scalegnn.train.defaults import (
    GraphShape,
    agreed_memory_budget,
    apply_graph_defaults,
)
from dgl_scalegnn.train.metrics import MetricsWriter, run_directory
from dgl_scalegnn.train.run_lock import RunDirectoryError, claim_run_directory
from dgl_scalegnn.train.trainer import Trainer

__all__ = [
    "Session",
    "start_session",
    "end_session",
    "load_graph",
    "check_prepared_source",
    "with_graph_defaults",
    "run_training",
    "versions",
]


def versions() -> dict[str, str]:
    """The versions a run records (DGL's from its installed metadata: reading
    ``dgl.__version__`` would import DGL, which a rank training from a prepared graph
    never needs)."""
    return {
        "dgl_scalegnn": dgl_scalegnn.__version__,
        "torch": torch.__version__,
        "dgl": importlib.metadata.version("dgl"),
        "python": platform.python_version(),
    }


def load_graph(
    cfg: Config, session: Session | None = None, metrics: MetricsWriter | None = None
) -> PreparedGraph:
    """The prepared graph of ``cfg.data``, memory-mapped from ``data.prepared`` if set.

    Otherwise one process prepares it in memory; the ranks of a job of several share a
    prepared directory in the cache (:mod:`~dgl_scalegnn.data.cache`): one rank per
    node prepares or reuses it while the others wait, and each maps only its share.
    ``data.prepared`` must hold the graph the config names
    (:func:`check_prepared_source`); what cannot be checked is said on ``metrics``.

    Raises
    ------
    DatasetError
        ``data.prepared`` holds another dataset, or was prepared from another file.
    """
    data = cfg.data
    if data.prepared is not None:
        graph = open_prepared(data.prepared)
        unchecked = check_prepared_source(cfg, graph.meta)
        if unchecked is not None and metrics is not None:
            metrics.note(unchecked)
        return graph
    if session is None or session.watchdog is None:
        return prepare_in_memory(load_dataset(data), data.permutation_seed)
    store = session.watchdog.store
    return open_prepared(shared_prepared_directory(data, store, session.launch.local_rank))


def check_prepared_source(cfg: Config, meta: GraphMeta) -> str | None:
    """Refuse a prepared graph (``meta``) that is not the one ``cfg.data`` names: another
    dataset, or for ``data.name: dgl`` another file than ``data.path``, compared by the
    size and SHA-256 its preparation recorded (a copy elsewhere is the same graph).
    Returns why the file could not be compared, where it could not (a directory
    prepared before the file was recorded, or ``data.path`` absent here), else ``None``.

    Raises
    ------
    DatasetError
        Naming the directory, what it holds and what ``cfg.data`` names.
    """
    data = cfg.data
    prepared = f"data.prepared: {data.prepared!r}"
    path = Path(data.path).expanduser() if data.name == "dgl" and data.path else None
    named = f"{data.name!r}" + (f" (data.path {str(path)!r})" if path is not None else "")
    if meta.name != data.name:
        raise DatasetError(
            f"{prepared} holds {meta.name!r} but data.name is {named}; point data.prepared "
            "at a directory prepared for it, or unset data.prepared"
        )
    if path is None:
        return None
    recorded = meta.source_file
    if recorded is None:
        return (
            f"{prepared} records no source file (prepared by an older version), so it is not "
            f"checked against data.path {str(path)!r}; prepare it again to have it checked"
        )
    if not path.is_file():
        return (
            f"data.path {str(path)!r} is not here to check {data.prepared!r} against; "
            f"training it as prepared from {recorded['path']!r}"
        )
    if not holds_recorded_file(path, recorded):
        raise DatasetError(
            f"{prepared} was prepared from {recorded['path']!r} ({recorded['bytes']:,} bytes, "
            f"SHA-256 {recorded['sha256'][:16]}), but data.path {str(path)!r} holds other "
            f"bytes ({path.stat().st_size:,}): another graph; prepare that file (scalegnn "
            "prepare --dataset dgl --set data.path=FILE --out DIR) and point data.prepared "
            "there, or unset data.prepared"
        )
    return None


def with_graph_defaults(
    cfg: Config, graph: PreparedGraph, session: Session, metrics: MetricsWriter
) -> Config:
    """``cfg`` with the settings derived from ``graph`` for every key it does not set
    (:mod:`~dgl_scalegnn.train.defaults`; none for the synthetic generator). Rank 0 says
    each on stdout, with why, and records them as a ``derived`` event."""
    if cfg.data.name == "synthetic":
        return cfg
    meta = graph.meta
    shape = GraphShape(meta.num_nodes, meta.nnz, meta.num_features, meta.num_classes)
    local_ranks = session.launch.local_world_size or 1
    rank_memory = agreed_memory_budget(session.device, local_ranks)
    resolved, derived = apply_graph_defaults(cfg, shape, rank_memory)
    if derived:  # the console says each, with why
        metrics.write(
            "derived",
            settings={d.key: d.value for d in derived},
            reasons={d.key: d.reason for d in derived},
        )
    return resolved


@dataclass(frozen=True)
class Session:
    """A started process: how it was launched, its runtime on the grid, its device, and
    (for several processes) the watchdog that stops the job when a rank is lost."""

    launch: LaunchInfo
    runtime: Runtime
    device: torch.device
    backend: str
    watchdog: Watchdog | None = None


def start_session(parallel: ParallelConfig) -> Session:
    """Detect the launch, check the grid against the world size, choose the device (rank
    0 says which, and why, in one line on stdout) and bind it, start torch.distributed
    on it, create every process group of the grid and run one warm-up collective on
    each (NCCL then starts here, not inside step 0).

    Raises
    ------
    ConfigError
        CUDA asked for where it is not usable, or a kernel the device cannot run (on
        every rank); more ranks on a node than its GPUs (on that node's ranks); ranks
        that share a GPU (on every rank).
    """
    info = detect_launch()
    shape = GridShape.parse(parallel.grid)
    shape.check_world_size(info.world_size)
    requested = parallel.requested_device()
    choice = resolve_device(requested)
    if info.rank == 0:
        print(f"scalegnn: {choice.describe(requested)}", flush=True)
    backend = choice.backend
    check_kernel_backend(parallel.spmm_kernel, backend)
    device = device_for(info, backend)
    use_tf32(parallel.tf32, device)
    # Ranks that may share their one GPU compare them before NCCL starts (bound to the
    # device, NCCL would start at once and stop on "Duplicate GPU detected").
    shared = gpu_may_be_shared(info, device)
    job = init_distributed(info, backend, parallel.timeout_s, None if shared else device)
    if shared:
        refuse_shared_gpus(job.store, info.rank, info.world_size, gpu_identity(device))
    watchdog = None
    if job is not None:
        watchdog = Watchdog(job, info.rank, info.world_size, timeout=parallel.watchdog_s).start()
    grid = Grid4D.build(shape, info.rank)
    warm_up_groups(grid, device)
    runtime = Runtime(grid, CommOptions.from_config(parallel), Profiler(device=device))
    return Session(info, runtime, device, backend, watchdog)


def end_session(session: Session, error: BaseException | None = None) -> None:
    """Shut down (the watchdog's thread too, which must not outlive the interpreter);
    after an ``error`` make every other rank stop too. A rank that only broke because
    another had failed or gone first ends here with the exit code of that failure's kind
    (:data:`~dgl_scalegnn.distributed.watchdog.EXIT_CODES`: 2 for bad input, 17 for a
    lost rank or a bug), saying why unless that was bad input or Ctrl-C (which the
    failing rank reports)."""
    watchdog = session.watchdog
    if watchdog is not None and error is not None:
        if is_communication_error(error):
            watchdog.await_verdict()  # ends the process if another rank left first
        watchdog.report_failure(error, bad_input=isinstance(error, InputError))
    elif watchdog is not None:
        dist.barrier()  # nobody marks itself done while another still trains
        watchdog.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_training(
    cfg: Config, metrics_path: str | None = None, *, json_stdout: bool = False
) -> dict[str, Any]:
    """Run one training job on however many processes launched it; returns the summary.

    Rank 0 shows the run on stdout: lines a person reads
    (:class:`~dgl_scalegnn.train.console.Console`), or with ``json_stdout`` its events
    as JSON lines. The events also go to ``metrics_path`` (or ``output.metrics``); an
    existing file is continued only by a resumed run. A run with ``output.dir`` holds
    that directory's lock from before anything is loaded to its end
    (:mod:`~dgl_scalegnn.train.run_lock`): a second job there is refused on every rank.
    """
    session = start_session(cfg.parallel)
    info, runtime = session.launch, session.runtime
    try:
        run_lock = claim_run_directory(cfg.output.dir, info.rank)
    except (RunDirectoryError, ResourceError):
        end_session(session)  # rank 0's refusal is every rank's: none stops another
        raise
    except BaseException as error:
        end_session(session, error)
        raise
    failure: BaseException | None = None
    try:
        shape = runtime.grid.shape
        backend = session.backend
        is_root = info.rank == 0
        path = metrics_path or cfg.output.metrics
        console = None
        if is_root and not json_stdout:
            console = Console(sys.stdout, cfg.output.log_every, progress_bar=cfg.train.progress)
        metrics = MetricsWriter(
            path,
            enabled=is_root,
            append=cfg.output.resume,
            console=console,
            json_stream=sys.stdout if is_root and json_stdout else None,
        )
        metrics.write(
            "config",
            run_dir=run_directory(cfg.output.dir),  # whose run the metrics file holds
            config=cfg.to_dict(),
            grid=str(shape),
            world_size=info.world_size,
            launcher=info.launcher,
            backend=backend,
            threads=torch.get_num_threads(),  # intra-op threads of each rank
            versions=versions(),
        )
        if run_lock is not None and run_lock.left_by is not None:
            metrics.note(
                f"took over the lock of output.dir {cfg.output.dir} from "
                f"{run_lock.left_by.describe()}, a job that ended without letting go of it"
            )
        try:
            graph = load_graph(cfg, session, metrics)
            cfg = with_graph_defaults(cfg, graph, session, metrics)
            trainer = Trainer(cfg, graph, runtime, metrics, session.device)
            trainer.choose_evaluation(session.launch.local_world_size or 1)
            return trainer.fit()
        finally:
            metrics.close()
    except BaseException as error:
        failure = error
        raise
    finally:
        if run_lock is not None:
            run_lock.release()
        end_session(session, failure)
