"""What a person reads while a job trains: rank 0's lines, made from the run's events.

The JSON-lines events of :mod:`~dgl_scalegnn.train.metrics` are the record of a run;
the console is a view of them, the same on a terminal, under ``mpirun``, ``srun`` or
``torchrun`` and in a log file:

- a start-up block: the launch, grid, backend and threads (as soon as the ranks are
  up, before the graph is loaded), the settings derived from the graph, the dataset,
  the batch size and steps, and where metrics and checkpoints go;
- one line per evaluation, in the style of DGL's examples, whose loss and seconds per
  step are the means of the steps since the line before, and whose last field is the
  training time so far (``Epoch 005 | Step 40 | Loss 0.5123 | Train 0.912 | Val 0.801 |
  Test 0.812 | 0.045 s/step | 12.3 s``);

- between evaluations, a loss line every ``output.log_every`` steps;
- a closing summary: best validation and the test accuracy there, the time to the
  target (or why there is none), peak memory per rank, and the files written (a
  metrics file deleted or moved during the run is said to be).

On a terminal ``train.progress`` adds a bar of the steps on stderr; lines are printed
above it, never into it.

>>> import io
>>> out = io.StringIO()
>>> console = Console(out, log_every=0)
>>> for step, loss in enumerate([0.9, 0.7]):
...     console.show({"event": "step", "epoch": 0, "step": step, "loss": loss, "step_s": 0.5})
>>> console.show({"event": "eval", "epoch": 1, "step": 2, "train_acc": 0.5, "val_acc": 0.4,
...               "test_acc": None, "eval_s": 0.1, "elapsed_train_s": 1.0})
>>> print(out.getvalue(), end="")
Epoch 001 | Step 2 | Loss 0.8000 | Train 0.500 | Val 0.400 | Test  n/a  | 0.500 s/step | 1.0 s
"""

from __future__ import annotations

import sys
from typing import IO, Any

__all__ = ["Console"]


def _count(value: int) -> str:
    return f"{value:,}"


def _accuracy(value: float | None) -> str:
    return " n/a " if value is None else f"{value:.3f}"


def _megabytes(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:,.0f} MB"
    return (
        f"{max(values):,.0f} MB at most, {min(values):,.0f} MB at least, over {len(values)} ranks"
    )


class Console:
    """Prints the lines of a run from its events (:meth:`show`); rank 0 only.

    Parameters
    ----------
    stream : IO
        Where the lines go (stdout).
    log_every : int
        A loss line every that many steps between evaluations (0: none).
    progress_bar : bool
        A bar of the steps on stderr, where stderr is a terminal.
    """

    def __init__(self, stream: IO[str], log_every: int = 50, progress_bar: bool = False) -> None:
        self.stream, self.log_every = stream, log_every
        self._want_bar = progress_bar and sys.stderr.isatty()
        self._bar: Any = None
        self._config: dict[str, Any] = {}
        self._start: dict[str, Any] = {}
        self._losses: list[float] = []
        self._step_seconds: list[float] = []
        self._pending: str | None = None  # a loss line, dropped if an evaluation follows
        self._eval_seconds = 0.0
        self._metrics_lost: bool | None = None  # deleted (True) or moved during the run

    # ------------------------------------------------------------------ output
    def _say(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._say(self._pending)
            self._pending = None

    def show(self, record: dict[str, Any]) -> None:
        """Print what ``record`` (one event) means for the person running the job."""
        handler = getattr(self, f"_on_{record['event']}", None)
        if handler is not None:
            handler(record)

    def metrics_lost(self, deleted: bool) -> None:
        """The metrics file was deleted (or, ``deleted`` false, moved) during the run:
        the summary does not name it as written."""
        self._metrics_lost = deleted

    def close(self) -> None:
        self._flush_pending()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # --------------------------------------------------------------- start-up
    def _on_config(self, record: dict[str, Any]) -> None:
        self._config = record
        ranks = record["world_size"]
        self._say(
            f"scalegnn {record['versions']['dgl_scalegnn']}: {ranks} "
            f"{'rank' if ranks == 1 else 'ranks'} ({record['launcher']}), grid "
            f"{record['grid']}, {record['backend']}, {record['threads']} threads a rank; "
            f"loading {record['config']['data']['name']!r}"
        )

    def _on_derived(self, record: dict[str, Any]) -> None:
        """One line per reason, naming the keys it set and their values."""
        by_reason: dict[str, list[str]] = {}
        for key, value in record["settings"].items():
            by_reason.setdefault(record["reasons"][key], []).append(f"{key}={value}")
        self._say("settings derived from the graph (the config does not set them):")
        for reason, keys in by_reason.items():
            self._say(f"  {', '.join(keys)} ({reason})")

    def _on_resume(self, record: dict[str, Any]) -> None:
        if record.get("checkpoint"):
            self._say(f"resumed from step {record['step']} of {record['checkpoint']}")

    def _on_start(self, record: dict[str, Any]) -> None:
        self._start = record
        splits = record["splits"]
        self._say(
            f"  dataset  {record['dataset']}: {_count(record['num_nodes'])} vertices, "
            f"{_count(record['nnz'])} adjacency entries, {_count(record['num_features'])} "
            f"features, {record['num_classes']} classes; train {_count(splits['train'])}, "
            f"val {_count(splits['val'])}, test {_count(splits['test'])}"
        )
        share = record["batch_size"] / record["num_nodes"]
        steps = f"{_count(record['total_steps'])} steps in all"
        if record.get("max_train_s") is not None:
            steps = f"at most {steps} or {record['max_train_s']:g} s of training"
        self._say(
            f"  batch    {_count(record['batch_size'])} vertices ({share:.0%} of the graph), "
            f"{record['steps_per_epoch']} steps an epoch, {steps}; evaluation "
            f"{record['evaluation']}"
        )
        checkpoints = record["checkpoints"] or "none (output.dir is not set)"
        self._say(
            f"  output   metrics {record['metrics'] or 'not written (--metrics FILE)'}; "
            f"checkpoints {checkpoints}"
        )
        if self._want_bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=record["total_steps"], initial=record["first_step"], unit="step", leave=False
            )

    # ------------------------------------------------------------------ steps
    def _on_step(self, record: dict[str, Any]) -> None:
        self._flush_pending()
        self._losses.append(record["loss"])
        self._step_seconds.append(record["step_s"])
        if self._bar is not None:
            self._bar.update(1)
        done = record["step"] + 1
        if self.log_every and done % self.log_every == 0:
            elapsed = sum(self._step_seconds)
            self._pending = (
                f"Epoch {record['epoch']:03d} | Step {done} | Loss {self._mean_loss()} | "
                f"{elapsed / len(self._step_seconds):.3f} s/step"
            )

    def _mean_loss(self) -> str:
        finite = [loss for loss in self._losses if isinstance(loss, float)]  # NaN: "nan"
        return f"{sum(finite) / len(finite):.4f}" if finite else "nan"

    def _on_eval(self, record: dict[str, Any]) -> None:
        self._pending = None  # the evaluation's line says it
        seconds = self._step_seconds
        per_step = f"{sum(seconds) / len(seconds):.3f} s/step" if seconds else "no step"
        loss = self._mean_loss() if self._losses else "  -   "
        self._say(
            f"Epoch {record['epoch']:03d} | Step {record['step']} | Loss {loss} | "
            f"Train {_accuracy(record['train_acc'])} | Val {_accuracy(record['val_acc'])} | "
            f"Test {_accuracy(record['test_acc'])} | {per_step} | "
            f"{record['elapsed_train_s']:.1f} s"
        )
        self._losses, self._step_seconds = [], []
        self._eval_seconds += record["eval_s"]

    # ---------------------------------------------------------------- closing
    def _on_summary(self, record: dict[str, Any]) -> None:
        self.close()
        stopped = " (stopped by a signal)" if "preempted" in record else ""
        self._say(
            f"done{stopped}: {record['epochs']} epochs, {_count(record['steps'])} steps, "
            f"{record['train_s']:.1f} s of training ({self._eval_seconds:.1f} s of evaluation "
            "besides)"
        )
        if record["best_val_acc"] is not None:
            # the trainer's step: the best may be an evaluation before a resume
            step = record.get("best_val_step")
            where = "" if step is None else f" at step {step} (epoch {record['best_val_epoch']})"
            test = _accuracy(record["test_at_best_val"]).strip()
            self._say(
                f"  best     validation {record['best_val_acc']:.4f}{where}; test there {test}"
            )
        elif record["test_at_best_val"] is not None:
            test = _accuracy(record["test_at_best_val"]).strip()
            self._say(f"  test     {test} at the last evaluation (no validation vertices)")
        self._say(f"  target   {self._target(record)}")
        self._say(f"  memory   peak per rank {_megabytes(record['max_rss_mb'])}")
        files = [self._metrics_file()] if self._start.get("metrics") else []
        if record.get("checkpoint"):
            files.append(f"checkpoint {record['checkpoint']}")
        self._say(f"  files    {'; '.join(files) or 'none (no --metrics, no output.dir)'}")

    def _metrics_file(self) -> str:
        path = self._start["metrics"]
        if self._metrics_lost is None:
            return f"metrics {path}"
        if self._metrics_lost:
            return f"metrics lost ({path} was deleted during the run)"
        return f"metrics moved ({path} was moved during the run; its events went with it)"

    def _target(self, record: dict[str, Any]) -> str:
        train = self._config.get("config", {}).get("train", {})
        target, metric = train.get("target_acc"), train.get("target_metric", "val_acc")
        if target is None:
            return "none set (train.target_acc)"
        if record["time_to_target_s"] is not None:
            return f"{metric} >= {target} after {record['time_to_target_s']:.1f} s of training"
        return f"{metric} >= {target} not reached"
