"""The model's layers own their shards: names and splits from the schedule, recorded on
each parameter; dropout follows ``nn.Module.training``."""

from __future__ import annotations

import pytest
import torch

from dgl_scalegnn.config import config_from_mapping
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.comm import CommOptions, Runtime
from dgl_scalegnn.distributed.grid import Grid4D
from dgl_scalegnn.evaluation.layerwise import full_graph_forward
from dgl_scalegnn.model.parameters import init_global_parameter
from dgl_scalegnn.model.scalegnn import ParallelScaleGNN
from dgl_scalegnn.model.stack import parameter_shards
from dgl_scalegnn.profiling import Profiler
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from tests.helpers import random_dataset


def _trainer(dropout: float) -> Trainer:
    cfg = config_from_mapping(
        {"model": {"hidden": 8, "layers": 3, "dropout": dropout}, "sampling": {"batch_size": 40}}
    )
    graph = prepare_in_memory(random_dataset(num_nodes=80, num_edges=400), 0)
    return Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))


def test_every_parameter_is_a_slice_of_its_global_tensor_with_its_split_recorded():
    cfg = config_from_mapping({"model": {"hidden": 6, "layers": 3}}).model
    shape = GridShape.parse("1x2x3x1")
    for rank in range(shape.world_size):
        grid = Grid4D.view(shape, rank)
        runtime = Runtime(grid, CommOptions(), Profiler(enabled=False))
        model = ParallelScaleGNN(cfg, in_features=5, num_classes=4, runtime=runtime, seed=3)
        params = model.sharded_state_dict()
        schedule = parameter_shards(cfg, 5, 4)
        assert list(params) == list(schedule)
        assert {id(p) for p in params.values()} == {id(p) for p in model.parameters()}
        for name, param in params.items():
            assert param.shard == schedule[name]
            full = init_global_parameter(name, param.shard, seed=3)
            expected = full[param.shard.local_slices(shape, grid.coords)]
            torch.testing.assert_close(param.detach(), expected, rtol=0, atol=0)


def test_dropout_follows_the_module_training_flag():
    trainer = _trainer(dropout=0.5)
    model, batch = trainer.model, trainer.sample(0)
    model.train()
    first, _ = model(batch)
    model.eval()
    evaluated, _ = model(batch)
    plain = _trainer(dropout=0.0)
    plain.model.eval()
    undropped, _ = plain.model(batch)
    assert not torch.allclose(first, evaluated)
    torch.testing.assert_close(evaluated, undropped)


def test_full_graph_forward_refuses_training_mode():
    trainer = _trainer(dropout=0.5)
    trainer.model.train()
    with pytest.raises(RuntimeError, match=r"model\.eval\(\)"):
        full_graph_forward(trainer.model, trainer.store.full_graph())
