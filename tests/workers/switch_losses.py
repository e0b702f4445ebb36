"""Rank worker: step losses of several optimisation settings, in the same processes.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.switch_losses:main`` with a
base config, ``{variant name: parallel/sampling overrides}``, a step count and an
output directory; rank 0 writes ``losses.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.distributed.comm import CommOptions
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.run import end_session, start_session
from dgl_scalegnn.train.trainer import Trainer


def main(base: dict, variants: dict[str, dict], steps: int, out: str) -> None:
    session = start_session(config_from_mapping(base).parallel)
    try:
        graph = prepare_in_memory(generate(config_from_mapping(base).data.synthetic), 0)
        losses = {}
        for name, overrides in variants.items():
            mapping = copy.deepcopy(base)
            for section, values in overrides.items():
                mapping.setdefault(section, {}).update(values)
            cfg = config_from_mapping(
                {**mapping, "train": {**mapping["train"], "max_steps": steps}}
            )
            options = CommOptions(bf16=cfg.parallel.bf16_comm, overlap=cfg.parallel.overlap)
            runtime = dataclasses.replace(session.runtime, options=options)
            metrics = MetricsWriter(None, enabled=True)
            Trainer(cfg, graph, runtime, metrics).fit()
            losses[name] = [e["loss"] for e in metrics.events if e["event"] == "step"]
        if session.runtime.grid.rank == 0:
            Path(out, "losses.json").write_text(json.dumps(losses))
    finally:
        end_session(session)
