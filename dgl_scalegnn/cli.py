"""scalegnn: mini-batch GNN training on a 4D grid of processes, built on DGL.

``scalegnn train [--config FILE] [--data GRAPH.bin] [--grid GdxGxxGyxGz] [--set key=value
...] [--metrics FILE]`` trains (on one process, or on every process of an
``mpirun``/``srun``/``torchrun`` launch); ``--data`` alone trains a ``dgl.save_graphs``
file with the settings derived from the graph. ``scalegnn prepare`` writes a prepared
dataset directory within a memory budget (split over the ranks when launched by
``mpirun -np P``), and ``scalegnn prepare --verify DIR`` checks one. ``scalegnn plan``
ranks grid shapes for N GPUs; ``scalegnn report`` tables and plots metrics files;
``scalegnn export`` gathers a checkpoint into one model file and ``scalegnn predict``
runs it on a ``dgl.save_graphs`` file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from dgl_scalegnn.config import Config, ConfigError, load_config
from dgl_scalegnn.errors import InputError

if TYPE_CHECKING:
    from dgl_scalegnn.data.prepared import GraphMeta
    from dgl_scalegnn.data.streaming import Coordinator

T = TypeVar("T")

__all__ = ["main", "BROKEN_PIPE_EXIT_CODE"]

#: Exit code when the reader of stdout left before the output ended (``| head``): the
#: shell's 128 + SIGPIPE, what a tool that SIGPIPE ends reports.
BROKEN_PIPE_EXIT_CODE = 141


def _launch_rank() -> int:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def _train_config(args: argparse.Namespace) -> Config:
    overrides = []
    if getattr(args, "data", None):  # before --set, which may still change them
        overrides += ["data.name=dgl", f"data.path={args.data}"]
    overrides += list(args.set or [])
    if getattr(args, "grid", None):
        overrides.append(f"parallel.grid={args.grid}")
    if getattr(args, "resume", False):
        overrides.append("output.resume=true")
    return load_config(args.config, overrides)


def _train(args: argparse.Namespace) -> int:
    from dgl_scalegnn.train.preemption import PREEMPTED_EXIT_CODE
    from dgl_scalegnn.train.run import run_training

    cfg = _train_config(args)
    bare = args.config is None and args.data is None and cfg.data.name == "synthetic"
    if bare and _launch_rank() == 0:
        # A note, not an error: on stdout with the start-up block (stderr keeps --json's
        # stdout pure JSON, and errors the only lines on stderr otherwise).
        print(
            "scalegnn: no --config or --data: training the built-in synthetic graph (20,000 "
            "vertices, config.py's defaults); give --config FILE or --data GRAPH.bin",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )
    summary = run_training(cfg, metrics_path=args.metrics, json_stdout=args.json)
    return PREEMPTED_EXIT_CODE if "preempted" in summary else 0


def _prepare(args: argparse.Namespace) -> int:
    from dgl_scalegnn.data.datasets import load_source
    from dgl_scalegnn.data.prepared import verify_prepared
    from dgl_scalegnn.data.streaming import MemoryBudget, prepare_streaming

    if args.verify:
        meta = verify_prepared(args.verify)
        print(
            f"{args.verify}: ok ({meta.name}, {meta.num_nodes} vertices, {meta.nnz} entries, "
            f"{meta.num_features} features, {meta.num_classes} classes)"
        )
        return 0
    overrides = list(args.set or [])
    if args.dataset:
        overrides.append(f"data.name={args.dataset}")
    if args.root:
        overrides.append(f"data.root={args.root}")
    cfg = load_config(args.config, overrides)
    if not args.out:
        raise ConfigError("prepare: --out DIR is required (or --verify DIR)")
    try:
        budget = MemoryBudget.gigabytes(args.memory_gb)
    except ValueError as error:
        raise ConfigError(str(error)) from None

    def prepare(coordinator: Coordinator) -> tuple[GraphMeta, Path]:
        source = load_source(cfg.data)
        return prepare_streaming(
            source, args.out, cfg.data.permutation_seed, budget=budget, coordinator=coordinator
        )

    meta, target = _on_every_rank(prepare, cfg.parallel.timeout_s)
    if _launch_rank() == 0:
        print(f"prepared {meta.name}: {meta.num_nodes} vertices, {meta.nnz} entries -> {target}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from dgl_scalegnn.train.plan import plan_report

    cfg = load_config(args.config, list(args.set or []))

    def progress(line: str) -> None:
        print(f"scalegnn plan: {line}", file=sys.stderr, flush=True)

    lines = plan_report(cfg, args.gpus, args.gpu, args.top, args.calibrate, progress)
    print("\n".join(lines))
    return 0


def _report(args: argparse.Namespace) -> int:
    from dgl_scalegnn.train.report import plot_runs, read_runs, run_table

    runs = read_runs(args.runs)
    for run in runs:
        if run.torn_line is not None:
            print(
                f"scalegnn: {run.source}, line {run.torn_line}: torn (the run stopped while "
                "writing it); reporting the events before it",
                file=sys.stderr,
            )
    table = run_table(runs)
    written = plot_runs(runs, args.out)  # refuses an --out that would lose a file first
    print("\n".join(table))
    print(f"wrote {written}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from dgl_scalegnn.train.export import export_checkpoint

    record = export_checkpoint(args.checkpoint, args.out)
    source, transform = record["source"], record["input"]
    kind = "labels" if transform["multilabel"] else "classes"
    scaling = "featureless recipe" if transform["featureless"] else transform["feature_norm"]
    print(
        f"exported {source['checkpoint']} (global step {source['global_step']}, grid "
        f"{source['grid']}): {record['in_features']} features -> {record['num_classes']} "
        f"{kind}, input scaling {scaling} -> {args.out}"
    )
    return 0


def _predict(args: argparse.Namespace) -> int:
    import torch

    from dgl_scalegnn.train.export import load_model, read_graph
    from dgl_scalegnn.train.outputs import TORCH_FILE, check_output, write_output

    inputs = [("--model file", args.model), ("--graph file", args.graph)]
    check_output(args.out, "--out", TORCH_FILE, inputs)
    model = load_model(args.model)
    graph = read_graph(args.graph)
    logits = model(graph)
    accuracy = model.accuracy(graph, logits)
    result = {"logits": logits, "predicted": model.classes(logits), "accuracy": accuracy}
    write_output(args.out, "--out", lambda file: torch.save(result, file))
    scores = "".join(f" | {split} {value:.4f}" for split, value in accuracy.items())
    print(f"{graph.num_nodes()} vertices{scores} -> {args.out}")
    return 0


def _on_every_rank(work: Callable[[Coordinator], T], timeout_s: float) -> T:
    """``work(coordinator)`` on this process, or on every rank of an ``mpirun``/``srun``/
    ``torchrun`` launch with a watchdog: a rank that fails stops all, which say its
    message unless it is bad input or Ctrl-C (then the failing rank alone reports it),
    and exit with its kind's code (:data:`~dgl_scalegnn.distributed.watchdog.EXIT_CODES`)."""
    from dgl_scalegnn.data.streaming import SingleProcess, StoreCoordinator
    from dgl_scalegnn.distributed.launch import detect_launch
    from dgl_scalegnn.distributed.rendezvous import init_distributed
    from dgl_scalegnn.distributed.watchdog import Watchdog

    info = detect_launch()
    if info.world_size == 1:
        return work(SingleProcess())
    import torch.distributed as dist

    job = init_distributed(info, "gloo", timeout_s)
    watchdog = Watchdog(job, info.rank, info.world_size).start()
    try:
        result = work(StoreCoordinator(job.store, info.rank, info.world_size))
    except BaseException as error:
        # ends this process if another rank's failure caused this one
        watchdog.report_failure(error, bad_input=isinstance(error, InputError))
        raise
    dist.barrier()  # the store's host (rank 0) outlives every reader
    watchdog.close()
    dist.destroy_process_group()
    return result


def _parser() -> argparse.ArgumentParser:
    import dgl_scalegnn
    from dgl_scalegnn.data.streaming import DEFAULT_MEMORY_GB
    from dgl_scalegnn.train.plan import MAX_PLAN_RANKS

    parser = argparse.ArgumentParser(
        prog="scalegnn",
        description=__doc__.splitlines()[0].removeprefix("scalegnn: "),
        epilog="run `scalegnn COMMAND --help` for a command's options and an example",
    )
    parser.add_argument(
        "--version", action="version", version=f"scalegnn {dgl_scalegnn.__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser(
        "train",
        help="train a GCN with uniform vertex sampling",
        description="Train on this process, or on every process of an mpirun, srun or torchrun\n"
        "launch (the grid's product is the process count). Rank 0 prints a start-up block,\n"
        "a line per evaluation and a summary; --metrics keeps every event as JSON lines.",
        epilog="examples:\n  scalegnn train --config yaml/cora.yaml --metrics runs/cora.jsonl\n"
        "  scalegnn train --data graph.bin\n"
        "  mpirun -np 8 scalegnn train --config yaml/synthetic.yaml --grid 1x2x2x2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--config", help="YAML config file (defaults for anything it omits)")
    train.add_argument(
        "--data",
        metavar="GRAPH.bin",
        help="a graph written by dgl.save_graphs (sets data.name=dgl and data.path); with "
        "no --config it trains with the settings derived from the graph",
    )
    train.add_argument("--grid", help="4D grid GdxGxxGyxGz, e.g. 1x2x2x2 (sets parallel.grid)")
    train.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override, e.g. model.hidden=64"
    )
    train.add_argument(
        "--metrics",
        metavar="FILE",
        help="write every event as a JSON line to FILE (refused if it exists, unless --resume)",
    )
    train.add_argument(
        "--json", action="store_true", help="print the events as JSON lines instead of lines"
    )
    train.add_argument(
        "--resume", action="store_true", help="continue from output.dir's latest checkpoint"
    )
    train.set_defaults(handler=_train)

    prepare = commands.add_parser(
        "prepare",
        help="write or verify a prepared dataset directory",
        description="Turn a dataset into one directory that every grid shape trains from: the\n"
        "GCN-normalised graph, features, labels and masks as memory-mapped files with\n"
        "checksums, within a memory budget (split over the ranks under mpirun -np P).",
        epilog="examples:\n"
        "  scalegnn prepare --config yaml/ogbn-products.yaml --out /scratch/products\n"
        "  scalegnn prepare --verify /scratch/products",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument("--config", help="YAML config whose data section names the dataset")
    prepare.add_argument("--dataset", help="dataset name (instead of --config)")
    prepare.add_argument("--root", help="raw data root (default $SCALEGNN_DATA_ROOT)")
    prepare.add_argument("--out", help="directory to write")
    prepare.add_argument("--verify", metavar="DIR", help="check a prepared directory and exit")
    prepare.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    prepare.add_argument(
        "--memory-gb",
        type=float,
        default=DEFAULT_MEMORY_GB,
        help=f"working memory per process in GiB (default {DEFAULT_MEMORY_GB:g}); the "
        "peak adds ~50 bytes per vertex and what the dataset loader holds",
    )
    prepare.set_defaults(handler=_prepare)

    plan = commands.add_parser(
        "plan",
        help="rank the grid shapes of N GPUs for a config by the cost model",
        description="Rank every grid shape GdxGxxGyxGz of --gpus ranks for the config by the cost\n"
        "model's updates a second at the config's batch (sampling.batch_size, the global\n"
        "batch: Gd groups draw a share each), then evaluation time and memory a rank;\n"
        "mark the ones that do not fit a rank's memory, and say why the first wins.\n"
        "--gpu cpu plans this host's ranks with its calibration for --gpus ranks where\n"
        "one was saved (--calibrate measures one, under a minute).",
        epilog="example:\n  scalegnn plan --config yaml/ogbn-products.yaml --gpus 8 --gpu a100\n"
        "  scalegnn plan --config yaml/synthetic-1m.yaml --gpus 8 --calibrate   # this host",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("--config", help="YAML config file (defaults for anything it omits)")
    plan.add_argument(
        "--gpus",
        type=int,
        required=True,
        metavar="N",
        help=f"number of ranks, 1 to {MAX_PLAN_RANKS:,}",
    )
    plan.add_argument(
        "--gpu",
        choices=("a100", "h100", "cpu"),
        help="the machines' rates: a100 (4 a node), h100 (8 a node), cpu (this host's "
        "calibration, else nodes like this one, a rank a core); default a100, cpu "
        "with --calibrate",
    )
    plan.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this host for --gpus ranks first (GEMM, SpMM, sampler, collectives; "
        "under a minute) and keep it in the cache for later plans",
    )
    plan.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    plan.add_argument("--top", type=int, default=10, help="grids to list, at least 1 (default 10)")
    plan.set_defaults(handler=_plan)

    report = commands.add_parser(
        "report",
        help="a table and a PNG of loss and accuracy of runs, from their metrics files",
        description="Print a table with a column per run (steps, epochs, best validation, test at\n"
        "best validation, time to target, median s/step, evaluation seconds, peak\n"
        "memory per rank) and draw one PNG of loss and accuracy against steps and\n"
        "training seconds, the runs overlaid and labelled by file name, to compare\n"
        "configs or grids.",
        epilog="example:\n  scalegnn train --config yaml/cora.yaml --metrics runs/a.jsonl\n"
        "  scalegnn train --config yaml/cora.yaml --grid 1x1x1x2 --metrics runs/b.jsonl\n"
        "  scalegnn report runs/a.jsonl runs/b.jsonl --out runs/cora.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="metrics files of runs")
    report.add_argument("--out", default="report.png", help="the PNG (default report.png)")
    report.set_defaults(handler=_report)

    export = commands.add_parser(
        "export",
        help="gather a sharded checkpoint into one model file for one process",
        description="Gather the shards of a checkpoint (written on any grid) into one file that\n"
        "loads on one process with no grid: the model section, the dataset's shapes,\n"
        "the whole parameters and the input scaling of training (torch.load(path,\n"
        "weights_only=True) reads it). It reads the training graph the checkpoint names\n"
        "for its label kind (and, for data.feature_norm standardize, its columns'\n"
        "statistics). In Python: dgl_scalegnn.train.export.load_model(path)(graph).",
        epilog="example:\n  scalegnn export --checkpoint runs/cora/checkpoints --out cora.pt\n"
        "  scalegnn predict --model cora.pt --graph cora.bin",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="a step_* checkpoint directory, the checkpoints directory (the newest that "
        "verifies) or the run's output.dir",
    )
    export.add_argument("--out", default="model.pt", help="the model file (default model.pt)")
    export.set_defaults(handler=_export)

    predict = commands.add_parser(
        "predict",
        help="full-graph inference with an exported model on a dgl.save_graphs file",
        description="Run an exported model on the first graph of a dgl.save_graphs file, with the\n"
        "input scaling and GCN normalisation of training; write the logits and\n"
        "predicted classes in the graph's vertex order, and print the accuracy of each\n"
        "split whose mask the graph has.",
        epilog="example:\n  scalegnn predict --model cora.pt --graph cora.bin --out cora-pred.pt\n"
        "  python -c \"import torch; print(torch.load('cora-pred.pt')['predicted'][:10])\"",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    predict.add_argument("--model", required=True, help="a file written by scalegnn export")
    predict.add_argument(
        "--graph", required=True, metavar="GRAPH.bin", help="a file written by dgl.save_graphs"
    )
    predict.add_argument(
        "--out",
        default="predictions.pt",
        help="where to write {logits, predicted, accuracy} (default predictions.pt)",
    )
    predict.set_defaults(handler=_predict)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Large CPU tensors on transparent huge pages (read by torch at its first large
    # allocation): each fresh (B, hidden) buffer otherwise page-faults 4 KiB at a time,
    # which measured 1.5x of the whole step at B = 100k. Set THP_MEM_ALLOC_ENABLE=0 to opt out.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = _parser().parse_args(argv)
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a reader that left (`| head`) shows here, not at the exit
        return code
    except BrokenPipeError:
        # The reader of stdout left (`scalegnn plan | head -1`) with what it wanted: end
        # quietly, as a tool that SIGPIPE ends, with stdout on /dev/null so that the
        # interpreter's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT_CODE
    except BaseException as error:
        from dgl_scalegnn.distributed.watchdog import (
            EXIT_CODES,
            failure_kind,
            say_failure,
            stopped_the_job,
        )

        kind = failure_kind(error)
        if kind == "error":
            raise  # a bug: its trace
        # Bad input, Ctrl-C or a lack of memory or disk: one rank says it, in one line. In
        # a running job the rank whose failure stopped it has said it already
        # (Watchdog.report_failure; the others exit with the same code), else rank 0 does
        # (every rank met the same).
        if _launch_rank() == 0 and not stopped_the_job(error):
            say_failure(error, 0)
        return EXIT_CODES[kind]


if __name__ == "__main__":
    sys.exit(main())
