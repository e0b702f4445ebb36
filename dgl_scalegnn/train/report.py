"""``scalegnn report``: what runs did, as a table and one picture, from their metrics.

A metrics file (:mod:`~dgl_scalegnn.train.metrics`) holds one run, or several where
runs appended to it: each ``config`` event starts one. Every run is labelled by its
file's stem (with its number in the file, when the file holds several, and its grid,
when two runs would share a label). A torn last line (a run that stopped while writing
it) is left out, and the run records its line number (:attr:`Run.torn_line`).

The table has a column per run and a row per figure: the grid and its ranks, steps,
epochs, the best validation accuracy (and its step), the test accuracy at it, the time
to the target (or why there is none), the median seconds of a step, the evaluations'
seconds, the training seconds and the peak resident memory of each rank. Figures come
from the run's ``summary`` event, and from its ``step`` and ``eval`` events where a run
stopped before writing one.

The picture (a PNG, drawn without a display) has loss and accuracy against steps and
against training seconds (evaluation excluded, as the runs count it), every run in its
own colour: validation accuracy solid, test accuracy dashed; the loss of long runs
drawn faintly step by step with a running mean over it.

Example
-------
>>> import json, pathlib, tempfile
>>> events = [{"event": "config", "grid": "1x1x1x1", "world_size": 1, "config": {}},
...           {"event": "step", "epoch": 0, "step": 0, "loss": 1.5, "step_s": 0.25},
...           {"event": "eval", "epoch": 1, "step": 1, "train_acc": 0.5, "val_acc": 0.4,
...            "test_acc": 0.3, "eval_s": 0.1, "elapsed_train_s": 0.25}]
>>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny.jsonl"
>>> _ = path.write_text("".join(json.dumps(e) + "\\n" for e in events))
>>> print("\\n".join(run_table(read_runs([path]))))
run               tiny
grid              1x1x1x1 (1 rank)
steps             1 (stopped before its summary)
epochs            1
best validation   0.4000 (step 1)
test at best val  0.3000
time to target    no target (train.target_acc unset)
s/step (median)   0.2500
evaluation        0.10 s in 1
training time     0.25 s
peak memory/rank  n/a
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dgl_scalegnn.errors import InputError
from dgl_scalegnn.train.metrics import whole_lines
from dgl_scalegnn.train.outputs import PNG_IMAGE, check_output, write_output

__all__ = ["Run", "read_runs", "run_figures", "run_table", "plot_runs", "MetricsFileError"]


class MetricsFileError(InputError, ValueError):
    """A metrics file that is missing, empty or not JSON lines."""


@dataclass
class Run:
    """The events of one run, by kind, and its label; ``torn_line``, on the last run of
    a file whose last line is torn, is that line's number (1-based)."""

    label: str
    source: Path
    config: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    torn_line: int | None = None

    @property
    def grid(self) -> str:
        return str(self.config.get("grid", "?"))


def _events(path: Path) -> tuple[list[dict[str, Any]], int | None]:
    """The events of ``path``, each line checked to be a JSON object, and the number of
    its torn last line (``None`` if it has none)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MetricsFileError(
            f"{path}: no such metrics file; give a file written by scalegnn train --metrics"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise MetricsFileError(f"{path}: cannot be read ({error})") from None
    lines, torn = whole_lines(text)
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or "event" not in event:
            raise MetricsFileError(
                f"{path}, line {number}: not a metrics event (a JSON object with an 'event' "
                "key); give a file written by scalegnn train --metrics"
            )
        events.append(event)
    if not any(e["event"] in ("step", "eval") for e in events):
        raise MetricsFileError(
            f"{path}: holds no step or eval event; a run writes them as it trains "
            "(scalegnn train --metrics FILE)"
        )
    return events, None if torn is None else len(lines) + 1


def _split(path: Path, events: list[dict[str, Any]], torn_line: int | None) -> list[Run]:
    """The runs of one file: each ``config`` event starts one."""
    runs: list[Run] = []
    for event in events:
        kind = event["event"]
        if kind == "config" or not runs:
            runs.append(Run(path.stem, path))
        run = runs[-1]
        if kind == "config":
            run.config = event
        elif kind == "step":
            run.steps.append(event)
        elif kind == "eval":
            run.evals.append(event)
        elif kind == "summary":
            run.summary = event
    runs = [run for run in runs if run.steps or run.evals]
    runs[-1].torn_line = torn_line
    if len(runs) > 1:
        for number, run in enumerate(runs, 1):
            run.label = f"{path.stem} #{number}"
    return runs


def read_runs(paths: list[str | os.PathLike[str]]) -> list[Run]:
    """Every run of the metrics files ``paths``, labelled.

    Raises
    ------
    MetricsFileError
        A file that is missing, not JSON lines of events (but for a torn last line), or
        holds no step or eval event.
    """
    runs = [run for path in paths for run in _split(Path(path), *_events(Path(path)))]
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
            run.label = f"{run.label} ({run.grid})"
    return runs


def _number(value: Any) -> float:
    """A metric as a float (the metrics write NaN and infinities as strings)."""
    return float(value) if value is not None else math.nan


def _accuracy(value: Any) -> str:
    return "n/a" if value is None else f"{_number(value):.4f}"


def _target(run: Run, reached: Any) -> str:
    """The time to target, or why there is none."""
    train = run.config.get("config", {}).get("train", {})
    target, metric = train.get("target_acc"), train.get("target_metric", "val_acc")
    if reached is not None:
        return f"{_number(reached):.2f} s ({metric} >= {target})"
    if target is None:
        return "no target (train.target_acc unset)"
    return f"not reached ({metric} >= {target})"


def _peak_memory(megabytes: list[float] | None) -> str:
    if not megabytes:
        return "n/a"
    if len(megabytes) <= 4:
        return ", ".join(f"{value:.0f}" for value in megabytes) + " MB"
    top = max(range(len(megabytes)), key=megabytes.__getitem__)
    return f"max {megabytes[top]:.0f} MB (rank {top}), median {statistics.median(megabytes):.0f}"


def _ranks(count: int | None) -> str:
    return "? ranks" if count is None else f"{count} rank{'' if count == 1 else 's'}"


def run_figures(run: Run) -> dict[str, str]:
    """The table's column of ``run``: figure name -> text."""
    summary = run.summary or {}
    best = max(
        (e for e in run.evals if e.get("val_acc") is not None),
        key=lambda e: _number(e["val_acc"]),
        default=None,
    )
    step_seconds = [_number(e["step_s"]) for e in run.steps if "step_s" in e]
    eval_seconds = [_number(e["eval_s"]) for e in run.evals if "eval_s" in e]
    last_eval = run.evals[-1] if run.evals else {}
    at_best = None if best is None else best.get("test_acc")
    steps = summary.get("steps", run.steps[-1]["step"] + 1 if run.steps else 0)
    train_s = summary.get("train_s", sum(step_seconds))
    figures = {
        "grid": f"{run.grid} ({_ranks(run.config.get('world_size'))})",
        "steps": str(steps),
        "epochs": str(summary.get("epochs", last_eval.get("epoch", "n/a"))),
        "best validation": "n/a"
        if best is None
        else f"{_accuracy(summary.get('best_val_acc', best['val_acc']))} (step {best['step']})",
        "test at best val": _accuracy(summary["test_at_best_val"] if summary else at_best),
        "time to target": _target(run, summary.get("time_to_target_s")),
        "s/step (median)": f"{statistics.median(step_seconds):.4f}" if step_seconds else "n/a",
        "evaluation": f"{sum(eval_seconds):.2f} s in {len(eval_seconds)}",
        "training time": f"{_number(train_s):.2f} s",
        "peak memory/rank": _peak_memory(summary.get("max_rss_mb")),
    }
    if not run.summary:
        figures["steps"] += " (stopped before its summary)"
    elif "preempted" in run.summary:
        figures["steps"] += " (preempted by a signal)"
    return figures


def run_table(runs: list[Run]) -> list[str]:
    """A column per run, a row per figure of :func:`run_figures`."""
    columns = [run_figures(run) for run in runs]
    names = ["run", *columns[0]]
    cells = [[run.label, *column.values()] for run, column in zip(runs, columns)]
    name_width = max(len(name) for name in names) + 2
    widths = [max(len(cell) for cell in column) + 2 for column in cells]
    return [
        (name.ljust(name_width) + "".join(c[i].ljust(w) for c, w in zip(cells, widths))).rstrip()
        for i, name in enumerate(names)
    ]


def _training_seconds(run: Run) -> np.ndarray:
    """Training seconds at the end of each step: the steps' own seconds summed, from
    where the run's evaluations say it started (a resumed run does not start at 0)."""
    elapsed = np.cumsum([_number(e.get("step_s", 0.0)) for e in run.steps])
    start = 0.0
    if run.evals and run.steps:
        first = run.evals[0]
        done = sum(1 for e in run.steps if e["step"] < first["step"])
        start = _number(first["elapsed_train_s"]) - (elapsed[done - 1] if done else 0.0)
    return start + elapsed


def _running_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    ends = np.arange(1, len(values) + 1)
    return (sums[ends] - sums[ends - counts]) / counts


def plot_runs(runs: list[Run], out: str | os.PathLike[str]) -> Path:
    """Draw loss and accuracy of ``runs`` against steps and training seconds into the
    PNG ``out`` (written whole or not at all); returns its path.

    Raises
    ------
    OutputError
        ``out`` is one of the runs' metrics files, a directory, in a checkpoint
        directory or an existing file that is not a PNG
        (:func:`~dgl_scalegnn.train.outputs.check_output`).
    ResourceError
        ``out`` cannot be written.
    """
    from matplotlib.figure import Figure  # no pyplot: no display, no global state

    check_output(out, "--out", PNG_IMAGE, [("metrics file", run.source) for run in runs])

    figure = Figure(figsize=(12, 8), dpi=100)
    axes = figure.subplots(2, 2)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for run, colour in zip(runs, colours):
        steps = np.array([e["step"] + 1 for e in run.steps])  # trained, as evals count
        loss = np.array([_number(e["loss"]) for e in run.steps])
        seconds = _training_seconds(run)
        window = max(1, len(loss) // 50)
        for axis, x in ((axes[0, 0], steps), (axes[0, 1], seconds)):
            if window > 1:
                axis.plot(x, loss, color=colour, alpha=0.25, linewidth=0.6)
            axis.plot(x, _running_mean(loss, window), color=colour, label=run.label)
        eval_steps = [e["step"] for e in run.evals]
        eval_seconds = [_number(e["elapsed_train_s"]) for e in run.evals]
        for key, style in (("val_acc", "-"), ("test_acc", "--")):
            values = [_number(e.get(key)) for e in run.evals]
            for axis, x in ((axes[1, 0], eval_steps), (axes[1, 1], eval_seconds)):
                axis.plot(x, values, style, color=colour, marker=".", label=run.label)
    for axis in axes[:, 0]:
        axis.set_xlabel("steps trained")
    for axis in axes[:, 1]:
        axis.set_xlabel("training seconds (evaluation excluded)")
    for axis in axes[0]:
        axis.set_ylabel("training loss")
        axis.set_yscale("log" if _positive(runs) else "linear")
    for axis in axes[1]:
        axis.set_ylabel("accuracy: validation (solid), test (dashed)")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", ncols=min(len(runs), 4), frameon=False)
    figure.tight_layout(rect=(0, 0, 1, 0.95))
    write_output(out, "--out", lambda file: figure.savefig(file, format="png"))
    return Path(out)


def _positive(runs: list[Run]) -> bool:
    """Whether every finite loss is positive (a log axis shows late progress best)."""
    losses = [_number(e["loss"]) for run in runs for e in run.steps]
    finite = [value for value in losses if math.isfinite(value)]
    return bool(finite) and min(finite) > 0
