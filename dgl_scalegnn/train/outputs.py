"""Where a command writes: never over its inputs, into a checkpoint, or over a foreign file.

``scalegnn predict``, ``report`` and ``export`` each write one file. Before they do,
:func:`check_output` refuses (an :class:`OutputError`, exit code 2) an output path that

- is a directory;
- is one of the command's inputs, or inside one that is a directory, by identity (the
  same file through a symlink or a hard link is the same input);
- lies inside a checkpoint directory (a ``step_*`` directory, or the directory whose
  ``latest`` names one), which training writes, replaces and prunes;
- lies under a file (a path component that is not a directory);
- is an existing, non-empty file of another kind than the command writes (a text file,
  a graph, a metrics file): the command did not write it.

:func:`write_output` then writes the file whole or not at all: into a temporary file
beside it, synced and renamed over the path, creating missing parent directories. A
path that cannot be written (no such directory can be made, no permission, a full
disk) is a :class:`~dgl_scalegnn.errors.ResourceError` (exit code 74), and an older
file at the path is left as it was.

Example
-------
>>> import pathlib, tempfile
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> graph = root / "graph.bin"
>>> _ = graph.write_bytes(b"DGL")
>>> try:
...     check_output(graph, "--out", TORCH_FILE, [("--graph file", graph)])
... except OutputError as error:
...     print(str(error).replace(str(root), "ROOT").split(";")[0])
--out ROOT/graph.bin: is the --graph file this command reads
>>> write_output(root / "new" / "x.pt", "--out", lambda file: file.write(b"PK"))
>>> sorted(p.name for p in (root / "new").iterdir())
['x.pt']
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dgl_scalegnn.errors import InputError, ResourceError

__all__ = [
    "OutputError",
    "FileKind",
    "TORCH_FILE",
    "PNG_IMAGE",
    "check_output",
    "write_output",
    "cannot_write",
]

#: A checkpoint directory's name (``step_00000120``, ``.1``, ``.partial``, ``.nonfinite``).
_STEP_DIRECTORY = re.compile(r"step_\d{8}")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class OutputError(InputError, ValueError):
    """An output path that would overwrite an input, a checkpoint, a directory or a file
    the command did not write."""


@dataclass(frozen=True)
class FileKind:
    """What a command writes: its name in messages, the command, and a test of a file."""

    name: str
    writer: str
    matches: Callable[[Path], bool]


def _is_torch_file(path: Path) -> bool:
    """A ``torch.save`` file: a zip archive holding a pickle ``.../data.pkl``."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _is_png(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(_PNG_MAGIC)) == _PNG_MAGIC


TORCH_FILE = FileKind("a torch.save file", "predict and export write one", _is_torch_file)
PNG_IMAGE = FileKind("a PNG image", "report writes one", _is_png)


def _same_or_inside(out: Path, given: str | os.PathLike[str]) -> bool:
    """Whether the resolved path ``out`` is the input ``given``, or inside it."""
    given = Path(given)
    with contextlib.suppress(OSError):
        if os.path.samefile(out, given):  # a hard link too
            return True
    resolved = given.resolve()
    return resolved == out or (given.is_dir() and resolved in out.parents)


def _checkpoint_directory(out: Path) -> Path | None:
    """The checkpoint directory holding the resolved path ``out``, if any: a ``step_*``
    directory, or a checkpoints directory whose ``latest`` names one that exists."""
    for directory in out.parents:
        if _STEP_DIRECTORY.match(directory.name) and directory.is_dir():
            return directory
        latest = directory / "latest"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            name = latest.read_text(encoding="utf-8").strip() if latest.is_file() else ""
            if _STEP_DIRECTORY.match(name) and (directory / name).is_dir():
                return directory
    return None


def check_output(
    path: str | os.PathLike[str],
    option: str,
    kind: FileKind | None,
    inputs: Iterable[tuple[str, str | os.PathLike[str] | None]] = (),
) -> None:
    """Refuse ``path`` as the output given by ``option`` where writing it would lose
    something (see the module's docstring); ``kind`` is what the command writes
    (``None``: any existing file is the caller's to judge), ``inputs`` its inputs as
    ``(description, path)`` pairs (``None`` paths are skipped).

    Raises
    ------
    OutputError
        ``path`` is a directory, an input or inside one, inside a checkpoint directory,
        under a file, or an existing file of another kind than ``kind``.
    """
    given = Path(path)
    if given.is_dir():
        raise OutputError(
            f"{option} {path}: is a directory; give the path of a file (in it, if you like)"
        )
    out = given.resolve()
    for description, source in inputs:
        if source is None or not _same_or_inside(out, source):
            continue
        if Path(source).is_dir():
            raise OutputError(
                f"{option} {path}: is inside the {description} {source} this command reads; "
                "give a path outside it"
            )
        raise OutputError(
            f"{option} {path}: is the {description} this command reads; writing there "
            "would destroy it; give another path"
        )
    checkpoint = _checkpoint_directory(out)
    if checkpoint is not None:
        raise OutputError(
            f"{option} {path}: is inside the checkpoint directory {checkpoint}, which "
            "training writes and prunes; give a path outside it"
        )
    above = next(parent for parent in out.parents if parent.exists())
    if not above.is_dir():
        raise OutputError(f"{option} {path}: {above} is a file, not a directory; give another path")
    if kind is not None and out.is_file() and out.stat().st_size and not kind.matches(out):
        raise OutputError(
            f"{option} {path}: exists and is not {kind.name} ({kind.writer}); give a new "
            "path, or remove the file first"
        )


def cannot_write(option: str, path: str | os.PathLike[str], error: OSError) -> ResourceError:
    """The one line for an output ``path`` that ``error`` kept from being written."""
    reason = error.strerror or type(error).__name__
    return ResourceError(
        f"{option} {path}: cannot be written ({reason}); give a path in a writable "
        "directory with free space"
    )


def write_output(
    path: str | os.PathLike[str], option: str, write: Callable[[IO[bytes]], Any]
) -> None:
    """Write ``path`` whole or not at all: ``write(file)`` fills a temporary file beside
    it (its parent directories made if missing), which is synced and renamed over it.

    Raises
    ------
    ResourceError
        The file or its directory cannot be written (no permission, a full disk); any
        older file at ``path`` is unchanged and no temporary file is left.
    """
    target = Path(path).resolve()
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(descriptor, "wb") as file:
                write(file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
    except OSError as error:
        raise cannot_write(option, path, error) from None
