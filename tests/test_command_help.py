"""The commands for looking at runs, choosing a grid and taking a model away explain
themselves: a description and a runnable example in each --help."""

from __future__ import annotations

import pytest

from dgl_scalegnn.cli import main

COMMANDS = ("plan", "report", "export", "predict")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_a_description_and_an_example(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    usage, description, *_ = text.split("\n\n")
    assert usage.startswith(f"usage: scalegnn {command}")
    assert len(description.split()) >= 20, description  # a paragraph, not a label
    assert "\nexample:\n  scalegnn " in text
    assert f"  scalegnn {command} " in text.split("\nexample:\n")[1]


def test_top_level_help_lists_them(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    for command in COMMANDS:
        assert f"    {command} " in listed
