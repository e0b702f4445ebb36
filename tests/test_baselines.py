"""The peer baselines: GraphSAINT-node, GraphSAGE, the shared loop and DistDGL.

``benchmarks.baselines`` is imported before torch so that its ``OMP_WAIT_POLICY=passive``
reaches torch's OpenMP runtime (see the package docstring).
"""

from __future__ import annotations

import benchmarks.baselines  # noqa: F401  (before torch: sets OMP_WAIT_POLICY)

# isort: split

import dataclasses
import itertools
import json
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks import bench_scale, ours
from benchmarks.baselines import distdgl, graphsage, graphsaint, run_peers, training
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import ModelConfig, SyntheticConfig, load_config
from dgl_scalegnn.data.graph import NodeDataset
from dgl_scalegnn.data.synthetic import generate
from tests.helpers import ROOT

SMALL = SyntheticConfig(num_nodes=3000, seed=1)  # 8 classes: chance is 0.125
#: A clear margin over chance (runs of a few epochs reach 0.5-0.6).
MIN_ACCURACY = 0.4
SAINT_SETTINGS = {"budget": 1000, "hidden": 32, "lr": 0.02}
SAGE_SETTINGS = {"batch_size": 100, "hidden": 32, "fanouts": [5, 5], "lr": 0.01}


@pytest.fixture(scope="module")
def small() -> NodeDataset:
    return generate(SMALL)


#: Six vertices, a path plus a chord.
_TINY_PAIRS = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 3)]


def _tiny_edges() -> dgl.DGLGraph:
    """:data:`_TINY_PAIRS` in both directions, no self loops."""
    src = [u for u, v in _TINY_PAIRS] + [v for u, v in _TINY_PAIRS]
    dst = [v for u, v in _TINY_PAIRS] + [u for u, v in _TINY_PAIRS]
    return dgl.graph((torch.tensor(src), torch.tensor(dst)))


def _tiny_graph() -> dgl.DGLGraph:
    """:func:`_tiny_edges` with GCN weights and self loops; vertices 0-2 train."""
    graph = graphsaint.gcn_graph(_tiny_edges())
    graph.ndata["train_mask"] = torch.tensor([True, True, True, False, False, False])
    return graph


# --------------------------------------------------------------------------------------
# GraphSAINT normalisation
# --------------------------------------------------------------------------------------


def test_saint_norm_matches_its_definition() -> None:
    """Counts, 1/lambda_v and 1/alpha_{u,v} against a plain loop over the subgraphs."""
    graph = _tiny_graph()
    torch.manual_seed(0)
    sampler = dgl.dataloading.SAINTSampler(mode="node", budget=3)
    subgraphs = [sampler.sample(graph, None) for _ in range(300)]
    node_count, edge_count, num = graphsaint.count_occurrences(graph, subgraphs)
    train = graph.ndata["train_mask"]
    norm = graphsaint.norm_from_counts(graph, node_count, edge_count, num, train)

    nodes = np.zeros(graph.num_nodes(), dtype=np.int64)
    edges = np.zeros(graph.num_edges(), dtype=np.int64)
    src, dst = graph.edges()
    for subgraph in subgraphs:
        members = set(subgraph.ndata[dgl.NID].tolist())
        for v in members:
            nodes[v] += 1
        for e in range(graph.num_edges()):
            edges[e] += int(src[e].item() in members and dst[e].item() in members)
    assert num == 300
    np.testing.assert_array_equal(node_count.numpy(), nodes)
    np.testing.assert_array_equal(edge_count.numpy(), edges)
    assert (nodes > 0).all() and (edges > 0).all()  # no clamping in this check
    num_train = int(train.sum())
    expected_loss = np.where(train.numpy(), num / (nodes * num_train), 0.0)
    np.testing.assert_allclose(norm.loss_norm.numpy(), expected_loss, rtol=1e-6)
    # lambda_v * |V_L| = ... i.e. loss_norm * |V_L| = N_s / C_v on training vertices
    np.testing.assert_allclose(
        (norm.loss_norm * num_train)[train].numpy(), num / nodes[train.numpy()], rtol=1e-6
    )
    np.testing.assert_allclose(norm.aggr_norm.numpy(), nodes[dst.numpy()] / edges, rtol=1e-6)


def test_saint_inclusion_frequency_is_the_samplers_probability() -> None:
    """C_v / N_s estimates Pr[v in subgraph] = 1 - (1 - q_v)^B, q_v ∝ out-degree."""
    graph = _tiny_graph()
    budget, num = 3, 4000
    torch.manual_seed(1)
    sampler = dgl.dataloading.SAINTSampler(mode="node", budget=budget)
    norm = graphsaint.estimate_norm(graph, sampler, num, graph.ndata["train_mask"])
    degree = graph.out_degrees().double()
    probability = 1 - (1 - degree / degree.sum()) ** budget
    frequency = norm.node_count.double() / num
    sigma = torch.sqrt(probability * (1 - probability) / num)
    assert bool(((frequency - probability).abs() < 5 * sigma).all()), (frequency, probability)


def test_saint_normalisation_cache_is_read_back_instead_of_sampling(small, tmp_path, monkeypatch):
    settings = training.merge_settings(graphsaint.DEFAULTS, SAINT_SETTINGS, graphsaint.METHOD)
    cache = tmp_path / "norm.pt"
    first = graphsaint.GraphSAINTBaseline(small, settings, norm_cache=cache)
    assert cache.exists() and not cache.with_suffix(".partial").exists()

    def no_sampling(*args, **kwargs):
        raise AssertionError("the cached normalisation was estimated again")

    monkeypatch.setattr(graphsaint, "estimate_norm", no_sampling)
    second = graphsaint.GraphSAINTBaseline(small, settings, norm_cache=cache)
    for field in ("node_count", "edge_count", "loss_norm", "aggr_norm"):
        assert torch.equal(getattr(first.norm, field), getattr(second.norm, field)), field
    assert second.norm.num_samples == first.norm.num_samples
    with pytest.raises(AssertionError, match="estimated again"):  # no cache: it samples
        graphsaint.GraphSAINTBaseline(small, settings)


def test_gcn_graph_weights_are_symmetric_normalisation() -> None:
    graph = _tiny_graph()
    src, dst = graph.edges()
    degree = graph.in_degrees().double()  # symmetric graph with one self loop each
    expected = 1 / torch.sqrt(degree[src] * degree[dst])
    torch.testing.assert_close(graph.edata["w"].double(), expected)
    assert int((src == dst).sum()) == graph.num_nodes()


def _tiny_dataset() -> NodeDataset:
    """:func:`_tiny_edges` with features, labels and masks; vertices 0-2 train."""
    graph = _tiny_edges()
    graph.ndata["feat"] = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    graph.ndata["label"] = torch.tensor([0, 1, 0, 1, 0, 1])
    graph.ndata["train_mask"] = torch.tensor([True, True, True, False, False, False])
    graph.ndata["val_mask"] = torch.tensor([False, False, False, True, True, False])
    graph.ndata["test_mask"] = torch.tensor([False, False, False, False, False, True])
    return NodeDataset("tiny", graph, 2)


def _tiny_baseline(normalization: str, **kwargs) -> graphsaint.GraphSAINTBaseline:
    overrides = {"budget": 3, "hidden": 8, "dropout": 0.0, "normalization": normalization}
    settings = training.merge_settings(graphsaint.DEFAULTS, overrides, graphsaint.METHOD)
    return graphsaint.GraphSAINTBaseline(_tiny_dataset(), settings, **kwargs)


def test_saint_subgraph_normalization_is_the_subgraphs_own_gcn() -> None:
    """Weights D_s^{-1/2} (A_s + I) D_s^{-1/2} of a dense A_s cut from the edge list, and
    the loss the mean cross-entropy over the subgraph's training vertices."""
    torch.manual_seed(0)
    baseline = _tiny_baseline("subgraph")
    adjacency = torch.zeros(6, 6, dtype=torch.float64)
    for u, v in _TINY_PAIRS:
        adjacency[u, v] = adjacency[v, u] = 1.0
    for _ in range(5):
        batch = next(baseline.batches())
        ids = batch.ndata[dgl.NID].long()
        looped = adjacency[ids][:, ids] + torch.eye(len(ids), dtype=torch.float64)
        inv_sqrt = looped.sum(1).rsqrt()
        dense = inv_sqrt[:, None] * looped * inv_sqrt[None, :]
        src, dst = batch.edges()
        assert int((src == dst).sum()) == batch.num_nodes()  # gcn_graph's loops came along
        assert batch.num_edges() == int((looped > 0).sum())  # and every other edge of A_s
        weight = baseline.edge_weight(batch)
        torch.testing.assert_close(weight.double(), dense[dst.long(), src.long()])
        # A proper subgraph of a connected graph: some kept vertex lost a neighbour.
        assert batch.num_nodes() < 6 and not torch.allclose(weight, batch.edata["w"])
        labelled = batch.ndata["train_mask"]
        if bool(labelled.any()):
            logits = baseline.model(batch, batch.ndata["feat"], dense[dst, src].float())
            expected = F.cross_entropy(logits[labelled], batch.ndata["label"][labelled])
            torch.testing.assert_close(baseline.loss(batch), expected)


@pytest.mark.parametrize("normalization", ["global", "subgraph"])
def test_saint_normalization_without_estimator_does_not_presample(
    normalization, tmp_path, monkeypatch
) -> None:
    def no_sampling(*args, **kwargs):
        raise AssertionError("estimate_norm ran")

    monkeypatch.setattr(graphsaint, "estimate_norm", no_sampling)
    cache = tmp_path / "norm.pt"
    torch.manual_seed(0)
    baseline = _tiny_baseline(normalization, norm_cache=cache)
    assert baseline.norm is None and not cache.exists()
    losses = []
    for _ in range(10):
        batch = next(baseline.batches())
        if normalization == "global":
            assert torch.equal(baseline.edge_weight(batch), batch.edata["w"])
        losses.append(baseline.loss(batch))
    assert any(loss is not None and bool(torch.isfinite(loss)) for loss in losses)


def test_saint_unknown_normalization_is_refused() -> None:
    with pytest.raises(ValueError, match="normalization must be one of 'estimator', 'global'"):
        _tiny_baseline("none")


# --------------------------------------------------------------------------------------
# Training and the result format
# --------------------------------------------------------------------------------------


def _check_result(result: dict, max_epochs: int, wall_s: float) -> None:
    for key in training.RESULT_KEYS:
        assert key in result
    history = result["history"]
    assert history[-1]["epoch"] == max_epochs
    for record in history:
        assert set(training.HISTORY_KEYS) <= set(record)
    train_s = [record["train_s"] for record in history]
    assert train_s == sorted(train_s)
    # training time excludes evaluation: both fit in the wall time together
    assert train_s[-1] + sum(record["eval_s"] for record in history) <= wall_s
    assert result["eval_s_per_round"] == pytest.approx(
        float(np.median([record["eval_s"] for record in history]))
    )


@pytest.mark.parametrize(
    ("module", "settings", "epochs"),
    [(graphsaint, SAINT_SETTINGS, 6), (graphsage, SAGE_SETTINGS, 3)],
    ids=["graphsaint", "graphsage"],
)
def test_baseline_learns_and_reports(module, settings, epochs, small) -> None:
    start = time.perf_counter()
    result = module.PEER.train(small, settings, 0, MIN_ACCURACY, epochs, 2)
    wall_s = time.perf_counter() - start
    _check_result(result, epochs, wall_s)
    assert [r["epoch"] for r in result["history"]] == sorted({*range(2, epochs + 1, 2), epochs})
    assert result["test_at_best_val"] > MIN_ACCURACY, result["history"]
    assert result["time_to_target_s"] is not None
    assert result["settings"]["lr"] == settings["lr"]


@pytest.mark.parametrize(
    ("module", "settings"),
    [(graphsaint, SAINT_SETTINGS), (graphsage, SAGE_SETTINGS)],
    ids=["graphsaint", "graphsage"],
)
def test_same_seed_same_run(module, settings, small, monkeypatch) -> None:
    """Bitwise with one thread (with two, DGL's CPU kernels are exact up to round-off)."""
    monkeypatch.setattr(training, "machine_cores", lambda: 1)
    previous = torch.get_num_threads()
    try:
        runs = [module.PEER.train(small, settings, seed, None, 1, 1) for seed in (5, 5, 6)]
    finally:
        torch.set_num_threads(previous)
    accuracies = [[(r["val_acc"], r["test_acc"]) for r in run["history"]] for run in runs]
    assert accuracies[0] == accuracies[1]
    assert accuracies[0] != accuracies[2]


def test_unknown_setting_is_refused(small) -> None:
    with pytest.raises(ValueError, match="unknown setting 'bugdet'"):
        graphsaint.PEER.train(small, {"bugdet": 10}, 0, None, 1, 1)
    with pytest.raises(ValueError, match="fanouts"):
        graphsage.PEER.train(small, {"fanouts": [5]}, 0, None, 1, 1)


def test_layerwise_inference_with_all_neighbours_is_exact(small) -> None:
    training.seed_everything(0)
    model = graphsage.SAGE(small.num_features, 16, small.num_classes, 2, 0.5).eval()
    graph, features = small.graph, small.graph.ndata["feat"]
    ids = torch.arange(0, graph.num_nodes(), 7)
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    input_nodes, output_nodes, blocks = sampler.sample(graph, ids)
    with torch.no_grad():
        expected = model(blocks, features[input_nodes])
        actual = graphsage.layerwise_inference(model, graph, features, ids, -1, 500)
    assert torch.equal(output_nodes, ids)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


class _Scripted:
    """A baseline whose epochs and evaluations take known times on a fake clock."""

    def __init__(self, accuracies: list[tuple[float, float]], clock: list[float]) -> None:
        self.accuracies, self.clock = iter(accuracies), clock

    def train_epoch(self) -> None:
        self.clock[0] += 0.02

    def evaluate(self) -> tuple[float, float]:
        self.clock[0] += 0.1
        return next(self.accuracies)


def test_run_epochs_books_training_time_without_evaluation(monkeypatch) -> None:
    # The timings are read from a clock that only the scripted baseline advances, so a
    # loaded machine cannot move them, and evaluation booked as training would show.
    clock = [0.0]
    monkeypatch.setattr(training, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    scripted = _Scripted([(0.5, 0.4), (0.7, 0.6), (0.6, 0.9)], clock)
    result = training.run_epochs(scripted, 0.55, 5, 2)
    history = result["history"]
    assert [r["epoch"] for r in history] == [2, 4, 5]
    for record in history:
        assert record["train_s"] == pytest.approx(0.02 * record["epoch"])
        assert record["eval_s"] == pytest.approx(0.1)
    assert (result["best_val_acc"], result["test_at_best_val"]) == (0.7, 0.6)
    assert result["time_to_target_s"] == history[1]["train_s"]
    stopped = training.run_epochs(_Scripted([(0.5, 0.4), (0.7, 0.6)], clock), 0.55, 9, 1, True)
    assert [r["epoch"] for r in stopped["history"]] == [1, 2]
    never = training.summarise(history, 0.95)
    assert never["time_to_target_s"] is None


def test_time_to_target_is_read_on_validation_accuracy_for_every_method() -> None:
    """One definition everywhere, the trainer's: the training seconds at the first
    evaluation whose validation accuracy reaches the target, whatever the test accuracy
    did before (here it passed the target an evaluation sooner)."""
    from benchmarks import harness, scale_report

    history = [
        {"step": 1, "epoch": 0.1, "train_s": 1.0, "val_acc": 0.5, "test_acc": 0.9, "eval_s": 0.1},
        {"step": 2, "epoch": 0.2, "train_s": 2.0, "val_acc": 0.8, "test_acc": 0.7, "eval_s": 0.1},
    ]
    assert harness.TARGET_METRIC == "val_acc"  # the trainer's default train.target_metric
    assert harness.first_at_target(history, 0.8)["train_s"] == 2.0
    assert training.summarise(history, 0.8)["time_to_target_s"] == 2.0
    run = {**training.summarise(history, None), "step_s": 1.0, "max_rss_mb": [1.0]}
    runs = {method: [run] for method in bench_scale.METHODS}
    analysis = scale_report.analyse({"runs": runs})
    assert analysis["targets"]["95%"] == pytest.approx(0.76)  # 95% of the best validation
    assert analysis["methods"][bench_scale.METHODS[0]]["to_target"]["95%"]["seconds"] == 2.0


class _ScriptedSteps(training.MiniBatchBaseline):
    """Steps of 10 time units, evaluations of 50, on a fake clock; three steps an epoch."""

    def __init__(self) -> None:
        self.now = 0.0
        self.steps = 0
        self.epochs = 0

    def clock(self) -> float:
        return self.now

    def batches(self):
        self.epochs += 1
        return iter(range(3))

    def train_step(self, batch) -> None:
        self.now += 10.0
        self.steps += 1

    def loss(self, batch):  # pragma: no cover - train_step is replaced
        raise AssertionError

    def predict(self, ids):  # pragma: no cover - evaluate is replaced
        raise AssertionError

    def evaluate(self) -> tuple[float, float]:
        self.now += 50.0
        return self.steps / 100, self.steps / 100


def test_eval_schedule_is_log_spaced_and_ends_at_the_budget() -> None:
    times = training.eval_schedule(10.0, 5)
    assert times[-1] == pytest.approx(10.0)
    assert times[0] == pytest.approx(2.5)
    ratios = [b / a for a, b in itertools.pairwise(times)]
    assert ratios == pytest.approx([2**0.5] * 4)
    with pytest.raises(ValueError, match="budget_s"):
        training.eval_schedule(0.0, 3)


def test_run_for_seconds_books_steps_and_training_time_without_evaluation(
    monkeypatch,
) -> None:
    baseline = _ScriptedSteps()
    monkeypatch.setattr(training.time, "perf_counter", baseline.clock)
    result = training.run_for_seconds(baseline, 200.0, [45.0, 100.0, 100.0], steps_per_epoch=3)
    history = result["history"]
    # evaluations after the steps passing 45 and 100 (one for both 100s) and the last
    assert [r["step"] for r in history] == [5, 10, 20]
    assert [r["train_s"] for r in history] == [50.0, 100.0, 200.0]  # evaluation excluded
    assert [r["epoch"] for r in history] == pytest.approx([5 / 3, 10 / 3, 20 / 3])
    assert [r["eval_s"] for r in history] == [50.0, 50.0, 50.0]
    assert [r["test_acc"] for r in history] == [0.05, 0.1, 0.2]
    assert baseline.steps == 20 and baseline.epochs == 7  # epochs restart as needed
    assert result["best_val_acc"] == 0.2


def test_final_run_of_ours_is_run_again_when_its_probe_misjudged_the_step_time(
    monkeypatch, tmp_path
) -> None:
    plan, graph = bench_scale.plan(), SimpleNamespace(name="g")
    calls: list[int] = []

    def fake_ours(graph, p, overrides, seed, processes, max_steps, eval_steps, log_dir):
        calls.append(max_steps)  # a step takes 0.1 s here (the probe said 0.2 s)
        return {
            "history": [{"train_s": 0.1 * max_steps}],
            "first_step_s": 0.1,
            "steady_step_s": 0.1,
        }

    monkeypatch.setattr(bench_scale, "ours", fake_ours)
    probe = {"first_step_s": 0.2, "steady_step_s": 0.2}
    result = bench_scale.run_ours_for_budget(graph, plan, {}, 0, 1, probe, tmp_path)
    assert calls == [120, 240]  # the second run at the first run's own step time
    assert result["history"][-1]["train_s"] == pytest.approx(plan.budget_s)
    calls.clear()  # a probe within the tolerance: one run
    probe = {"first_step_s": 0.1, "steady_step_s": 0.105}
    bench_scale.run_ours_for_budget(graph, plan, {}, 0, 1, probe, tmp_path)
    assert len(calls) == 1


def test_bench_scale_runs_the_methods_asked_for_and_reuses_the_other_rows(
    monkeypatch, tmp_path
) -> None:
    """``--methods ours-gin,dgl-gin-ns --reuse FILE``: the GIN sweeps and final runs
    alone, the other rows (and their sweeps) from the earlier file, in the report's order."""
    from benchmarks import scale_report

    plan, graph = bench_scale.plan(), SimpleNamespace(name="g", config_file="c", num_nodes=10)
    graph.setup_s = {}
    ran: list[tuple[str, str]] = []
    gin, dgl_gin = bench_scale.METHOD_KEYS["ours-gin"], bench_scale.METHOD_KEYS["dgl-gin-ns"]

    def fake_ours(graph, p, overrides, seed, processes, max_steps, eval_steps, log_dir):
        ran.append(("ours", overrides.get("model.conv", "gcn")))
        return _run([(max_steps, plan.budget_s, 0.7)], 1.0, [100.0]) | {
            "steps": max_steps,
            "first_step_s": 0.1,
            "steady_step_s": plan.budget_s / 240,
        }

    def fake_peer(graph, method, settings, seed, budget_s, eval_at_s, log_dir, extra=False):
        ran.append(("peer", method))
        accuracy = 0.6 + 0.01 * settings["fanouts"][0]
        return _run([(10, budget_s, accuracy)], 1.0, [50.0]) | {"steps": 10}

    monkeypatch.setattr(bench_scale, "ours", fake_ours)
    monkeypatch.setattr(bench_scale, "run_peer", fake_peer)
    report = bench_scale.run_graph(graph, plan, tmp_path, (gin, dgl_gin))
    assert set(ran) == {("ours", "gin"), ("peer", "dgl-gin-ns")}
    assert list(report["runs"]) == [gin, dgl_gin]
    assert report["runs"][dgl_gin][0]["best_val_acc"] == pytest.approx(0.75)  # fan-out 15 won
    earlier = {
        "runs": {m: [_run([(5, 3.0, 0.8)], 1.0, [10.0])] for m in bench_scale.METHODS[:8]},
        "sweeps": {"graphsage": [], gin: []},
    }
    merged = bench_scale.with_reused_rows(report, earlier, "earlier.json")
    assert bench_scale.METHODS[7] == gin
    assert list(merged["runs"]) == [*bench_scale.METHODS[:8], dgl_gin]
    assert merged["runs"][gin] == report["runs"][gin]  # the new run, not the earlier one
    assert merged["sweeps"]["graphsage"] == []
    assert len(merged["sweeps"][gin]) == len(plan.ours_grid("gin"))
    assert merged["reused"]["methods"] == list(bench_scale.METHODS[:7])
    payload = {
        "plan": dataclasses.asdict(plan) | {"batch_size": plan.batch_size},
        "minutes": 1.0,
        "graphs": {"g": merged},
        "analysis": {"g": scale_report.analyse(merged)},
    }
    text = scale_report.markdown(payload)
    assert f"| {bench_scale.METHODS[4]} (earlier run) | 1 |" in text
    assert f"| {gin} | 1 |" in text and "earlier.json's, not run here" in text


def test_bench_scale_keeps_the_graphs_it_does_not_run_from_the_file_it_reuses(
    monkeypatch, tmp_path
) -> None:
    """``--graphs sparse --methods ours-gin --reuse FILE``: sparse's GIN row is new, its
    other rows and the whole products-like report are the file's, marked reused."""
    gin = bench_scale.METHOD_KEYS["ours-gin"]
    plan = dataclasses.asdict(bench_scale.plan())
    old_runs = {m: [_run([(5, 3.0, 0.8)], 1.0, [10.0])] for m in bench_scale.METHODS[:8]}
    graphs = {
        name: {"config": "c", "setup_s": {}, "runs": old_runs, "sweeps": {}}
        for name in plan["graphs"]
    }
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"plan": plan, "graphs": graphs}))
    new_gin = _run([(9, 20.0, 0.81)], 1.0, [10.0])
    monkeypatch.setattr(
        bench_scale, "setup_graph", lambda *args, **kwargs: (SimpleNamespace(setup_s={}), {})
    )
    monkeypatch.setattr(
        bench_scale,
        "run_graph",
        lambda graph, p, log_dir, methods: {"config": "c", "runs": {gin: [new_gin]}, "sweeps": {}},
    )
    written = {}
    monkeypatch.setattr(bench_scale, "write_results", lambda name, payload: written.update(payload))
    monkeypatch.setattr(bench_scale.scale_report, "write", lambda payload, path: None)
    settings = bench_scale.ScaleSettings(
        graphs=("sparse",), methods=(gin,), reuse=earlier, work=tmp_path / "work"
    )
    bench_scale.main(settings)
    sparse, products = written["graphs"]["sparse"], written["graphs"]["products-like"]
    assert sparse["runs"][gin] == [new_gin] and sparse["reused"]["methods"] == list(
        bench_scale.METHODS[:7]
    )
    assert products["runs"] == old_runs and products["reused"]["methods"] == list(old_runs)
    assert written["plan"]["graphs"] == ["sparse", "products-like"]
    assert written["analysis"]["sparse"]["methods"][gin]["test_acc"]["mean"] == 0.81


def test_bench_scale_refuses_a_partial_run_without_rows_to_reuse(tmp_path, capsys) -> None:
    for argv, says in (
        (["--methods", "ours-gin"], "--methods leaves out ours, ours-8, saint-b"),
        (["--methods", "ours-gni"], "unknown method 'ours-gni' in --methods"),
    ):
        with pytest.raises(SystemExit) as stop:
            bench_scale.ScaleSettings.from_argv(argv)
        assert stop.value.code == 2
        assert says in capsys.readouterr().err
    earlier = tmp_path / "bench_scale.json"
    earlier.write_text(
        json.dumps({"plan": {**dataclasses.asdict(bench_scale.plan()), "budget_s": 12.0}})
    )
    with pytest.raises(bench_scale.BenchError, match=r"ran with budget_s 12\.0, this run 24\.0"):
        bench_scale.earlier_results(earlier, bench_scale.plan())
    plan = dataclasses.asdict(bench_scale.plan())  # the same settings, without GraphSAGE's row
    runs = {method: [] for method in bench_scale.ANCHORS if method != "GraphSAGE"}
    graphs = {name: {"runs": runs} for name in plan["graphs"]}
    earlier.write_text(json.dumps({"plan": plan, "graphs": graphs}))
    gin = bench_scale.METHOD_KEYS["ours-gin"]
    settings = bench_scale.ScaleSettings(methods=(gin,), reuse=earlier)
    with pytest.raises(bench_scale.BenchError, match="has no 'GraphSAGE' rows for sparse"):
        bench_scale.main(settings)  # before anything runs


def test_sampled_inference_is_the_model_on_full_neighbourhoods_when_fanout_covers_them(
    small,
) -> None:
    """With fan-outs above every in-degree, sampled inference is exact (dense oracle)."""
    graph, features = small.graph, small.graph.ndata["feat"]
    torch.manual_seed(0)
    model = graphsage.SAGE(small.num_features, 16, small.num_classes, 2, 0.0).eval()
    ids = torch.tensor([5, 0, 17, 2999])
    big = int(graph.in_degrees().max()) + 1
    with torch.no_grad():
        actual = graphsage.sampled_inference(model, graph, features, ids, [big, big], 3)
        expected = graphsage.layerwise_inference(model, graph, features, ids, -1, 500)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_sweep_picks_best_mean_validation(small) -> None:
    def fake_train(dataset, settings, seed, target_acc, max_epochs, eval_every) -> dict:
        val = settings["quality"] + 0.01 * seed
        history = [{"epoch": 1, "train_s": 1.0, "val_acc": val, "test_acc": val, "eval_s": 0.1}]
        return training.summarise(history, target_acc)

    grid = [{"quality": 0.5}, {"quality": 0.7}, {"quality": 0.6}]
    result = training.sweep(fake_train, small, grid, [0, 1, 2])
    assert result["best_settings"] == {"quality": 0.7}
    assert result["best_mean_val_acc"] == pytest.approx(0.71)
    assert [r["best_val_acc"] for r in result["results"]] == pytest.approx([0.7, 0.71, 0.72])
    assert result["table"][1]["std_val_acc"] == pytest.approx(0.01)


# --------------------------------------------------------------------------------------
# DistDGL: two trainers on this host (about 20-30 s)
# --------------------------------------------------------------------------------------


def _worker_processes(work_dir: str) -> list[str]:
    found = subprocess.run(
        ["pgrep", "-f", f"benchmarks.baselines.distdgl_worker {work_dir}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.split()


@pytest.mark.slow
def test_distdgl_two_trainers_smoke(tmp_path) -> None:
    result = distdgl.smoke_run(tmp_path)
    assert result["num_trainers"] == 2
    assert result["num_machines"] == (2 if result["topology"] == "machines" else 1)
    for key in training.RESULT_KEYS:
        assert key in result
    assert [r["epoch"] for r in result["history"]] == [1, 2, 3]
    assert result["test_at_best_val"] > 0.4  # 4 classes
    assert not _worker_processes(str(tmp_path))


# --------------------------------------------------------------------------------------
# The scale benchmark's report: targets, times to target and ratios from the runs
# --------------------------------------------------------------------------------------


def _run(points: list[tuple[int, float, float]], eval_s: float, rss: list[float]) -> dict:
    """A run whose evaluations are ``(step, train_s, test_acc)``, its loss 1 - test_acc."""
    history = [
        {
            "step": s,
            "epoch": s / 10,
            "train_s": t,
            "val_acc": a,
            "test_acc": a,
            "eval_s": eval_s,
            "train_loss": 1 - a,
        }
        for s, t, a in points
    ]
    return {
        **training.summarise(history, None),
        "step_s": points[-1][1] / points[-1][0],
        "max_rss_mb": rss,
    }


def test_scale_report_targets_and_ratios_follow_the_histories() -> None:
    from benchmarks import bench_scale, scale_report

    ours_1, ours_8, saint_b, saint_best, sage, dist = bench_scale.METHODS[:6]
    runs = {
        ours_1: [_run([(5, 10.0, 0.5), (10, 20.0, 0.76), (20, 40.0, 0.80)], 2.0, [900.0])],
        ours_8: [_run([(5, 4.0, 0.5), (10, 8.0, 0.79), (20, 16.0, 0.80)], 1.0, [200.0] * 8)],
        saint_b: [_run([(5, 5.0, 0.7), (10, 10.0, 0.77)], 3.0, [800.0])],
        saint_best: [_run([(50, 30.0, 0.78)], 3.0, [700.0])],
        sage: [
            {
                **_run([(100, 5.0, 0.6), (400, 30.0, 0.76), (800, 60.0, 0.79)], 4.0, [600.0]),
                "sampled_eval_s": 40.0,
            }
        ],
        dist: [_run([(100, 20.0, 0.77)], 8.0, [300.0] * 8)],
        # dgl_scalegnn with SAGE layers: 0.76 after 15 s, where DGL's GraphSAGE takes 30 s
        bench_scale.LAYER_TYPES["sage"]: [_run([(5, 15.0, 0.76), (9, 27.0, 0.78)], 2.0, [900.0])],
        # with GIN layers: 0.77 after 6 s, where DGL's neighbour-sampled GIN takes 12 s
        bench_scale.LAYER_TYPES["gin"]: [_run([(5, 6.0, 0.77)], 2.0, [900.0])],
        bench_scale.LAYER_PEERS["gin"][0]: [_run([(5, 6.0, 0.7), (10, 12.0, 0.765)], 3.0, [500.0])],
    }
    same_layer = {m: p for m, p in bench_scale.SAME_LAYER.items() if m in runs}
    analysis = scale_report.analyse({"runs": runs, "same_layer": same_layer})
    layer = analysis["layer_types_vs_dgl"][bench_scale.LAYER_TYPES["sage"]]
    assert layer["peer"] == sage
    assert layer["95%"] == {"ratio": pytest.approx(2.0), "peer_s": 30.0, "ours_s": 15.0}
    assert layer["99%"]["ours_s"] is None and layer["99%"]["peer_s"] is None
    gin = analysis["layer_types_vs_dgl"][bench_scale.LAYER_TYPES["gin"]]
    assert gin["peer"] == bench_scale.LAYER_PEERS["gin"][0]
    assert gin["95%"] == {"ratio": pytest.approx(2.0), "peer_s": 12.0, "ours_s": 6.0}
    # the loss of the steps before the last evaluation
    assert analysis["methods"][ours_1]["final_train_loss"] == pytest.approx(0.2)
    assert analysis["best_val_acc"] == pytest.approx(0.80)
    assert analysis["targets"] == pytest.approx({"95%": 0.76, "99%": 0.792})
    to_95 = analysis["methods"][ours_1]["to_target"]["95%"]
    assert (to_95["seconds"], to_95["steps"], to_95["reached"]) == (20.0, 10, "1/1")
    assert analysis["methods"][saint_b]["to_target"]["99%"]["seconds"] is None
    speed = analysis["speedup_to_target"]["95%"]
    # fastest 1-process peer to 0.76: GraphSAINT at B after 10 s; ours 20 s
    assert speed["1 process"] == {
        "fastest_peer": saint_b,
        "ratio": pytest.approx(0.5),
        "peer_s": 10.0,
        "ours_s": 20.0,
    }
    assert speed["8 processes"]["ratio"] == pytest.approx(20.0 / 8.0)
    assert analysis["speedup_to_target"]["99%"]["8 processes"]["ratio"] is None  # never
    evaluation = analysis["eval_speedup"]
    assert evaluation["neighbour-sampled (GraphSAGE) / ours"] == pytest.approx(20.0)
    assert evaluation["layer-wise full-neighbour (GraphSAGE) / ours"] == pytest.approx(2.0)
    assert analysis["methods"][ours_8]["max_rss_mb"] == [200.0] * 8
    text = scale_report.markdown(
        {
            "plan": {"num_nodes": 100, "batch_size": 10, "budget_s": 60, "seeds": [0]},
            "minutes": 1.0,
            "graphs": {"g": {"config": "c.yaml", "setup_s": {}, "sweeps": {}, "runs": runs}},
            "analysis": {"g": analysis},
        }
    )
    assert "0.50x (slower; paper >= 1.4x)" in text and "not reached" in text
    # 99% (0.792): ours on 8 ranks after 16 s, DistDGL never
    assert "only dgl_scalegnn reached it (16.0 s)" in text
    assert (
        "| dgl_scalegnn SAGE, 1 process | GraphSAGE | 95% | 0.7800 / 0.7900 | 2.00x (meets; "
        "paper >= 1.4x) |" in text
    )
    assert f"| {ours_1} | 1 | 0.8000 ± 0.0000 | 0.200 | 20 |" in text


def test_projection_uses_the_epochs_to_the_papers_target_measured_here(tmp_path) -> None:
    from benchmarks import bench_projection

    best = 0.813  # validation; the test accuracy passes the target an evaluation sooner
    history = [
        {"step": 10, "epoch": 1.0, "train_s": 5.0, "val_acc": 0.7, "test_acc": 0.70},
        {"step": 30, "epoch": 3.0, "train_s": 15.0, "val_acc": 0.75, "test_acc": 0.80},
        {"step": 50, "epoch": 5.0, "train_s": 25.0, "val_acc": 0.80, "test_acc": 0.80},
        {"step": 70, "epoch": 7.0, "train_s": 35.0, "val_acc": best, "test_acc": 0.81},
    ]
    payload = {
        "graphs": {
            "products-like": {
                "num_nodes": 1000,
                "runs": {"dgl_scalegnn, 1x2x2x2": [{"history": history}]},
            }
        },
    }
    path = tmp_path / "bench_scale.json"
    assert bench_projection.measured_epochs_to_target(path) is None  # not run yet
    path.write_text(json.dumps(payload))
    measured = bench_projection.measured_epochs_to_target(path)
    assert measured["target_acc"] == pytest.approx(0.79)  # 79% of the paper's 81.3%
    assert measured["epochs"] == 5.0
    rows = bench_projection.project(
        bench_projection.PRODUCTS, bench_projection.PRODUCTS_POINTS, measured["epochs"]
    )
    assert rows[0]["paper_time_to_target_s"] == 7.83
    assert rows[0]["projected_time_to_target_s"] == pytest.approx(
        5.0 * rows[0]["projected_epoch_s"]
    )


@pytest.mark.parametrize(("index", "config"), [(0, "cora"), (-1, "cora-paper")])
def test_the_peer_comparison_trains_cora_as_shipped(index, config):
    """The first Cora setting of the peer comparison is yaml/cora.yaml and the last
    yaml/cora-paper.yaml, every model key included (a key the wrapper does not pass would
    silently train the default)."""
    setting = {**ours.DEFAULTS, **run_peers.GRIDS[("scalegnn", "cora")][index]}
    shipped = load_config(ROOT / "yaml" / f"{config}.yaml")
    model_keys = [f.name for f in dataclasses.fields(ModelConfig)]
    assert set(model_keys) <= set(ours.DEFAULTS)
    assert {k: setting[k] for k in model_keys} == {k: getattr(shipped.model, k) for k in model_keys}
    assert (
        setting["batch_size"],
        setting["lr"],
        setting["weight_decay"],
        setting["lr_schedule"],
        setting["epochs"],
    ) == (
        shipped.sampling.batch_size,
        shipped.optim.lr,
        shipped.optim.weight_decay,
        shipped.optim.lr_schedule,
        shipped.train.epochs,
    )


def test_results_in_git_are_summaries_and_the_whole_results_stay_beside_them(tmp_path, monkeypatch):
    """Per-epoch logs go to results/raw/ (ignored by git), the summary keeps the rest."""
    from benchmarks import common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "benchmarks" / "results")
    monkeypatch.setattr(common, "RAW_RESULTS", common.RESULTS / "raw")
    history = [{"epoch": e, "val_acc": e / 100} for e in range(40)]
    curve = list(range(200))
    payload = {"runs": {"ours": {"test_acc": 0.8, "history": history, "curve": curve}}}
    summary = json.loads(common.write_results("demo", payload).read_text())
    whole = json.loads((common.RAW_RESULTS / "demo.json").read_text())
    assert whole["runs"]["ours"]["history"] == history and whole["runs"]["ours"]["curve"] == curve
    ours = summary["runs"]["ours"]
    assert ours["test_acc"] == 0.8
    assert ours["history"] == {"omitted": "40 entries", "see": "benchmarks/results/raw/demo.json"}
    assert ours["curve"]["omitted"] == "200 entries"
    ignored = subprocess.run(
        ["git", "check-ignore", "benchmarks/results/raw/demo.json"], cwd=ROOT, capture_output=True
    )
    assert ignored.returncode == 0  # git ignores the whole results


def test_distdgl_reads_a_users_graph_as_scalegnn_train_data_does(tmp_path) -> None:
    """``--graph``: DistDGL's graph is the file, with the features training sees (rows
    scaled to sum 1, ``data.feature_norm: auto``), not the synthetic graph."""
    graph = generate(SyntheticConfig(num_nodes=300, num_features=6, num_classes=3)).graph
    graph.ndata["feat"] = graph.ndata["feat"].abs() + 0.1
    path = tmp_path / "graph.bin"
    dgl.save_graphs(str(path), [graph])
    dataset = distdgl.bench_dataset(str(path), num_nodes=50_000)
    assert dataset.num_nodes == 300 and dataset.num_classes == 3
    feat = graph.ndata["feat"]
    torch.testing.assert_close(dataset.graph.ndata["feat"], feat / feat.sum(1, keepdim=True))
    assert torch.equal(dataset.graph.ndata["label"], graph.ndata["label"])
    assert distdgl.bench_dataset(None, num_nodes=500).num_nodes == 500
