"""The growth benchmark's arithmetic: sizes from the environment, exponents, the model's
gap, and failed runs kept with what they measured (no benchmark is run)."""

from __future__ import annotations

import benchmarks.baselines  # noqa: F401  (before torch: sets OMP_WAIT_POLICY)

# isort: split

import math
import sys
import time

import pytest

from benchmarks import bench_growth, bench_scale, growth_report


def test_sizes_parse_per_preset_smallest_first_and_refuse_unknown_presets() -> None:
    sizes = bench_growth.growth_sizes("sparse=3e6,1e6;products-like=1000000")
    assert [(s.preset, s.num_nodes, s.batch_size) for s in sizes] == [
        ("sparse", 1_000_000, 10_000),
        ("sparse", 3_000_000, 30_000),
        ("products-like", 1_000_000, 10_000),
    ]
    with pytest.raises(ValueError, match="unknown preset"):
        bench_growth.growth_sizes("dense=1000")


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
    starved = bench_growth.ThrashGuard(floor_mb=500, patience=3, available_mb=lambda: 100.0)
    start = time.perf_counter()
    with pytest.raises(bench_scale.BenchScaleError, match="exited with -9"):
        bench_scale._run(sleeper, tmp_path / "starved.log", 1, 30, starved)
    assert starved.stopped and time.perf_counter() - start < 15
    # short dips below the floor are forgiven: the count restarts when memory returns
    readings = iter([100.0, 100.0, 4000.0] * 10 + [4000.0] * 100)
    dips = bench_growth.ThrashGuard(500, patience=3, available_mb=lambda: next(readings))
    quick = [sys.executable, "-c", "import time; time.sleep(3)"]
    bench_scale._run(quick, tmp_path / "dips.log", 1, 30, dips)
    assert not dips.stopped
