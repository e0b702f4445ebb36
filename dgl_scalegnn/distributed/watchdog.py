"""Stop the whole job quickly, saying why, when one rank dies or fails.

Collectives block while any member is missing, so one lost rank can stall the others
until the collective timeout (minutes). A watchdog thread on every rank shares the
rendezvous key-value store (a ``TCPStore``):

- each rank bumps a heartbeat counter every ``interval`` seconds;
- each rank watches the next rank's counter (a ring, so the store sees O(world) traffic);
  a counter that stops for ``timeout`` seconds means that rank is gone;
- a rank that fails, or sees a rank gone, writes one abort record naming the rank and
  the reason; every watchdog polls that record and ends its process with it;
- a rank that finishes normally marks itself done, so it is not taken for dead;
- losing the store itself means the rank that hosts it (rank 0) is gone.

Aborting uses ``os._exit``: the main thread may be blocked inside a collective.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

__all__ = ["Watchdog", "ABORT_EXIT_CODE", "is_communication_error"]

ABORT_EXIT_CODE = 17
_ABORT, _DONE = "watchdog/abort", "watchdog/done/{}"


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
    store : torch.distributed.Store
        The rendezvous store all ranks share.
    rank, world_size : int
        This rank and the job size.
    interval, timeout : float
        Heartbeat period, and silence after which a rank is declared gone.
    hosts_store : bool
        This rank's process holds the store: it lingers after an abort record so that
        the other watchdogs can read it before the store goes away.
    exit : callable
        Ends the process (``os._exit`` unless a test passes something else).
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        *,
        interval: float = 1.0,
        timeout: float = 15.0,
        hosts_store: bool = False,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.hosts_store = hosts_store
        self.interval, self.timeout = interval, timeout
        self._exit = exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._beats = 0

    def start(self) -> Watchdog:
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        self._beats += 1
        self.store.set(f"watchdog/beat/{self.rank}", str(self._beats))

    def _watched(self) -> int:
        return (self.rank + 1) % self.world_size

    def _run(self) -> None:
        watched = self._watched()
        last_value, last_change = None, time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                if self.store.check([_ABORT]):
                    self._abort(self.store.get(_ABORT).decode())
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
                last_value, last_change = value, now
            elif now - last_change > self.timeout:
                self.fail(
                    f"rank {watched} stopped responding (no heartbeat for "
                    f"{now - last_change:.0f} s): it died or its machine is unreachable"
                )
                return

    def _record(self, message: str) -> str:
        """Write the abort record unless one exists; return the one that stands."""
        try:
            return self.store.compare_set(_ABORT, "", message).decode()
        except Exception:  # nothing more can be done without the store
            return message

    def fail(self, reason: str) -> None:
        """Record why the job must stop (first record wins) and end this process."""
        self._abort(self._record(f"rank {self.rank}: {reason}"))

    def _linger(self) -> None:
        if self.hosts_store:
            time.sleep(3 * self.interval)

    def _abort(self, message: str) -> None:
        print(f"[rank {self.rank}] stopping the job: {message}", file=sys.stderr, flush=True)
        self._linger()
        self._exit(ABORT_EXIT_CODE)

    def await_verdict(self) -> None:
        """After a broken collective: give the watchdogs time to find the rank that left.

        Ends the process with the abort record if one appears within twice the heartbeat
        timeout (the watching rank's own thread may lag on a loaded machine); returns if
        none does (then this rank's own error is the news).
        """
        deadline = time.monotonic() + 2 * self.timeout + 3 * self.interval
        while time.monotonic() < deadline:
            try:
                if self.store.check([_ABORT]):
                    self._abort(self.store.get(_ABORT).decode())
                    return
            except Exception as error:
                self._abort(f"lost the rendezvous store hosted by rank 0 ({error}); rank 0 is gone")
                return
            time.sleep(self.interval / 2)

    def report_failure(self, reason: str) -> str:
        """Called by a rank whose own work failed: record it so the others stop too.

        Returns the record that stands: this failure, or an earlier one that caused it
        (a collective that broke because another rank had already gone).
        """
        self._stop.set()
        record = self._record(f"rank {self.rank} failed: {reason}")
        self._linger()
        return record

    def close(self) -> None:
        """Normal end: mark this rank done and stop the thread."""
        self._stop.set()
        with contextlib.suppress(Exception):  # shutting down anyway
            self.store.set(_DONE.format(self.rank), "1")
        self._thread.join(timeout=2 * self.interval)
