"""Rank workers of the CUDA smoke suite (run by :func:`tests.ranks.spawn_ranks`).

:func:`gpu_checks` trains a small synthetic graph on this rank's GPU and writes
``rank{r}.json`` with what the suite asserts: the device each piece ran on, the step
losses with prefetch off and on, the layer tail's kernels by kind, and the host
synchronisations of one training step and of one batch build (counted by
``torch.cuda.set_sync_debug_mode``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.sampling.prefetch import Prefetcher
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer
from tests.gpu.check import training_syncs


def prefetch_thread_devices(profiler: Profiler, device: torch.device) -> list[list[int]]:
    """``[step, current device]`` of each batch the prefetch thread builds for
    ``get(0)`` and ``close()``: step 0, and step 1, which ``get(0)`` starts at once and
    ``close()`` waits for."""
    built: list[list[int]] = []

    def record(step: int) -> int:
        built.append([step, torch.cuda.current_device()])
        return step

    prefetcher = Prefetcher(record, profiler, device)
    prefetcher.get(0)
    prefetcher.close()
    return built


def _losses(cfg_mapping: dict, graph, session, device) -> list[float]:
    cfg = config_from_mapping(cfg_mapping)
    metrics = MetricsWriter(None, enabled=True)
    Trainer(cfg, graph, session.runtime, metrics, device).fit()
    return [e["loss"] for e in metrics.events if e["event"] == "step"]


def gpu_checks(base: dict, out: str) -> None:
    session = start_session(config_from_mapping(base).parallel)
    try:
        device, rank = session.device, session.runtime.grid.rank
        graph = prepare_in_memory(generate(config_from_mapping(base).data.synthetic), 0)
        prefetch_on = {**base, "sampling": {**base["sampling"], "prefetch": True}}
        report: dict[str, Any] = {
            "device": str(device),
            "local_rank": session.launch.local_rank,
            "current_device": torch.cuda.current_device(),
            "losses": _losses(base, graph, session, device),
            "losses_prefetch": _losses(prefetch_on, graph, session, device),
        }
        report["prefetch_thread_devices"] = prefetch_thread_devices(
            session.runtime.profiler, device
        )

        trainer = Trainer(
            config_from_mapping(base), graph, session.runtime, MetricsWriter(None), device
        )
        report["syncs_train_step"], report["syncs_batch"] = training_syncs(trainer, device)
        report["fused"] = trainer.model.layer_tail.fused
        report["kernel_calls"] = trainer.model.layer_tail.calls
        report["threads"] = [t.name for t in threading.enumerate()]
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        end_session(session)
