"""Everything that evaluates a model on the whole graph.

Read in this order: :mod:`~dgl_scalegnn.evaluation.buffer_plan` (which whole-graph
matrices a layer-wise evaluation holds: one value that the engine and the cost model
read), :mod:`~dgl_scalegnn.evaluation.memory` (what they and a chunk take, and the chunk
rows every rank agrees on), :mod:`~dgl_scalegnn.evaluation.chunks` (the row chunks and
their CSR rows), :mod:`~dgl_scalegnn.evaluation.layerwise` (the engine),
:mod:`~dgl_scalegnn.evaluation.hops` and :mod:`~dgl_scalegnn.evaluation.neighbourhood`
(the engine whose memory is bounded by its pieces), and
:mod:`~dgl_scalegnn.evaluation.evaluator` (one interface over both, and the choice the
trainer asks for).
"""
