"""Stop the whole job quickly, saying why, when one rank dies or fails.

Collectives block while any member is missing, so one lost rank can stall the others
until the collective timeout (minutes). A watchdog thread on every rank shares the
rendezvous key-value store (a ``TCPStore``):

- each rank bumps a heartbeat counter every ``interval`` seconds;
- each rank watches the next rank's counter (a ring, so the store sees O(world) traffic);
  a counter that stops for ``timeout`` seconds means that rank is gone;
- a rank that fails, or sees a rank gone, writes one abort record naming the rank, the
  kind of failure and the reason; every watchdog polls that record and ends its process
  with it, with the kind's exit code (:data:`EXIT_CODES`: every rank of a job stopped by
  bad input exits 2, as its failing rank does, so a launcher that reports the first rank
  to exit says 2), saying why unless the record is bad input or an interrupt (the
  failing rank reports those itself, once);
- the record is signed with a key derived from the job's secret: a record no rank of
  the job signed (written by a client outside it) is ignored;
- a rank that finishes normally marks itself done, so it is not taken for dead;
- a silent rank whose process runs on this rank's kernel, and is alive and not stopped,
  is stalled, not gone (each rank publishes where its process is, signed): a Python
  thread needs the GIL to beat, and on an oversubscribed host a rank holding it in a long
  call while loading went 15 s without a beat and a healthy job was stopped. A hang of
  such a rank is left to the collective timeout;
- losing the store itself means the rank that hosts it (rank 0) is gone.

Aborting uses ``os._exit``: the main thread may be blocked inside a collective.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from dgl_scalegnn.distributed.rendezvous import JobStore
from dgl_scalegnn.errors import (
    BAD_INPUT_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    RESOURCE_EXIT_CODE,
    InputError,
    ResourceError,
    say_input_error,
)

__all__ = [
    "Watchdog",
    "AbortRecord",
    "ABORT_EXIT_CODE",
    "EXIT_CODES",
    "failure_kind",
    "is_out_of_memory",
    "say_failure",
    "is_communication_error",
    "stopped_the_job",
    "signed",
    "kernel_identity",
    "location",
    "running_here",
]

#: Exit code of a rank stopped by another rank's failure (one that is not bad input,
#: an interrupt or a lack of resources) or by a lost rank.
ABORT_EXIT_CODE = 17
#: The exit code of every rank a job's abort record stops, by the record's kind. The
#: failing rank itself exits with the same code, except for ``error`` (a trace, 1).
EXIT_CODES = {
    "input": BAD_INPUT_EXIT_CODE,
    "interrupt": INTERRUPTED_EXIT_CODE,
    "resource": RESOURCE_EXIT_CODE,
    "error": ABORT_EXIT_CODE,
}
#: The kinds said by the failing rank alone, once: every rank it stops exits quietly.
_SAID_ONCE = ("input", "interrupt")
_ABORT, _DONE, _WHERE = "watchdog/abort", "watchdog/done/{}", "watchdog/where/{}"
_RECORD_TRIES = 3  # replacements of an unsigned abort record before giving up on the store
_STOPPED_THE_JOB = "_scalegnn_stopped_the_job"


@dataclass(frozen=True)
class AbortRecord:
    """Why the job stops: the rank that wrote it, its kind, and the message.

    ``kind`` (:func:`failure_kind`) is ``"input"`` for bad input (a configuration,
    dataset, grid or checkpoint error) and ``"interrupt"`` for Ctrl-C outside training:
    the failing rank reports it, the ranks it stops exit quietly. ``"resource"`` (a rank
    out of memory, a full disk) and any other failure (``"error"``) are said by every
    rank they stop. Each kind has its exit code (:data:`EXIT_CODES`).
    """

    rank: int
    kind: str
    message: str

    def encode(self, key: bytes) -> bytes:
        """``<HMAC-SHA256 of the payload, hex> <JSON payload>``: the key stays secret."""
        return signed(key, json.dumps([self.rank, self.kind, self.message]).encode())

    @classmethod
    def decode(cls, value: bytes, key: bytes) -> AbortRecord | None:
        """The record in ``value``, or ``None`` if ``key`` did not sign it."""
        payload = _verified(key, value)
        if payload is None:
            return None
        rank, kind, message = json.loads(payload)
        return cls(rank, kind, message)


def _signature(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode()


def signed(key: bytes, payload: bytes) -> bytes:
    """``<HMAC-SHA256 of payload with key, hex> <payload>``: what a rank of the job writes
    to the store where an outsider could write too."""
    return _signature(key, payload) + b" " + payload


def _verified(key: bytes, value: bytes) -> bytes | None:
    """The payload of ``value`` if ``key`` signed it, else ``None``."""
    signature, _, payload = value.partition(b" ")
    return payload if hmac.compare_digest(signature, _signature(key, payload)) else None


def kernel_identity() -> str:
    """This kernel's boot id and this process's PID namespace: processes that share both
    see each other's ``/proc/<pid>``."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"


#: psutil's states of a process that will not beat again unless someone resumes it.
_NOT_RUNNING = (
    psutil.STATUS_ZOMBIE,
    psutil.STATUS_DEAD,
    psutil.STATUS_STOPPED,
    psutil.STATUS_TRACING_STOP,
)


def location(pid: int | None = None) -> str:
    """Where process ``pid`` (this one by default) runs: this kernel, its pid and its
    start time, as :func:`running_here` reads them."""
    process = psutil.Process(pid)
    return json.dumps([kernel_identity(), process.pid, process.create_time()])


def running_here(where: str) -> bool:
    """Whether the process that ``where`` (a :func:`location`) names runs on this kernel
    and is alive and not stopped: a zombie, a dead process, a stopped or traced one, or a
    pid taken by a later process is not; a process on another kernel cannot be seen.

    >>> running_here(location()), running_here(location().replace(":", "x:", 1))
    (True, False)
    """
    kernel, pid, started = json.loads(where)
    try:
        if kernel != kernel_identity():
            return False
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() not in _NOT_RUNNING
    except (OSError, psutil.Error):  # no /proc here, or no such process
        return False


def stopped_the_job(error: BaseException) -> bool:
    """Whether ``error`` is the failure whose record stopped a multi-process job: the rank
    that raised it reports it (whichever rank it is; bad input it has said already, in
    :meth:`Watchdog.report_failure`); the ranks it stopped said nothing if it is bad
    input."""
    return getattr(error, _STOPPED_THE_JOB, False)


#: The messages of torch's CPU allocator when an allocation fails.
_CPU_ALLOCATOR_FAILURES = (
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: Python's or NumPy's
    ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA's), or the ``RuntimeError`` of
    torch's CPU allocator.

    >>> is_out_of_memory(MemoryError()), is_out_of_memory(RuntimeError("shape mismatch"))
    (True, False)
    """
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        failure in text for failure in _CPU_ALLOCATOR_FAILURES
    )


def failure_kind(error: BaseException) -> str:
    """The kind of an abort record for ``error`` (:class:`AbortRecord`): ``"input"``,
    ``"interrupt"`` (``KeyboardInterrupt``), ``"resource"`` (:class:`ResourceError` or
    :func:`is_out_of_memory`) or ``"error"``.

    >>> failure_kind(KeyboardInterrupt()), failure_kind(MemoryError()), failure_kind(OSError())
    ('interrupt', 'resource', 'error')
    """
    if isinstance(error, InputError):
        return "input"
    if isinstance(error, KeyboardInterrupt):
        return "interrupt"
    if isinstance(error, ResourceError) or is_out_of_memory(error):
        return "resource"
    return "error"


def say_failure(error: BaseException, rank: int) -> None:
    """Say on stderr, in one line, a failure that is not a bug (``failure_kind`` other
    than ``"error"``): bad input as :func:`~dgl_scalegnn.errors.say_input_error` says
    it; an interrupt; a lack of resources, for a rank out of memory with what to change.
    """
    kind = failure_kind(error)
    if kind == "interrupt":
        print(f"scalegnn: interrupted{f': {error}' if str(error) else ''}", file=sys.stderr)
    elif kind == "resource" and is_out_of_memory(error):
        first = next((line for line in str(error).splitlines() if line.strip()), "")
        what = f"{type(error).__name__}{f': {first.strip()}' if first else ''}"
        say_input_error(
            ResourceError(
                f"rank {rank} ran out of memory ({what}): give each rank more memory: fewer "
                "ranks a host, a smaller sampling.batch_size, or a grid whose ranks hold "
                "smaller shares (scalegnn plan ranks the grids by memory)"
            )
        )
    else:
        say_input_error(error)
    sys.stderr.flush()


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` is a collective that broke (a peer left or timed out)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("gloo", "NCCL", "Connection closed by peer", "Timed out")
    )


class Watchdog:
    """Heartbeats and abort records for one rank.

    Parameters
    ----------
    job : JobStore
        The store all ranks share (under the job's secret prefix), whether this rank's
        process hosts it (then it lingers after an abort record so that the other
        watchdogs can read it before the store goes away), and the key that signs
        abort records.
    rank, world_size : int
        This rank and the job size.
    interval, timeout : float
        Heartbeat period, and silence after which a rank is declared gone.
    exit : callable
        Ends the process (``os._exit`` unless a test passes something else).
    """

    def __init__(
        self,
        job: JobStore,
        rank: int,
        world_size: int,
        *,
        interval: float = 1.0,
        timeout: float = 15.0,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.store, self.rank, self.world_size = job.store, rank, world_size
        self.hosts_store, self._key = job.hosts_store, job.record_key
        self.interval, self.timeout = interval, timeout
        self._exit = exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._beats = 0
        self._stopping, self._said = threading.Lock(), False

    def start(self) -> Watchdog:
        with contextlib.suppress(OSError, psutil.Error):  # no /proc: silence means gone
            self.store.set(_WHERE.format(self.rank), signed(self._key, location().encode()))
        self._beat()
        self._thread.start()
        return self

    def _stalled_here(self, rank: int) -> bool:
        """Whether silent ``rank`` runs on this kernel, alive and not stopped (by its
        signed :func:`location` record); ``False`` where that cannot be known."""
        key = _WHERE.format(rank)
        if not self.store.check([key]):
            return False
        payload = _verified(self._key, self.store.get(key))
        return payload is not None and running_here(payload.decode())

    def _beat(self) -> None:
        self._beats += 1
        self.store.set(f"watchdog/beat/{self.rank}", str(self._beats))

    def _watched(self) -> int:
        return (self.rank + 1) % self.world_size

    def _run(self) -> None:
        watched = self._watched()
        last_value, last_change, said = None, time.monotonic(), False
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                record = self._standing()
                if record is not None:
                    if record.rank != self.rank:  # its own: the main thread reports it
                        self._follow(record)
                    return
                if self.store.check([_DONE.format(watched)]):
                    continue
                value = (
                    self.store.get(f"watchdog/beat/{watched}")
                    if self.store.check([f"watchdog/beat/{watched}"])
                    else None
                )
            except Exception as error:  # the store is unreachable: its host is gone
                if self._stop.is_set():
                    return
                self._abort(f"lost the rendezvous store hosted by rank 0 ({error}); rank 0 is gone")
                return
            now = time.monotonic()
            if value != last_value:
                last_value, last_change, said = value, now, False
            elif now - last_change > self.timeout and self._stalled_here(watched):
                if not said:
                    print(
                        f"[rank {self.rank}] rank {watched} has not beaten for "
                        f"{now - last_change:.0f} s, but its process runs on this host: "
                        "waiting for it (parallel.timeout_s bounds a hang)",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
            elif now - last_change > self.timeout:
                self.fail(
                    f"rank {watched} stopped responding (no heartbeat for "
                    f"{now - last_change:.0f} s): it died or its machine is unreachable"
                )
                return

    def _standing(self) -> AbortRecord | None:
        """The job's abort record, if one signed by a rank of the job exists."""
        if not self.store.check([_ABORT]):
            return None
        return AbortRecord.decode(self.store.get(_ABORT), self._key)

    def _record(self, record: AbortRecord) -> AbortRecord:
        """Write ``record`` unless a signed one exists; return the one that stands.

        An unsigned value (set from outside the job) is replaced, not obeyed."""
        mine, expected = record.encode(self._key), b""
        try:
            for _ in range(_RECORD_TRIES):
                value = self.store.compare_set(_ABORT, expected, mine)
                standing = AbortRecord.decode(value, self._key)
                if standing is not None:
                    return standing
                expected = value
        except Exception:  # nothing more can be done without the store
            pass
        return record

    def fail(self, reason: str) -> None:
        """Record why the job must stop (first record wins) and end this process."""
        self._follow(self._record(AbortRecord(self.rank, "error", f"rank {self.rank}: {reason}")))

    def _linger(self) -> None:
        if self.hosts_store:
            time.sleep(3 * self.interval)

    def _follow(self, record: AbortRecord) -> None:
        quiet = record.kind in _SAID_ONCE
        self._abort(record.message, quiet=quiet, code=EXIT_CODES[record.kind])

    def _abort(self, message: str, quiet: bool = False, code: int = ABORT_EXIT_CODE) -> None:
        # The watchdog's thread and the main thread (after a broken collective) may both
        # end this process: the first says why, once.
        with self._stopping:
            said, self._said = self._said, True
        if not (quiet or said):
            print(f"[rank {self.rank}] stopping the job: {message}", file=sys.stderr, flush=True)
        self._linger()
        self._exit(code)

    def await_verdict(self) -> None:
        """After a broken collective: give the watchdogs time to find the rank that left.

        Ends the process with the abort record if one appears within twice the heartbeat
        timeout (the watching rank's own thread may lag on a loaded machine); returns if
        none does (then this rank's own error is the news).
        """
        deadline = time.monotonic() + 2 * self.timeout + 3 * self.interval
        while time.monotonic() < deadline:
            try:
                record = self._standing()
                if record is not None:
                    self._follow(record)
                    return
            except Exception as error:
                self._abort(f"lost the rendezvous store hosted by rank 0 ({error}); rank 0 is gone")
                return
            time.sleep(self.interval / 2)

    def report_failure(self, error: BaseException, *, bad_input: bool = False) -> None:
        """Called by a rank whose own work failed: record it so the others stop too.

        If an earlier record stands (another rank failed or left first, and this one
        broke because of it), this process ends with that record. Otherwise ``error``
        is marked as the job's failure (:func:`stopped_the_job`) and returns to the
        caller to report. ``bad_input`` (or an interrupt) makes the ranks it stops exit
        without a word; a failure other than a bug (:func:`failure_kind`) this rank says
        at once (:func:`say_failure`), before it lingers: a launcher that sees a stopped
        rank exit may end this one meanwhile (``mpirun`` does), and its message would be
        lost.
        """
        self._stop.set()
        kind = "input" if bad_input else failure_kind(error)
        record = self._record(
            AbortRecord(
                self.rank, kind, f"rank {self.rank} failed: {type(error).__name__}: {error}"
            )
        )
        if record.rank == self.rank:
            setattr(error, _STOPPED_THE_JOB, True)
            if kind != "error":
                say_failure(error, self.rank)
            self._linger()
        else:
            self._follow(record)

    def close(self) -> None:
        """Normal end: mark this rank done and stop the thread."""
        self._stop.set()
        with contextlib.suppress(Exception):  # shutting down anyway
            self.store.set(_DONE.format(self.rank), "1")
        self._thread.join(timeout=2 * self.interval)
