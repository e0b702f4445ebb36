"""JSON-lines metrics: one object per line, written by rank 0.

Events: ``config`` (once), ``step``, ``eval``, ``summary``; see DESIGN §6; and
``note``, a sentence also printed for the person running the job. Each line is
flushed as it is written so a crashed run keeps everything up to the crash.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import IO, Any

__all__ = ["MetricsWriter", "read_metrics"]


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as strings so every line stays valid."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    """Append events to a JSON-lines file (and keep them in memory).

    Parameters
    ----------
    path : str or None
        File to append to; ``None`` keeps events in memory only.
    enabled : bool
        ``False`` on every rank but 0.
    echo : IO or None
        Also print ``eval`` and ``summary`` events here as JSON lines.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, enabled: bool = True, echo: IO[str] | None = None
    ) -> None:
        self.enabled = enabled
        self.events: list[dict[str, Any]] = []
        self._echo = echo
        self._file: IO[str] | None = None
        if enabled and path is not None:
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
        if self._echo is not None and event in ("eval", "summary"):
            print(line, file=self._echo, flush=True)

    def note(self, message: str) -> None:
        """Tell the person running the job something (rank 0 only): one line on stderr,
        ``scalegnn: message``, and a ``note`` event."""
        if not self.enabled:
            return
        print(f"scalegnn: {message}", file=sys.stderr, flush=True)
        self.write("note", message=message)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: str | os.PathLike[str], event: str | None = None) -> list[dict[str, Any]]:
    """Parse a JSON-lines metrics file, optionally keeping one event kind."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in records if event is None or r.get("event") == event]
