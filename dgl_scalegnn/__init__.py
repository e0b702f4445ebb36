"""dgl_scalegnn: mini-batch GCN training with communication-free uniform vertex sampling
and 4D hybrid parallelism (data parallelism x 3D parallel matrix multiplication)."""

__version__ = "0.1.0"
