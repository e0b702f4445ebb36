"""ScaleGNN on one process with DGL message passing: the oracle of the parallel model,
and a module DGL users can train in a plain loop with
:class:`~dgl_scalegnn.sampling.dgl_loader.UniformVertexSampler`.

.. math::

    X_{h,0} = X W_{in}, \\qquad
    X_{h,l} = \\mathrm{Dropout}(\\mathrm{ReLU}(\\mathrm{RMSNorm}(P_l(X_{h,l-1})))) + X_{h,l-1},
    \\qquad O = X_{h,L} W_{out}

with :math:`P_l` the product of the layer type ``model.conv``, computed by the layer's
own :meth:`~dgl_scalegnn.model.convs.base.GraphLayer.reference` (without input
projection :math:`X_{h,0} = X`; without head :math:`O = P_L(X_{h,L-1})`;
``residual_from: aggregated`` adds the aggregated input; ``final_norm`` normalises
:math:`X_{h,L}` before :math:`W_{out}`; ``bias`` makes every :math:`X W` an
:math:`X W + b`), with :math:`A` the weighted adjacency in ``graph.edata[weight]`` in
the layer type's normalisation (:func:`~dgl_scalegnn.sampling.dgl_loader.norm_graph`),
aggregating over in-edges. Parameters are initialised exactly as the parallel model's
global tensors and dropout uses the same hashed masks, so both compute the same numbers.
"""

from __future__ import annotations

import torch
from torch import nn

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig
from dgl_scalegnn.core.schedule import layer_widths
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.model.layers import INPUT_DROPOUT_LAYER
from dgl_scalegnn.model.parameters import init_global_parameter
from dgl_scalegnn.model.stack import conv_layer, parameter_shards
from dgl_scalegnn.parallel.elementwise import hashed_dropout

__all__ = ["ScaleGNN"]


class ScaleGNN(nn.Module):
    """Single-process ScaleGNN.

    Parameters
    ----------
    cfg : ModelConfig
        Hidden size, layers, dropout, norm/residual switches, RMSNorm epsilon.
    in_features, num_classes : int
        :math:`d_{in}`, :math:`d_{out}`.
    seed : int
        Initialisation and dropout seed (as in the parallel model).

    Shapes
    ------
    graph: ``N`` vertices with ``edata[weight]`` ``(E,)``; ``features`` ``(N, d_in)``;
    output ``(N, d_out)`` logits.

    Examples
    --------
    >>> import torch
    >>> from dgl_scalegnn._dgl import dgl
    >>> from dgl_scalegnn.config import ModelConfig
    >>> from dgl_scalegnn.sampling.dgl_loader import norm_graph
    >>> g = norm_graph(dgl.rand_graph(10, 30))
    >>> model = ScaleGNN(ModelConfig(hidden=8, layers=2), in_features=4, num_classes=3, seed=0)
    >>> model(g, torch.randn(10, 4)).shape
    torch.Size([10, 3])
    """

    def __init__(self, cfg: ModelConfig, *, in_features: int, num_classes: int, seed: int) -> None:
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.widths = layer_widths(cfg, in_features, num_classes)
        self.params = nn.ParameterDict(
            {
                name: nn.Parameter(init_global_parameter(name, shard, seed))
                for name, shard in parameter_shards(cfg, in_features, num_classes).items()
            }
        )

    def rms_norm(self, x: torch.Tensor, gain: str) -> torch.Tensor:
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + self.cfg.rms_eps)
        return x * inv_rms * self.params[gain]

    def linear(self, x: torch.Tensor, weight: str, bias: str) -> torch.Tensor:
        """``x @ params[weight]``, plus ``params[bias]`` if the model has biases."""
        out = x @ self.params[weight]
        return out + self.params[bias] if bias in self.params else out

    def _dropout(
        self, x: torch.Tensor, vertex_ids: torch.Tensor, step: int, layer: int, rate: float
    ) -> torch.Tensor:
        return hashed_dropout(x, mix_seed(self.seed, step, layer), vertex_ids, 0, rate)

    def forward(
        self,
        graph: dgl.DGLGraph,
        features: torch.Tensor,
        *,
        vertex_ids: torch.Tensor | None = None,
        step: int = 0,
        weight: str = "w",
    ) -> torch.Tensor:
        """Logits of every vertex of ``graph``.

        ``vertex_ids`` are the global ids of the graph's vertices (``dgl.NID`` of a
        sampled subgraph); with ``step`` they key the dropout masks as in the parallel
        model. They default to ``graph.ndata[dgl.NID]`` or ``arange(N)``.
        """
        cfg = self.cfg
        if vertex_ids is None:
            vertex_ids = graph.ndata.get(dgl.NID, torch.arange(graph.num_nodes()))
        if self.training and cfg.input_dropout > 0:
            features = self._dropout(
                features, vertex_ids, step, INPUT_DROPOUT_LAYER, cfg.input_dropout
            )
        if cfg.input_projection:
            hidden = self.linear(features, "input_proj", "input_proj_bias")
        else:
            hidden = features
        conv = conv_layer(cfg)
        for widths in self.widths:
            prefix = conv.prefix(widths.index)
            own = {
                name.removeprefix(prefix): param
                for name, param in self.params.items()
                if name.startswith(prefix)
            }
            out, aggregated = conv.reference(own, graph, hidden, weight, widths, cfg)
            if f"{prefix}bias" in self.params:
                out = out + self.params[f"{prefix}bias"]
            if widths.outputs_classes:
                return out
            if cfg.norm:
                out = self.rms_norm(out, f"{prefix}gain")
            out = torch.relu(out)
            if self.training and cfg.dropout > 0:
                out = self._dropout(out, vertex_ids, step, widths.index, cfg.dropout)
            if widths.residual:
                out = out + (aggregated if cfg.residual_from == "aggregated" else hidden)
            hidden = out
        if cfg.final_norm:
            hidden = self.rms_norm(hidden, "final_gain")
        return self.linear(hidden, "head", "head_bias")
