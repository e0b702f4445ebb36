"""The one place the package imports DGL, on first use.

DGL 2.1.0's wheel ships its ``graphbolt`` and ``dgl.sparse`` native libraries only for
torch <= 2.2.1, and ``import dgl`` imports ``dgl.graphbolt`` eagerly, which raises
``FileNotFoundError`` on newer torch. dgl_scalegnn needs neither: the core, ``dgl.ops``
kernels, samplers, dataset classes and ``dgl.distributed`` work on torch 2.13. When the
graphbolt library for the running torch is missing, an empty ``dgl.graphbolt`` module is
registered before the import so that the rest of DGL loads. Every other module does
``from dgl_scalegnn._dgl import dgl``.

``dgl`` here stands for the module and imports it at its first attribute access: a rank
that trains from a prepared graph never touches DGL, and importing it costs about 1.5 s
of CPU and 95 MB per process. Importing changes no other global state: DGL's libxsmm
SpMM path is switched off by :func:`disable_libxsmm`, where DGL's kernels are about to
run on new graphs.

>>> from dgl_scalegnn._dgl import dgl
>>> dgl.__version__
'2.1.0'
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from functools import cache
from typing import Any

import torch

__all__ = ["dgl", "graphbolt_stubbed", "disable_libxsmm"]


def _graphbolt_library_present() -> bool:
    spec = importlib.util.find_spec("dgl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "dgl is not installed; run `make install` (dgl==2.1.0 is pinned in requirements.txt)"
        )
    package_dir = next(iter(spec.submodule_search_locations))
    torch_version = torch.__version__.split("+")[0]
    library = os.path.join(package_dir, "graphbolt", f"libgraphbolt_pytorch_{torch_version}.so")
    return os.path.exists(library)


@cache
def _import_dgl() -> tuple[types.ModuleType, bool]:
    stub = "dgl" not in sys.modules and not _graphbolt_library_present()
    if stub:
        placeholder = types.ModuleType("dgl.graphbolt")
        placeholder.__doc__ = "Placeholder: graphbolt has no native library for this torch."
        sys.modules["dgl.graphbolt"] = placeholder
    import dgl as module

    return module, stub


def graphbolt_stubbed() -> bool:
    """Whether DGL was imported with the placeholder ``dgl.graphbolt`` (imports DGL)."""
    return _import_dgl()[1]


class _DeferredDGL(types.ModuleType):
    """The ``dgl`` module, imported when one of its attributes is first read."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_import_dgl()[0], name)


dgl = _DeferredDGL("dgl", "DGL, imported on first use (dgl_scalegnn._dgl)")


def disable_libxsmm() -> None:
    """Route DGL's CPU SpMM to its own kernel instead of libxsmm (a process-wide switch).

    libxsmm JIT-compiles code for every new graph; mini-batch blocks and sampled
    subgraphs are new every step, which made ``copy_u_sum`` 5-25x slower here.
    """
    dgl.use_libxsmm(False)
