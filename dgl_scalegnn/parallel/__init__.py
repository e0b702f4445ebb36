"""Parallel operators of a GCN layer under 3D PMM, each an autograd function
(products.py, norm.py, redistribute.py, losses.py; dropout masks in dropout_hash.py;
the data-parallel gradient average in data_parallel.py).

Every operator takes the local shard of a matrix in a :class:`Layout` ``(a, b, e)``
and writes its forward and backward side by side, and beside them a ``*_cost``
function listing the same collectives as :class:`~dgl_scalegnn.core.cost.CollectiveCost`
values (what the performance model sums). Notation: ``group(a)`` is the group
of ranks that differ only along grid axis ``a``.

=================  ==========================  =====================================
operator           forward                     backward
=================  ==========================  =====================================
linear  X W        all-reduce group(b)         dX: all-reduce group(e);
                                               dW: all-reduce group(a)
SpMM    A F        all-reduce group(a)         dF: all-reduce group(e)
RMSNorm            sum of squares, group(b)    the same, group(b); gain: group(a)
redistribute       all-to-all over the TP grid the reverse all-to-all
cross-entropy      max/sum-exp over group(b),  local
                   loss over group(a)
=================  ==========================  =====================================

Gradients of replicated tensors are kept complete on every replica.
"""
