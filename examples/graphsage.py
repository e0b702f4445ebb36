"""GraphSAGE on a dgl.save_graphs file, with your own loop, on any grid.

    python examples/graphsage.py --graph graph.bin --out runs/sage        # one process
    launch/mpirun.sh 8 1x2x2x2 examples/graphsage.py --graph graph.bin --out runs/sage
    launch/torchrun.sh 8 1x2x2x2 examples/graphsage.py --graph graph.bin --out runs/sage

AdamW with a linear warm-up and a cosine decay (torch's LambdaLR), a class-weighted
loss, early stopping on validation, a checkpoint every --checkpoint-every steps and on
SIGTERM; --resume continues from the newest checkpoint, on any grid (--stop-at ends a job
at a step, with a checkpoint, for the next job to resume).
"""

import argparse
import math
import sys
from pathlib import Path

import torch

import dgl_scalegnn as sg

parser = argparse.ArgumentParser()
parser.add_argument("--graph", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--grid", default="1x1x1x1")
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=1024)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--patience", type=int, default=5, help="evaluations without progress")
parser.add_argument("--eval-every", type=int, default=10)
parser.add_argument("--checkpoint-every", type=int, default=20)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--stop-at", type=int, help="checkpoint and stop after it")
parser.add_argument("--plain", action="store_true", help="Adam, constant rate, no weights")
args = parser.parse_args()

with sg.init(grid=args.grid) as job:
    graph = sg.load_graph(args.graph, job)
    model = sg.build_model(
        graph,
        job,
        layers=["sage", "sage"],
        hidden=64,
        dropout=0.5,
        bias=True,
        norm=False,
        residual=False,
        input_projection=False,
        head=False,
    )
    batches = sg.minibatches(graph, model, job, args.batch_size)
    labels = torch.from_numpy(graph.labels[graph.train_mask]).long()
    counts = torch.bincount(labels[labels >= 0], minlength=graph.meta.num_classes)
    weights = None if args.plain else counts.sum() / counts.clamp(min=1) / len(counts)
    loss_of = sg.objective(graph, job, class_weights=weights)
    optimizer = (torch.optim.Adam if args.plain else torch.optim.AdamW)(model.parameters(), args.lr)
    checkpoints = sg.Checkpoints(f"{args.out}/checkpoints", job, model, optimizer, graph=graph)
    progress = {"global_step": 0, "best_val": -1.0, "waited": 0}
    resumed = checkpoints.resume() if args.resume else None
    progress = resumed.progress if resumed is not None else progress
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", args.lr)

    def rate(step: int) -> float:  # warm-up, then cosine decay
        warm = min(1.0, (step + 1) / args.warmup)
        return 1.0 if args.plain else warm * 0.5 * (1 + math.cos(math.pi * step / args.steps))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate, progress["global_step"] - 1)
    metrics = sg.MetricsWriter(f"{args.out}/metrics.jsonl", enabled=job.is_root, append=True)
    metrics.write("config", run_dir=str(Path(args.out).resolve()), args=vars(args))
    preempted = False
    for step in range(progress["global_step"], args.steps):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        batch = batches[step]
        logits, spec = model(batch)
        loss = loss_of(logits, spec, batch)
        loss.backward()
        agreed = job.agree(model, loss)
        if not agreed.nonfinite:
            optimizer.step()
        schedule.step()
        metrics.write("step", step=step, loss=agreed.loss)
        progress["global_step"] = step + 1
        if (step + 1) % args.eval_every == 0:
            accuracy = sg.evaluate(model, batches, job)
            metrics.write("eval", step=step + 1, **accuracy)
            better = accuracy["val_acc"] > progress["best_val"]
            progress["best_val"] = max(progress["best_val"], accuracy["val_acc"])
            progress["waited"] = 0 if better else progress["waited"] + 1
        preempted = agreed.request == sg.Request.STOP  # SIGTERM: save, exit 75 to requeue
        stop_here = step + 1 == args.stop_at or preempted
        if (step + 1) % args.checkpoint_every == 0 or stop_here or agreed.request:
            checkpoints.save(progress)
        if stop_here or progress["waited"] >= args.patience:
            break
    metrics.close()
sys.exit(sg.PREEMPTED_EXIT_CODE if preempted else 0)
