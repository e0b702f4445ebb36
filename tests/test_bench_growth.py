"""The growth benchmark's arithmetic: sizes and methods from its command line, exponents,
the model's gap, and failed runs kept with what they measured (no benchmark is run)."""

from __future__ import annotations

import benchmarks.baselines  # noqa: F401  (before torch: sets OMP_WAIT_POLICY)

# isort: split

import json
import math
import sys
import time

import pytest

from benchmarks import bench_growth, graphs, growth_report, harness
from benchmarks.graphs import Size
from benchmarks.methods import STEP_CAP
from tests.helpers import small_prepared_graph


def test_sizes_parse_per_preset_smallest_first_and_refuse_unknown_presets() -> None:
    sizes = graphs.parse_sizes("sparse=3e6,1m;products-like=1000000")
    assert [(s.preset, s.num_nodes, s.batch_size) for s in sizes] == [
        ("sparse", 1_000_000, 10_000),
        ("sparse", 3_000_000, 30_000),
        ("products-like", 1_000_000, 10_000),
    ]
    with pytest.raises(ValueError, match="unknown preset"):
        graphs.parse_sizes("dense=1000")


@pytest.mark.parametrize("slope", [0.0, 0.5, 1.0, 1.7])
def test_exponent_recovers_a_power_law_through_noise_free_points(slope: float) -> None:
    sizes = [1e6, 3e6, 1e7]
    values = [2.5 * n**slope for n in sizes]
    assert growth_report.exponent(sizes, values) == pytest.approx(slope, abs=1e-9)
    # least squares, not the end points: a middle point off the line moves it
    bent = [values[0], values[1] * 4, values[2]]
    assert growth_report.exponent(sizes, bent) != pytest.approx(slope, abs=1e-3)


def _row(size: int, method: str, step_s: float, predicted_step_s: float, **extra) -> dict:
    return {
        "size": f"sparse-{size}",
        "method": method,
        "grid": "1x2x2x2",
        "step_s": step_s,
        "eval_s": step_s * 10,
        "test_acc": 0.8,
        "max_rss_mb": [500.0, 600.0],
        "predicted": {"step_s": predicted_step_s},
        **extra,
    }


def test_analysis_flags_growth_the_model_does_not_predict_and_keeps_failed_runs() -> None:
    method = "dgl_scalegnn, 1x2x2x2"
    rows = [
        # measured s/step grows as N, the model says N^0.5: a gap to explain
        _row(1_000_000, method, 1.0, 1.0),
        _row(4_000_000, method, 4.0, 2.0),
        # a run killed in its evaluation keeps its step time and fixed-B time
        {
            "size": "sparse-16000000",
            "method": method,
            "error": "rank 3 exited with 137",
            "step_s_before_failure": 16.0,
            "fixed_batch": {"step_s": 0.5},
        },
    ]
    payload = {"rows": rows}
    figures = growth_report.analyse(payload)["sparse"][method]
    assert figures["sizes"][16_000_000] == {"step_s": 16.0, "fixed_step_s": 0.5}
    assert figures["exponents"]["step_s"] == pytest.approx(1.0)
    assert figures["exponents"]["predicted_step_s"] == pytest.approx(0.5)
    assert figures["disagree"] == ["step_s"]
    assert figures["sizes"][4_000_000]["summed_mb"] == 1100.0
    assert math.isclose(figures["sizes"][4_000_000]["peak_rank_mb"], 600.0)
    # where the model agrees, nothing is flagged
    agree = [_row(1_000_000, method, 1.0, 1.0), _row(4_000_000, method, 4.0, 3.9)]
    assert growth_report.analyse({"rows": agree})["sparse"][method]["disagree"] == []


def test_thrash_guard_stops_a_run_that_starves_the_host_and_spares_others(tmp_path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    starved = harness.ThrashGuard(floor_mb=500, patience=3, available_mb=lambda: 100.0)
    start = time.perf_counter()
    with pytest.raises(harness.BenchError, match="exited with -9"):
        harness.run_process(sleeper, tmp_path / "starved.log", 1, 30, starved)
    assert starved.stopped and time.perf_counter() - start < 15
    # short dips below the floor are forgiven: the count restarts when memory returns
    readings = iter([100.0, 100.0, 4000.0] * 10 + [4000.0] * 100)
    dips = harness.ThrashGuard(500, patience=3, available_mb=lambda: next(readings))
    quick = [sys.executable, "-c", "import time; time.sleep(3)"]
    harness.run_process(quick, tmp_path / "dips.log", 1, 30, dips)
    assert not dips.stopped


def test_ranks_refused_an_evaluation_train_without_it_and_evaluate_the_checkpoint_on_one(
    monkeypatch, tmp_path
) -> None:
    """The control flow around a refusal (runs faked): a timing run is not evaluated, the
    run that is refused is run again with ``train.evaluate false``, so is every later one,
    the last keeps a checkpoint of its last step, and that checkpoint is evaluated on one
    process."""
    calls, rounds = [], []
    refusal = (
        "scalegnn: error: parallel.grid 1x2x2x2: a layer-wise evaluation needs 2.59 GB a rank "
        "beside what the rank holds"
    )

    def fake_run(graph, settings, log_dir, timeout_s, grid, watch):
        calls.append(dict(settings))
        rounds.append(json.loads(settings["train.eval_at_steps"]))
        if settings.get("train.evaluate") != "false":
            raise harness.BenchError(f"mpirun ... exited with 2; log x:\n{refusal}")
        return {
            "history": [],
            # stopped at 20 s
            "steps": 40 if "train.max_train_s" in settings else settings["train.max_steps"],
            "step_s": 0.5,
            "steady_step_s": 0.5,
            "first_step_s": 0.9,
            "seconds_per_step_breakdown": {"spmm": 0.2},
            "max_rss_mb": [1900.0] * 8,
            "train_max_rss_mb": None,
        }

    def fake_evaluate(graph, size, output_dir, step, log_dir):
        assert output_dir == tmp_path / f"ckpt-{size.name}-1x2x2x2" and step == 40
        return {
            "grid": "1x1x1x1",
            "step": step,
            "eval_s": 42.0,
            "peak_rss_mb": 8875.0,
            "val_acc": 0.80,
            "test_acc": 0.81,
        }

    monkeypatch.setattr(bench_growth, "run_ours", fake_run)
    monkeypatch.setattr(bench_growth, "evaluate_checkpoint", fake_evaluate)
    monkeypatch.setattr(
        bench_growth,
        "predict",
        lambda graph, grid, batch: {"step_s": 0.4, "peak_rank_mb": 4000.0, "eval_s": 9.0},
    )
    size = Size("sparse", 10_000_000)
    row = bench_growth.measure_ours(None, size, "1x2x2x2", 20.0, 0.5, 0.0, tmp_path)
    # the timing run at the fixed B is never evaluated; the budget run is, until refused
    assert [c.get("train.evaluate") for c in calls] == ["false", None, "false"]
    assert calls[1]["train.evaluation"] == "layerwise"  # never minutes in neighbourhoods
    assert [c.get("train.max_train_s") for c in calls] == [None, 20.0, 20.0]
    assert rounds == [[], [], []]  # 8 ranks: one round, the one after the last step
    assert calls[0]["sampling.batch_size"] == bench_growth.FIXED_BATCH
    assert calls[-1]["output.dir"] == tmp_path / "ckpt-sparse-10000000-1x2x2x2"
    assert calls[-1]["output.checkpoint_every"] == STEP_CAP  # only at the end
    assert row["steps"] == 40
    assert row["test_acc"] == 0.81 and row["train_max_rss_mb"] == [1900.0] * 8
    assert row["evaluated_elsewhere"]["why"].startswith("parallel.grid 1x2x2x2: a layer-wise")
    table = "\n".join(growth_report._run_table([{**row, "size": size.name, "method": "ours"}]))
    assert "refused; its checkpoint on 1 process: 42" in table
    assert "training max 1900 (sum 15200); 1 process evaluating 8875" in table
    assert bench_growth._summary(row).startswith("test_acc 0.81, step_s 0.5, peak 1900")
    figures = growth_report.quantities({**row, "method": "ours"})
    assert "peak_rank_mb" not in figures and figures["train_peak_rank_mb"] == 1900.0
    analysed = growth_report.analyse({"rows": [{**row, "size": size.name, "method": "ours"}]})
    at = analysed["sparse"]["ours"]["sizes"][size.num_nodes]
    assert "predicted_peak_rank_mb" not in at and at["predicted_step_s"] == 0.4


def test_a_checkpoint_evaluates_on_one_process_from_the_benchmark(tmp_path) -> None:
    """:func:`bench_growth.evaluate_checkpoint` on a real checkpoint of a run that did not
    evaluate: the command a user is told to run resumes it, trains nothing, evaluates."""
    from dgl_scalegnn.cli import main as cli_main
    from dgl_scalegnn.train.metrics import read_metrics

    graph = small_prepared_graph(tmp_path)
    prepared, config = graph.prepared, graph.config_file
    run = tmp_path / "run"
    steps = ["--set", "train.max_steps=3", "--set", "sampling.batch_size=200"]
    argv = ["train", "--config", config, "--grid", "1x1x1x1", "--set", f"data.prepared={prepared}"]
    argv += [*steps, "--set", "train.evaluate=false", "--set", "train.progress=false"]
    argv += ["--set", f"output.dir={run}", "--set", "output.checkpoint_every=3"]
    argv += ["--metrics", str(tmp_path / "train.jsonl")]
    assert cli_main(argv) == 0
    assert not [e for e in read_metrics(tmp_path / "train.jsonl") if e["event"] == "eval"]
    size = Size("sparse", 20_000)  # B = 200, as trained
    evaluated = bench_growth.evaluate_checkpoint(graph, size, run, 3, tmp_path)
    assert evaluated["step"] == 3 and evaluated["grid"] == "1x1x1x1"
    assert 0.0 <= evaluated["test_acc"] <= 1.0 and evaluated["eval_s"] > 0
    assert evaluated["peak_rss_mb"] > 100


def _ran(steps: int, step_s: float, history: list, processes: int = 1) -> dict:
    """What a faked ``methods.run_ours`` returns: ``steps`` steps of ``step_s``."""
    return {
        "history": history,
        "steps": steps,
        "step_s": step_s,
        "steady_step_s": step_s,
        "first_step_s": step_s,
        "seconds_per_step_breakdown": {},
        "max_rss_mb": [900.0] * processes,
        "train_max_rss_mb": [800.0] * processes,
    }


def _schedule(settings: dict) -> tuple[int, list[int]]:
    """The steps and evaluation steps a faked run was asked for."""
    return settings["train.max_steps"], json.loads(settings["train.eval_at_steps"])


def test_one_process_trains_its_budget_in_one_launch_evaluated_twice(monkeypatch, tmp_path) -> None:
    """One launch of ``train.max_train_s`` 20 s (runs faked), whatever its steps cost:
    the guess of 0.5 s a step plans 40 steps, so the first round goes after 32 of them
    and the second after the last (none at an epoch's end). The row's round is the
    second, the first beside it."""
    launches = []

    def fake_run(graph, settings, log_dir, timeout_s, grid, watch):
        launches.append((dict(settings), *_schedule(settings)))
        history = [  # 1 s a step: 20 steps, the first round after step 32 not run
            {"train_s": 19.0, "eval_s": 2.5, "val_acc": 0.8, "test_acc": 0.8},
            {"train_s": 20.0, "eval_s": 1.0, "val_acc": 0.8, "test_acc": 0.8},
        ]
        return _ran(20, 1.0, history)

    monkeypatch.setattr(bench_growth, "run_ours", fake_run)
    monkeypatch.setattr(bench_growth, "predict", lambda graph, grid, batch: {"step_s": 1.0})
    size = Size("sparse", 1_000_000)  # B = 10,000: no fixed-B run
    row = bench_growth.measure_ours(None, size, "1x1x1x1", 20.0, 0.5, 0.85, tmp_path)
    ((settings, steps, at),) = launches
    assert settings["train.max_train_s"] == 20.0 and steps == STEP_CAP
    assert settings["train.eval_every"] == STEP_CAP
    assert at == [32] and row["step_guess_s"] == 0.5
    assert row["steps"] == 20 and row["train_s"] == 20.0
    assert row["eval_s"] == 1.0 and row["first_eval_s"] == 2.5
    table = growth_report._run_table([{**row, "size": size.name, "method": "ours"}])
    assert "| 1 (first 2.5) |" in table[-1]


def test_one_process_without_a_guess_times_its_batch_first(monkeypatch, tmp_path) -> None:
    """No smaller size and no fixed-B run: 8 timing steps at B = N/100, not evaluated,
    place the first round (0.25 s a step: 80 steps of 20 s, the round after 64)."""
    launches = []

    def fake_run(graph, settings, log_dir, timeout_s, grid, watch):
        steps, at = _schedule(settings)
        launches.append((settings.get("train.evaluate"), steps, at))
        history = [{"train_s": 20.0, "eval_s": 1.0, "val_acc": 0.8, "test_acc": 0.8}]
        return _ran(80 if steps == STEP_CAP else steps, 0.25, history)

    monkeypatch.setattr(bench_growth, "run_ours", fake_run)
    monkeypatch.setattr(bench_growth, "predict", lambda graph, grid, batch: {"step_s": 1.0})
    size = Size("sparse", 1_000_000)
    bench_growth.measure_ours(None, size, "1x1x1x1", 20.0, None, 0.85, tmp_path)
    assert launches == [("false", 8, []), (None, STEP_CAP, [64])]


def test_eight_ranks_time_the_fixed_batch_then_train_the_budget_once(monkeypatch, tmp_path) -> None:
    """At 3M on 4x2x1x1: 8 steps at the fixed B = 10k (2,500 in each of its 4 groups),
    then one launch of the budget at B = 30k (7,500 a group), evaluated only after its
    last step, with no guess of its steps (runs faked). The
    guess that places one process's first round is the geometric mean of the previous
    size's step and the fixed-B run's, grown as B^exponent."""
    launches = []

    def fake_run(graph, settings, log_dir, timeout_s, grid, watch):
        steps, at = _schedule(settings)
        launches.append((settings["sampling.batch_size"], steps, at))
        step_s = 0.5 if settings["sampling.batch_size"] == 2_500 else 1.5
        history = [{"train_s": 30.0, "eval_s": 1.0, "val_acc": 0.8, "test_acc": 0.8}]
        return _ran(20 if steps == STEP_CAP else steps, step_s, history, 8)

    monkeypatch.setattr(bench_growth, "run_ours", fake_run)
    monkeypatch.setattr(bench_growth, "predict", lambda graph, grid, batch: {"step_s": 1.0})
    size = Size("sparse", 3_000_000)
    row = bench_growth.measure_ours(None, size, "4x2x1x1", 30.0, None, 1.0, tmp_path)
    assert launches == [(2_500, 8, []), (7_500, STEP_CAP, [])]
    assert "step_guess_s" not in row and row["fixed_batch"]["step_s"] == 0.5
    assert row["steps"] == 20 and row["train_s"] == 30.0
    assert bench_growth.batch_exponent(row["step_s"], 0.5, size.batch_size) == 1.0
    assert bench_growth.guess_step_s(6.0, 0.5, 30_000, 1.0) == 3.0


def test_a_partition_predicted_not_to_fit_is_not_started_and_its_row_says_so(
    monkeypatch, tmp_path
) -> None:
    """Measured peaks of 3,260 and 8,897 MB at 1M and 3M predict 26.6 GB at 10M; on a host
    with 20 GB available the partitioning is not started (``_measured`` would fail the
    test), the setup holds the prediction, and DistDGL's row and the report say why. With
    64 GB available it runs."""
    size = Size("sparse", 10_000_000)
    base = tmp_path / size.name
    base.mkdir()
    ready = {"prepare": {"seconds": 1.0, "peak_rss_mb": 1.0}}
    (base / "setup.json").write_text(json.dumps({**ready, "generate": ready["prepare"]}))
    started = []
    monkeypatch.setattr(graphs, "host_available_mb", lambda: 20_000.0)
    monkeypatch.setattr(graphs, "measured", lambda *args: started.append(args))
    peaks = {"sparse": [(1_000_000, 3260.0), (3_000_000, 8897.0)]}
    _, setup = graphs.setup_graph(size, tmp_path, ("generate", "partition"), peaks)
    assert not started and round(setup["partition"]["predicted_peak_rss_mb"]) == 26735
    assert "N^0.91" in setup["partition"]["error"]

    rows = []
    monkeypatch.setattr(bench_growth, "setup_graph", lambda *args: (None, setup))
    monkeypatch.setattr(bench_growth, "plan_grid", lambda graph, batch: bench_growth.GRID_8)
    carry = {"partition_peaks": peaks}
    wanted = {"DistDGL, 8 trainers"}
    bench_growth.run_size(size, 6.0, tmp_path, tmp_path, {}, rows.append, wanted, carry)
    (setup_row, distdgl_row) = rows
    assert distdgl_row["error"].startswith("its partition step was not run: predicted peak 26735")
    assert growth_report.failure(distdgl_row) == (
        "no partition: not run, its peak predicted at 26735 MB"
    )
    analysed = growth_report.analyse({"rows": [setup_row]})["sparse"]["setup"]
    table = "\n".join(growth_report._setup_table({**analysed, "exponents": {}}))
    assert "| not run (predicted 26735 MB) |" in table

    monkeypatch.setattr(graphs, "host_available_mb", lambda: 64_000.0)
    (base / "setup.json").write_text(json.dumps({**ready, "generate": ready["prepare"]}))
    monkeypatch.setattr(graphs, "measured", lambda *args: {"seconds": 2.0, "peak_rss_mb": 25_000.0})
    _, setup = graphs.setup_graph(size, tmp_path, ("generate", "partition"), peaks)
    assert setup["partition"] == {"seconds": 2.0, "peak_rss_mb": 25_000.0}


def test_graphsaint_sweeps_normalisation_and_rate_then_dropout_on_the_best() -> None:
    """Six runs without dropout, then the best of them with dropout, kept only where it
    beats that best on validation; the report names the choice and every other run."""
    ran = []

    def fake_saint(choice):
        ran.append(choice)
        val = 0.8 if (choice["normalization"], choice["lr"]) == ("estimator", 0.03) else 0.7
        return {"val_acc": val - choice["dropout"], "test_acc": 0.79, "steps": len(ran)}

    best = bench_growth.sweep_saint(fake_saint)
    assert len(ran) == 7 and all(c["dropout"] == 0.0 for c in ran[:6])
    assert ran[6] == {"normalization": "estimator", "lr": 0.03, "dropout": 0.2}
    assert best["choice"] == {"normalization": "estimator", "lr": 0.03, "dropout": 0.0}
    assert best["steps"] == 4 and len(best["sweep"]) == 7
    row = {"size": "sparse-1000000", "method": "GraphSAINT-node", **best}
    (line,) = growth_report._sweep_lines([row])
    assert "from 7 runs: normalization estimator, lr 0.03, dropout 0.0 (val 0.8" in line
    assert line.count(": 0.7") == 5 and "dropout 0.2: 0.6" in line


def test_methods_are_chosen_by_their_names_which_hold_commas(monkeypatch, tmp_path, capsys) -> None:
    """``--methods`` takes names separated by ``;`` and refuses one it does not know
    before anything runs; so is the environment variable it replaced, naming the flag."""
    argv = ["--work", str(tmp_path), "--methods", "dgl_scalegnn, 1 process; GraphSAGE"]
    settings = bench_growth.GrowthSettings.from_argv(argv)
    run_sizes = []
    monkeypatch.setattr(
        bench_growth, "run_size", lambda size, *args: run_sizes.append((size, args[5]))
    )
    monkeypatch.setattr(bench_growth, "write_results", lambda name, payload: tmp_path / name)
    monkeypatch.setattr(bench_growth.growth_report, "analyse", lambda payload: {})
    monkeypatch.setattr(bench_growth.growth_report, "write", lambda payload, path: None)
    bench_growth.main(settings)
    assert [size for size, _ in run_sizes] == list(bench_growth.GrowthSettings().sizes)
    assert all(wanted == ("dgl_scalegnn, 1 process", "GraphSAGE") for _, wanted in run_sizes)
    with pytest.raises(SystemExit) as refused:
        bench_growth.GrowthSettings.from_argv(["--methods", "dgl_scalegnn, 1 process, GraphSAGE"])
    assert refused.value.code == 2
    monkeypatch.setenv("SCALEGNN_BENCH_GROWTH_METHODS", "GraphSAGE")
    with pytest.raises(SystemExit) as retired:
        bench_growth.GrowthSettings.from_argv([])
    assert retired.value.code == 2
    assert "SCALEGNN_BENCH_GROWTH_METHODS is no longer read" in capsys.readouterr().err
