"""The one place the package imports DGL, on first use, and what makes ``import dgl`` work.

DGL 2.1.0's wheel ships its ``graphbolt`` and ``dgl.sparse`` native libraries only for
torch <= 2.2.1, and ``import dgl`` imports ``dgl.graphbolt`` (through
``dgl.distributed``), which raises ``FileNotFoundError`` on newer torch. The rest of
DGL (graphs, ``dgl.ops``, ``dgl.nn``, samplers, dataset classes, ``save_graphs``,
``dgl.distributed``) works on torch 2.13. Where the graphbolt library for the running
torch is missing, :class:`GraphboltPlaceholderFinder` (on ``sys.meta_path``) gives DGL a
placeholder ``dgl.graphbolt`` to import, so that the rest of DGL loads; reading any of
its names says why it is empty. Where the library is there, the finder does nothing.
``dgl.sparse`` stays unavailable (its import raises DGL's own ``FileNotFoundError``).

Plain ``import dgl`` works because ``make install`` writes ``dgl_scalegnn_dgl.pth``
into the environment's site-packages (:func:`write_startup_hook`): at start-up it
imports this module (nothing else: about a millisecond) and installs the finder, which
acts only when ``dgl.graphbolt`` is imported.

Within the package every module does ``from dgl_scalegnn._dgl import dgl``. ``dgl`` here
stands for the module and imports it at its first attribute access: a rank that trains
from a prepared graph never touches DGL, and importing it costs about 1.5 s of CPU and
95 MB per process. Importing it installs the finder (where no start-up hook did) and
changes no other global state: DGL's libxsmm SpMM path is switched off by
:func:`disable_libxsmm`, where DGL's kernels are about to run on new graphs.

>>> from dgl_scalegnn._dgl import dgl
>>> dgl.__version__
'2.1.0'
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from functools import cache

__all__ = [
    "dgl",
    "graphbolt_stubbed",
    "disable_libxsmm",
    "GraphboltPlaceholderFinder",
    "install_import_hook",
    "write_startup_hook",
]

#: The file ``make install`` writes into site-packages; sorted after setuptools'
#: ``__editable__`` file, which makes the package importable first.
PTH_NAME = "dgl_scalegnn_dgl.pth"
#: Its one line (site runs lines that begin with ``import``): silent once the package is
#: uninstalled, since pip leaves a file it did not install.
_PTH_LINE = (
    'import contextlib; exec("with contextlib.suppress(ModuleNotFoundError): '
    'import dgl_scalegnn._dgl as hook; hook.install_import_hook()")\n'
)


def _missing_graphbolt_library(dgl_path: Sequence[str]) -> str | None:
    """The graphbolt library of the running torch that DGL (at ``dgl_path``) will look
    for, if it is missing; ``None`` when it is there."""
    import torch  # DGL has imported it by now

    torch_version = torch.__version__.split("+")[0]
    library = os.path.join(dgl_path[0], "graphbolt", f"libgraphbolt_pytorch_{torch_version}.so")
    return None if os.path.exists(library) else library


class _GraphboltPlaceholder(types.ModuleType):
    """``dgl.graphbolt`` where its native library is missing: no names but one class
    DistDGL's partition loader tests instances against (there are never any)."""

    def __init__(self, library: str) -> None:
        super().__init__("dgl.graphbolt", "Placeholder: graphbolt has no library for this torch.")
        self._library = library
        self.FusedCSCSamplingGraph = type("FusedCSCSamplingGraph", (), {})

    def __getattr__(self, name: str) -> object:
        raise AttributeError(
            f"dgl.graphbolt.{name} is unavailable: DGL has no graphbolt library for this "
            f"torch ({os.path.basename(self._library)} is missing), so dgl_scalegnn "
            "gave DGL an empty dgl.graphbolt to import; use dgl.dataloading instead, or a "
            "torch that DGL ships graphbolt for (<= 2.2.1)"
        )


class _PlaceholderLoader:
    """Creates the placeholder ``dgl.graphbolt`` (the import system binds it to ``dgl``)."""

    def __init__(self, library: str) -> None:
        self.library = library

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _GraphboltPlaceholder(self.library)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class GraphboltPlaceholderFinder:
    """A ``sys.meta_path`` entry that answers only for ``dgl.graphbolt``, and only when
    the graphbolt library for the running torch is missing: with the placeholder."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "dgl.graphbolt" or not path:
            return None
        library = _missing_graphbolt_library(path)
        if library is None:
            return None  # DGL's own graphbolt loads
        return importlib.machinery.ModuleSpec(name, _PlaceholderLoader(library))


def install_import_hook() -> None:
    """Put a :class:`GraphboltPlaceholderFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, GraphboltPlaceholderFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, GraphboltPlaceholderFinder())


def write_startup_hook(site_packages: str | None = None) -> str:
    """Write :data:`PTH_NAME` into ``site_packages`` (by default this interpreter's);
    returns its path."""
    if site_packages is None:
        import sysconfig

        site_packages = sysconfig.get_paths()["purelib"]
    path = os.path.join(site_packages, PTH_NAME)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_PTH_LINE)
    return path


@cache
def _import_dgl() -> types.ModuleType:
    install_import_hook()  # where no start-up hook has
    import dgl as module

    return module


def graphbolt_stubbed() -> bool:
    """Whether DGL was imported with the placeholder ``dgl.graphbolt`` (imports DGL)."""
    _import_dgl()
    return isinstance(sys.modules.get("dgl.graphbolt"), _GraphboltPlaceholder)


class _DeferredDGL(types.ModuleType):
    """The ``dgl`` module, imported when one of its attributes is first read."""

    def __getattr__(self, name: str) -> object:
        return getattr(_import_dgl(), name)


dgl = _DeferredDGL("dgl", "DGL, imported on first use (dgl_scalegnn._dgl)")


def disable_libxsmm() -> None:
    """Route DGL's CPU SpMM to its own kernel instead of libxsmm (a process-wide switch).

    libxsmm JIT-compiles code for every new graph; mini-batch blocks and sampled
    subgraphs are new every step, which made ``copy_u_sum`` 5-25x slower here.
    """
    dgl.use_libxsmm(False)
