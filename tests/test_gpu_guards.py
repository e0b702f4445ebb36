"""CPU guards of the GPU path: what can go wrong on CUDA/NCCL, checked where no GPU is.

Impossible kernel/backend pairs are refused; the device policy (CUDA where usable, said
at start-up; refusals naming torch's CUDA, the driver and the compute capability) runs
on stub CUDA calls, as do the checks that every rank uses its own GPU (the prefetch
thread too), the fused kernels' and TF32's ``auto``, and the CUDA-event timings (read
without waiting; host waits on the host clock); and the host synchronisations of
sampling, batch building and a training step are counted on CPU tensors (each counted
call would make the host wait for a GPU).
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from dgl_scalegnn.cli import main
from dgl_scalegnn.config import CPU_ONLY_KERNELS, ConfigError, ParallelConfig, config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed import devices
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.distributed.devices import (
    DeviceChoice,
    device_for,
    driver_version,
    gpu_may_be_shared,
    refuse_shared_gpus,
    resolve_device,
    use_tf32,
)
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.distributed.launch import LaunchInfo
from dgl_scalegnn.distributed.rendezvous import init_distributed
from dgl_scalegnn.parallel.elementwise import LayerTail, LocalRows
from dgl_scalegnn.parallel.partition import RowPartition
from dgl_scalegnn.parallel.spmm import BlockCOO, KernelDeviceError, build_local_spmm
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.sampling.blocks import extract_block
from dgl_scalegnn.sampling.prefetch import Prefetcher
from dgl_scalegnn.sampling.store import RankStore
from dgl_scalegnn.sampling.uniform import inclusion_probability, sample_vertices
from dgl_scalegnn.train import run
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.gpu.host_syncs import HostSyncCounter
from tests.gpu.workers import prefetch_thread_devices
from tests.helpers import random_dataset

# ------------------------------------------------------------- kernel and backend


@pytest.mark.parametrize("kernel", CPU_ONLY_KERNELS)
def test_config_refuses_dgl_kernels_with_nccl(kernel):
    for parallel in ({"backend": "nccl"}, {"device": "cuda"}):
        with pytest.raises(ConfigError, match=f"spmm_kernel: got '{kernel}' on CUDA"):
            config_from_mapping({"parallel": {**parallel, "spmm_kernel": kernel}})
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
    values = csr.values_at(rows, csr.indices)
    dense.index_put_((rows, csr.indices.long()), values, accumulate=True)
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


def test_prefetch_thread_builds_steps_zero_and_one_on_the_ranks_gpu(monkeypatch):
    """What the GPU suite measures on every rank (tests/gpu/workers.py): ``get(0)``
    builds step 0 and at once step 1, both on the rank's GPU (the suite expected one)."""
    _StubCuda(monkeypatch, current=0)
    assert prefetch_thread_devices(Profiler(enabled=False), torch.device("cuda", 2)) == [
        [0, 2],
        [1, 2],
    ]


def test_each_rank_takes_its_node_local_gpu(monkeypatch):
    cuda = _StubCuda(monkeypatch, device_count=4)
    info = LaunchInfo(rank=6, world_size=8, local_rank=2, launcher="mpi")
    assert device_for(info, "nccl") == torch.device("cuda", 2)
    assert cuda.current_device() == 2
    assert device_for(info, "gloo") == torch.device("cpu")
    crowded = LaunchInfo(rank=5, world_size=8, local_rank=5, launcher="mpi")
    with pytest.raises(ConfigError, match="rank 5 is node-local rank 5, but the node shows 4 GPUs"):
        device_for(crowded, "nccl")
    # 8 ranks on a node of 4 GPUs: refused on every one of them, local rank 1 too
    known = LaunchInfo(rank=1, world_size=8, local_rank=1, launcher="torchrun", local_world_size=8)
    with pytest.raises(
        ConfigError, match="local rank 1 of the 8 on its node, but the node shows 4"
    ):
        device_for(known, "nccl")
    _StubCuda(monkeypatch, device_count=1)  # one GPU bound to this rank by the launcher
    assert device_for(crowded, "nccl") == torch.device("cuda", 0)
    assert gpu_may_be_shared(crowded, torch.device("cuda", 0))  # or the same GPU for all
    assert not gpu_may_be_shared(LaunchInfo(0, 1, 0, "single"), torch.device("cuda", 0))
    _StubCuda(monkeypatch, device_count=4)
    assert not gpu_may_be_shared(info, torch.device("cuda", 2))  # local rank i takes GPU i


def _ranks_on_gpus(gpus: list[str]) -> list[BaseException | None]:
    """:func:`refuse_shared_gpus` on one thread per rank, rank ``r`` on ``gpus[r]``,
    through one store; what each raised."""
    store, outcome = dist.HashStore(), [None] * len(gpus)
    store.set_timeout(datetime.timedelta(seconds=20))

    def rank(r: int) -> None:
        try:
            refuse_shared_gpus(store, r, len(gpus), gpus[r])
        except ConfigError as error:
            outcome[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(gpus))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return outcome


def test_ranks_sharing_a_gpu_are_refused_on_every_rank():
    """Each rank sees one GPU: bound per task (all differ) or shared (NCCL would stop on
    "Duplicate GPU detected" on some ranks and hang the rest)."""
    assert _ranks_on_gpus(["H100 GPU-a", "H100 GPU-b", "H100 GPU-c"]) == [None] * 3
    refused = _ranks_on_gpus(["H100 GPU-a", "H100 GPU-b", "H100 GPU-a"])
    assert all(isinstance(error, ConfigError) for error in refused), refused
    assert len({str(error) for error in refused}) == 1  # the same verdict on every rank
    assert str(refused[0]).startswith("2 ranks use one GPU, H100 GPU-a (rank ")
    assert "srun --gpus-per-task=1" in str(refused[0])


@pytest.fixture
def matmul():
    """``torch.backends.cuda.matmul`` with float32 precision unset, restored after."""
    matmul = torch.backends.cuda.matmul
    saved, matmul.fp32_precision = matmul.fp32_precision, "none"
    yield matmul
    matmul.fp32_precision = saved


class _Started(Exception):
    """Raised by the stand-in ``init_distributed`` below once it has seen its arguments."""


@pytest.mark.parametrize(("gpus", "bound"), [(1, None), (4, torch.device("cuda", 1))])
def test_process_group_starts_unbound_where_ranks_may_share_a_gpu(monkeypatch, matmul, gpus, bound):
    _StubCuda(monkeypatch, device_count=gpus)
    launch = LaunchInfo(rank=1, world_size=2, local_rank=1, launcher="torchrun")
    monkeypatch.setattr(run, "detect_launch", lambda: launch)
    monkeypatch.setattr(run, "resolve_device", lambda requested: DeviceChoice("cuda", "nccl", ""))
    seen = {}

    def started(info, backend, timeout_s, device=None):
        seen.update(backend=backend, device=device)
        raise _Started

    monkeypatch.setattr(run, "init_distributed", started)
    with pytest.raises(_Started):
        run.start_session(ParallelConfig(grid="1x1x1x2"))
    assert seen == {"backend": "nccl", "device": bound}
    assert matmul.fp32_precision == "tf32"  # tf32 auto on CUDA


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


# ------------------------------------------------------ device policy (stub CUDA)

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
V100 = ("Tesla V100-SXM2-32GB", (7, 0))
_MODULE_LINE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Jul 15 05:40:52 UTC 2025\n"
)


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """Stands in for a machine's driver and GPUs: ``machine(driver=..., gpus=[(name,
    capability), ...], build=...)``; torch's CUDA calls answer as on such a machine (no
    GPU visible when the driver is missing or older than ``build`` needs)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(devices, "_DRIVER_VERSION_FILE", tmp_path / "version")

    def make(driver: str | None, gpus=(), build: str | None = "13.0", driver_cuda: int = 0):
        (tmp_path / "version").unlink(missing_ok=True)
        if driver is not None:
            (tmp_path / "version").write_text(_MODULE_LINE.format(driver))
        visible = list(gpus) if build and driver and int(driver.split(".")[0]) >= 580 else []
        for name, value in {
            "is_available": lambda: bool(visible),
            "device_count": lambda: len(visible),
            "get_device_name": lambda index=0: visible[index][0],
            "get_device_capability": lambda index=0: visible[index][1],
            "get_device_properties": lambda index=0: SimpleNamespace(
                name=visible[index][0],
                major=visible[index][1][0],
                minor=visible[index][1][1],
                total_memory=80 << 30,
                multi_processor_count=132,
            ),
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(torch.version, "cuda", build)
        monkeypatch.setattr(torch._C, "_cuda_getDriverVersion", lambda: driver_cuda, raising=False)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: build is not None)

    return make


def test_auto_takes_cuda_and_nccl_where_usable_and_says_what_it_found(machine):
    machine("580.65.06", [H100] * 8, driver_cuda=13000)
    choice = resolve_device("auto")
    assert (choice.device, choice.backend) == ("cuda", "nccl")
    assert choice.reason == (
        f"torch {torch.__version__} with CUDA 13.0, driver 580.65.06 (CUDA 13.0), "
        "8 x NVIDIA H100 80GB HBM3 (compute capability 9.0)"
    )
    assert resolve_device("cuda") == choice
    assert resolve_device("cpu") == DeviceChoice("cpu", "gloo", "asked for")


def test_auto_falls_back_to_the_cpu_saying_why_and_cuda_is_refused(machine):
    version = torch.__version__
    machine(None, build=None)  # a CPU build of torch, no driver
    assert resolve_device("auto") == DeviceChoice("cpu", "gloo", f"torch {version} has no CUDA")
    with pytest.raises(ConfigError) as refused:
        resolve_device("cuda")
    assert str(refused.value).startswith(
        f"parallel.device: cuda (or backend nccl), but CUDA is not usable here: torch {version} "
        f"has no CUDA (torch {version} without CUDA, no NVIDIA driver found); docs/gpu.md"
    )
    machine("535.104.05", [H100], driver_cuda=12020)  # the driver is too old for CUDA 13.0
    old = f"CUDA driver 535.104.05 is older than torch {version}'s CUDA 13.0 needs (>= 580)"
    assert resolve_device("auto").reason == old
    with pytest.raises(
        ConfigError, match=rf"{re.escape(old)} \(.*driver 535\.104\.05 \(CUDA 12\.2\)"
    ):
        resolve_device("cuda")
    machine("580.65.06", [H100, V100])  # Volta: no kernels in torch's CUDA 13 build
    volta = "GPU 1 (Tesla V100-SXM2-32GB) has compute capability 7.0"
    assert resolve_device("auto").reason.startswith(volta)
    with pytest.raises(
        ConfigError,
        match=rf"{re.escape(volta)}; .* runs on 7\.5 and newer "
        r".*compute capability 9\.0\), 1 x Tesla",
    ):
        resolve_device("cuda")
    machine(None, [H100])
    assert resolve_device("auto").reason == (
        f"no NVIDIA driver found; torch {version} is built for CUDA 13.0"
    )


def test_driver_version_from_the_kernel_module_or_nvidia_smi(machine, tmp_path):
    machine(None)
    assert driver_version() is None
    (tmp_path / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    )
    assert driver_version() == "535.104.05"
    (tmp_path / "version").unlink()
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '580.82.07\\n580.82.07\\n'\n")
    smi.chmod(0o755)
    assert driver_version() == "580.82.07"


def test_start_up_says_the_device_on_rank_0_and_cuda_is_refused_in_one_line(
    machine, capsys, monkeypatch
):
    machine(None, build=None)
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    run.end_session(run.start_session(ParallelConfig()))
    assert capsys.readouterr().out == (
        "scalegnn: device cpu, backend gloo (parallel.device auto): "
        f"torch {torch.__version__} has no CUDA\n"
    )
    for asked in ("parallel.device=cuda", "parallel.backend=nccl"):
        assert main(["train", "--set", asked]) == 2
        said = capsys.readouterr().err
        assert said.startswith("scalegnn: error: parallel.device: cuda (or backend nccl), ")
        assert said.count("\n") == 1 and "has no CUDA" in said


def test_tf32_is_on_for_cuda_under_auto_and_never_touched_on_the_cpu(matmul):
    assert not use_tf32("auto", torch.device("cpu")) and matmul.fp32_precision == "none"
    assert not use_tf32(True, torch.device("cpu")) and matmul.fp32_precision == "none"
    assert use_tf32("auto", torch.device("cuda", 0)) and matmul.fp32_precision == "tf32"
    assert not use_tf32(False, torch.device("cuda", 0)) and matmul.fp32_precision == "ieee"


def _tail_step(tail: LayerTail) -> None:
    x = torch.randn(9, 4, requires_grad=True)
    tail(x, torch.ones(4), None, torch.arange(9), statistics=LocalRows(), key=3,
         col_start=0, width=4, eps=1e-6, rate=0.25).sum().backward()  # fmt: skip


def test_fusion_auto_stays_eager_on_the_cpu_and_compiles_on_cuda(monkeypatch):
    assert config_from_mapping({}).parallel.fuse == "auto"
    tail = LayerTail("auto", native=False)
    _tail_step(tail)
    assert tail.fused is False and tail.calls["compiled"] == 0 and tail.calls["eager"] > 0
    on_gpu, compiled = LayerTail("auto"), []
    monkeypatch.setitem(on_gpu._compiled, "forward", lambda *args: compiled.append(args) or 1)
    cuda_tensor = SimpleNamespace(device=torch.device("cuda", 0))  # what run() reads of it
    assert on_gpu.run("forward", cuda_tensor) == 1
    assert on_gpu.fused is True and on_gpu.calls["compiled"] == 1 and compiled


def test_fusion_forced_on_the_cpu_runs_compiled_kernels():
    tail = LayerTail(True)
    _tail_step(tail)
    assert tail.fused is True and tail.calls == {"native": 0, "compiled": 2, "eager": 0}


def test_kernels_are_compiled_at_their_first_fused_call_only(monkeypatch):
    """``torch.compile`` imports the compiler (torch._inductor alone: 0.7 s of CPU and
    45 MB a process) at its first call: an ``auto`` tail on the CPU never calls it, a
    fused one at its first step."""
    compiled = []

    def compile_spy(kernel, **options):
        compiled.append(kernel.__name__)
        return kernel

    monkeypatch.setattr(torch, "compile", compile_spy)
    auto, fused = LayerTail("auto"), LayerTail(True)
    assert compiled == []  # built, nothing compiled yet
    _tail_step(auto)
    assert compiled == [] and auto.fused is False
    _tail_step(fused)
    assert compiled == ["tail_forward", "tail_backward"] and fused.calls["compiled"] == 2


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


def test_host_waits_take_the_host_clock_and_sampling_the_longer_clock(monkeypatch):
    """On CUDA, events queued behind other GPU work time the GPU, not the host: a wait
    of the host for the prefetch thread then read about 0, and sampling lost its CPU
    part. Here the stub GPU's events say ``gpu_ms`` whatever the host did."""
    cuda, gpu_ms, events = _StubCuda(monkeypatch), [0.0], []

    class QueuedEvent(cuda.Event):
        def __init__(self, enable_timing: bool = False) -> None:
            self.gpu_ms = gpu_ms[0]  # the GPU time its region will read
            events.append(self)

        def query(self) -> bool:
            return True

        def elapsed_time(self, end) -> float:
            return end.gpu_ms

    monkeypatch.setattr(torch.cuda, "Event", QueuedEvent)
    profiler = Profiler(device="cuda:0")
    with profiler.region("prefetch_wait"):
        time.sleep(0.05)  # the host waits; the GPU is busy with the last step meanwhile
    assert events == []  # no CUDA events for a host wait
    with profiler.region("sampling"):
        time.sleep(0.05)  # the sample drawn and split on the CPU
    gpu_ms[0] = 1000.0
    with profiler.region("sampling"):
        pass  # the blocks cut out on the GPU, 1 s
    seconds = profiler.snapshot()["seconds"]
    assert 0.05 <= seconds["prefetch_wait"] < 0.5
    assert 1.05 <= seconds["sampling"] < 1.5  # 0.05 s of host, then 1 s of GPU
