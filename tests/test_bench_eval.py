"""``make bench-eval``: the model it evaluates for DGL's forward is the forward's model,
and its child process evaluates a prepared graph."""

from __future__ import annotations

from benchmarks import bench_eval, bench_scale
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.config import load_config
from dgl_scalegnn.model.stack import parameter_shards
from tests.helpers import ROOT


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


def test_the_child_evaluates_a_prepared_graph_twice(tmp_path) -> None:
    prepared = tmp_path / "prepared"
    synthetic = ["--set", "data.synthetic.num_nodes=2000", "--set", "data.synthetic.num_features=8"]
    assert cli_main(["prepare", "--dataset", "synthetic", *synthetic, "--out", str(prepared)]) == 0
    graph = bench_scale.Graph(
        name="sparse",
        config_file=str(ROOT / "yaml" / "synthetic-1m.yaml"),
        prepared=prepared,
        dgl_file=tmp_path / "unused.bin",
        part_config=tmp_path / "unused.json",
        num_classes=8,
        num_nodes=2000,
        setup_s={},
    )
    result = bench_eval.run_ours(graph, bench_eval.FORWARD_MODEL, "sage", tmp_path)
    assert len(result["eval_s_rounds"]) == 2 and result["eval_s"] == min(result["eval_s_rounds"])
    assert result["max_rss_mb"][0] >= result["loaded_mb"] > 100
