"""dgl_scalegnn: mini-batch GNN training with communication-free uniform vertex sampling
and 4D hybrid parallelism (data parallelism x 3D parallel matrix multiplication).

``import dgl_scalegnn as sg`` gives the public API of :mod:`dgl_scalegnn.api` (its
``__all__``): ``sg.init``, ``sg.load_graph``, ``sg.build_model``, ``sg.minibatches``,
``sg.objective``, ``sg.evaluate``, ``sg.predict``, ``sg.Checkpoints`` and the helpers.
It is read when first used, so that ``scalegnn --version`` imports no torch.
"""

import sys
from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    from dgl_scalegnn.api import __all__ as public

    if name in public:
        return getattr(sys.modules["dgl_scalegnn.api"], name)
    raise AttributeError(f"module 'dgl_scalegnn' has no attribute {name!r}")


def __dir__() -> list[str]:
    from dgl_scalegnn.api import __all__ as public

    return sorted([*globals(), *public])
