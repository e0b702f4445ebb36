"""JSON-lines metrics: one object per line, written by rank 0.

Events: ``config`` (once, as the ranks start), ``derived`` (settings derived from the
graph), ``resume``, ``start`` (the graph, batch and steps, where output goes), ``step``,
``eval``, ``summary``; see DESIGN §6; ``note``, a sentence also printed on stderr for
the person running the job; ``nonfinite``. Each line is flushed as it is written so a
crashed run keeps everything up to the crash. The console
(:mod:`~dgl_scalegnn.train.console`) shows them as lines a person reads.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import IO, Any

from dgl_scalegnn.config import InputError
from dgl_scalegnn.train.console import Console

__all__ = ["MetricsWriter", "MetricsFileError", "read_metrics"]


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as strings so every line stays valid."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsFileError(InputError):
    """A metrics file that exists already (a run would be mixed into another's events)."""


class MetricsWriter:
    """Write events to a JSON-lines file (and keep them in memory), and show them.

    Parameters
    ----------
    path : str or None
        File to write; ``None`` keeps events in memory only.
    enabled : bool
        ``False`` on every rank but 0.
    append : bool
        Add to ``path`` if it exists (a resumed run); otherwise an existing file is
        refused, so that reruns never mix their events silently.
    console : Console or None
        Prints each event for the person running the job
        (:class:`~dgl_scalegnn.train.console.Console`).
    json_stream : IO or None
        Also print every event here as a JSON line (``scalegnn train --json``).

    Raises
    ------
    MetricsFileError
        ``path`` exists and ``append`` is false.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        enabled: bool = True,
        *,
        append: bool = False,
        console: Console | None = None,
        json_stream: IO[str] | None = None,
    ) -> None:
        self.enabled, self.path = enabled, path
        self.events: list[dict[str, Any]] = []
        self._console, self._json = console, json_stream
        self._file: IO[str] | None = None
        if enabled and path is not None:
            if Path(path).exists() and not append:
                raise MetricsFileError(
                    f"--metrics {path}: the file exists; give a new path, remove it, or pass "
                    "--resume to continue the run that wrote it"
                )
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = _clean({"event": event, **fields})
        self.events.append(record)
        line = json.dumps(record, sort_keys=False)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        if self._json is not None:
            print(line, file=self._json, flush=True)
        if self._console is not None:
            self._console.show(record)

    def note(self, message: str) -> None:
        """Tell the person running the job something (rank 0 only): one line on stderr,
        ``scalegnn: message``, and a ``note`` event."""
        if not self.enabled:
            return
        print(f"scalegnn: {message}", file=sys.stderr, flush=True)
        self.write("note", message=message)

    def close(self) -> None:
        if self._console is not None:
            self._console.close()
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: str | os.PathLike[str], event: str | None = None) -> list[dict[str, Any]]:
    """Parse a JSON-lines metrics file, optionally keeping one event kind."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in records if event is None or r.get("event") == event]
