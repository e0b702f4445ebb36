"""``make bench-eval``: the model it evaluates for DGL's forward is the forward's model,
and its child process evaluates a prepared graph."""

from __future__ import annotations

from benchmarks import bench_eval
from benchmarks.methods import run_our_evaluation
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
    result = run_our_evaluation(
        graph, bench_eval.FORWARD_MODEL, "sage", tmp_path, bench_eval.ROUNDS
    )
    assert len(result["eval_s_rounds"]) == bench_eval.ROUNDS
    assert result["eval_s"] == min(result["eval_s_rounds"])
    assert result["max_rss_mb"][0] >= result["loaded_mb"] > 100


def test_the_forward_and_a_peer_run_in_their_own_processes_on_a_saved_graph(tmp_path) -> None:
    """DGL's forward times its rounds, and GraphSAINT-node trains its budget of seconds
    and is evaluated at the times asked for (and after its last step), each in a child
    that reads the peers' ``dgl.save_graphs`` file."""
    from benchmarks.graphs import Graph
    from benchmarks.methods import run_forward, run_peer
    from dgl_scalegnn.config import SyntheticConfig
    from dgl_scalegnn.data.synthetic import generate

    dataset = generate(SyntheticConfig(num_nodes=1500, num_features=8, num_classes=4))
    dgl.save_graphs(str(tmp_path / "graph.bin"), [dataset.graph])
    graph = Graph("tiny", "unused.yaml", 4, 1500, dgl_file=tmp_path / "graph.bin")
    forward = run_forward(graph, "forward", tmp_path, 2)
    assert len(forward["eval_s_rounds"]) == 2 and forward["eval_s"] == min(forward["eval_s_rounds"])
    settings = {"budget": 300, "hidden": 16, "norm_coverage": 2}
    peer = run_peer(graph, "graphsaint", settings, 0, 1.0, [0.5, 1.0], tmp_path)
    history = peer["history"]
    assert 1 <= len(history) <= 2 and history[-1]["train_s"] >= 1.0
    assert peer["steps"] == history[-1]["step"] and peer["settings"]["budget"] == 300
    assert (tmp_path / "saint-norm-b300-c2-s0.pt").exists()  # shared by runs at one budget
    assert peer["max_rss_mb"][0] > 100 and peer["setup_s"] > 0
