"""scalegnn plan: grid shapes ranked by the cost model, computed here directly."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import signal
import subprocess
import time

import pytest

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import BROKEN_PIPE_EXIT_CODE, main
from dgl_scalegnn.config import ModelConfig, load_config
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.normalize import gcn_normalize
from dgl_scalegnn.perfmodel import Hardware, Workload, memory_bytes, step_time
from dgl_scalegnn.train.defaults import GraphShape, apply_graph_defaults
from dgl_scalegnn.train.plan import (
    MACHINES,
    MAX_PLAN_RANKS,
    GridPlan,
    Machine,
    grid_shapes,
    machine,
    plan_grid,
    plan_lines,
    rank_grids,
    why_best,
)
from tests.helpers import VENV_BIN, random_dataset

WORK = Workload(
    num_nodes=20_000,
    nnz=220_000,
    batch_size=2_500,
    in_features=64,
    num_classes=8,
    model=ModelConfig(hidden=128, layers=3),
)


def _every_shape(ranks: int) -> set[str]:
    return {
        f"{d}x{x}x{y}x{z}"
        for d, x, y, z in itertools.product(range(1, ranks + 1), repeat=4)
        if d * x * y * z == ranks
    }


def test_every_grid_takes_updates_of_the_global_batch_ranked_by_updates_per_second():
    """The config's batch is an update's: Gd groups draw ceil(B / Gd) each, and the
    shapes rank by the updates a second of that step (epoch time at B a group would
    count a step of Gd batches as one of B)."""
    # four A100s share a node: every group at the node's bandwidth, TF32 products
    hardware = Hardware(
        bandwidth=dict.fromkeys(("x", "y", "z", "tp", "dp"), 150e9),
        latency_s=15e-6,
        gemm_flops=156e12,
        memory_bw=1.55e12,
    )
    expected, batches = {}, {}
    for spec in _every_shape(4):
        shape = GridShape.parse(spec)
        batches[spec] = math.ceil(WORK.batch_size / shape.dp)
        work = dataclasses.replace(WORK, batch_size=batches[spec])
        expected[spec] = sum(step_time(work, shape, hardware).values())
    plans = rank_grids(WORK, 4, MACHINES["a100"], tf32=True)
    assert [str(p.grid) for p in plans] == sorted(expected, key=lambda s: (expected[s], s))
    for plan in plans:
        spec = str(plan.grid)
        assert plan.batch_size == batches[spec]
        assert WORK.batch_size <= plan.global_batch < WORK.batch_size + plan.grid.dp
        batches_an_epoch = math.ceil(WORK.num_nodes / batches[spec])
        assert plan.steps_per_epoch == math.ceil(batches_an_epoch / plan.grid.dp)
        assert plan.step_s == pytest.approx(expected[spec], rel=1e-12)
        assert plan.updates_per_s == pytest.approx(1 / expected[spec], rel=1e-12)
        assert plan.fits


def _plan(spec: str, batch: int, gemm: float, fits: bool = True) -> GridPlan:
    return GridPlan(
        grid=GridShape.parse(spec),
        batch_size=batch,
        steps_per_epoch=10,
        step_seconds={"gemm": gemm, "tp_allreduce": 0.05},
        step_bytes={"x": 1e6},
        eval_s=1.0,
        memory=1e9,
        fits=fits,
    )


def test_the_first_grid_and_why_it_wins_by_hand():
    """Three hand-costed shapes: 0.10 s, 0.15 s and (not fitting) 0.06 s a step."""
    plans = [
        _plan("1x1x1x4", 10_000, 0.10),
        _plan("2x1x1x2", 5_000, 0.05),
        _plan("4x1x1x1", 2_500, 0.01, fits=False),
    ]
    ranked = sorted(plans, key=GridPlan.sort_key)
    assert [str(p.grid) for p in ranked] == ["2x1x1x2", "1x1x1x4", "4x1x1x1"]
    assert why_best(ranked, MACHINES["a100"]) == (
        "2x1x1x2: 10 updates/s of 10,000 vertices (2 groups of 5,000); 1x1x1x4 makes 33% "
        "fewer, its step 50 ms longer in dense products"
    )


def test_groups_across_nodes_get_the_network_bandwidth():
    hardware = MACHINES["a100"].hardware(GridShape.parse("1x2x2x2"), tf32=False)
    # rank 0's groups: x {0, 1} and y {0, 2} in node 0-3; z {0, 4} and the TP grid span two
    assert hardware.bandwidth == {"x": 150e9, "y": 150e9, "z": 25e9, "tp": 25e9, "dp": 150e9}
    assert hardware.gemm_flops == 19.5e12


def test_grids_that_do_not_fit_a_rank_are_marked_and_ranked_last():
    def held(spec: str) -> float:  # a group draws its share of the batch
        shape = GridShape.parse(spec)
        work = dataclasses.replace(WORK, batch_size=math.ceil(WORK.batch_size / shape.dp))
        return sum(memory_bytes(work, shape).values())

    sizes = {s: held(s) for s in _every_shape(8)}
    capacity = sorted(sizes.values())[len(sizes) // 2] / 0.9  # about half the grids fit
    small = Machine("a100", 4, 150e9, 25e9, 15e-6, 19.5e12, 156e12, 1.55e12, capacity)
    plans = rank_grids(WORK, 8, small, tf32=True)
    fitting = {s for s, size in sizes.items() if size <= 0.9 * capacity}
    assert 0 < len(fitting) < len(sizes)
    assert [str(p.grid) in fitting for p in plans] == sorted(
        (s in fitting for s in sizes), reverse=True
    )
    lines = plan_lines(plans, WORK, small, top=len(plans))
    rows = {line.split()[1]: line for line in lines[1 : 1 + len(plans)]}
    for spec, row in rows.items():
        assert row.endswith("yes") == (spec in fitting), row
        assert ("NO (over" in row) == (spec not in fitting), row


def test_plan_answers_for_8_and_512_gpus(capsys):
    for gpus, shapes in ((8, 20), (512, 220)):
        start = time.perf_counter()
        assert main(["plan", "--config", "yaml/synthetic.yaml", "--gpus", str(gpus)]) == 0
        assert time.perf_counter() - start < 10
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith(f"{gpus} a100 GPUs (4 a node")
        assert lines[1] == "rates: published figures of the a100 (no --calibrate)"
        assert lines[2].startswith("synthetic: 20,000 vertices")
        assert [line.split()[0] for line in lines[4:14]] == [str(i) for i in range(1, 11)]
        assert lines[14] == f"  ... {shapes - 10} more grids"
        best, batch = lines[4].split()[1:3]
        assert lines[15].startswith(f"{best}: ") and "fewer" in lines[15]
        batch = batch.replace(",", "")
        assert lines[17] == f"train the first: --grid {best} --set sampling.batch_size={batch}"


def test_plan_refuses_no_ranks_in_one_line(capsys):
    assert main(["plan", "--gpus", "0"]) == 2
    assert capsys.readouterr().err == (
        "scalegnn: error: --gpus: got 0; give the number of ranks, 1 to 65,536\n"
    )


def test_a_graph_file_is_measured_and_its_derived_settings_planned(tmp_path, capsys):
    graph = random_dataset().graph
    path = tmp_path / "graph.bin"
    dgl.save_graphs(str(path), [graph])
    src, dst = (t.numpy() for t in graph.edges())
    nnz = gcn_normalize(src, dst, graph.num_nodes()).nnz
    overrides = ["data.name=dgl", f"data.path={path}"]
    argv = ["plan", "--set", overrides[0], "--set", overrides[1], "--gpus", "2", "--gpu", "cpu"]
    assert main(argv) == 0
    graph_line = capsys.readouterr().out.splitlines()[2]
    shape = GraphShape(97, nnz, 11, 5)
    available = machine("cpu", 2).rank_memory
    resolved = apply_graph_defaults(load_config(None, overrides), shape, int(available))[0]
    assert resolved.sampling.batch_size == 97  # a small graph trains full-batch
    assert graph_line == (
        f"dgl: 97 vertices, {nnz:,} adjacency entries, 11 features, 5 classes ({path}); "
        f"batch 97, {resolved.model.layers} layers of {resolved.model.hidden}"
    )


def test_where_no_shape_fits_the_one_nearest_to_fitting_leads():
    """Ranked by speed alone, 8 data-parallel ranks (each holding the whole graph)
    would lead a graph too large for every shape: the first run to be killed."""
    tiny = dataclasses.replace(MACHINES["a100"], rank_memory=1e6)
    plans = rank_grids(WORK, 8, tiny, tf32=True)
    assert not any(plan.fits for plan in plans)
    memory = [plan.memory for plan in plans]
    assert memory == sorted(memory)
    fitting = rank_grids(WORK, 8, MACHINES["a100"], tf32=True)
    assert all(plan.fits for plan in fitting)
    assert [p.step_s for p in fitting] == sorted(p.step_s for p in fitting)
    assert str(fitting[0].grid) != str(plans[0].grid)  # the switch changed the leader


@contextlib.contextmanager
def _within(seconds: int):
    """Fail (TimeoutError) instead of hanging if the block runs longer than ``seconds``."""

    def late(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_plan_refuses_more_ranks_than_its_maximum_in_one_line(capsys):
    for gpus in (3656158440062976, 1_000_000_000, MAX_PLAN_RANKS + 1):
        with _within(10):
            assert main(["plan", "--gpus", str(gpus)]) == 2
        assert capsys.readouterr().err == (
            f"scalegnn: error: --gpus: got {gpus:,}; give the number of ranks, 1 to 65,536\n"
        )


def test_plan_refuses_a_top_below_one(capsys):
    for top in (-1, 0):
        assert main(["plan", "--gpus", "8", "--top", str(top)]) == 2
        assert capsys.readouterr().err == (
            f"scalegnn: error: --top: got {top}; give how many grids to list, at least 1\n"
        )


def test_the_shapes_of_many_ranks_are_enumerated_and_costed_in_bounded_time():
    """2**40 ranks have C(43, 3) shapes (the exponents of the four axes sum to 40); their
    enumeration takes the divisors up to the square root, not every number below. A
    shape of 262,144 ranks is costed without a loop over its TP grid."""
    with _within(10):
        shapes = grid_shapes(2**40)
    assert len(shapes) == len({str(s) for s in shapes}) == math.comb(43, 3)
    assert all(s.world_size == 2**40 for s in shapes)
    start = time.perf_counter()
    plan = plan_grid(WORK, GridShape(1, 64, 64, 64), MACHINES["a100"], tf32=True)
    assert time.perf_counter() - start < 2 and plan.step_bytes["tp"] > 0


def test_plan_into_a_reader_that_left_ends_quietly(tmp_path):
    """`scalegnn plan ... | head -1`: head leaves after its line; plan must end without a
    BrokenPipeError trace, as a tool that SIGPIPE ends (exit code 141)."""
    read, write = os.pipe()
    os.close(read)  # the reader has left before plan writes
    try:
        result = subprocess.run(
            [str(VENV_BIN / "scalegnn"), "plan", "--gpus", "8"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (BROKEN_PIPE_EXIT_CODE, "")
