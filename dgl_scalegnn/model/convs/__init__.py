"""The graph layer types, one module each, by their ``model.conv`` name.

Adding a layer type: one module with a :class:`~dgl_scalegnn.model.convs.base.GraphLayer`
subclass, its line in :data:`CONV_LAYERS` (and its name in
:data:`~dgl_scalegnn.config.CONVS`), and its oracle test (``docs/extending.md``).
"""

from __future__ import annotations

from dgl_scalegnn.config import CONVS, registry
from dgl_scalegnn.model.convs.base import GraphLayer
from dgl_scalegnn.model.convs.gat import GATLayer
from dgl_scalegnn.model.convs.gcn import GCNLayer
from dgl_scalegnn.model.convs.gin import GINLayer
from dgl_scalegnn.model.convs.sage import SAGELayer

__all__ = ["CONV_LAYERS", "GraphLayer"]

#: The layer class of each ``model.conv``.
CONV_LAYERS: dict[str, type[GraphLayer]] = registry(
    "model.conv",
    CONVS,
    {"gcn": GCNLayer, "sage": SAGELayer, "gin": GINLayer, "gat": GATLayer},
)
