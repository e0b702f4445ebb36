"""Peer systems of the benchmarks, built from DGL's own components.

- :mod:`.graphsaint`: GraphSAINT node sampling (``SAINTSampler(mode="node")``) with the
  paper's loss and aggregator normalisation, a weighted ``GraphConv`` GCN, full-graph
  evaluation.
- :mod:`.graphsage`: GraphSAGE (``NeighborSampler`` + ``SAGEConv`` mean), layer-wise
  neighbour-sampled evaluation.
- :mod:`.distdgl`: DGL's distributed training (DistDGL servers and trainers on this
  host, loopback only) of the same GraphSAGE.
- :mod:`.training`: the shared epoch loop, result format and sweep;
  :mod:`.run_peers`: the measurement command line.

The parent package sets ``OMP_WAIT_POLICY=passive`` before torch is imported (see
:mod:`benchmarks`).
"""
