"""The benchmarks of dgl_scalegnn (README.md, docs/results.md#benchmarks).

Importing this package sets ``OMP_WAIT_POLICY=passive`` unless it is set. Torch and
DGL share one OpenMP runtime (torch's ``libgomp``); with its default active waiting,
the idle thread spins between parallel regions, and on the 2-core benchmark machine,
shared with other jobs, two threads ran the baselines' steps about ten times slower than
one thread (GraphSAGE epoch on the default synthetic graph: 2.6 s, against 0.23 s with
passive waiting and 0.21 s with one thread). libgomp reads the variable when it is
loaded, so it must be set before torch is imported: import a module of this package
first, or set it in the environment (the Makefile targets and the child processes of
:mod:`benchmarks.harness` do).
"""

from __future__ import annotations

import os
import sys
import warnings

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "passive"
    if "torch" in sys.modules:
        warnings.warn(
            "benchmarks imported after torch: OMP_WAIT_POLICY=passive does not apply to "
            "this process; set it in the environment for representative timings",
            RuntimeWarning,
            stacklevel=2,
        )
