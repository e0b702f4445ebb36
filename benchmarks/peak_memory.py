"""Run a module as ``python -m`` would, then write its process's peak resident memory.

``python -m benchmarks.peak_memory OUT.json MODULE [ARG ...]`` runs ``MODULE`` with
``ARG ...`` as its command line and, however it ends, writes ``{"peak_rss_mb": ...,
"exit": ...}`` to ``OUT.json``: Linux's ``VmHWM``, the high-water mark of this process
alone (a parent's ``ru_maxrss`` of its child would carry the parent's own peak through
``fork``). This wrapper imports nothing heavy, so the figure is the module's.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def vm_hwm_mb(pid: int | str = "self") -> float:
    """The peak resident set (``VmHWM``) of process ``pid`` (this one by default), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise OSError(f"no VmHWM in /proc/{pid}/status")


def main(argv: list[str]) -> int:
    out, module, *args = argv
    sys.argv = [module, *args]
    code: int | str | None = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    finally:
        Path(out).write_text(json.dumps({"peak_rss_mb": vm_hwm_mb(), "exit": code}))
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
