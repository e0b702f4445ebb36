"""``scalegnn prepare --out DIR`` never removes what it did not write: a directory holding
anything else is refused, a prepared directory is replaced only by a whole new one (a
failure midway keeps the old), two preparations into one target take turns, and a file
system that does not take the files is said in one line."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from pathlib import Path

from dgl_scalegnn.cli import main as cli_main
from dgl_scalegnn.data import streaming
from dgl_scalegnn.data.prepared import verify_prepared
from dgl_scalegnn.errors import RESOURCE_EXIT_CODE
from tests.ranks import spawn_ranks, start_ranks


def _prepare(out: Path, seed: int = 4) -> list[str]:
    """``scalegnn prepare`` of a 2,000-vertex synthetic graph (permutation ``seed``)."""
    return [
        "prepare",
        "--dataset",
        "synthetic",
        "--set",
        "data.synthetic.num_nodes=2000",
        "--set",
        "data.synthetic.num_features=8",
        "--set",
        f"data.permutation_seed={seed}",
        "--out",
        str(out),
    ]


def _digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def _seed_of(directory: Path) -> int:
    return json.loads((directory / "meta.json").read_text())["permutation_seed"]


def _siblings(directory: Path) -> list[str]:
    """What a preparation into ``directory`` left beside it (hidden staging, locks)."""
    return sorted(
        p.name for p in directory.parent.iterdir() if p.name.startswith(f".{directory.name}")
    )


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalegnn: error: "), err
    return lines[0]


def test_a_directory_holding_what_no_preparation_writes_is_refused_and_kept(tmp_path, capsys):
    """Probe 1: ``--out`` on the user's directory (``~``, ``/scratch/$USER``)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "important.txt").write_text("keep\n")
    assert cli_main(_prepare(home)) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(home) in line and "important.txt" in line
    assert sorted(p.name for p in home.iterdir()) == ["important.txt"]
    assert (home / "important.txt").read_text() == "keep\n"

    # a file; and a prepared directory someone added a file to
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    assert cli_main(_prepare(notes)) == 2
    assert str(notes) in _one_error_line(capsys.readouterr().err)
    assert notes.read_text() == "mine\n"
    graph = tmp_path / "graph"
    assert cli_main(_prepare(graph)) == 0
    (graph / "README").write_text("how I made it\n")
    before = _digests(graph)
    capsys.readouterr()
    assert cli_main(_prepare(graph, seed=5)) == 2
    assert "'README'" in _one_error_line(capsys.readouterr().err)
    assert _digests(graph) == before
    assert _siblings(home) == _siblings(graph) == []


def test_a_prepared_directory_is_replaced_whole_or_kept(tmp_path, monkeypatch, capsys):
    """Probe 1: ours is replaced by the new preparation; a disk that fills up while the
    new one is written, or while it is put in place, leaves the old one whole."""
    graph = tmp_path / "graph"
    assert cli_main(_prepare(graph, seed=4)) == 0
    assert cli_main(_prepare(graph, seed=5)) == 0
    assert _seed_of(graph) == 5 and verify_prepared(graph).num_nodes == 2000
    before = _digests(graph)
    capsys.readouterr()

    write_at = streaming._write_at
    full_disk = {
        "No space left on device": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        "a write stopped short": OSError("65536 requested and 27632 written"),  # NumPy's
    }
    for said, failure in full_disk.items():

        def fill_up_at_the_features(path: Path, offset, array, failure=failure) -> None:
            if path.name == "features.npy":
                raise failure
            write_at(path, offset, array)

        monkeypatch.setattr(streaming, "_write_at", fill_up_at_the_features)
        assert cli_main(_prepare(graph, seed=6)) == RESOURCE_EXIT_CODE
        line = _one_error_line(capsys.readouterr().err)
        assert said in line and str(graph) in line
        assert _digests(graph) == before
        assert _siblings(graph) == []
    monkeypatch.undo()

    rename = os.rename

    def no_room_for_the_new_entry(source, destination, *args, **kwargs) -> None:
        meta = Path(source) / "meta.json"
        if Path(destination) == graph and meta.is_file() and _seed_of(Path(source)) == 6:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(destination))
        rename(source, destination, *args, **kwargs)

    monkeypatch.setattr(os, "rename", no_room_for_the_new_entry)
    assert cli_main(_prepare(graph, seed=6)) == RESOURCE_EXIT_CODE
    _one_error_line(capsys.readouterr().err)
    assert _digests(graph) == before
    assert _siblings(graph) == []


def test_a_read_only_target_is_said_in_one_line(tmp_path, monkeypatch, capsys):
    """Probe 11: ``--out`` on a read-only file system (its errors injected at the system
    calls: the tests may run as root, whom permissions do not stop)."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    mkdir, open_ = os.mkdir, os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def inside(path) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(read_only)

    def read_only_mkdir(path, *args, **kwargs):
        if inside(path) and not os.path.exists(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return mkdir(path, *args, **kwargs)

    def read_only_open(path, flags, *args, **kwargs):
        if inside(path) and flags & writes:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return open_(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only_mkdir)
    monkeypatch.setattr(os, "open", read_only_open)
    assert cli_main(_prepare(read_only / "graph")) == RESOURCE_EXIT_CODE
    line = _one_error_line(capsys.readouterr().err)
    assert "Read-only file system" in line and str(read_only / "graph") in line
    assert list(read_only.iterdir()) == []


def _wait_until(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout} s"
        time.sleep(0.05)


def test_two_prepares_into_one_target_take_turns(tmp_path):
    """Probe 11: a preparation started while another writes the same target waits for it,
    then puts its own in place: both succeed, the later one's graph is what stays, and
    it verifies (before, the first removed the second's directory to install its own)."""
    graph = tmp_path / "graph"
    paused, go_on = tmp_path / "paused", tmp_path / "go-on"
    first_args = [_prepare(graph, seed=4), str(paused), str(go_on)]
    with start_ranks(
        1, "tests.workers.paused_prepare:main", first_args, tmp_path / "first"
    ) as first:
        _wait_until(paused.exists, "paused midway")
        with start_ranks(
            1, "dgl_scalegnn.cli:main", [_prepare(graph, seed=5)], tmp_path / "second"
        ) as second:
            _wait_until(
                lambda: "waiting for" in second.output(0) or not second.processes[0].is_alive(),
                "waiting or done",
            )
            go_on.touch()
            (_, [(first_code, first_output)]) = first.wait(120)
            (_, [(second_code, second_output)]) = second.wait(120)
    assert first_code == 0, first_output
    assert second_code == 0, second_output
    assert "Traceback" not in first_output + second_output
    assert _seed_of(graph) == 5
    assert verify_prepared(graph).num_nodes == 2000
    assert f"waiting for another preparation into {graph}" in second_output
    assert _siblings(graph) == []


def test_every_rank_of_a_parallel_prepare_follows_rank_0s_refusal(tmp_path):
    """``mpirun -np 2 scalegnn prepare --out`` the user's directory: refused once, by rank
    0, every rank exits 2 and the directory is kept."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "important.txt").write_text("keep\n")
    results = spawn_ranks(
        2,
        "dgl_scalegnn.cli:main",
        [_prepare(home)],
        tmp_path / "ranks",
        timeout=120,
        expect_failure=True,
    )
    assert [code for code, _ in results] == [2, 2], results
    said = [output for _, output in results if "important.txt" in output]
    assert len(said) == 1 and "Traceback" not in "".join(output for _, output in results)
    assert sorted(p.name for p in home.iterdir()) == ["important.txt"]
    assert _siblings(home) == []
