"""Rank worker: a user's script, as ``python SCRIPT ARGS`` runs it.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.run_script:main`` with the
script's path and its arguments: the rank runs the file as ``__main__`` with that
``sys.argv`` in the launcher's environment the ranks get (torchrun's), so a loop written
with ``import dgl_scalegnn`` starts a job as under ``launch/torchrun.sh``.
"""

from __future__ import annotations

import runpy
import sys


def main(path: str, argv: list[str]) -> None:
    sys.argv = [path, *argv]
    runpy.run_path(path, run_name="__main__")
