"""The scale benchmark's graphs: the configs match the presets, and they are neither
trivially easy nor unlearnable (an independent full-graph GraphSAGE, at 20,000 vertices).
"""

from __future__ import annotations

import benchmarks.baselines  # noqa: F401  (before torch: sets OMP_WAIT_POLICY)

# isort: split

import dataclasses
from pathlib import Path

import pytest

from benchmarks import bench_scale, scale_presets
from benchmarks.graphs import BATCH_FRACTION
from dgl_scalegnn.config import load_config
from dgl_scalegnn.data.synthetic import generate

ROOT = Path(__file__).resolve().parents[1]
SMALL = 20_000
#: The probe's band at 20,000 vertices. The sparse graph's accuracy hardly depends on
#: the size (probe: 0.787 at 20k, 0.793 at 100k), so the benchmark's band applies. On
#: the products-like graph the probe's 30 full-graph epochs underfit 47 classes from
#: 6,000 labels, and accuracy rises with the size (the preset's docstring): noise 9 gave
#: 0.692 at 20k and 0.959 at 1M (too easy), noise 12 gives 0.550 at 20k. The band at
#: 20k is calibrated on that: it refuses the setting that was too easy at 1M.
SMALL_BAND = {"sparse": scale_presets.BAND, "products-like": (0.45, 0.65)}


@pytest.mark.parametrize("name", list(scale_presets.PRESETS))
def test_config_file_is_the_preset_at_1m(name: str) -> None:
    cfg = load_config(ROOT / scale_presets.CONFIG_FILES[name])
    assert cfg.data.name == "synthetic"
    assert cfg.data.synthetic == scale_presets.preset(name, 1_000_000)
    # the shipped setting is one that the benchmark's quick sweep tries
    assert {
        "optim.lr": cfg.optim.lr,
        "model.dropout": cfg.model.dropout,
        "sampling.batch_size": cfg.sampling.batch_size,
    } in bench_scale.plan().ours_grid()
    # the paper's model with the aggregated residual and the final norm
    model = cfg.model
    assert (model.layers, model.norm, model.residual, model.input_projection, model.head) == (
        2,
        True,
        True,
        True,
        True,
    )
    assert (model.residual_from, model.final_norm) == ("aggregated", True)


@pytest.mark.parametrize(
    ("config_file", "name", "num_nodes"),
    [
        ("yaml/products-like-2m.yaml", "products-like", 2_449_029),
        ("yaml/synthetic-10m.yaml", "sparse", 10_000_000),
    ],
)
def test_larger_configs_are_the_preset_at_their_size_with_the_1m_settings(
    config_file: str, name: str, num_nodes: int
) -> None:
    """The configs at other sizes are the graphs `make bench-growth` measured: the
    preset at that size, the 1M config's model and optimiser, and B = N/100."""
    cfg = load_config(ROOT / config_file)
    at_1m = load_config(ROOT / scale_presets.CONFIG_FILES[name])
    assert cfg.data.synthetic == scale_presets.preset(name, num_nodes)
    assert cfg.sampling.batch_size == num_nodes // BATCH_FRACTION
    assert (cfg.model, cfg.optim) == (at_1m.model, at_1m.optim)


def test_products_like_has_the_shape_of_ogbn_products() -> None:
    cfg = scale_presets.preset("products-like", SMALL)
    assert (cfg.num_features, cfg.num_classes) == (100, 47)
    assert cfg.degree_exponent < scale_presets.preset("sparse").degree_exponent  # more skewed
    # average degree 50.5 at 100k and 1M vertices after the generator merges parallel
    # edges between hubs (ogbn-products: 50.5); at 20k, more merge: 42
    graph = generate(cfg).graph
    assert 40 <= graph.num_edges() / SMALL <= 55


@pytest.mark.parametrize("name", list(scale_presets.PRESETS))
def test_preset_difficulty_is_in_the_band(name: str) -> None:
    low, high = SMALL_BAND[name]
    accuracy = scale_presets.probe_accuracy(generate(scale_presets.preset(name, SMALL)))
    assert low <= accuracy <= high, f"{name}: probe test accuracy {accuracy:.4f}"


@pytest.mark.parametrize(("name", "noise"), [("sparse", 2.0), ("products-like", 9.0)])
def test_an_easier_setting_falls_out_of_the_band(name: str, noise: float) -> None:
    """The check can fail: the generator's default noise makes the sparse graph easy, and
    the products-like setting that reached 0.959 at 1M vertices fails the band at 20k."""
    easy = dataclasses.replace(scale_presets.preset(name, SMALL), feature_noise=noise)
    assert scale_presets.probe_accuracy(generate(easy)) > SMALL_BAND[name][1]
