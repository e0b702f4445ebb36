"""CPU guards of the GPU path: what can go wrong on CUDA/NCCL, checked where no GPU is.

Impossible kernel/backend pairs are refused; the prefetch thread and every rank use the
rank's own GPU (checked with stub CUDA calls); CUDA-event timings are read without
waiting; and the host synchronisations of sampling, batch building and a training step
are counted on CPU tensors (each counted call would make the host wait for a GPU).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist

from dgl_scalegnn.config import CPU_ONLY_KERNELS, ConfigError, config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.bootstrap import LaunchInfo, device_for, init_distributed
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import BlockCOO, KernelDeviceError, build_local_spmm
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.sampling.blocks import extract_block
from dgl_scalegnn.sampling.prefetch import Prefetcher
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import inclusion_probability, sample_vertices
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.gpu.host_syncs import HostSyncCounter
from tests.helpers import random_dataset

# ------------------------------------------------------------- kernel and backend


@pytest.mark.parametrize("kernel", CPU_ONLY_KERNELS)
def test_config_refuses_dgl_kernels_with_nccl(kernel):
    with pytest.raises(ConfigError, match=f"spmm_kernel: got '{kernel}' with parallel.backend"):
        config_from_mapping({"parallel": {"backend": "nccl", "spmm_kernel": kernel}})
    for backend in ("gloo", "auto"):  # auto is checked once the backend is known
        config_from_mapping({"parallel": {"backend": backend, "spmm_kernel": kernel}})
    config_from_mapping({"parallel": {"backend": "nccl", "spmm_kernel": "torch-csr"}})


def _block(device: str, nnz: int = 3, n: int = 2) -> BlockCOO:
    return BlockCOO(
        rows=torch.zeros(nnz, dtype=torch.int64, device=device),
        cols=torch.zeros(nnz, dtype=torch.int64, device=device),
        values=torch.ones(nnz, device=device),
        diagonal=torch.zeros(nnz, dtype=torch.bool, device=device),
        row_scale=torch.ones(n, device=device),
        col_scale=torch.ones(n, device=device),
        inv_p=1.0,
        num_rows=n,
        num_cols=n,
    )


@pytest.mark.parametrize("kernel", CPU_ONLY_KERNELS)
def test_dgl_kernels_refuse_a_block_off_the_cpu(kernel):
    # "meta" stands in for a GPU: any device but the CPU must be refused before DGL runs.
    with pytest.raises(KernelDeviceError, match=f"'{kernel}' calls DGL's CPU-only kernels.*meta"):
        build_local_spmm(_block("meta"), kernel)
    build_local_spmm(_block("cpu"), kernel)


# ------------------------------------------------------------------ host syncs


@pytest.fixture(scope="module")
def store() -> RankStore:
    """Rank 5 of a 1x2x2x2 grid (its three adjacency planes differ) of a small graph."""
    graph = prepare_in_memory(random_dataset(num_nodes=400, num_edges=3000), 0)
    return RankStore(graph, Grid4D.view(GridShape.parse("1x2x2x2"), 5), num_layers=3)


def test_sync_counter_sees_every_kind_of_host_sync():
    values = torch.arange(6)
    with HostSyncCounter() as syncs:
        float(values.sum()), values.tolist(), values[values > 2], torch.bincount(values)
        torch.repeat_interleave(values, values)
        torch.repeat_interleave(values, values, output_size=15)  # size given: no sync
    assert dict(syncs.calls) == {
        "_local_scalar_dense": 1,
        "tolist": 1,
        "index": 1,
        "bincount": 1,
        "repeat_interleave": 1,
    }


def test_row_partition_reads_all_offsets_back_once(store):
    sample = sample_vertices(400, 90, seed=3)
    with HostSyncCounter() as syncs:
        rows = RowPartition.of(sample, 400, GridShape.parse("2x3x2x4"))
    assert syncs.total == 1  # one .tolist() of every axis's offsets, on the host sample
    for axis_bounds in dict(rows.bounds).values():
        assert list(axis_bounds) == sorted(axis_bounds) and axis_bounds[-1] == 90


def test_block_extraction_syncs_only_for_its_two_data_dependent_sizes(store):
    n, batch = store.num_nodes, 90
    sample = sample_vertices(n, batch, seed=4)
    rows = RowPartition.of(sample, n, store.grid.shape)
    p = inclusion_probability(n, batch)
    for plane, csr in store.blocks.items():
        spans = (
            rows.range(plane.rows, store.grid.coord(plane.rows)),
            rows.range(plane.cols, store.grid.coord(plane.cols)),
        )
        with HostSyncCounter() as syncs:
            block = extract_block(csr, sample, p, spans=spans)
        # The gathered entry count (before repeat_interleave) and the kept count.
        assert dict(syncs.calls) == {"_local_scalar_dense": 2}, plane
        with HostSyncCounter() as syncs:
            searched = extract_block(csr, sample, p)
        assert syncs.total == 3  # without spans the offsets are searched and read back
        assert torch.equal(block.dense(), searched.dense())
        with HostSyncCounter() as syncs:
            build_local_spmm(block, "torch-csr")
        assert syncs.total == 0, dict(syncs.calls)


class _ReadBacks(torch.overrides.TorchFunctionMode):
    """Records the values each ``.tolist()`` read."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[list] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.tolist:
            self.values.append(result)
        return result


def test_one_batch_waits_for_the_device_once(store):
    sample = sample_vertices(store.num_nodes, 90, seed=5)
    with HostSyncCounter() as syncs:
        store.batch(sample, step=0)
    # Three read-backs, none per row, element, block or layer: the partition offsets and
    # the blocks' gathered entry counts, both from the host sample and the host indptr
    # (no device involved), then the kept counts of all blocks together, the only read
    # of device data.
    assert dict(syncs.calls) == {"tolist": 3}
    with _ReadBacks() as reads:
        store.batch(sample, step=1)
    rows = RowPartition.of(sample, store.num_nodes, store.grid.shape)
    p = inclusion_probability(store.num_nodes, 90)
    kept = {}  # one entry per distinct block: planes sharing a block share its extraction
    for plane, csr in store.blocks.items():
        spans = (
            rows.range(plane.rows, store.grid.coord(plane.rows)),
            rows.range(plane.cols, store.grid.coord(plane.cols)),
        )
        kept[id(csr)] = extract_block(csr, sample, p, spans=spans).rows.numel()
    assert reads.values[-1] == list(kept.values())


@pytest.mark.parametrize("paper_model", [False, True])
def test_a_training_step_reads_the_device_once(paper_model):
    model = {"hidden": 8, "layers": 3, "dropout": 0.2, "norm": paper_model}
    model["residual"] = paper_model
    cfg = config_from_mapping({"model": model, "sampling": {"batch_size": 40}})
    graph = prepare_in_memory(random_dataset(num_nodes=80, num_edges=400), 0)
    trainer = Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    trainer.train_step(trainer.sample(0))  # creates Adam's state
    steps = [state["step"] for state in trainer.optimizer.state.values()]
    batch = trainer.sample(1)
    with HostSyncCounter(host_resident=steps) as syncs:
        trainer.train_step(batch)
    # Forward, loss, backward, the gradient average and Adam: one read-back, the loss
    # with the non-finite flag.
    assert dict(syncs.calls) == {"tolist": 1}


def test_batch_builds_no_transpose_until_a_backward_product(store):
    sorts = []

    class _CountSorts(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.argsort, torch.sort, torch.Tensor.argsort, torch.Tensor.sort):
                sorts.append(func)
            return func(*args, **(kwargs or {}))

    graph = prepare_in_memory(random_dataset(num_nodes=60, num_edges=300), 0)
    fresh = RankStore(graph, store.grid, num_layers=3)
    everything = torch.arange(graph.meta.num_nodes)  # B = N: p = 1, the stored values
    with _CountSorts():
        full = fresh.batch(everything, step=0)
        for spmm in full.adjacency.values():
            spmm.matmul(torch.ones(spmm.num_cols, 2))
    assert sorts == []
    plane, csr = next(iter(fresh.blocks.items()))
    spmm = full.adjacency[plane]
    grads = torch.randn(spmm.num_rows, 3)
    dense = torch.zeros(spmm.num_rows, spmm.num_cols)
    rows = torch.repeat_interleave(torch.arange(spmm.num_rows), torch.diff(csr.indptr))
    dense.index_put_((rows, csr.indices.long()), csr.values, accumulate=True)
    torch.testing.assert_close(spmm.matmul_t(grads), dense.T @ grads)


# -------------------------------------------------------- devices (stub CUDA calls)


class _StubCuda:
    """Just enough of torch.cuda to run the CUDA branches on a CPU-only machine: records
    which device each thread made current."""

    def __init__(self, monkeypatch, device_count: int = 4, current: int = 0) -> None:
        self.current = threading.local()
        self.calls: list[tuple[str, torch.device]] = []
        self._main_current = current

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.done = True

            def record(self, stream=None) -> None:
                pass

        class Stream:
            def __init__(self, device=None) -> None:
                pass

            def wait_event(self, event) -> None:
                pass

        for name, value in {
            "set_device": self.set_device,
            "current_device": self.current_device,
            "device_count": lambda: device_count,
            "Stream": Stream,
            "Event": Event,
            "stream": lambda stream: nullcontext(),
            "current_stream": lambda device=None: Stream(),
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)
        self.Event = Event

    def set_device(self, device) -> None:
        device = torch.device(device)
        self.current.index = device.index
        self.calls.append((threading.current_thread().name, device))

    def current_device(self) -> int:
        return getattr(self.current, "index", self._main_current)


@pytest.mark.parametrize(("device", "expected"), [("cuda:2", 2), ("cuda", 3)])
def test_prefetch_thread_builds_on_the_ranks_gpu(monkeypatch, device, expected):
    cuda = _StubCuda(monkeypatch, current=3)
    seen = []

    def build(step: int) -> int:
        seen.append((threading.current_thread().name, torch.cuda.current_device()))
        return step

    prefetcher = Prefetcher(build, Profiler(enabled=False), device=device)
    try:
        assert [prefetcher.get(step) for step in range(3)] == [0, 1, 2]
    finally:
        prefetcher.close()
    assert len(seen) == 4  # steps 0-2 and the prefetched step 3
    assert all(name.startswith("prefetch") and index == expected for name, index in seen), seen
    assert [d for name, d in cuda.calls if name.startswith("prefetch")] == [
        torch.device("cuda", expected)
    ]


def test_each_rank_takes_its_node_local_gpu(monkeypatch):
    cuda = _StubCuda(monkeypatch, device_count=4)
    info = LaunchInfo(rank=6, world_size=8, local_rank=2, launcher="mpi")
    assert device_for(info, "nccl") == torch.device("cuda", 2)
    assert cuda.current_device() == 2
    assert device_for(info, "gloo") == torch.device("cpu")
    crowded = LaunchInfo(rank=5, world_size=8, local_rank=5, launcher="mpi")
    with pytest.raises(RuntimeError, match="rank 5 is node-local rank 5 but this node shows 4"):
        device_for(crowded, "nccl")
    _StubCuda(monkeypatch, device_count=1)  # one GPU bound to this rank by the launcher
    assert device_for(crowded, "nccl") == torch.device("cuda", 0)


def test_process_group_is_bound_to_the_device(monkeypatch):
    started = {}
    monkeypatch.setattr(dist, "TCPStore", lambda *args, **kwargs: dist.HashStore())
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: started.update(kwargs))
    monkeypatch.setenv("SCALEGNN_JOB_SECRET", "s" * 32)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    info = LaunchInfo(rank=1, world_size=2, local_rank=1, launcher="torchrun")
    init_distributed(info, "nccl", 60, torch.device("cuda", 1))
    assert started["device_id"] == torch.device("cuda", 1) and started["backend"] == "nccl"
    init_distributed(info, "gloo", 60, torch.device("cpu"))
    assert started["device_id"] is None


# ----------------------------------------------------------------------- timers


def test_cuda_timers_are_read_without_waiting(monkeypatch):
    cuda = _StubCuda(monkeypatch)
    events = []

    class TimedEvent(cuda.Event):
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.done, self.at, self.waited = False, None, False
            events.append(self)

        def record(self, stream=None) -> None:
            self.at = len(events)

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            self.waited = self.done = True

        def elapsed_time(self, end) -> float:
            assert end.done  # the start was recorded earlier on the same stream
            return 1000.0 * (end.at - self.at)  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", TimedEvent)
    profiler = Profiler(device="cuda:0")
    with profiler.region("spmm"):
        pass
    with profiler.region("gemm"):
        pass
    for event in events[:2]:
        event.done = True  # the spmm kernels finished, the gemm ones still run
    first = profiler.snapshot(reset=True)
    assert first["seconds"] == {"spmm": 1.0} and first["calls"] == {"spmm": 1, "gemm": 1}
    assert not any(event.waited for event in events)
    second = profiler.snapshot(wait=True)
    assert second["seconds"] == {"gemm": 1.0}  # carried over, charged once
    assert profiler.snapshot()["seconds"] == {"gemm": 1.0}
