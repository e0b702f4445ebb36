"""Test helpers: local multi-process launches and small graphs with awkward shapes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import psutil
import torch

import yaml
from benchmarks.graphs import Graph
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.parallel.data_parallel import average_gradients
from dgl_scalegnn.parallel.spmm import build_local_spmm
from dgl_scalegnn.sampling.batch import RankBatch
from dgl_scalegnn.sampling.blocks import full_block
from dgl_scalegnn.sampling.store import FullGraph
from dgl_scalegnn.train.metrics import read_metrics
from tests.ranks import spawn_ranks

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SHARED_DATA = ROOT.parent / "shared" / "datasets"


def random_dataset(
    num_nodes: int = 97,
    num_edges: int = 400,
    num_features: int = 11,
    num_classes: int = 5,
    seed: int = 0,
    isolated: int = 3,
    multilabel: bool = False,
) -> NodeDataset:
    """A random directed multigraph with duplicate edges, self loops and isolated vertices
    (``multilabel``: each vertex has each class with probability 0.4)."""
    rng = np.random.default_rng(seed)
    connected = num_nodes - isolated
    src = rng.integers(0, connected, num_edges)
    dst = rng.integers(0, connected, num_edges)
    src = np.concatenate((src, src[:10], [0, 1]))  # duplicates and self loops
    dst = np.concatenate((dst, dst[:10], [0, 1]))
    graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=num_nodes)
    graph.ndata["feat"] = torch.from_numpy(rng.standard_normal((num_nodes, num_features))).float()
    if multilabel:
        label = torch.from_numpy(rng.random((num_nodes, num_classes)) < 0.4).float()
    else:
        label = torch.from_numpy(rng.integers(0, num_classes, num_nodes))
    graph.ndata["label"] = label
    split = rng.random(num_nodes)
    graph.ndata["train_mask"] = torch.from_numpy(split < 0.6)
    graph.ndata["val_mask"] = torch.from_numpy((split >= 0.6) & (split < 0.8))
    graph.ndata["test_mask"] = torch.from_numpy(split >= 0.8)
    return NodeDataset("random", graph, num_classes, multilabel=multilabel)


def small_prepared_graph(tmp_path: Path) -> Graph:
    """A 2,000-vertex synthetic graph (8 features) prepared by ``scalegnn prepare`` into
    ``tmp_path/prepared``, as the benchmarks' :class:`~benchmarks.graphs.Graph` of
    the sparse preset (its 1M config; no DGL file, no partitions)."""
    from dgl_scalegnn.cli import main as cli_main

    prepared = tmp_path / "prepared"
    synthetic = ["--set", "data.synthetic.num_nodes=2000", "--set", "data.synthetic.num_features=8"]
    assert cli_main(["prepare", "--dataset", "synthetic", *synthetic, "--out", str(prepared)]) == 0
    return Graph(
        name="sparse",
        config_file=str(ROOT / "yaml" / "synthetic-1m.yaml"),
        prepared=prepared,
        num_classes=8,
        num_nodes=2000,
    )


def record_steps(trainer) -> list[dict[str, float]]:
    """Per optimizer step: the rate, the agreed seconds and this rank's own before it."""
    seen: list[dict[str, float]] = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(
            {
                "lr": trainer.optimizer.param_groups[0]["lr"],
                "agreed_s": trainer.agreed_train_s,
                "own_s": trainer.progress.train_seconds,
            }
        )
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    return seen


def whole_graph_batch(graph: FullGraph) -> RankBatch:
    """A training batch of every vertex of this rank's full-graph share (``step`` -1):
    what the training forward computes on the whole graph, the evaluation's oracle."""
    return RankBatch(
        step=-1,
        rows=graph.rows,
        adjacency={p: build_local_spmm(full_block(b)) for p, b in graph.blocks.items()},
        features=graph.features,
        labels=graph.labels,
        masks=graph.masks,
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().clamp(min=1e-12)
    return float((actual - expected).abs().max() / scale)


def train_through_cli(
    tmp_path: Path,
    name: str,
    grid: str,
    config: dict | str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> list[dict]:
    """Run ``scalegnn train`` on spawned ranks of ``grid`` with a config (a dict, or a
    YAML file of the project) and Cora's files at hand; returns its metrics events."""
    if isinstance(config, dict):
        config_path = tmp_path / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config))
    else:
        config_path = ROOT / config
    metrics = tmp_path / f"{name}.jsonl"
    argv = ["train", "--config", str(config_path), "--grid", grid, "--metrics", str(metrics)]
    rank_env = {"SCALEGNN_DATA_ROOT": str(SHARED_DATA), **(env or {})}
    world_size = GridShape.parse(grid).world_size
    spawn_ranks(
        world_size, "dgl_scalegnn.cli:main", [[*argv, *extra]], tmp_path / name, env=rank_env
    )
    return read_metrics(metrics)


@contextlib.contextmanager
def launched(argv: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A launcher started as a user starts it (one thread a rank unless ``env`` says
    otherwise), in a session of its own: if the block leaves early, everything it started
    is killed."""
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:  # ranks may have left the session: kill them by name
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(process.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if not process.stdout.closed:  # not read by the block: reap it
            process.communicate()


# srun: note the arguments, then start SLURM_NTASKS copies of the command after the
# options, spread evenly over the nodes `scontrol show hostnames` names (through
# SRUN_ON_NODE, `SRUN_ON_NODE NODE COMMAND...`, where set); say which tasks failed and
# exit with the largest exit code of the tasks, as srun does.
_STAND_IN_SRUN = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    printf '%s\\n' "$@" > "$SRUN_ARGS_FILE"
    while [[ "$1" == --* ]]; do shift; done
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    per_node=$(( SLURM_NTASKS / ${#nodes[@]} ))
    pids=()
    for ((rank = 0; rank < SLURM_NTASKS; rank++)); do
      node=$(( rank / per_node ))
      SLURM_PROCID=$rank SLURM_LOCALID=$(( rank % per_node )) SLURM_NODEID=$node \\
        ${SRUN_ON_NODE:+"$SRUN_ON_NODE" "${nodes[node]}"} "$@" & pids+=($!)
    done
    status=0
    for rank in "${!pids[@]}"; do
      wait "${pids[rank]}" && code=0 || code=$?
      (( code == 0 )) || echo "srun: error: ${nodes[rank / per_node]}: task $rank: exit $code" >&2
      (( code > status )) && status=$code
    done
    exit $status
    """
)
_STAND_IN_SCONTROL = '#!/usr/bin/env bash\n[ "$1 $2" = "show hostnames" ] && tr , "\\n" <<< "$3"\n'


def stand_in_slurm(
    tmp_path: Path,
    tasks: int,
    port: int,
    nodes: Sequence[str] = ("127.0.0.1",),
    on_node: Path | None = None,
) -> dict[str, str]:
    """The environment of an sbatch job on ``nodes`` (this machine by default), whose
    ``srun`` and ``scontrol`` are stand-ins that start the tasks as Slurm would
    (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``), each node's through
    ``on_node NODE COMMAND...`` where given; ``srun``'s arguments are noted in
    ``tmp_path/srun_args``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", _STAND_IN_SRUN), ("scontrol", _STAND_IN_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_NTASKS": str(tasks),
        "SLURM_NTASKS_PER_NODE": str(tasks // len(nodes)),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_CPUS_PER_TASK": "1",
        "SCALEGNN_ROOT": str(ROOT),
        "MASTER_PORT": str(port),
        "SRUN_ARGS_FILE": str(tmp_path / "srun_args"),
        **({"SRUN_ON_NODE": str(on_node)} if on_node else {}),
    }


def step_losses(events: list[dict]) -> list[float]:
    """The losses of the ``step`` events, in order."""
    return [e["loss"] for e in events if e["event"] == "step"]


def first_step_gradients(trainer) -> tuple:
    """The trainer's step 0 in training mode, forward and backward, its gradients averaged
    over the data-parallel group (no optimizer step): ``(batch, logits, spec, loss)``."""
    model = trainer.model
    batch = trainer.sample(0)
    model.train()
    logits, logits_spec = model(batch)
    loss = trainer.objective.loss(logits, logits_spec, batch, "train")
    loss.backward()
    average_gradients(list(model.parameters()), loss, trainer.runtime)
    return batch, logits, logits_spec, loss
