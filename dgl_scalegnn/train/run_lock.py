"""One job per run directory.

Two jobs writing checkpoints into one ``output.dir`` interleave their steps, move
``latest`` under each other and leave a directory neither can resume. So before it
loads anything, a run with ``output.dir`` has rank 0 check that the path is a directory
(creating it if missing) that it can write, and take the directory's lock,
``output.dir/scalegnn.lock`` (a :class:`~dgl_scalegnn.data.locks.FileLock`: an
``flock`` on a file that records the host, the pid and since when). Rank 0 then
broadcasts what it found, so that a refusal is every rank's, said once, and every rank
exits 2; a second job is refused naming the holder.

A lock left by a job that died without letting go (``SIGKILL``, a lost node: the
``flock`` is gone with the process, its record stays) is taken over, and the run says
whose it was. The lock is let go when the run ends, however it ends (done, preempted,
failed, interrupted), so the same directory resumes with ``--resume`` once the job that
wrote it is over.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

from dgl_scalegnn.data.locks import FileLock, LockHeld
from dgl_scalegnn.data.prepared import NOT_WRITABLE_ERRNOS
from dgl_scalegnn.errors import InputError, ResourceError

__all__ = ["LOCK_NAME", "RunDirectoryError", "claim_run_directory"]

#: The lock file in ``output.dir``.
LOCK_NAME = "scalegnn.lock"


class RunDirectoryError(InputError):
    """An ``output.dir`` that is not a directory, or that another job is using."""


def claim_run_directory(directory: str | os.PathLike[str] | None, rank: int) -> FileLock | None:
    """Take the lock of run directory ``directory`` on rank 0 (collective: every rank of
    the job calls this); returns the held lock on rank 0, ``None`` on the others and
    without a directory. A lock taken over from a job that died says whose it was in
    :attr:`~dgl_scalegnn.data.locks.FileLock.left_by`.

    Raises
    ------
    RunDirectoryError
        On every rank, if ``directory`` is not a directory (a file, or a path through
        one) or another job holds its lock.
    ResourceError
        On every rank, if ``directory`` cannot be created or written.
    """
    if directory is None:
        return None
    lock, refusal = None, None
    if rank == 0:
        try:
            lock = _claim(Path(directory))
        except (RunDirectoryError, ResourceError) as error:
            refusal = error
    if dist.is_initialized() and dist.get_world_size() > 1:
        verdict = [refusal]
        dist.broadcast_object_list(verdict, src=0)
        refusal = verdict[0]
    if refusal is not None:
        raise refusal
    return lock


def _claim(directory: Path) -> FileLock:
    """Rank 0: check ``directory`` (created if missing) and take its lock."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = FileLock(directory / LOCK_NAME)
        return lock.acquire(wait=False)
    except LockHeld as held:
        who = held.holder.describe() if held.holder is not None else "a job starting now"
        raise RunDirectoryError(
            f"output.dir: {directory} is in use by another job ({who}; lock {held.path}): "
            "wait for it to end, or give this run another output.dir"
        ) from None
    except (FileExistsError, NotADirectoryError):
        raise RunDirectoryError(
            f"output.dir: {directory} is a file, or a path through one, not a directory; "
            "give a directory for the run's checkpoints (created if missing)"
        ) from None
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        if error.errno in NOT_WRITABLE_ERRNOS:
            raise ResourceError(
                f"output.dir: cannot write {directory} ({reason}); give a directory this "
                "user can write, on a file system with room for the checkpoints"
            ) from None
        raise RunDirectoryError(f"output.dir: cannot use {directory} ({reason})") from None
