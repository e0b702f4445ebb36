"""Rank worker: what each optimisation switch did, in the same processes.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.switch_losses:main`` with a
base config, ``{variant name: config overrides}``, a step count and an output
directory. Every variant trains from its config (switches wired as ``scalegnn train``
wires them) while this worker records, per rank, in ``report<rank>.json``:

- ``losses``: the step losses;
- ``reduces``: every all-reduce handed to torch.distributed: dtype, shape, whether its
  group is the data-parallel one;
- ``max_in_flight``: the most asynchronous all-reduces started and not yet waited for;
- ``build_threads``: the thread that built each training batch;
- ``fused``: whether the layer tail ran compiled in this rank;
- ``tail_calls``: how many of the layer tail's kernels ran native, compiled or eager;
- ``prefetch_wait_steps``: steps whose breakdown has a ``prefetch_wait``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.comm import CommOptions
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer


class _ReduceRecorder:
    """Wraps ``torch.distributed.all_reduce``: logs each call and tracks async ones in flight."""

    def __init__(self, dp_handle: Any) -> None:
        self.dp_handle, self.calls, self.in_flight, self.max_in_flight = dp_handle, [], 0, 0
        self._original = dist.all_reduce

    def __call__(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        group, async_op = kwargs.get("group"), kwargs.get("async_op", False)
        self.calls.append(
            {
                "dtype": str(tensor.dtype),
                "shape": list(tensor.shape),
                "dp": group is not None and group is self.dp_handle,
            }
        )
        work = self._original(tensor, *args, **kwargs)
        if not async_op:
            return work
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        recorder = self

        class _Tracked:
            def wait(self) -> bool:
                recorder.in_flight -= 1
                return work.wait()

        return _Tracked()


def main(base: dict, variants: dict[str, dict], steps: int, out: str) -> None:
    session = start_session(config_from_mapping(base).parallel)
    try:
        graph = prepare_in_memory(generate(config_from_mapping(base).data.synthetic), 0)
        report = {}
        for name, overrides in variants.items():
            mapping = copy.deepcopy(base)
            for section, values in overrides.items():
                mapping.setdefault(section, {}).update(values)
            cfg = config_from_mapping(
                {**mapping, "train": {**mapping["train"], "max_steps": steps}}
            )
            runtime = dataclasses.replace(
                session.runtime,
                options=CommOptions.from_config(cfg.parallel),
                profiler=Profiler(),
            )
            metrics = MetricsWriter(None, enabled=True)
            trainer = Trainer(cfg, graph, runtime, metrics)
            build_threads: list[str] = []
            build = trainer.store.batch

            def recorded_build(*args: Any, _build=build, _threads=build_threads, **kwargs: Any):
                _threads.append(threading.current_thread().name)
                return _build(*args, **kwargs)

            trainer.store.batch = recorded_build
            recorder = _ReduceRecorder(runtime.grid.dp_group.handle)
            dist.all_reduce = recorder
            try:
                trainer.fit()
            finally:
                dist.all_reduce = recorder._original
            step_events = [e for e in metrics.events if e["event"] == "step"]
            report[name] = {
                "losses": [e["loss"] for e in step_events],
                "reduces": recorder.calls,
                "max_in_flight": recorder.max_in_flight,
                "build_threads": build_threads,
                "fused": trainer.model.layer_tail.fused,
                "tail_calls": trainer.model.layer_tail.calls,
                "prefetch_wait_steps": sum("prefetch_wait" in e["seconds"] for e in step_events),
            }
        rank = session.runtime.grid.rank
        Path(out, f"report{rank}.json").write_text(json.dumps(report))
    finally:
        end_session(session)
