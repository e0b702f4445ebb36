"""Property-based: any config either runs and matches the oracle, or is refused with a
named reason. Malformed YAML and unknown keys are refused."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dgl_scalegnn.config import Config, ConfigError, ModelConfig, config_from_mapping, load_config
from dgl_scalegnn.core.grid_shape import GridError, GridShape
from dgl_scalegnn.data.prepared import prepare_in_memory
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.train.metrics import MetricsWriter
from dgl_scalegnn.train.trainer import Trainer
from dgl_scalegnn.yaml_reader import parse_yaml
from tests.helpers import ROOT, random_dataset
from tests.oracle import assemble, reference_step
from tests.ranks import spawn_ranks

SECTIONS = ("data", "model", "sampling", "train", "parallel", "optim", "output")
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10_000),
    st.floats(-2, 2, allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(["1x2x2x2", "2x2", "cora", "synthetic", "nccl"]),
)
KEYS = st.sampled_from(
    [
        "hidden",
        "layers",
        "dropout",
        "batch_size",
        "grid",
        "name",
        "epochs",
        "lr",
        "bogus",
        "target_acc",
        "timeout_s",
        "checkpoint_every",
        "spmm_kernel",
        "eval_every",
        "prefetch",
    ]
)


#: Real keys with values of their type and range (most of the time), so that many drawn
#: mappings are accepted and the values can be checked.
VALID = {
    "model.hidden": st.integers(1, 256),
    "model.layers": st.integers(1, 4),
    "model.dropout": st.floats(0, 0.9),
    "model.input_dropout": st.floats(0, 0.9),
    "model.norm": st.booleans(),
    "model.residual": st.booleans(),
    "sampling.batch_size": st.integers(2, 10**6),
    "sampling.seed": st.integers(0, 100),
    "sampling.prefetch": st.booleans(),
    "train.epochs": st.integers(1, 100),
    "train.eval_every": st.integers(1, 10),
    "train.target_acc": st.floats(0.01, 1),
    "train.max_steps": st.integers(1, 100),
    "parallel.grid": st.sampled_from(["1x1x1x1", "1x2x2x2", "2x1x1x1"]),
    "parallel.overlap": st.booleans(),
    "parallel.bf16_comm": st.booleans(),
    "parallel.fuse": st.booleans(),
    "parallel.native_kernels": st.booleans(),
    "parallel.spmm_kernel": st.sampled_from(["auto", "torch-csr", "dgl-scaled"]),
    "parallel.timeout_s": st.floats(1, 600),
    "optim.lr": st.floats(1e-4, 1),
    "optim.weight_decay": st.floats(0, 0.1),
    "optim.lr_schedule": st.sampled_from(["constant", "cosine"]),
    "optim.warmup_steps": st.integers(0, 10),
}
ENTRIES = st.sampled_from(sorted(VALID)).flatmap(
    lambda dotted: st.tuples(
        *map(st.just, dotted.split(".")),
        st.sampled_from([True] * 7 + [False]).flatmap(
            lambda valid: VALID[dotted] if valid else SCALARS
        ),
    )
)


def _nest(entries: list[tuple[str, str, object]]) -> dict:
    mapping: dict = {}
    for section, key, value in entries:
        mapping.setdefault(section, {})[key] = value
    return mapping


@settings(
    max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    st.dictionaries(
        st.sampled_from([*SECTIONS, "extra"]),
        st.dictionaries(KEYS, SCALARS, max_size=3),
        max_size=4,
    )
)
def test_any_mapping_is_accepted_or_refused_naming_a_key(mapping):
    _accepted_or_refused(mapping)


@settings(
    max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(ENTRIES, max_size=4).map(_nest))
def test_real_keys_are_accepted_with_their_values_or_refused_naming_the_key(mapping):
    _accepted_or_refused(mapping)


def _accepted_or_refused(mapping: dict) -> None:
    try:
        cfg = config_from_mapping(mapping)
    except ConfigError as error:
        message = str(error)
        event("refused")
        # the dotted key at fault, or the section itself when it is not one
        named = [f"{s}.{k}" for s, values in mapping.items() for k in values]
        unknown_section = "extra" in mapping and "extra" in message
        assert unknown_section or any(key in message for key in named), message
        return
    event("accepted, with values" if any(mapping.values()) else "accepted, empty")
    for section, values in mapping.items():  # accepted: every value is the one given
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, (section, key, value)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.text(alphabet="ab:-[]{}\n 1x,'\"#&*!|>", max_size=40))
def test_malformed_yaml_is_refused(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as error:
        assert str(path) in str(error) or "unknown key" in str(error) or ": expected" in str(error)


def test_unknown_key_is_refused_with_the_known_keys():
    with pytest.raises(
        ConfigError, match=r"unknown key model\.hiden; the keys of model are .*hidden"
    ):
        config_from_mapping({"model": {"hiden": 8}})


# ---------------------------------------------------------------- grid / size property
shapes = st.tuples(
    st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2)
).filter(lambda s: math.prod(s) <= 4)


@st.composite
def jobs(draw):
    return {
        "shape": draw(shapes),
        "num_nodes": draw(st.integers(4, 40)),
        "batch_size": draw(st.integers(-1, 45)),
        "num_features": draw(st.integers(1, 6)),
        "num_classes": draw(st.integers(2, 5)),
        "hidden": draw(st.integers(1, 7)),
        "layers": draw(st.integers(0, 4)),
    }


def _refusal(job) -> str | None:
    """The key a job must be refused for, checked by the real code path on one process."""
    mapping = {
        "model": {"hidden": job["hidden"], "layers": job["layers"], "dropout": 0.25},
        "sampling": {"batch_size": job["batch_size"]},
    }
    try:
        cfg = config_from_mapping(mapping)
        graph = _graph(job)
        Trainer(cfg, graph, Runtime.single_process(), MetricsWriter(None, enabled=False))
    except (ConfigError, GridError) as error:
        return str(error)
    return None


def _graph(job):
    dataset = random_dataset(
        num_nodes=job["num_nodes"],
        num_edges=3 * job["num_nodes"],
        num_features=job["num_features"],
        num_classes=job["num_classes"],
        isolated=1,
        seed=job["num_nodes"],
    )
    return prepare_in_memory(dataset, permutation_seed=3)


@settings(max_examples=5, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs())
def test_random_grid_and_sizes_match_the_oracle_or_are_refused(tmp_path_factory, job):
    refusal = _refusal(job)
    if job["batch_size"] < 2 or job["batch_size"] > job["num_nodes"]:
        event("refused: batch size")
        assert refusal is not None and "sampling.batch_size" in refusal
        return
    if not _graph(job).meta.split_sizes["train"]:
        event("refused: no training vertex")
        assert refusal is not None and "train_mask selects no vertex" in refusal
        return
    assert refusal is None
    event(f"ran on {math.prod(job['shape'])} ranks")
    shape = GridShape(*job["shape"])
    out = tmp_path_factory.mktemp("job")
    spec = {
        "grid": str(shape),
        "layers": [job["layers"]],
        "batch_size": job["batch_size"],
        "model": {"hidden": job["hidden"], "dropout": 0.25},
        "out": str(out),
        "graph": {
            "num_nodes": job["num_nodes"],
            "num_edges": 3 * job["num_nodes"],
            "num_features": job["num_features"],
            "num_classes": job["num_classes"],
            "isolated": 1,
            "seed": job["num_nodes"],
        },
    }
    (out / "spec.json").write_text(json.dumps(spec))
    spawn_ranks(
        shape.world_size, "tests.workers.grid_equivalence:main", [str(out / "spec.json")], out
    )
    model = ModelConfig(hidden=job["hidden"], layers=job["layers"], dropout=0.25)
    for dp_rank in range(shape.dp):
        expected = reference_step(_graph(job), model, job["batch_size"], dp_rank)
        records = [
            torch.load(out / f"rank{r}_L{job['layers']}.pt") for r in range(shape.world_size)
        ]
        group = [r for r in records if r["coords"][0] == dp_rank]
        for record in group:
            assert record["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
        logits = assemble(
            group,
            lambda r: ((slice(*r["logit_rows"]), slice(*r["logit_cols"])), r["logits"]),
            expected["logits"].shape,
        )
        assert torch.allclose(logits, expected["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("sampling.batch_size=1", "sampling.batch_size: got 1; it must be at least 2"),
        ("model.hidden=0", "model.hidden: got 0; it must be at least 1"),
        ("model.dropout=1.5", "model.dropout: got 1.5; it must be in [0, 1)"),
        ("parallel.grid=2x2", "parallel.grid: got '2x2'; give GdxGxxGyxGz"),
        ("parallel.grid=1x0x2x2", "parallel.grid: got '1x0x2x2'"),
        ("parallel.grid=1x2x2x2", "grid 1x2x2x2 needs 8 processes but the job has 1"),
        ("data.name=imagenet", "data.name: got 'imagenet'; allowed values are"),
        ("model.hidden=abc", "model.hidden: expected int, got str 'abc'"),
        ("data.prepared=/no/such/dir", "data.prepared: got '/no/such/dir'; there is no such dir"),
        ("data.name=cora", "set data.root in the config or the SCALEGNN_DATA_ROOT environment"),
    ],
)
def test_cli_refuses_bad_values_naming_the_key(capsys, monkeypatch, override, named):
    from dgl_scalegnn.cli import main

    monkeypatch.delenv("SCALEGNN_DATA_ROOT", raising=False)
    assert main(["train", "--set", override, "--set", "train.max_steps=1"]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("switch", ["head", "input_projection"])
def test_a_model_without_head_or_projection_needs_a_gcn_layer(switch):
    with pytest.raises(ConfigError, match=rf"model.layers: got 0, but model.{switch}: false"):
        config_from_mapping({"model": {"layers": 0, switch: False}})
    assert config_from_mapping({"model": {"layers": 0}}).model.layers == 0  # paper's form


def test_final_norm_needs_a_head_and_residual_from_names_its_choices():
    with pytest.raises(ConfigError, match=r"model\.final_norm: true normalises the head's input"):
        config_from_mapping({"model": {"final_norm": True, "head": False}})
    with pytest.raises(ConfigError, match=r"model\.residual_from: got 'output'; allowed values"):
        config_from_mapping({"model": {"residual_from": "output"}})
    model = config_from_mapping({"model": {"residual_from": "aggregated", "final_norm": True}})
    assert (model.model.residual_from, model.model.final_norm) == ("aggregated", True)


def test_resume_needs_a_run_directory_and_is_refused_before_any_data_is_read(capsys):
    from dgl_scalegnn.cli import main

    with pytest.raises(ConfigError, match=r"^output\.resume: true \(--resume\) .* give the run's"):
        config_from_mapping({"output": {"resume": True}})
    resumed = config_from_mapping({"output": {"resume": True, "dir": "runs/a"}}).output
    assert (resumed.resume, resumed.dir) == (True, "runs/a")
    # Cora's files are not there: refused for the config before the dataset is looked for
    assert main(["train", "--resume", "--set", "data.name=cora", "--set", "data.root=/no"]) == 2
    assert capsys.readouterr().err.startswith("scalegnn: error: output.resume: true")


def _documented_defaults() -> dict[str, object]:
    """``section.key`` -> the default docs/configuration.md's tables give it (YAML's
    reading of the default column; ``unset`` is None)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    defaults: dict[str, object] = {}
    for section, body in re.findall(r"^## `(\w+)`.*?\n(.*?)(?=^## )", text, re.M | re.S):
        table = body.split("| key | default | meaning |\n|---|---|---|\n")[1].split("\n\n")[0]
        for row in table.splitlines():
            keys, values = (cell.strip() for cell in row.split("|")[1:3])
            for key, value in zip(keys.split(", "), values.split(", "), strict=True):
                default = None if value == "unset" else parse_yaml(value.strip("`"))
                defaults[f"{section}.{key.strip('`')}"] = default
    return defaults


def _declared_defaults(cls: type = Config, prefix: str = "") -> dict[str, object]:
    defaults: dict[str, object] = {}
    for item in dataclasses.fields(cls):
        if item.name == "explicit":
            continue
        value = item.default_factory() if item.default is dataclasses.MISSING else item.default
        if dataclasses.is_dataclass(value):
            defaults |= _declared_defaults(type(value), f"{prefix}{item.name}.")
        else:
            defaults[f"{prefix}{item.name}"] = list(value) if isinstance(value, tuple) else value
    return defaults


def test_the_reference_gives_every_key_with_the_default_config_py_declares():
    assert _documented_defaults() == _declared_defaults()


def test_every_key_is_documented_where_it_is_declared():
    """A ``#:`` comment above every field of every section in config.py."""
    source = (ROOT / "dgl_scalegnn" / "config.py").read_text().splitlines()
    sections = [
        node
        for node in ast.parse("\n".join(source)).body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and node.name != "Config"
    ]
    assert len(sections) == 8
    undocumented = [
        f"{section.name}.{statement.target.id}"
        for section in sections
        for statement in section.body
        if isinstance(statement, ast.AnnAssign)
        and not source[statement.lineno - 2].strip().startswith("#:")
    ]
    assert undocumented == []
