"""``scalegnn plan --calibrate``: measuring this host for the cost model, keeping the
measurement for this machine and rank count only, and planning with it."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from dgl_scalegnn.cli import main
from dgl_scalegnn.config import ConfigError, ModelConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.perfmodel import Workload, step_collectives, step_time
from dgl_scalegnn.train import calibrate as calibration
from dgl_scalegnn.train.calibrate import (
    Link,
    MeasureSizes,
    RankRates,
    calibrate,
    calibration_path,
    load_calibration,
    read_calibrations,
    save_calibration,
)
from dgl_scalegnn.train.plan import calibrated_machine, plan_grid, seconds
from tests.ranks import _forkserver, spawn_ranks
from tests.workers.rank_start import PRELOADED

#: A measurement of a few milliseconds of work a kind: what a test can wait for.
TINY = MeasureSizes(repeats=2, rows=256, width=16, degree=4, large_bytes=64 << 10)

WORK = Workload(
    num_nodes=20_000,
    nnz=220_000,
    batch_size=2_500,
    in_features=64,
    num_classes=8,
    model=ModelConfig(hidden=128, layers=2),
)


@pytest.fixture(scope="module", autouse=True)
def test_ranks_forkserver():
    """The test ranks' forkserver, started before any calibration: there is one a
    process, and ``calibrate`` would start it with its own modules (torch only) and this
    module's temporary cache directory, for every rank of the suite after it."""
    _forkserver()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache directory of this test's own (no calibration in it yet)."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_two_ranks_calibrate_in_seconds_and_are_kept_for_this_machine_only(cache):
    start = time.perf_counter()
    measured = calibrate(2, TINY)
    assert time.perf_counter() - start < 60
    shared, alone = measured.shared, measured.alone
    assert (shared.ranks, alone.ranks, alone.threads) == (2, 1, shared.cores)
    assert shared.threads == max(1, shared.cores // 2)
    for rates in (shared, alone):
        figures = (rates.gemm_flops, rates.elementwise_bw, rates.spmm_bw)
        assert all(0 < f < math.inf for f in figures), rates
        assert 0 < rates.sample_vertex_s < 1 and 0 < rates.sample_entry_s < 1
    # both collectives of the one group size that divides 2, and none on one process
    assert {op: sorted(sizes) for op, sizes in shared.links.items()} == {
        "all_reduce": [2],
        "all_to_all": [2],
    }
    assert alone.links == {}
    for sizes in shared.links.values():
        assert 0 < sizes[2].latency_s < 1 and 0 < sizes[2].bandwidth < math.inf

    path = save_calibration(measured)
    assert path == calibration_path() and path.parent.parent == cache
    assert load_calibration(2) == measured
    assert load_calibration(4) is None  # another rank count is measured again
    record = json.loads(path.read_text())
    record[0]["machine"] = {**record[0]["machine"], "host": "another-host"}
    path.write_text(json.dumps(record))
    assert load_calibration(2) is None  # another machine's is not this one's
    assert len(read_calibrations(path)) == 1
    path.write_text("{ not json")
    assert read_calibrations(path) == [] and load_calibration(2) is None
    save_calibration(measured)  # an unreadable file is replaced
    assert load_calibration(2) == measured


def test_calibrating_leaves_other_ranks_their_modules_and_environment(cache, tmp_path):
    """The test ranks started after a calibration still fork from a server that has
    torch's compiler front end and DGL imported (a rank that imports them itself costs
    ~5 s, every rank of the suite after this module), and none inherits this test's
    temporary cache directory."""
    calibrate(1, TINY)
    spawn_ranks(1, "tests.workers.rank_start:main", [str(tmp_path)], tmp_path / "logs")
    record = json.loads((tmp_path / "start0.json").read_text())
    assert record == {"preloaded": list(PRELOADED), "cache_dir": None}


def test_a_calibration_outside_one_host_is_refused_in_one_line():
    for ranks in (0, calibration.MAX_CALIBRATE_RANKS + 1):
        with pytest.raises(ConfigError) as error:
            calibrate(ranks, TINY)
        assert str(error.value) == (
            f"--gpus: got {ranks}; --calibrate starts every rank on this host: give 1 to "
            f"{calibration.MAX_CALIBRATE_RANKS}"
        )


def _rates(ranks: int, links: dict[str, dict[int, Link]]) -> RankRates:
    return RankRates(
        ranks=ranks,
        threads=1,
        cores=2,
        gemm_flops=1e10,
        elementwise_bw=4e9,
        spmm_bw=1e9,
        sample_vertex_s=2e-6,
        sample_entry_s=5e-8,
        links=links,
    )


def test_calibrated_collectives_cost_their_own_latency_and_bandwidth():
    """Each collective of a 2-rank step costs what its group size's measured link says:
    ring all-reduce 2 (g-1)/g b / beta + 2 (g-1) alpha, all-to-all b / beta + (g-1) alpha."""
    links = {"all_reduce": {2: Link(1e-3, 2e8)}, "all_to_all": {2: Link(4e-4, 1e8)}}
    shared = _rates(2, links)
    measured = calibration.Calibration(
        machine=calibration.machine_identity(),
        ranks=2,
        shared=shared,
        alone=dataclasses.replace(shared, ranks=1, threads=2, links={}),
        measured_at="2026-01-01T00:00:00",
        seconds=1.0,
        load_average=0.0,
    )
    shape = GridShape.parse("1x1x1x2")
    spec = calibrated_machine(measured)
    expected = 0.0
    for call in step_collectives(WORK, shape, 0):
        if call.operation == "all_reduce":
            expected += call.payload / 2e8 + 2 * 1e-3
        else:
            expected += call.payload / 1e8 + 4e-4
    seconds_of = step_time(WORK, shape, spec.hardware(shape, tf32=False))
    collectives = seconds_of["tp_allreduce"] + seconds_of.get("redistribute", 0.0)
    assert collectives == pytest.approx(expected, rel=1e-9)
    # the sampler's work: the group's batch drawn and the entries of its rows gathered
    # (1x1x1x2: layer 0's plane z by x holds half the rows and every column, layer 1's
    # y by z every row and half the columns: one batch's entries in all)
    entries = WORK.batch_size * WORK.nnz / WORK.num_nodes
    assert seconds_of["sampling"] == pytest.approx(
        WORK.batch_size * 2e-6 + entries * 5e-8, rel=1e-9
    )
    # one process plans with the measurement alone: no links, its own rates
    single = plan_grid(WORK, GridShape.parse("1x1x1x1"), spec, tf32=False)
    assert "tp_allreduce" not in single.step_seconds


def test_plan_calibrate_measures_saves_and_later_plans_say_they_use_it(cache, monkeypatch, capsys):
    monkeypatch.setattr(calibration, "DEFAULT_SIZES", TINY)
    argv = ["plan", "--config", "yaml/synthetic.yaml", "--gpus", "2"]
    assert main([*argv, "--calibrate"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "scalegnn plan: calibrating 2 ranks on this host (under a minute)\n"
    lines = captured.out.splitlines()
    saved = load_calibration(2)
    assert saved is not None
    assert lines[0].startswith("2 ranks (all on this host, ")
    assert lines[1] == f"rates: {saved.describe()}; saved in {calibration_path()}"

    assert main([*argv, "--gpu", "cpu"]) == 0  # the saved one, and said so
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        f"rates: {saved.describe()}, saved in {calibration_path()}; --calibrate measures again"
    )
    # the table's steps are the calibrated model's
    from dgl_scalegnn.config import load_config
    from dgl_scalegnn.train.plan import rank_grids, workload

    spec = calibrated_machine(saved)
    work = workload(load_config("yaml/synthetic.yaml", []), spec)[0]
    best = rank_grids(work, 2, spec, tf32=False)[0]
    first = lines[4].split()
    assert first[1] == str(best.grid) and " ".join(first[3:5]) == seconds(best.step_s)

    assert main(["plan", "--config", "yaml/synthetic.yaml", "--gpus", "4", "--gpu", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "rates: a core's defaults, not measured here; --calibrate measures 4 ranks on this "
        "host in under a minute"
    )


def test_plan_calibrate_refuses_gpus_and_too_many_ranks_in_one_line(cache, capsys):
    assert main(["plan", "--gpus", "8", "--gpu", "h100", "--calibrate"]) == 2
    assert capsys.readouterr().err == (
        "scalegnn: error: --calibrate: measures this host's CPU ranks, not h100 GPUs (their "
        "published figures need none); drop --calibrate or give --gpu cpu\n"
    )
    assert main(["plan", "--gpus", "65", "--calibrate"]) == 2
    assert capsys.readouterr().err == (
        "scalegnn: error: --gpus: got 65; --calibrate starts every rank on this host: give "
        "1 to 64\n"
    )
    assert not calibration_path().exists()
