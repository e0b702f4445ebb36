"""JSON-lines metrics: one object per line, written by rank 0.

Events: ``config`` (once, as the ranks start; its ``run_dir``, the resolved
``output.dir``, says whose run the file holds), ``derived`` (settings derived from the
graph), ``resume``, ``start`` (the graph, batch and steps, where output goes), ``step``,
``eval``, ``summary``; see DESIGN §6; ``note``, a sentence also printed on stderr for
the person running the job; ``nonfinite``.

Each line goes to the file in one write as it happens, so a crashed run keeps
everything up to the crash. A write that fails (a full disk) is taken back to the last
whole line and ends the run with a :class:`~dgl_scalegnn.errors.ResourceError`: the
file stays readable to its last whole event. A resumed run appends only to a file whose
first event is the ``config`` event of the same run directory (a torn last line there
is dropped). A file deleted or moved during the run is said once (``note``) and in the
console's summary. The console (:mod:`~dgl_scalegnn.train.console`) shows the events as
lines a person reads.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import IO, Any, NoReturn

from dgl_scalegnn.errors import InputError, ResourceError
from dgl_scalegnn.train.console import Console
from dgl_scalegnn.train.outputs import cannot_write, check_output

__all__ = ["MetricsWriter", "MetricsFileError", "read_metrics", "whole_lines", "run_directory"]

#: The most of a file read to find its first line (a config event is a few kB).
_FIRST_LINE_BYTES = 1 << 20
#: Bytes read at a time, backwards, to find a file's last whole line.
_TAIL_BLOCK = 1 << 16


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as strings so every line stays valid."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def run_directory(output_dir: str | os.PathLike[str] | None) -> str | None:
    """The run a metrics file belongs to: its ``output.dir``, resolved (one job at a time
    holds a run directory); ``None`` for a run that writes no checkpoints."""
    return None if output_dir is None else str(Path(output_dir).resolve())


def whole_lines(text: str) -> tuple[list[str], str | None]:
    """The lines of a metrics file's ``text``, and its torn last line (``None`` if there
    is none): a last line with no newline that is not a JSON object, as a run stopped
    while writing it leaves. A last line without its newline that parses is kept.

    >>> whole_lines('{"event": "step"}\\n{"event": "st')
    (['{"event": "step"}'], '{"event": "st')
    """
    lines = text.split("\n")
    last = lines.pop()
    if not last.strip():
        return lines, None
    try:
        whole = isinstance(json.loads(last), dict)
    except ValueError:
        whole = False
    return ([*lines, last], None) if whole else (lines, last)


class MetricsFileError(InputError):
    """A metrics file that exists already (a run would be mixed into another's events),
    or one that a resumed run does not own."""


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
        refused, so that reruns never mix their events silently. The first event
        written must then be the run's ``config`` event, and a non-empty file must begin
        with a ``config`` event of the same ``run_dir``; a torn last line there (a run
        that stopped while writing it) is dropped.
    console : Console or None
        Prints each event for the person running the job
        (:class:`~dgl_scalegnn.train.console.Console`).
    json_stream : IO or None
        Also print every event here as a JSON line (``scalegnn train --json``).

    Raises
    ------
    MetricsFileError
        ``path`` exists and ``append`` is false; on the first :meth:`write`, a file
        appended to that is not the metrics of this run.
    OutputError
        ``path`` is a directory or inside a checkpoint directory
        (:func:`~dgl_scalegnn.train.outputs.check_output`).
    ResourceError
        ``path`` cannot be opened for writing; on :meth:`write`, the file cannot be
        written (a full disk).
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
        self._fd: int | None = None
        self._size = 0  # bytes of whole lines in the file
        self._continued = False  # appending to a file that holds events already
        self._lost = False  # the file was deleted or replaced (said once)
        if enabled and path is not None:
            check_output(path, "--metrics", None)  # not a directory, not in a checkpoint
            if Path(path).exists() and not append:
                raise MetricsFileError(
                    f"--metrics {path}: the file exists; give a new path, remove it, or pass "
                    "--resume to continue the run that wrote it"
                )
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
            except OSError as error:
                raise cannot_write("--metrics", path, error) from None
            self._size = os.fstat(self._fd).st_size
            self._continued = self._size > 0

    def write(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = _clean({"event": event, **fields})
        dropped = self._continue(record) if self._continued else None
        if self._fd is not None and not self._lost:
            self._check_still_there()
        self.events.append(record)
        line = json.dumps(record, sort_keys=False)
        if self._fd is not None:
            self._append(line, event)
        if self._json is not None:
            print(line, file=self._json, flush=True)
        if self._console is not None:
            self._console.show(record)
        if dropped is not None:  # said after the config event, which starts the run
            self.note(dropped)

    def _continue(self, record: dict[str, Any]) -> str | None:
        """Before the first event appended to an existing file: check that the file is
        this run's (``record``, its ``config`` event, has the same ``run_dir`` as the
        file's first event) and drop a torn last line; returns what was dropped."""
        self._continued = False
        first = os.pread(self._fd, _FIRST_LINE_BYTES, 0).split(b"\n", 1)[0]
        try:
            theirs = json.loads(first.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError too
            theirs = None
        if not isinstance(theirs, dict) or theirs.get("event") != "config":
            self._refuse(
                "not a metrics file of scalegnn train (its first line is not a config event); "
                "--resume appends only to the metrics of the run it continues: give a new file"
            )
        if "run_dir" not in theirs:
            self._refuse(
                "its config event names no run directory (an older scalegnn wrote it), so "
                "it cannot be told to be this run's: give a new file"
            )
        ours = record.get("run_dir") if record["event"] == "config" else None
        if theirs["run_dir"] != ours:
            self._refuse(
                f"holds the metrics of the run in {theirs['run_dir'] or 'no output.dir'}, not "
                f"of this one ({ours or 'no output.dir'}); give a new file, or the one this "
                "run wrote"
            )
        whole = self._whole_size()
        if whole == self._size:
            return None
        os.ftruncate(self._fd, whole)
        dropped, self._size = self._size - whole, whole
        return (
            f"--metrics {self.path}: dropped its torn last line ({dropped} bytes, written as "
            "the run before stopped)"
        )

    def _refuse(self, reason: str) -> NoReturn:
        os.close(self._fd)
        self._fd = None
        raise MetricsFileError(f"--metrics {self.path}: {reason}")

    def _whole_size(self) -> int:
        """The bytes of the file up to the end of its last whole line."""
        end = self._size
        while end > 0:
            start = max(0, end - _TAIL_BLOCK)
            block = os.pread(self._fd, end - start, start)
            if b"\n" in block:
                return start + block.rindex(b"\n") + 1
            end = start
        return 0

    def _append(self, line: str, event: str) -> None:
        """``line`` and its newline at the end of the file, in one write (a short write
        is finished); a failure takes the file back to its last whole line and ends the
        run."""
        data = memoryview((line + "\n").encode("utf-8"))
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as error:
            with contextlib.suppress(OSError):  # back to the last whole line
                os.ftruncate(self._fd, self._size)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            raise ResourceError(
                f"--metrics {self.path}: cannot be written ({error.strerror}); the file keeps "
                f"every event before this {event} event; free space there, then continue with "
                "scalegnn train --resume"
            ) from None
        self._size += len(data)

    def _check_still_there(self) -> None:
        """Say once if the file was deleted or moved: the events written from then on
        are not at ``path``."""
        mine = os.fstat(self._fd)
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            there = None
        except OSError:  # no permission to look: it cannot be told
            return
        if there is not None and os.path.samestat(mine, there):
            return
        self._lost = True
        deleted = mine.st_nlink == 0
        if self._console is not None:
            self._console.metrics_lost(deleted)
        after = "are not kept" if deleted else "go on into the moved file"
        how = "deleted" if deleted else "moved"
        self.note(
            f"--metrics {self.path} was {how} during the run: the events from there on {after}"
        )

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
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_metrics(path: str | os.PathLike[str], event: str | None = None) -> list[dict[str, Any]]:
    """Parse a JSON-lines metrics file, optionally keeping one event kind; a torn last
    line (:func:`whole_lines`) is left out."""
    lines, _ = whole_lines(Path(path).read_text())
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if event is None or r.get("event") == event]
