"""Rank worker: what a rank holds before it does anything.

Run by :func:`tests.ranks.spawn_ranks` as ``tests.workers.rank_start:main``; writes
``start{rank}.json`` to ``out``: which of the modules the test ranks preload are
already imported, and the cache directory the rank's environment names.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: Imported by the ranks' forkserver before any rank starts (``tests/ranks.py``).
PRELOADED = ("torch._dynamo", "dgl")


def main(out: str) -> None:
    record = {
        "preloaded": [name for name in PRELOADED if name in sys.modules],
        "cache_dir": os.environ.get("SCALEGNN_CACHE_DIR"),
    }
    rank = os.environ["RANK"]
    (Path(out) / f"start{rank}.json").write_text(json.dumps(record))
