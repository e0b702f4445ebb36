"""Bounded-memory and parallel preparation, and the shared cache of training runs
without ``data.prepared``. The oracle is the in-memory preparation written by
``write_prepared``: every other path must give the same files, SHA-256 for SHA-256."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.config import DataConfig, SyntheticConfig
from dgl_scalegnn.core.grid_shape import GridShape
from dgl_scalegnn.data.cache import cache_directory, prepare_cached
from dgl_scalegnn.data.datasets import dataset_from_graph, file_identity
from dgl_scalegnn.data.prepared import open_prepared, prepare_in_memory, write_prepared
from dgl_scalegnn.data.source import source_from_dataset
from dgl_scalegnn.data.streaming import MemoryBudget, prepare_streaming
from dgl_scalegnn.data.synthetic import generate, synthetic_source
from dgl_scalegnn.distributed.watchdog import ABORT_EXIT_CODE
from dgl_scalegnn.errors import BAD_INPUT_EXIT_CODE
from tests.helpers import random_dataset
from tests.ranks import spawn_ranks
from tests.test_prepared import _independent_share

SYNTHETIC = SyntheticConfig(num_nodes=3000, num_features=12, seed=5)
#: A few KiB: dozens of row-tile groups and feature passes on these small graphs.
TINY = MemoryBudget(1 << 13)


def _digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def _reference(dataset, directory: Path, seed: int = 4, tile_count: int | None = None):
    return _digests(write_prepared(prepare_in_memory(dataset, seed, tile_count), directory))


def _multilabel_dataset():
    base = random_dataset(num_nodes=150, num_edges=700, seed=2).graph
    labels = torch.from_numpy(np.random.default_rng(0).random((150, 6)) < 0.3).float()
    base.ndata["label"] = labels
    return dataset_from_graph(base, "multi")


@pytest.mark.parametrize("budget", [TINY, MemoryBudget(1 << 30)], ids=["tiny", "ample"])
def test_budgeted_prepare_writes_the_in_memory_files(tmp_path, budget):
    cases = {
        "synthetic": (generate(SYNTHETIC), synthetic_source(SYNTHETIC)),
        "featureless": (
            generate(dataclasses.replace(SYNTHETIC, featureless=True)),
            synthetic_source(dataclasses.replace(SYNTHETIC, featureless=True)),
        ),
        "duplicates-and-loops": (random_dataset(num_nodes=200, num_edges=900), None),
        "multilabel": (_multilabel_dataset(), None),
    }
    for name, (dataset, source) in cases.items():
        expected = _reference(dataset, tmp_path / f"{name}-reference", tile_count=7)
        for kind, piece in (("dataset", source_from_dataset(dataset)), ("source", source)):
            if piece is None:
                continue
            _, out = prepare_streaming(
                piece, tmp_path / f"{name}-{kind}", 4, tile_count=7, budget=budget
            )
            assert _digests(out) == expected, (name, kind)


def test_small_budget_really_splits_the_work(tmp_path, monkeypatch):
    """The tiny budget must bucket the edges into many groups (or the test above proves
    nothing about bounded memory)."""
    from dgl_scalegnn.data import streaming

    merged = []
    merge = streaming._merge_group
    monkeypatch.setattr(
        streaming, "_merge_group", lambda group, *rest: merged.append(group) or merge(group, *rest)
    )
    meta, _ = prepare_streaming(synthetic_source(SYNTHETIC), tmp_path / "g", budget=TINY)
    assert len(merged) >= 20
    largest = max(b - a for a, b in merged)
    assert largest <= meta.tile_count // 10


def _cli_prepare(out: Path, *extra: str) -> list[str]:
    return [
        "prepare",
        "--dataset",
        "synthetic",
        "--set",
        f"data.synthetic.num_nodes={SYNTHETIC.num_nodes}",
        "--set",
        f"data.synthetic.num_features={SYNTHETIC.num_features}",
        "--set",
        f"data.synthetic.seed={SYNTHETIC.seed}",
        "--set",
        "data.permutation_seed=4",
        "--out",
        str(out),
        *extra,
    ]


def test_parallel_prepare_writes_the_one_process_files(tmp_path):
    expected = _reference(generate(SYNTHETIC), tmp_path / "reference")
    out = tmp_path / "parallel"
    spawn_ranks(
        3,
        "dgl_scalegnn.cli:main",
        [_cli_prepare(out, "--memory-gb", "0.00002")],
        tmp_path / "ranks",
        timeout=120,
    )
    assert _digests(out) == expected
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".parallel")]


def test_prepare_failing_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    out = tmp_path / "parallel"
    results = spawn_ranks(
        3,
        "tests.workers.fail_prepare:main",
        [_cli_prepare(out), 1],
        tmp_path / "ranks",
        timeout=120,
        expect_failure=True,
    )
    message = "rank 1 failed: OSError: no space left on device writing the features of rank 1"
    for rank, (code, output) in enumerate(results):
        assert code != 0, (rank, output[-2000:])
        if rank != 1:
            assert code == ABORT_EXIT_CODE, (rank, code, output[-2000:])
            assert message in output, (rank, output[-2000:])
    assert not out.exists()


# --- the cache of training runs -----------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _data_config(**synthetic) -> DataConfig:
    return DataConfig(
        name="synthetic",
        permutation_seed=4,
        synthetic=dataclasses.replace(SYNTHETIC, **synthetic),
    )


def test_cache_is_prepared_once_then_reused(cache_dir, tmp_path, capsys):
    cfg = _data_config()
    directory = prepare_cached(cfg, TINY)
    assert directory.parent.parent == cache_dir
    files = _digests(directory)
    del files["cache.json"]
    assert files == _reference(generate(SYNTHETIC), tmp_path / "reference")
    assert "preparing 'synthetic'" in capsys.readouterr().err
    stamp = (directory / "rows.npy").stat().st_mtime_ns
    assert prepare_cached(cfg, TINY) == directory
    assert "reusing" in capsys.readouterr().err
    assert (directory / "rows.npy").stat().st_mtime_ns == stamp
    # every setting that changes the bytes makes another directory
    assert cache_directory(_data_config()) == directory
    assert cache_directory(_data_config(seed=6)) != directory
    assert cache_directory(dataclasses.replace(cfg, permutation_seed=5)) != directory


def test_damaged_cache_is_rebuilt_and_a_changed_byte_is_refused_by_name(cache_dir, capsys):
    cfg = _data_config()
    directory = prepare_cached(cfg, TINY)
    features = directory / "features.npy"
    features.write_bytes(features.read_bytes()[:-64])  # truncated
    capsys.readouterr()
    prepare_cached(cfg, TINY)
    err = capsys.readouterr().err
    assert f"preparing {directory} again: damaged" in err and "features.npy" in err
    open_prepared(directory, checksum=True)  # whole again
    # A changed byte keeps every size: reuse it, and the rank reading it refuses it.
    values = directory / "values.npy"
    data = bytearray(values.read_bytes())
    data[-3] ^= 0xFF
    values.write_bytes(bytes(data))
    graph = open_prepared(prepare_cached(cfg, TINY))
    with pytest.raises(ValueError, match=r"values\.npy: bytes \d+-\d+ differ from their checksum"):
        graph.verify("values", 0, graph.meta.nnz)


def test_stale_and_interrupted_caches_are_rebuilt(cache_dir, tmp_path, capsys):
    path = tmp_path / "graph.bin"
    dataset = random_dataset()
    dgl.save_graphs(str(path), [dataset.graph], {"num_classes": torch.tensor([5])})
    cfg = DataConfig(name="dgl", path=str(path), permutation_seed=1, feature_norm="none")
    directory = prepare_cached(cfg, TINY)
    dataset = random_dataset(seed=9)  # the file is replaced by another graph
    dgl.save_graphs(str(path), [dataset.graph], {"num_classes": torch.tensor([5])})
    capsys.readouterr()
    assert prepare_cached(cfg, TINY) == directory
    assert "again: stale" in capsys.readouterr().err
    files = _digests(directory)
    del files["cache.json"]
    read = dataset_from_graph(dataset.graph, "dgl", 5)  # and the file it was read from:
    read = dataclasses.replace(read, source_file=file_identity(path))
    assert files == _reference(read, tmp_path / "ref", 1)
    (directory / "cache.json").unlink()  # as if the preparing rank died before the end
    prepare_cached(cfg, TINY)
    assert "interrupted" in capsys.readouterr().err


def test_eight_ranks_without_prepared_each_map_only_their_share(tmp_path):
    config = {
        "data": {"name": "synthetic", "synthetic": dataclasses.asdict(SYNTHETIC)},
        "model": {"layers": 3},
        "parallel": {"grid": "1x2x2x2"},
    }
    env = {"SCALEGNN_CACHE_DIR": str(tmp_path / "cache")}
    spawn_ranks(
        8, "tests.workers.rank_share:main", [config, str(tmp_path)], tmp_path / "r", env=env
    )
    reference = prepare_in_memory(generate(SYNTHETIC), 0)
    whole = sum(array.nbytes for array in reference.arrays().values())
    shape = GridShape.parse("1x2x2x2")
    directories = set()
    for rank in range(8):
        record = json.loads((tmp_path / f"share{rank}.json").read_text())
        share = _independent_share(reference, shape, rank, layers=3)
        expected = share["adjacency_bytes"] + share["vertex_bytes"]
        assert record["memory_mapped"], rank
        assert record["entries"] == share["entries"], rank
        assert record["bytes_read"] <= 1.25 * expected, (rank, record, expected)
        assert record["bytes_read"] < 0.5 * whole, rank
        directories.add(record["directory"])
    assert len(directories) == 1
    assert Path(directories.pop()).parent.parent == tmp_path / "cache"


def test_failure_while_preparing_is_said_once_and_stops_the_waiting_ranks(tmp_path):
    """Bad input found by the preparing rank: it says so in one line; the ranks it stops
    exit with the same code (2) without repeating it."""
    missing = tmp_path / "no-such-graph.bin"
    config = {"data": {"name": "dgl", "path": str(missing)}, "parallel": {"grid": "1x1x1x3"}}
    env = {"SCALEGNN_CACHE_DIR": str(tmp_path / "cache")}
    results = spawn_ranks(
        3,
        "tests.workers.rank_share:main",
        [config, str(tmp_path)],
        tmp_path / "r",
        env=env,
        timeout=120,
        expect_failure=True,
    )
    message = f"dataset 'dgl': file {str(missing)!r} does not exist"
    assert results[0][0] != 0 and message in results[0][1]  # a worker: no CLI, no code 2
    for rank in (1, 2):
        assert results[rank] == (BAD_INPUT_EXIT_CODE, ""), (rank, results[rank][1][-2000:])
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
