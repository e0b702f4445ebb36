"""Rank worker: train through the CLI and die (``os._exit``) inside a checkpoint's
publication, right after the ``occurrence``-th rename (``os.replace``) or removal
(``shutil.rmtree``) whose path matches ``pattern``.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.checkpoint_window:main`` with
the CLI arguments, the pattern (searched in the rename's target or the removed path)
and the occurrence. Exits with :data:`KILLED` there; with the CLI's code if never there.
"""

from __future__ import annotations

import os
import re
import shutil

from dgl_scalegnn.cli import main as cli_main

#: The exit code of a rank that died in the window.
KILLED = 86


def main(argv: list[str], pattern: str, occurrence: int) -> int:
    real_replace, real_rmtree = os.replace, shutil.rmtree
    seen = 0

    def then_die(path: object) -> None:
        nonlocal seen
        if re.search(pattern, os.fspath(path)):
            seen += 1
            if seen == occurrence:
                os._exit(KILLED)

    def replace(source, target, *args, **kwargs):
        real_replace(source, target, *args, **kwargs)
        then_die(target)

    def rmtree(path, *args, **kwargs):
        real_rmtree(path, *args, **kwargs)
        then_die(path)

    os.replace, shutil.rmtree = replace, rmtree
    return cli_main(argv)
