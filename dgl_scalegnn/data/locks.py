"""Exclusive locks on files that say who holds them.

A :class:`FileLock` is an ``flock`` on a file that records its holder (host, pid, the
process's start time and since when it holds the lock), so that a process kept out
can name it. The holder removes the file when it lets go: a file left with a record
and no ``flock`` on it is the trace of a holder that died (``SIGKILL``, a lost node),
and the next process takes the lock over, knowing whose it was (:attr:`FileLock.left_by`).

Removing the file on release leaves a window: a process that opened the file just
before it went may get the ``flock`` of a file no longer in place. Each taker
therefore checks that the file it locked is still the one at the path, and starts
again if not.

On a file system without ``flock`` (``ENOLCK``, ``EOPNOTSUPP``, ``ENOSYS``, as some
parallel file systems mounted without it answer) the record alone is the lock: held
while it names a process that is not known to have ended (on this host, no process
with its pid and start time); two processes that start at the same instant may then
both take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

__all__ = ["Holder", "LockHeld", "FileLock"]

#: How often a waiting process tries the lock again.
_POLL_S = 0.5
#: ``flock`` errors that mean the file system does not provide it.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


@dataclass(frozen=True)
class Holder:
    """The process that holds (or held) a lock: its host, pid and start time (psutil's,
    which tells a reused pid apart), and when it took the lock (seconds since the epoch)."""

    host: str
    pid: int
    started: float
    since: float

    @classmethod
    def this_process(cls) -> Holder:
        process = psutil.Process()
        return cls(socket.gethostname(), process.pid, process.create_time(), time.time())

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a lock file records; ``None`` for an empty or unreadable record."""
        try:
            record = json.loads(text)
            return cls(str(record["host"]), int(record["pid"]), record["started"], record["since"])
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        """``pid 4242 on host node07 since 2025-01-31 14:02:11``."""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on host {self.host} since {since}"

    def has_ended(self) -> bool:
        """Whether this holder is known to have ended: it ran on this host and no process
        with its pid and start time runs now (on another host it cannot be known)."""
        if self.host != socket.gethostname():
            return False
        try:
            return psutil.Process(self.pid).create_time() != self.started
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:  # it exists, but cannot be looked at (another user's)
            return False


class LockHeld(Exception):
    """The lock at ``path`` is held by ``holder`` (``None``: its record is not written
    yet, or unreadable)."""

    def __init__(self, path: Path, holder: Holder | None) -> None:
        who = holder.describe() if holder is not None else "a process that has not said which"
        super().__init__(f"{path} is held by {who}")
        self.path, self.holder = path, holder


class FileLock:
    """An exclusive lock on ``path`` (see the module docstring); as a context manager it
    waits for the lock.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "job.lock"
    >>> with FileLock(path) as lock:
    ...     holder = FileLock.holder_of(path)
    ...     holder.pid == os.getpid(), lock.left_by
    (True, None)
    >>> path.exists()
    False
    """

    def __init__(self, path: str | os.PathLike[str], mode: int = 0o644) -> None:
        self.path, self.mode = Path(path), mode
        #: The holder whose record was left in the file when this process took the lock
        #: (it ended without letting go), or ``None``.
        self.left_by: Holder | None = None
        self._fd: int | None = None

    @staticmethod
    def holder_of(path: str | os.PathLike[str]) -> Holder | None:
        """The holder that the lock file at ``path`` records, if any."""
        try:
            return Holder.parse(Path(path).read_text())
        except OSError:
            return None

    def acquire(
        self, *, wait: bool = True, on_wait: Callable[[Holder | None], None] | None = None
    ) -> FileLock:
        """Take the lock; while another process holds it, wait (calling ``on_wait`` with
        the holder once) or, with ``wait=False``, raise :class:`LockHeld`.

        Raises
        ------
        LockHeld
            If ``wait`` is false and another process holds the lock.
        OSError
            If the lock file cannot be created or written.
        """
        waited = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, self.mode)
            try:
                locked = _try_flock(fd)
                holder = Holder.parse(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
                if locked is None:  # no flock here: the record is the lock
                    locked = holder is None or holder.has_ended()
                if locked and _is_at(fd, self.path):
                    self.left_by = holder
                    record = json.dumps(asdict(Holder.this_process())).encode()
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, record, 0)
                    self._fd, fd = fd, -1
                    return self
            finally:
                if fd >= 0:
                    os.close(fd)  # lets go of an flock taken on a file no longer in place
            if not locked:
                if not wait:
                    raise LockHeld(self.path, holder)
                if on_wait is not None and not waited:
                    on_wait(holder)
                waited = True
                time.sleep(_POLL_S)

    def release(self) -> None:
        """Remove the lock file and let go (a no-op when not held)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # already removed: nothing left to tidy
            if _is_at(self._fd, self.path):
                self.path.unlink()
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _try_flock(fd: int) -> bool | None:
    """Take the ``flock`` of ``fd`` without waiting: True if taken, False if another
    holds it, ``None`` where the file system has no ``flock``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno in _NO_FLOCK:
            return None
        raise
    return True


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path``."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (opened.st_dev, opened.st_ino)
