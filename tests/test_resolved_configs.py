"""Every shipped config, the no-config run and ``scalegnn train --data`` resolve to the
settings recorded in ``tests/data/resolved_configs.json``.

The record was written by the code before the config module was split (one source of
defaults, allowed values as typed fields): the resolved ``cfg.to_dict()``, the keys given
and the settings derived from a graph with their reasons, or the one-line refusal. The
same settings give the same losses. After a deliberate change of a default, rewrite the
record with ``python -m tests.test_resolved_configs`` and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgl_scalegnn.config import ConfigError, load_config
from dgl_scalegnn.train.defaults import GraphShape, apply_graph_defaults

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "data" / "resolved_configs.json"
GIB = 2**30
#: Citeseer's sizes, and a graph 1,000 times larger with a hundredth of the features.
SHAPES = {
    "citeseer": GraphShape(num_nodes=2995, nnz=19311, num_features=2879, num_classes=7),
    "3m": GraphShape(num_nodes=3_000_000, nnz=60_000_000, num_features=28, num_classes=40),
}
DATA = ["data.name=dgl", "data.path=graph.bin"]  # what `scalegnn train --data graph.bin` sets
#: name -> (config file under yaml/ or None, --set overrides).
CASES: dict[str, tuple[str | None, list[str]]] = {
    **{path.stem: (path.name, []) for path in sorted((ROOT / "yaml").glob("*.yaml"))},
    "no config": (None, []),
    "--data": (None, DATA),
    "--data, hidden 32": (None, [*DATA, "model.hidden=32"]),
    "--data, 3 layers and a projection": (
        None,
        [*DATA, "model.layers=3", "model.input_projection=true"],
    ),
    "--data, batch and rate": (None, [*DATA, "sampling.batch_size=500", "optim.lr=0.003"]),
    "--data, the ScaleGNN parts": (
        None,
        [*DATA, *(f"model.{key}=true" for key in ("norm", "residual", "input_projection", "head"))],
    ),
    "--data, no layer": (None, [*DATA, "model.layers=0"]),
    "--data, features as given": (None, [*DATA, "data.feature_norm=none"]),
    "ogbn-arxiv, no other key": (None, ["data.name=ogbn-arxiv"]),
    "cora on 1x2x2x2": (None, ["data.name=cora", "parallel.grid=1x2x2x2"]),
}
#: Rank memories: a GPU's, and a small host share where a full batch no longer fits.
MEMORIES = {"16 GiB": 16 * GIB, "100 MiB": 100 * 2**20}


def _flat(sections: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data": {"synthetic": {"seed": 0}}}`` as ``{"data.synthetic.seed": 0}``, in JSON's
    types (a tuple as a list)."""
    flat: dict[str, Any] = {}
    for name, value in sections.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = json.loads(json.dumps(value))
    return flat


def resolve(config: str | None, overrides: list[str]) -> dict[str, Any]:
    """The config as loaded, and what a graph of each shape on ranks of each memory changes
    in it (the settings it derives, with their reasons, or the refusal)."""
    cfg = load_config(ROOT / "yaml" / config if config else None, overrides)
    loaded = _flat(cfg.to_dict())
    record: dict[str, Any] = {"loaded": loaded, "explicit": sorted(cfg.explicit)}
    for shape_name, shape in SHAPES.items():
        for memory_name, memory in MEMORIES.items():
            try:
                resolved, derived = apply_graph_defaults(cfg, shape, memory)
            except ConfigError as error:
                record[f"{shape_name}, {memory_name}"] = {"refused": str(error)}
                continue
            changed = {k: v for k, v in _flat(resolved.to_dict()).items() if loaded[k] != v}
            record[f"{shape_name}, {memory_name}"] = {
                "changed": changed,
                "derived": [[d.key, d.value, d.reason] for d in derived],
            }
    return record


def resolve_all() -> dict[str, Any]:
    return {name: resolve(config, overrides) for name, (config, overrides) in CASES.items()}


def test_every_shipped_config_is_a_case():
    assert {path.stem for path in (ROOT / "yaml").glob("*.yaml")} <= set(CASES)
    assert set(json.loads(RECORD.read_text())) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_config_resolves_to_the_recorded_settings(name):
    config, overrides = CASES[name]
    assert resolve(config, overrides) == json.loads(RECORD.read_text())[name]


if __name__ == "__main__":
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(resolve_all(), indent=1) + "\n")
