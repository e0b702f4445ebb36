"""One DistDGL process (server or trainer) started by :mod:`benchmarks.baselines.distdgl`.

``python -m benchmarks.baselines.distdgl_worker SPEC.json``. The role comes from
``DGL_ROLE`` as with DGL's own ``tools/launch.py``: a server
(``DGL_ROLE=server``) serves its partition from ``dgl.distributed.initialize`` until
trainer 0 shuts the servers down; a trainer (``DGL_ROLE=client``) joins the servers,
forms a gloo process group with the other trainers (a ``FileStore``: no TCP
rendezvous port) and trains GraphSAGE with ``DistNodeDataLoader`` +
``NeighborSampler`` under ``DistributedDataParallel``, evaluating layer by layer over
the ``DistGraph``. Trainer 0 writes the result (the format of
:mod:`benchmarks.baselines.training`) to the spec's ``result_path``.

Three adjustments to DGL 2.1.0 are made in this process only (see :func:`patch_dgl`):
the graphbolt placeholder of :mod:`dgl_scalegnn._dgl` gets the one class DistDGL's
server checks with ``isinstance``; the trainer's RPC listener address is chosen on
127.0.0.1 (DGL probes with a socket bound to all interfaces); and, when several
"machines" share this host, the machine id comes from ``SCALEGNN_DISTDGL_MACHINE``
(DGL takes the first ip_config line whose address is local, i.e. machine 0 for all).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.baselines import training
from benchmarks.baselines.graphsage import DEFAULTS, SAGE, resolve_fanouts
from dgl_scalegnn._dgl import dgl, graphbolt_stubbed
from dgl_scalegnn.train.trainer import peak_rss_mb

__all__ = ["patch_dgl", "DistGraphSAGE", "main"]

#: Environment variable with this process's machine id (several machines on one host).
MACHINE_ENV = "SCALEGNN_DISTDGL_MACHINE"
#: Environment variable with this trainer's rank among all trainers.
RANK_ENV = "SCALEGNN_DISTDGL_RANK"
#: Environment variable with the number of trainers.
WORLD_ENV = "SCALEGNN_DISTDGL_WORLD"


def _loopback_address(_probe_addr: str) -> str:
    """``127.0.0.1:<free port>`` for the trainer's RPC receiver."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


def patch_dgl() -> None:
    """Make DGL 2.1.0's distributed runtime work on one host with torch 2.13.

    1. ``dgl.distributed.dist_graph._format_partition`` tests
       ``isinstance(graph, dgl.graphbolt.FusedCSCSamplingGraph)``; the graphbolt
       placeholder that :mod:`dgl_scalegnn._dgl` registers (no graphbolt library for
       this torch) lacks the class, so an empty class is added (never an instance).
    2. ``rpc_client.get_local_usable_addr`` is replaced so the trainer's RPC receiver
       is on 127.0.0.1 (DGL asks the routing table and probes a port on all
       interfaces).
    3. With ``SCALEGNN_DISTDGL_MACHINE`` set, ``rpc_client.get_local_machine_id``
       returns it: every ip_config line is 127.0.0.1 here, and DGL would otherwise
       take machine 0 for every trainer and read the wrong partition's shared memory.
    """
    if graphbolt_stubbed():
        placeholder = sys.modules["dgl.graphbolt"]
        if not hasattr(placeholder, "FusedCSCSamplingGraph"):
            placeholder.FusedCSCSamplingGraph = type("FusedCSCSamplingGraph", (), {})
    rpc_client = dgl.distributed.rpc_client
    rpc_client.get_local_usable_addr = _loopback_address
    machine = os.environ.get(MACHINE_ENV)
    if machine is not None:
        rpc_client.get_local_machine_id = lambda _namebook: int(machine)


def _all_reduce(values: list[float], op: torch.distributed.ReduceOp) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(tensor, op=op)
    return tensor.tolist()


class DistGraphSAGE(training.MiniBatchBaseline):
    """GraphSAGE on a ``DistGraph``: this trainer's share of the training vertices.

    Every trainer takes the same number of steps per epoch (the smallest share's), so
    that the gradient all-reduces of ``DistributedDataParallel`` pair up. Evaluation is
    layer-wise over all vertices, each trainer computing its ``node_split`` share into a
    ``DistTensor`` per hidden layer, then the last layer for its share of the validation
    and test vertices; the correct counts are summed over the trainers.

    Parameters
    ----------
    graph : dgl.distributed.DistGraph
        With ``ndata`` ``feat``, ``label``, ``train_mask``, ``val_mask``, ``test_mask``.
    num_classes : int
        Output width.
    settings : dict
        GraphSAGE settings (:data:`benchmarks.baselines.graphsage.DEFAULTS`);
        ``batch_size`` is per trainer.
    """

    def __init__(self, graph: Any, num_classes: int, settings: Mapping[str, Any]) -> None:
        self.graph = graph
        book = graph.get_partition_book()
        ndata = graph.ndata
        self.features = ndata["feat"]
        self.eval_fanout = int(settings["eval_fanout"])
        self.eval_batch_size = int(settings["eval_batch_size"])
        train_ids = dgl.distributed.node_split(ndata["train_mask"], book, force_even=True)
        batch_size = int(settings["batch_size"])
        self.steps = int(
            _all_reduce(
                [math.ceil(train_ids.numel() / batch_size)], torch.distributed.ReduceOp.MIN
            )[0]
        )
        self.loader = dgl.dataloading.DistNodeDataLoader(
            graph,
            train_ids,
            dgl.dataloading.NeighborSampler(resolve_fanouts(settings)),
            batch_size=batch_size,
            shuffle=True,
            drop_last=False,
        )
        all_vertices = torch.ones(graph.num_nodes(), dtype=torch.bool)
        self.own_vertices = dgl.distributed.node_split(all_vertices, book, force_even=True)
        sage = SAGE(
            int(self.features.shape[1]),
            settings["hidden"],
            num_classes,
            settings["layers"],
            settings["dropout"],
        )
        self.buffers = [
            dgl.distributed.DistTensor(
                (graph.num_nodes(), sage.layer_width(index)),
                torch.float32,
                name=f"sage_layer{index}",
                persistent=True,
            )
            for index in range(sage.num_layers - 1)
        ]
        model = torch.nn.parallel.DistributedDataParallel(sage)
        super().__init__(
            model,
            ndata["label"],
            dgl.distributed.node_split(ndata["val_mask"], book, force_even=True),
            dgl.distributed.node_split(ndata["test_mask"], book, force_even=True),
            settings,
        )

    def batches(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.steps)

    def loss(self, batch: Any) -> torch.Tensor:
        input_nodes, output_nodes, blocks = batch
        logits = self.model(blocks, self.features[input_nodes])
        return F.cross_entropy(logits, self.labels[output_nodes])

    def train_epoch(self) -> float | None:
        loss = super().train_epoch()
        torch.distributed.barrier()
        return loss

    def agree(self, seconds: float) -> float:
        """The slowest trainer's training time, so that all stop and evaluate together."""
        return _all_reduce([seconds], torch.distributed.ReduceOp.MAX)[0]

    def _layer_loader(self, seeds: torch.Tensor) -> Any:
        return dgl.dataloading.DistNodeDataLoader(
            self.graph,
            seeds,
            dgl.dataloading.NeighborSampler([self.eval_fanout]),
            batch_size=self.eval_batch_size,
            shuffle=False,
            drop_last=False,
        )

    def predict(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of ``ids`` (in that order) after the hidden layers of every vertex."""
        sage: SAGE = self.model.module
        h = self.features
        for index, buffer in enumerate(self.buffers):
            for input_nodes, output_nodes, blocks in self._layer_loader(self.own_vertices):
                buffer[output_nodes] = sage.layer(index, blocks[0], h[input_nodes])
            self.graph.barrier()
            h = buffer
        vertices, logits = [], []
        last = sage.num_layers - 1
        for input_nodes, output_nodes, blocks in self._layer_loader(ids):
            vertices.append(output_nodes)
            logits.append(sage.layer(last, blocks[0], h[input_nodes]))
        if not logits:
            return torch.empty(0, sage.layer_width(last))
        return _rows_in_order(torch.cat(vertices), torch.cat(logits), ids)

    def reduce_counts(self, counts: list[float]) -> list[float]:
        """Sum the correct and total counts of all trainers."""
        return _all_reduce(counts, torch.distributed.ReduceOp.SUM)


def _rows_in_order(vertices: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``rows`` (one per entry of ``vertices``) rearranged to the order of ``ids``."""
    order = torch.argsort(vertices)
    position = torch.searchsorted(vertices[order], ids)
    return rows[order[position]]


def _train(spec: Mapping[str, Any]) -> None:
    rank, world = int(os.environ[RANK_ENV]), int(os.environ[WORLD_ENV])
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{spec['store_path']}", rank=rank, world_size=world
    )
    try:
        training.seed_everything(int(spec["seed"]) + rank, int(spec["threads"]))
        graph = dgl.distributed.DistGraph(spec["graph_name"])
        settings = training.merge_settings(DEFAULTS, spec["settings"], "distdgl-graphsage")
        trainer = DistGraphSAGE(graph, int(spec["num_classes"]), settings)
        if spec.get("budget_s") is None:
            result = training.run_epochs(
                trainer,
                spec["target_acc"],
                int(spec["max_epochs"]),
                int(spec["eval_every"]),
                bool(spec["stop_at_target"]),
            )
        else:
            result = training.run_for_seconds(
                trainer, float(spec["budget_s"]), spec["eval_at_s"], trainer.steps
            )
        peaks = torch.zeros(world, dtype=torch.float64)
        peaks[rank] = peak_rss_mb()
        torch.distributed.all_reduce(peaks)
        if rank == 0:
            result.update(
                settings=settings,
                seed=spec["seed"],
                steps_per_epoch=trainer.steps,
                max_rss_mb=peaks.tolist(),
            )
            Path(spec["result_path"]).write_text(json.dumps(result, indent=2) + "\n")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run the role ``DGL_ROLE`` names with the spec file ``argv[0]``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.baselines.distdgl_worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    patch_dgl()
    dgl.distributed.initialize(spec["ip_config"])  # a server serves here, then exits
    _train(spec)
    dgl.distributed.exit_client()
    return 0


if __name__ == "__main__":
    sys.exit(main())
