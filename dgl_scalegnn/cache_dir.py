"""The user's cache directory, checked private before code is loaded from it: DGL
unpickles its processed files there, and the native kernels are shared libraries."""

from __future__ import annotations

import os
from pathlib import Path

from dgl_scalegnn.config import ConfigError

__all__ = ["default_cache_dir"]


def default_cache_dir(*parts: str) -> Path:
    """Where staged raw files, DGL's processed caches, prepared graphs and the native
    kernels' builds go (or the directory ``parts`` below it), private to this user.

    Each directory from the cache root down to ``parts`` is created with mode 0700
    whatever the umask, and one that exists must belong to this user and be writable by
    no one else.

    Returns
    -------
    Path
        ``$SCALEGNN_CACHE_DIR``, or ``dgl_scalegnn`` in the user's cache directory
        (``$XDG_CACHE_HOME``, by default ``~/.cache``), joined with ``parts``.

    Raises
    ------
    ConfigError
        If one of these directories cannot be created, is not a directory, is another
        user's, or is writable by its group or by others (refused, not repaired: someone
        else may already have put files in it).
    """
    configured = os.environ.get("SCALEGNN_CACHE_DIR")
    user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    directory = Path(configured) if configured else Path(user_cache) / "dgl_scalegnn"
    fix = "set SCALEGNN_CACHE_DIR to a directory of your own"
    for part in ("", *parts):
        directory = directory / part
        try:
            directory.mkdir(mode=0o700, parents=not part)
        except FileExistsError:
            pass
        except OSError as error:
            raise ConfigError(f"cache directory {str(directory)!r}: {error}; {fix}") from None
        else:
            os.chmod(directory, 0o700)  # mkdir's mode passes through the umask
        if not directory.is_dir():
            raise ConfigError(f"cache directory {str(directory)!r} is not a directory; {fix}")
        status = directory.stat()
        if status.st_uid != os.geteuid():
            raise ConfigError(
                f"cache directory {str(directory)!r} belongs to uid {status.st_uid}, not to "
                f"you (uid {os.geteuid()}), and code is loaded from it; {fix}"
            )
        if status.st_mode & 0o022:
            raise ConfigError(
                f"cache directory {str(directory)!r} is writable by its group or others (mode "
                f"{status.st_mode & 0o7777:04o}), and code is loaded from it: if no one else "
                f"could write in it, run `chmod -R go-w {directory}`; otherwise delete it or "
                f"{fix}"
            )
    return directory
