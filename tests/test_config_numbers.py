"""Numbers in configs as people write them (``1e-3``, ``.5``, ``1E6``), non-finite values,
and bad input said in one line by ``scalegnn``.

PyYAML implements YAML 1.1, which reads ``1e-3`` as a string; the oracle for a spelling's
value is Python's ``float``, which reads every spelling YAML 1.2 accepts.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from dgl_scalegnn.config import Config, ConfigError, SyntheticConfig, load_config
from dgl_scalegnn.core.grid_shape import GridError
from dgl_scalegnn.data.graph import DatasetError
from dgl_scalegnn.train.checkpoint import CheckpointError


def _float_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, float | None]]:
    """Every dotted key whose setting is a float (or optional float), with its default."""
    keys = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key, hint = f"{prefix}{field.name}", hints[field.name]
        if dataclasses.is_dataclass(hint):
            keys += _float_keys(hint, f"{key}.")
        elif float in (hint, *typing.get_args(hint)):
            default = field.default if field.default is not dataclasses.MISSING else None
            keys.append((key, default))
    return keys


FLOAT_KEYS = _float_keys()


def _value(cfg: Config, key: str) -> object:
    value: object = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _nested(key: str, text: str) -> str:
    """``key: text`` as a YAML document with one mapping per section of ``key``."""
    parts = key.split(".")
    lines = [f"{'  ' * depth}{part}:" for depth, part in enumerate(parts[:-1])]
    return "\n".join([*lines, f"{'  ' * (len(parts) - 1)}{parts[-1]}: {text}"]) + "\n"


def _load(tmp_path, how: str, key: str, text: str) -> Config:
    """The config with ``key`` written as ``text`` in a YAML file or a ``--set``."""
    if how == "--set":
        return load_config(None, [f"{key}={text}"])
    path = tmp_path / "config.yaml"
    path.write_text(_nested(key, text))
    return load_config(path)


HOW = ["file", "--set"]


def test_the_float_keys_are_found():
    synthetic = ["avg_degree", "homophily", "feature_noise", "degree_exponent"]
    synthetic += ["train_fraction", "val_fraction"]
    assert dict(FLOAT_KEYS) == {
        **{f"data.synthetic.{key}": getattr(SyntheticConfig(), key) for key in synthetic},
        "model.dropout": 0.5,
        "model.input_dropout": 0.0,
        "model.rms_eps": 1e-6,
        "model.gin_eps": 0.0,
        "model.gat_negative_slope": 0.2,
        "model.gat_attn_dropout": 0.0,
        "train.target_acc": None,
        "train.max_train_s": None,
        "parallel.timeout_s": 300.0,
        "parallel.watchdog_s": 15.0,
        "optim.lr": 0.01,
        "optim.weight_decay": 0.0,
    }


# ------------------------------------------------------------------- YAML 1.2 numbers
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    "text", ["1e-3", "5e-4", "1E6", "1e+2", "2.5E-1", ".5", "+.5", "1.0e5", "1.e-2", "1_0e-3"]
)
def test_exponent_and_dot_spellings_are_read_as_floats(tmp_path, how, text):
    cfg = _load(tmp_path, how, "optim.lr", text)
    assert cfg.optim.lr == float(text.replace("_", ""))
    assert isinstance(cfg.optim.lr, float)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(("key", "default"), FLOAT_KEYS)
def test_every_float_key_takes_an_exponent_without_a_dot(tmp_path, how, key, default):
    value = 0.8 if default is None else default  # train.target_acc has none
    text = f"{round(value * 1e6)}e-6"  # e.g. 300.0 as 300000000e-6: a string to YAML 1.1
    assert _value(_load(tmp_path, how, key, text), key) == value


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("key", "text", "named"),
    [
        ("optim.lr", "-2.5e-1", "optim.lr: got -0.25; it must be positive"),
        ("optim.lr", "-.5", "optim.lr: got -0.5; it must be positive"),
        ("optim.weight_decay", "-5e-4", "optim.weight_decay: got -0.0005; give 0 (none) or more"),
        ("model.dropout", "1E0", "model.dropout: got 1.0; it must be in [0, 1)"),
        ("model.rms_eps", "0e-6", "model.rms_eps: got 0.0; it must be positive"),
        ("parallel.timeout_s", "5e-1", "parallel.timeout_s: got 0.5; it must be at least 1"),
    ],
)
def test_numbers_out_of_range_are_refused_with_their_value(tmp_path, how, key, text, named):
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, how, key, text)
    assert named in str(refused.value)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("text", ["fast", "1e", "e-3", "1e-3x", "0.1.2", "1,5"])
def test_strings_that_are_not_numbers_are_still_refused_naming_the_key(tmp_path, how, text):
    with pytest.raises(ConfigError, match=r"^optim\.lr: expected float, got str '"):
        _load(tmp_path, how, "optim.lr", text)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("sampling.batch_size", "1e4", 10_000),
        ("sampling.batch_size", "2.5E3", 2_500),
        ("train.max_steps", "2e1", 20),
        ("model.hidden", "64.0", 64),
        ("train.eval_at_steps", "[1e1, 2E2, 3]", (10, 200, 3)),
    ],
)
def test_a_float_equal_to_an_int_is_accepted_where_an_int_is(tmp_path, how, key, text, expected):
    value = _value(_load(tmp_path, how, key, text), key)
    assert value == expected
    assert all(type(v) is int for v in (value if isinstance(value, tuple) else [value]))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("key", "text", "named"),
    [
        ("model.hidden", "12.5", "model.hidden: expected int, got float 12.5; give a whole"),
        ("sampling.batch_size", "1e-1", "sampling.batch_size: expected int, got float 0.1"),
        ("train.eval_at_steps", "[1e1, 2.5]", "train.eval_at_steps[1]: expected int, got float"),
        ("train.max_steps", ".inf", "train.max_steps: expected int, got float inf"),
        ("train.epochs", ".nan", "train.epochs: expected int, got float nan"),
    ],
)
def test_a_fraction_or_non_finite_value_is_refused_where_an_int_is(tmp_path, how, key, text, named):
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, how, key, text)
    assert named in str(refused.value)


# ------------------------------------------------------------------- non-finite values
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("text", "shown"),
    [(".nan", "nan"), (".NaN", "nan"), (".inf", "inf"), ("-.inf", "-inf"), ("1e999", "inf")],
)
@pytest.mark.parametrize("key", [key for key, _ in FLOAT_KEYS])
def test_non_finite_floats_are_refused_naming_the_key_and_value(tmp_path, how, text, shown, key):
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, how, key, text)
    assert str(refused.value).startswith(f"{key}: got {shown}; give a finite number")


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("text", ["nan", "inf", "NaN", "-inf", "infinity"])
def test_bare_nan_and_inf_are_strings_refused_naming_the_key(tmp_path, how, text):
    with pytest.raises(ConfigError, match=rf"^optim\.lr: expected float, got str '{text}'"):
        _load(tmp_path, how, "optim.lr", text)


def test_other_yaml_scalars_are_read_as_before(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "parallel: {grid: 1x1x1x1, overlap: yes, timeout_s: 0x100}\n"
        "sampling: {batch_size: 1_024}\ntrain: {max_steps: ~}\n"
    )
    cfg = load_config(path)
    assert (cfg.parallel.grid, cfg.parallel.overlap, cfg.parallel.timeout_s) == (
        "1x1x1x1",
        True,
        256.0,
    )
    assert (cfg.sampling.batch_size, cfg.train.max_steps) == (1024, None)


def test_malformed_yaml_is_refused_in_one_line_with_its_place(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  hidden: [1, 2\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"config file {str(path)!r} is not valid YAML: line 3, column 1: ")
    assert "expected ',' or ']'" in message


@pytest.mark.parametrize(
    ("how", "text", "said"),
    [
        ("--set", "[1, 2", "--set model.hidden: '[1, 2' is not a YAML value: line 1, column 6: "),
        ("--set", "2020-13-45", "--set model.hidden: '2020-13-45' is not a YAML value: month must"),
        ("file", "2020-13-45", "is not valid YAML: month must be in 1..12"),
    ],
)
def test_a_value_yaml_cannot_read_is_refused_in_one_line(tmp_path, how, text, said):
    """A --set value that is not YAML, or a date that does not exist (YAML reads
    ``2020-13-45`` as one), is a ConfigError naming the key, not PyYAML's traceback."""
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, how, "model.hidden", text)
    assert said in str(refused.value) and "\n" not in str(refused.value)


# ------------------------------------------------------------------- the command line
TINY = [
    "data.synthetic.num_nodes=120",
    "data.synthetic.num_features=4",
    "data.synthetic.num_classes=3",
    "model.hidden=8",
    "model.layers=1",
    "sampling.batch_size=32",
    "train.max_steps=2",
    "train.progress=false",
]


def _cli(*sets: str) -> list[str]:
    return ["train", *(arg for item in sets for arg in ("--set", item))]


def test_cli_trains_with_lr_and_weight_decay_in_exponent_form(capsys, tmp_path):
    from dgl_scalegnn.cli import main

    config = tmp_path / "config.yaml"
    config.write_text("optim:\n  weight_decay: 5e-4\n")
    assert main(["train", "--config", str(config), *_cli(*TINY, "optim.lr=1e-3")[1:]]) == 0
    assert "done: " in capsys.readouterr().out  # the console's summary: it trained


FINITE = " (YAML's .nan, .inf and -.inf are not)"


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("optim.lr=.nan", f"optim.lr: got nan; give a finite number{FINITE}"),
        ("optim.lr=.inf", f"optim.lr: got inf; give a finite number{FINITE}"),
        ("optim.lr=nan", "optim.lr: expected float, got str 'nan'"),
        ("parallel.watchdog_s=.inf", f"parallel.watchdog_s: got inf; give a finite number{FINITE}"),
    ],
)
def test_cli_refuses_non_finite_values_in_one_line(capsys, override, said):
    from dgl_scalegnn.cli import main

    assert main(_cli(*TINY, override)) == 2
    assert capsys.readouterr().err == f"scalegnn: error: {said}\n"


TRACED = (
    "\n  \ncheckpoint 'step_3/rank0.pt' is damaged: its SHA-256 differs from meta.json\n"
    "Stack trace:\n  [bt] (0) /lib/libdgl.so(dmlc::LogMessageFatal+0x67) [0x7f]\n"
    "  [bt] (1) /lib/libdgl.so(+0x69265a) [0x7e]\n\n"
)
PY_TRACED = (
    "Traceback (most recent call last):\n"
    '  File "/x/run.py", line 3, in <module>\n'
    "checkpoint 'step_3/rank0.pt' is damaged: its SHA-256 differs from meta.json\n"
    "second line"
)


@pytest.mark.parametrize("error", [ConfigError, DatasetError, CheckpointError, GridError])
@pytest.mark.parametrize("message", [TRACED, PY_TRACED])
def test_cli_reduces_a_multi_line_error_to_its_first_meaningful_line(
    capsys, monkeypatch, tmp_path, error, message
):
    from dgl_scalegnn.cli import main

    def fail(*args, **kwargs):
        raise error(message)

    monkeypatch.setattr("dgl_scalegnn.train.run.run_training", fail)
    monkeypatch.delenv("RANK", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("train:\n  epochs: 1\n")
    assert main(["train", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "scalegnn: error: checkpoint 'step_3/rank0.pt' is damaged: "
        "its SHA-256 differs from meta.json\n"
    )


def test_cli_error_on_another_rank_is_not_repeated_and_others_propagate(capsys, monkeypatch):
    from dgl_scalegnn.cli import main

    def fail(*args, **kwargs):
        raise CheckpointError(TRACED)

    monkeypatch.setattr("dgl_scalegnn.train.run.run_training", fail)
    monkeypatch.setenv("RANK", "1")
    assert main(["train"]) == 2
    assert capsys.readouterr().err == ""

    def crash(*args, **kwargs):
        raise RuntimeError("a bug\nwith its trace")

    monkeypatch.setattr("dgl_scalegnn.train.run.run_training", crash)
    with pytest.raises(RuntimeError, match="a bug\nwith its trace"):
        main(["train"])
