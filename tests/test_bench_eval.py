"""``make bench-eval``: the model it evaluates for DGL's forward is the forward's model,
and its child process evaluates a prepared graph."""

from __future__ import annotations

from benchmarks import bench_eval
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import load_config
from dgl_scalegnn.model.stack import parameter_shards
from tests.helpers import small_prepared_graph


def test_the_forward_model_has_the_parameters_of_dgls_forward() -> None:
    """Our parameters of :data:`bench_eval.FORWARD_MODEL` are DGL's two ``SAGEConv``
    layers' (``fc_self``, ``fc_neigh`` as d_in x d_out, the bias), and no other."""
    cfg = load_config(None, [f"{key}={value}" for key, value in bench_eval.FORWARD_MODEL.items()])
    ours = {name: shard.global_shape for name, shard in parameter_shards(cfg.model, 64, 8).items()}
    expected = {}
    for index, conv in enumerate(
        [dgl.nn.SAGEConv(64, 128, "mean"), dgl.nn.SAGEConv(128, 8, "mean")]
    ):
        expected[f"layer{index}_self_weight"] = tuple(conv.fc_self.weight.T.shape)
        expected[f"layer{index}_weight"] = tuple(conv.fc_neigh.weight.T.shape)
        expected[f"layer{index}_bias"] = tuple(conv.fc_self.bias.shape)  # DGL's one bias
    assert ours == expected


def test_the_child_evaluates_a_prepared_graph_every_round(tmp_path) -> None:
    graph = small_prepared_graph(tmp_path)
    result = bench_eval.run_ours(graph, bench_eval.FORWARD_MODEL, "sage", tmp_path)
    assert len(result["eval_s_rounds"]) == bench_eval.ROUNDS
    assert result["eval_s"] == min(result["eval_s_rounds"])
    assert result["max_rss_mb"][0] >= result["loaded_mb"] > 100
