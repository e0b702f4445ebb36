"""The README and docs/results.md as a user follows them.

- The Python examples of the README and of docs/dgl.md run as written.
- Every command they show is accepted as printed: ``scalegnn`` lines by the CLI's own
  parser, ``make`` targets by the Makefile, the launch scripts with a process count that
  is the grid's product and options that ``scalegnn train`` takes, ``python -m`` modules
  that exist.
- ``scalegnn plan``'s example prints the lines the README shows.
- Their links lead to a file and, with an anchor, to a heading there, as do the links of
  every doc into them; the README stays one page (at most 150 lines).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import re
import shlex
from pathlib import Path

import pytest

from dgl_scalegnn.cli import _parser, main
from tests.helpers import ROOT

#: The pages whose commands are checked: the README and the page its findings moved to.
COMMAND_PAGES = ("README.md", "docs/results.md")
README_MAX_LINES = 150
_FENCED = re.compile(r"```(\w*)\n(.*?)```", flags=re.DOTALL)


def _text(page: str) -> str:
    return (ROOT / page).read_text()


def _blocks(page: str, language: str) -> list[str]:
    return [body for lang, body in _FENCED.findall(_text(page)) if lang == language]


def _commands(page: str) -> list[list[str]]:
    """The shell commands of a page's ``bash`` blocks (continued lines joined, comments
    dropped) and of its inline ``make ...`` spans, each as its words."""
    lines = []
    for block in _blocks(page, "bash"):
        lines += block.replace("\\\n", " ").splitlines()
    prose = _FENCED.sub("", _text(page))
    lines += re.findall(r"`(make [^`]+)`", prose)
    return [words for words in (shlex.split(line, comments=True) for line in lines) if words]


def _make_targets() -> set[str]:
    makefiles = [ROOT / "Makefile"]
    makefiles += [ROOT / m for m in re.findall(r"^include (\S+)", _text("Makefile"), re.M)]
    return {t for f in makefiles for t in re.findall(r"^([\w-]+):", f.read_text(), re.M)}


def _parses(argv: list[str]) -> None:
    """``scalegnn`` accepts ``argv`` (argparse exits 2, naming the problem, if not)."""
    _parser().parse_args(argv)


def _check_launch(words: list[str], sbatch_options: list[str]) -> None:
    """``launch/X.sh [NP] GRID CONFIG [train options]``: the script exists, NP (for
    ``srun.sh``, sbatch's nodes times the tasks its ``#SBATCH`` lines ask a node) is the
    grid's product, a shipped config exists, and the options are ``scalegnn train``'s."""
    script, *args = words
    assert (ROOT / script).is_file(), script
    if script == "launch/srun.sh":
        tasks = re.search(r"--ntasks-per-node=(\d+)", _text(script))
        nodes = re.search(r"--nodes=(\d+)", " ".join(sbatch_options))
        processes = int(nodes.group(1)) * int(tasks.group(1))
        grid, config, *options = args
    else:
        processes, grid, config, *options = args
    assert int(processes) == math.prod(int(g) for g in grid.split("x")), words
    if config.endswith(".py"):  # a loop of the user's: the script's own options
        assert (ROOT / config).is_file(), config
        return
    if config.startswith("yaml/"):
        assert (ROOT / config).is_file(), config
    _parses(["train", "--config", config, "--grid", grid, *options])


def _check(words: list[str]) -> None:
    program, *args = words
    if program == "sbatch":
        options = list(itertools.takewhile(lambda a: a.startswith("--"), args))
        _check_launch(args[len(options) :], options)
    elif program.endswith("bin/scalegnn") or program == "scalegnn":
        _parses(args)
    elif program == "make":
        target = next(a for a in args if "=" not in a)
        assert target in _make_targets(), f"make {target}: no such target"
    elif program.startswith("launch/"):
        _check_launch(words, [])
    elif program.endswith("bin/python") and args[0] == "-m":
        assert importlib.util.find_spec(args[1]) is not None, args[1]
    elif program == "export":  # a variable for the next command
        assert all("=" in a for a in args), words
    else:
        raise AssertionError(f"{' '.join(words)}: a kind of command this test cannot check")


@pytest.mark.parametrize("page", ["README.md", "docs/dgl.md"])
def test_python_examples_run(page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the examples write files (graph.bin)
    blocks = _blocks(page, "python")
    assert blocks, f"{page} has no Python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, page, "exec"), namespace)
        if "loss" in namespace:  # a training loop ran at least one step to a finite loss
            assert bool(namespace["loss"].isfinite())


@pytest.mark.parametrize("page", COMMAND_PAGES)
def test_every_command_is_accepted_as_printed(page):
    commands = _commands(page)
    assert commands, f"{page} shows no command"
    for words in commands:
        _check(words)


def test_a_mistyped_command_is_caught():
    """The checks above are not vacuous: an unknown option, target or process count fails."""
    for words in (
        [".venv/bin/scalegnn", "train", "--data", "graph.bin", "--epochs", "3"],
        ["make", "bench-grow"],
        ["launch/mpirun.sh", "4", "1x2x2x2", "yaml/synthetic.yaml"],
    ):
        with pytest.raises((AssertionError, SystemExit)):
            _check(words)


def test_the_plan_example_prints_what_the_readme_shows(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # its config is named from the checkout
    (example,) = [b for b in _blocks("README.md", "") if b.startswith("$ .venv/bin/scalegnn plan")]
    command, *shown = example.splitlines()
    assert main(shlex.split(command)[2:]) == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    for line in shown:
        if line != "...":
            assert line.rstrip() in printed, f"the README shows {line!r}; plan printed {printed}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", _FENCED.sub("", page.read_text()), re.M)
    return {_slug(h) for h in headings}


def _links(page: Path) -> list[tuple[Path, str]]:
    """Each relative link of a page (outside code), as the file it names and its anchor."""
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _FENCED.sub("", page.read_text())):
        if not re.match(r"\w+://", target):
            path, _, anchor = target.partition("#")
            found.append(((page.parent / path).resolve() if path else page, anchor))
    return found


def _check_link(page: Path, target: Path, anchor: str) -> None:
    where = f"{page.relative_to(ROOT)}: link to {target.relative_to(ROOT)}#{anchor}"
    assert target.exists(), where
    if anchor:
        assert anchor in _anchors(target), f"{where}: no such heading"


@pytest.mark.parametrize("page", COMMAND_PAGES)
def test_links_lead_somewhere(page):
    links = _links(ROOT / page)
    assert links, f"{page} has no link"
    for target, anchor in links:
        _check_link(ROOT / page, target, anchor)


def test_links_into_the_readme_and_results_lead_to_their_headings():
    """Other docs link to headings of these two pages: moving a section keeps them."""
    pages = {(ROOT / p).resolve() for p in COMMAND_PAGES}
    docs = [p for p in [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md")] if p.resolve() not in pages]
    checked = 0
    for page in docs:
        for target, anchor in _links(page):
            if target in pages:
                _check_link(page, target, anchor)
                checked += 1
    assert checked, "no doc links to the README or to docs/results.md"


def test_the_readme_is_one_page():
    lines = len(_text("README.md").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; findings go to docs/results.md"
