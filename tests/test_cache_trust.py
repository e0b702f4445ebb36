"""Nothing in the cache runs unless this user made it, and bad input is one line.

The cache directories are private (0700 whatever the umask; another user's or a
group-writable one is refused); a planted kernel library or DGL pickle never runs (their
code writes a marker file, which must not appear); a prepared directory swapped for
another is prepared again; a killed preparation's staging directory is removed by the
next run; a file that is not a DGL graph and NaN or infinite features are refused with
one line that names the file or the vertex.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dgl_scalegnn import native
from dgl_scalegnn._dgl import dgl
from dgl_scalegnn.cli import main
from dgl_scalegnn.config import ConfigError, DataConfig, SyntheticConfig
from dgl_scalegnn.data.cache import cache_directory, cache_problem, prepare_cached
from dgl_scalegnn.data.datasets import dataset_from_graph, load_dataset
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.data.prepared import (
    array_entry,
    open_prepared,
    prepare_in_memory,
    write_prepared,
)
from dgl_scalegnn.data.source import source_from_dataset
from dgl_scalegnn.data.streaming import MemoryBudget, prepare_streaming
from dgl_scalegnn.data.synthetic import generate
from dgl_scalegnn.parallel import cpu_kernels
from tests.helpers import ROOT, SHARED_DATA, random_dataset

TINY = MemoryBudget(1 << 13)


def synthetic_config(seed: int = 5) -> DataConfig:
    """A small synthetic graph (also built by the child process of the staging test)."""
    synthetic = SyntheticConfig(num_nodes=3000, num_features=12, seed=seed)
    return DataConfig(name="synthetic", permutation_seed=4, synthetic=synthetic)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def cora_root(tmp_path) -> Path:
    """Cora's raw Planetoid files, copied (not linked) into a data root of this test."""
    root = tmp_path / "data"
    shutil.copytree(SHARED_DATA / "planetoid", root / "planetoid")
    return root


@pytest.fixture
def fresh_kernels(monkeypatch):
    """cpu_kernels as in a new process: the next load() builds or reuses from the cache."""
    monkeypatch.setattr(cpu_kernels.LIBRARY, "_library", None)
    monkeypatch.setattr(cpu_kernels.LIBRARY, "failure", None)

    def reload():
        cpu_kernels.LIBRARY._library = cpu_kernels.LIBRARY.failure = None
        return cpu_kernels.LIBRARY.load()

    return reload


class _WritesMarker:
    """Unpickling this object writes ``path``: the code a planted pickle would run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.path)!r}, 'w').write('ran')",)


def _modes(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root.parent)): f"{path.stat().st_mode & 0o7777:04o}"
        for path in [root, *root.rglob("*")]
        if path.is_dir() and not path.is_symlink()
    }


def _kernels_compute() -> bool:
    x = torch.tensor([[3.0, -4.0], [1.0, 2.0]])
    out = torch.empty(2, 1)
    cpu_kernels.row_square_sums(x, out)
    return torch.equal(out, torch.tensor([[25.0], [5.0]]))


# ----------------------------------------------------------------- private directories


def test_every_cache_directory_is_created_0700_whatever_the_umask(cache, cora_root, fresh_kernels):
    previous = os.umask(0)  # mkdir's default would make them 0777
    try:
        prepare_cached(synthetic_config(), TINY)
        load_dataset(DataConfig(name="cora", root=str(cora_root)))
        assert fresh_kernels() is not None
    finally:
        os.umask(previous)
    modes = _modes(cache)
    assert {"cache/prepared", "cache/kernels", "cache/cora"} <= set(modes)
    assert len(modes) >= 7  # the prepared graph, DGL's staged directories too
    assert set(modes.values()) == {"0700"}, modes


def test_a_shared_or_foreign_cache_directory_is_refused_naming_it(cache, monkeypatch):
    cfg = synthetic_config()
    cache.mkdir(mode=0o700)
    (cache / "prepared").mkdir(mode=0o700)
    for directory, mode in ((cache, 0o1777), (cache / "prepared", 0o770)):
        directory.chmod(mode)
        with pytest.raises(ConfigError) as refused:
            prepare_cached(cfg, TINY)
        message = str(refused.value)
        assert f"{str(directory)!r} is writable by its group or others (mode {mode:04o})" in message
        assert f"chmod -R go-w {directory}" in message and "SCALEGNN_CACHE_DIR" in message
        assert not list(cache.rglob("*.npy")), "nothing may be written into it"
        directory.chmod(0o700)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    with pytest.raises(ConfigError, match=rf"belongs to uid {uid}, not to you \(uid {uid + 1}\)"):
        prepare_cached(cfg, TINY)


# ----------------------------------------------------------------- native kernels


def _planted_library(tmp_path: Path, marker: Path) -> bytes:
    """A shared library whose constructor writes ``marker`` when it is loaded."""
    source = tmp_path / "planted.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'    FILE *f = fopen("{marker}", "w");\n'
        '    if (f) { fputs("ran", f); fclose(f); }\n'
        "}\n"
    )
    library = tmp_path / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library.read_bytes()


def _load_kernels_in_a_new_process(cache: Path) -> subprocess.CompletedProcess:
    """A new process (a library is loaded once per process and path) loads the kernels
    and computes with them; its log lines go to its stderr."""
    code = (
        "import torch\n"
        "from dgl_scalegnn.parallel import cpu_kernels\n"
        "assert cpu_kernels.LIBRARY.load() is not None, cpu_kernels.LIBRARY.failure\n"
        "out = cpu_kernels.row_square_sums(torch.tensor([[3.0, -4.0]]), torch.empty(1, 1))\n"
        "assert out.item() == 25.0, out\n"
    )
    env = {**os.environ, "SCALEGNN_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def built_kernels(tmp_path_factory) -> Path:
    """A cache directory with the kernels built once (by a new process), for the tests
    that tamper with a build rather than make one."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    built = _load_kernels_in_a_new_process(cache)
    assert built.returncode == 0, built.stderr
    return cache


def _with_kernels(cache: Path, built: Path) -> None:
    """``built``'s kernels in ``cache``, as if this cache had built them (modes kept)."""
    cache.mkdir(mode=0o700)
    shutil.copytree(built / "kernels", cache / "kernels")


def test_a_planted_kernel_library_never_runs_and_the_kernels_are_rebuilt(
    cache, tmp_path, built_kernels
):
    _with_kernels(cache, built_kernels)  # the real build, at its predictable name
    marker = tmp_path / "planted-ran"
    planted = _planted_library(tmp_path, marker)
    names = [path for path in (cache / "kernels").iterdir() if path.suffix == ".so"]
    assert names
    for path in names:  # the same names, owner and mode: only the bytes differ
        path.write_bytes(planted)
    result = _load_kernels_in_a_new_process(cache)
    assert not marker.exists(), "the planted library's constructor ran"
    assert result.returncode == 0, result.stderr
    assert "building the native CPU kernels again: the SHA-256 of" in result.stderr
    assert str(cache / "kernels") in result.stderr


def test_a_kernel_library_others_could_write_is_rebuilt_saying_why(
    cache, fresh_kernels, caplog, monkeypatch, built_kernels
):
    _with_kernels(cache, built_kernels)
    assert fresh_kernels() is not None
    (library,) = (cache / "kernels").glob("*.so")
    library.chmod(0o775)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert fresh_kernels() is not None
    assert f"{library} is writable by its group or others (mode 0775)" in caplog.text
    assert library.stat().st_mode & 0o777 == 0o700  # the rebuilt one
    assert _kernels_compute()
    # A library of another user (the cache directory itself passes: checked above)
    caplog.clear()
    uid = os.geteuid()
    monkeypatch.setattr(native, "default_cache_dir", lambda *parts: cache / "kernels")
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert fresh_kernels() is not None
    assert f".json belongs to uid {uid}, not to you (uid {uid + 1})" in caplog.text


def test_kernels_in_a_directory_others_could_write_are_not_loaded(
    cache, fresh_kernels, caplog, built_kernels
):
    _with_kernels(cache, built_kernels)
    assert fresh_kernels() is not None
    (cache / "kernels").chmod(0o777)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert fresh_kernels() is None
    assert "native CPU kernels unavailable, running eager kernels" in caplog.text
    assert f"{str(cache / 'kernels')!r} is writable by its group or others" in caplog.text


# ----------------------------------------------------------------- DGL's processed pickles


def test_a_planted_dgl_pickle_is_never_unpickled(cache, cora_root, tmp_path, monkeypatch):
    cfg = DataConfig(name="cora", root=str(cora_root))
    assert load_dataset(cfg).num_nodes == 2708  # DGL writes its processed files
    (processed,) = cache.glob("cora/*/cora_v2_*/*.pkl")
    marker = tmp_path / "pickle-ran"
    processed.write_bytes(pickle.dumps(_WritesMarker(marker)))
    fingerprint = processed.parent.parent
    fingerprint.chmod(0o777)  # as if the cache were shared: anyone could have put it there
    with pytest.raises(ConfigError, match=rf"{fingerprint}'? is writable by its group"):
        load_dataset(cfg)
    assert not marker.exists(), "DGL unpickled the planted file"
    fingerprint.chmod(0o700)
    uid = os.geteuid()
    with monkeypatch.context() as patch:  # a cache directory of another user
        patch.setattr(os, "geteuid", lambda: uid + 1)
        with pytest.raises(ConfigError, match="not to you"):
            load_dataset(cfg)
    assert not marker.exists(), "DGL unpickled the planted file"


# ----------------------------------------------------------------- prepared directories


def test_a_swapped_prepared_directory_is_refused_and_prepared_again(cache, capsys):
    ours, other = synthetic_config(seed=5), synthetic_config(seed=6)
    directory = prepare_cached(ours, TINY)
    elsewhere = prepare_cached(other, TINY)
    record = (directory / "cache.json").read_text()
    shutil.rmtree(directory)
    shutil.copytree(elsewhere, directory)  # a sound prepared graph, its own meta.json
    (directory / "cache.json").write_text(record)  # and a cache.json valid for ours
    assert open_prepared(directory, checksum=True).meta.num_nodes == 3000
    problem = cache_problem(directory, ours)
    assert problem.startswith("replaced: its meta.json or cache.json differs from the SHA-256")
    assert str(cache / "prepared" / f"{directory.name}.sha256") in problem
    capsys.readouterr()
    assert prepare_cached(ours, TINY) == directory
    assert f"preparing {directory} again: replaced" in capsys.readouterr().err
    expected = prepare_in_memory(generate(ours.synthetic), ours.permutation_seed)
    assert np.array_equal(open_prepared(directory).features, expected.features)
    assert cache_problem(directory, ours) is None


def test_the_staging_directory_of_a_killed_preparation_is_removed_next_time(
    cache, tmp_path, capsys
):
    ready = tmp_path / "writing-features"
    child = (
        "import sys, time\n"
        "from dgl_scalegnn.data import streaming\n"
        "from dgl_scalegnn.data.cache import prepare_cached\n"
        "from tests.test_cache_trust import TINY, synthetic_config\n"
        "def stall(*args, **kwargs):\n"
        f"    open({str(ready)!r}, 'w').close()\n"
        "    time.sleep(600)\n"
        "streaming._write_features = stall\n"
        "prepare_cached(synthetic_config(), TINY)\n"
    )
    env = {**os.environ, "SCALEGNN_CACHE_DIR": str(cache)}
    process = subprocess.Popen([sys.executable, "-c", child], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), f"the preparing process did not get to its features ({process})"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    directory = cache_directory(synthetic_config())
    (staging,) = directory.parent.glob(f".{directory.name}.*")
    assert any(staging.iterdir())
    capsys.readouterr()
    prepare_cached(synthetic_config(), TINY)
    err = capsys.readouterr().err
    assert f"removed {staging} (" in err and "left by a preparation" in err
    assert not staging.exists()
    assert [path.name for path in directory.parent.iterdir() if path.name.startswith(".")] == []
    assert cache_problem(directory, synthetic_config()) is None


# ----------------------------------------------------------------- bad input, one line


def _train_refuses_in_one_line(path: Path, capsys) -> str:
    """``scalegnn train`` on the ``dgl`` file ``path``: exit code 2 and one line."""
    overrides = ["--set", "data.name=dgl", "--set", f"data.path={path}", "--set", "train.epochs=1"]
    capsys.readouterr()
    assert main(["train", *overrides]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalegnn: error: "), lines
    message = lines[0].removeprefix("scalegnn: error: ")
    assert "Stack trace" not in message and ".cc:" not in message
    return message


def _not_a_dgl_file(path: Path, capsys) -> str:
    with pytest.raises(DatasetError) as refused:
        load_dataset(DataConfig(name="dgl", path=str(path)))
    message = str(refused.value)
    assert str(path) in message and "dgl.save_graphs" in message
    assert _train_refuses_in_one_line(path, capsys) == message
    return message


def test_a_file_that_is_not_a_dgl_graph_is_refused_in_one_line(tmp_path, capsys):
    good = tmp_path / "graph.bin"
    dgl.save_graphs(str(good), [random_dataset().graph])
    files = {
        "random": np.random.default_rng(0).bytes(4096),
        "text": b"feat,label\n1.0,2\n",
        "empty": b"",
    }
    for name, data in files.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(data)
        assert "is not a DGL graph file" in _not_a_dgl_file(path, capsys), name
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(good.read_bytes()[:200])  # DGL's magic number, then too little
    assert "is not a readable DGL graph file" in _not_a_dgl_file(truncated, capsys)


def _graph_with_non_finite_features():
    dataset = random_dataset(num_nodes=60, num_edges=200)
    feat = dataset.graph.ndata["feat"].double()
    feat[41, 2] = float("nan")
    feat[17, 0] = float("inf")
    feat[23, 5] = 1e300  # finite in float64, infinite as the float32 it is stored as
    dataset.graph.ndata["feat"] = feat
    return dataset


def test_non_finite_features_are_refused_by_every_preparation(tmp_path, capsys):
    dataset = _graph_with_non_finite_features()
    expected = "NaN or infinite features in 3 vertices (the first: vertex 17)"
    with pytest.raises(DatasetError, match=re.escape(f"dataset 'random': {expected};")):
        prepare_in_memory(dataset)
    with pytest.raises(DatasetError, match=re.escape(f"dataset 'random': {expected};")):
        prepare_streaming(source_from_dataset(dataset), tmp_path / "streamed", budget=TINY)
    assert not (tmp_path / "streamed").exists()
    path = tmp_path / "nan.bin"
    dgl.save_graphs(str(path), [dataset.graph])
    assert f"dataset 'dgl': {expected};" in _train_refuses_in_one_line(path, capsys)


def test_non_finite_features_of_a_prepared_directory_are_refused_by_the_rank_reading_them(
    tmp_path,
):
    dataset = dataset_from_graph(random_dataset(num_nodes=60, num_edges=200).graph, "random")
    graph = prepare_in_memory(dataset, permutation_seed=3)
    directory = write_prepared(graph, tmp_path / "prepared")
    # As another tool, or a version without the check, would have written it: NaN at
    # original vertex 29, with checksums that match the bytes.
    features = np.load(directory / "features.npy")
    features[graph.permutation[29], 1] = np.nan
    np.save(directory / "features.npy", features)
    meta = json.loads((directory / "meta.json").read_text())
    meta["files"]["features"] = array_entry(directory / "features.npy")
    (directory / "meta.json").write_text(json.dumps(meta))
    opened = open_prepared(directory, checksum=True)  # sizes and checksums all match
    new = int(graph.permutation[29])
    with pytest.raises(
        DatasetError,
        match=r"features\.npy: NaN or infinite features in 1 vertex among those this process "
        r"reads \(the first: vertex 29\)",
    ):
        opened.verify("features", new, new + 1)
