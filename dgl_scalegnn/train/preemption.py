"""Signals that ask a running job to checkpoint: preemption without lost work.

Cluster schedulers warn a job before they end it. Slurm sends ``SIGTERM`` to every task
at preemption, ``scancel`` and the time limit, then ``SIGKILL`` after ``KillWait``
(30 s by default); ``sbatch --signal=USR1@120`` adds a ``SIGUSR1`` 120 s before the
time limit. A handler installed here only records the request; the trainer acts on it
at the next step boundary, where every rank is between two steps:

===========  =======================================================================
signal       at the next step boundary
===========  =======================================================================
``SIGUSR1``  write a checkpoint and go on training
``SIGTERM``  write a checkpoint and stop: the process exits with
             :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``: resume with
             ``--resume``)
``SIGUSR2``  the same as ``SIGTERM``. Open MPI's ``mpirun`` kills its ranks 0.2 s after
             it forwards a ``SIGTERM`` it receives itself, but forwards ``SIGUSR2``
             untouched: ``launch/mpirun.sh`` turns its own ``SIGTERM`` into one.
``SIGINT``   (Ctrl-C) the same as ``SIGTERM``; a second one stops at once, without a
             checkpoint (``KeyboardInterrupt``). ``mpirun`` cannot forward it (it
             kills its ranks instead): ``launch/mpirun.sh`` hands the first to its
             ranks as ``SIGUSR2``.
===========  =======================================================================

A signal may reach one rank or all of them; the ranks agree on the strongest request
with one all-reduce per step (:meth:`Trainer.train_step
<dgl_scalegnn.train.trainer.Trainer.train_step>` adds it to the step's non-finite flag).
A signal that arrives during an evaluation or a checkpoint write is honoured once that
is done.

>>> requests = SignalRequests()
>>> requests.record(signal.SIGUSR1, None)
>>> requests.take(), requests.name(Request.CHECKPOINT)
(<Request.CHECKPOINT: 1>, 'SIGUSR1')
>>> requests.take()
<Request.NONE: 0>
"""

from __future__ import annotations

import enum
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "Request", "SignalRequests"]

#: Exit code of a job stopped by ``SIGTERM`` / ``SIGUSR2`` after its checkpoint
#: (``EX_TEMPFAIL`` of sysexits.h: a temporary failure, to be resumed).
PREEMPTED_EXIT_CODE = 75


class Request(enum.IntEnum):
    """What the job was asked to do; a larger value includes the smaller ones."""

    NONE = 0
    CHECKPOINT = 1
    STOP = 2


_REQUEST_OF_SIGNAL = {
    signal.SIGUSR1: Request.CHECKPOINT,
    signal.SIGTERM: Request.STOP,
    signal.SIGUSR2: Request.STOP,
    signal.SIGINT: Request.STOP,
}


class Preempted(Exception):
    """Training stopped at a step boundary because a signal asked it to.

    ``checkpoint`` is the checkpoint written there (``None`` without ``output.dir``).
    """

    def __init__(self, message: str, checkpoint: str | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class SignalRequests:
    """Requests received by signal and not yet taken.

    The handler only counts (a signal may interrupt the main thread between any two
    bytecodes); :meth:`take` compares the counts with those it last saw, so a signal
    that arrives while a request is being taken is kept for the next step.
    """

    def __init__(self) -> None:
        self._received = dict.fromkeys(Request, 0)
        self._taken = dict.fromkeys(Request, 0)
        self._names: dict[Request, str] = {}
        self._interrupts = 0

    def record(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler. A second ``SIGINT`` raises ``KeyboardInterrupt``: a person
        who presses Ctrl-C again wants the job to stop now, not at the step boundary."""
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                raise KeyboardInterrupt("a second Ctrl-C: stopped at once, without a checkpoint")
        request = _REQUEST_OF_SIGNAL[signal.Signals(signum)]
        self._names[request] = signal.Signals(signum).name
        self._received[request] += 1

    def take(self) -> Request:
        """The strongest request received since the last call (``NONE`` if none)."""
        strongest = Request.NONE
        for request in (Request.CHECKPOINT, Request.STOP):
            received = self._received[request]
            if received > self._taken[request]:
                strongest, self._taken[request] = request, received
        return strongest

    def name(self, request: Request) -> str:
        """The signal that last asked for ``request`` (``SIGTERM``...), or "a signal"."""
        return self._names.get(request, "a signal")

    @contextmanager
    def installed(self) -> Iterator[SignalRequests]:
        """Handle ``SIGTERM``, ``SIGUSR1``, ``SIGUSR2`` and ``SIGINT`` while the block runs;
        the previous handlers come back afterwards. Signals are delivered to the main thread
        only, so elsewhere (a test driving a trainer from a thread) nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {signum: signal.signal(signum, self.record) for signum in _REQUEST_OF_SIGNAL}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
