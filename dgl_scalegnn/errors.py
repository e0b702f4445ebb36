"""The errors a user can act on, their exit codes, and how ``scalegnn`` says one: in one
line, on the rank that found it; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import re
import sys

__all__ = [
    "InputError",
    "ResourceError",
    "BAD_INPUT_EXIT_CODE",
    "RESOURCE_EXIT_CODE",
    "INTERRUPTED_EXIT_CODE",
    "say_input_error",
]


class InputError(Exception):
    """Bad input (a config, a grid, a dataset, a checkpoint) rather than a failure of the
    program: :data:`BAD_INPUT_EXIT_CODE`."""


class ResourceError(Exception):
    """The machine lacks what the run needs (disk space, memory, a writable path) rather
    than the input being wrong: :data:`RESOURCE_EXIT_CODE` (``EX_IOERR`` of sysexits.h)."""


#: Exit code of bad input (:class:`InputError`): the same on every rank and launcher.
BAD_INPUT_EXIT_CODE = 2
#: Exit code of a run the machine could not carry (:class:`ResourceError`): a full disk,
#: a path that cannot be written, a rank out of memory. Fix the machine, then resume.
RESOURCE_EXIT_CODE = 74
#: Exit code of a command interrupted by Ctrl-C (``SIGINT``) outside training, the
#: shell's 128 + 2: nothing is wrong with the input or the machine.
INTERRUPTED_EXIT_CODE = 130

#: Lines of a stack trace that an error message may embed (DGL's C++ errors end in
#: "Stack trace:" and "[bt] (0) ..." lines), and blank lines: not said on the terminal.
_TRACE_LINE = re.compile(
    r"\s*(?:$|Stack trace:|\[bt\] \(\d+\)|Traceback \(most recent call last\):"
    r"|File \".*\", line \d+)"
)


def say_input_error(error: BaseException) -> None:
    """Say ``error`` on stderr in one line, ``scalegnn: error: `` and the first line of its
    message that says something (the rest is a trace or a continuation; the error's type
    name if none does).

    >>> import contextlib, io
    >>> error = InputError("data.path: no such file\\nTraceback (most recent call last):")
    >>> with contextlib.redirect_stderr(io.StringIO()) as said:
    ...     say_input_error(error)
    >>> said.getvalue()
    'scalegnn: error: data.path: no such file\\n'
    """
    lines = [line.strip() for line in str(error).splitlines() if not _TRACE_LINE.match(line)]
    print(f"scalegnn: error: {lines[0] if lines else type(error).__name__}", file=sys.stderr)
    sys.stderr.flush()
