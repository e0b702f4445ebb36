"""The layer tail and its dropout hash against independent oracles.

The hash is checked bit for bit against a NumPy ``uint32`` reference (torch's int32
arithmetic must wrap as two's complement), the mask's statistics against the binomial
law, and the tail's values and gradients (eager and compiled) and the final RMSNorm's
against plain autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dgl_scalegnn.core.layout import INPUT_LAYOUT
from dgl_scalegnn.core.seeds import mix_seed
from dgl_scalegnn.distributed.comm import Runtime
from dgl_scalegnn.parallel import elementwise
from dgl_scalegnn.parallel.dropout_hash import dropout_mask, hash32
from dgl_scalegnn.parallel.elementwise import LayerTail, LocalRows
from dgl_scalegnn.parallel.norm import rms_norm
from dgl_scalegnn.parallel.partition import RowPartition, ShardSpec

MIX = np.uint32(0x45D9F3B)


def _hash32_numpy(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    x = ((x >> np.uint32(16)) ^ x) * MIX
    x = ((x >> np.uint32(16)) ^ x) * MIX
    return (x >> np.uint32(16)) ^ x


def _mask_numpy(key: int, rows: np.ndarray, col_start: int, cols: int, rate: float) -> np.ndarray:
    """The documented mask in unsigned arithmetic: product read as signed, vs threshold."""
    row_hash = _hash32_numpy(rows.astype(np.uint32) ^ np.uint32(key & 0xFFFFFFFF))
    columns = np.arange(col_start, col_start + cols, dtype=np.uint64) + np.uint64(key >> 32)
    col_hash = _hash32_numpy(_hash32_numpy((columns & 0xFFFFFFFF).astype(np.uint32)))
    product = (row_hash[:, None] ^ col_hash[None, :]) * MIX
    return product.view(np.int32).astype(np.int64) >= int(rate * 2**32) - 2**31


def test_hash32_wraps_like_uint32():
    values = np.concatenate(
        [
            np.arange(1000),
            [2**31 - 1, 2**31, 2**32 - 1],
            np.random.default_rng(0).integers(0, 2**32, 5000),
        ]
    ).astype(np.uint32)
    got = hash32(torch.from_numpy(values.view(np.int32).copy()))
    assert got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy().view(np.uint32), _hash32_numpy(values))


@pytest.mark.parametrize("fuse", [False, True])
def test_mask_matches_the_uint32_reference_eager_and_compiled(fuse):
    key = mix_seed(3, 17, 1)
    rows = np.sort(np.random.default_rng(1).choice(2_000_000, 300, replace=False))
    expected = _mask_numpy(key, rows, 40, 24, 0.3)
    np.testing.assert_array_equal(
        dropout_mask(key, torch.from_numpy(rows), 40, 24, 0.3).numpy(), expected
    )
    # The tail applies the same mask (compiled or not): ones in, kept ones scaled out.
    x = torch.ones(len(rows), 24)
    y = LayerTail(fuse)(
        x,
        None,
        None,
        torch.from_numpy(rows),
        statistics=None,
        key=key,
        col_start=40,
        width=24,
        eps=0,
        rate=0.3,
    )
    np.testing.assert_array_equal((y > 0).numpy(), expected)


def test_mask_keeps_each_element_with_probability_one_minus_rate_independently():
    rate, rows, cols = 0.2, 4000, 128
    masks = {
        (step, layer): dropout_mask(mix_seed(0, step, layer), torch.arange(rows), 0, cols, rate)
        for step in (0, 1)
        for layer in (0, 1)
    }
    n = rows * cols
    for mask in masks.values():
        kept = mask.double()
        error = abs(kept.mean().item() - (1 - rate)) / np.sqrt(rate * (1 - rate) / n)
        assert error < 5, error
        # Neither rows nor columns share a pattern: neighbours are uncorrelated.
        centred = kept - kept.mean()
        scale = (centred * centred).mean()
        for shifted, base in ((centred[1:], centred[:-1]), (centred[:, 1:], centred[:, :-1])):
            correlation = ((shifted * base).mean() / scale).item()
            assert abs(correlation) < 5 / np.sqrt(shifted.numel()), correlation
        # Per-row and per-column keep fractions spread as binomials do, no more.
        for axis, length in ((1, cols), (0, rows)):
            spread = kept.mean(dim=axis).std().item()
            assert spread == pytest.approx(np.sqrt(rate * (1 - rate) / length), rel=0.15)
    # Different steps and layers give different (nearly independent) masks.
    reference = masks[(0, 0)].double()
    for other in ((0, 1), (1, 0), (1, 1)):
        agreement = (masks[other].double() == reference).double().mean().item()
        expected = (1 - rate) ** 2 + rate**2
        assert abs(agreement - expected) < 5 * np.sqrt(expected * (1 - expected) / n)


class MirroredColumns:
    """Another rank holds a copy of these columns (inputs, gain, gradient): the sums over
    the global columns are twice the local ones, in forward and in backward."""

    local = False

    def __init__(self) -> None:
        self.calls = 0

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return partial * 2


def _tail_by_autograd(x, square_sum, gain, residual, keep, width, eps, rate):
    if square_sum is not None:
        x = x * torch.rsqrt(square_sum / width + eps) * gain
    x = torch.relu(x) * keep / (1 - rate)
    return x + residual if residual is not None else x


@pytest.mark.parametrize("kernels", ["eager", "eager in blocks of 4 rows", "compiled"])
@pytest.mark.parametrize("norm", ["none", "local", "reduced"])
@pytest.mark.parametrize("residual", [False, True])
def test_tail_values_and_gradients_match_autograd(monkeypatch, kernels, norm, residual):
    """``reduced``: the square sums and their gradient pass an all-reduce (a mirrored
    second half of the columns), so backward completes the gradient of ``x`` after it."""
    fuse = kernels == "compiled"
    if kernels == "eager in blocks of 4 rows":
        monkeypatch.setattr(elementwise, "_BLOCK_ELEMENTS", 24)
    generator = torch.Generator().manual_seed(4)
    rows, cols, rate, eps = 29, 6, 0.3, 1e-6
    width = 2 * cols if norm == "reduced" else cols
    ids = torch.randperm(500, generator=generator)[:rows]
    keep = dropout_mask(99, ids, 3, cols, rate).double()
    statistics = MirroredColumns() if norm == "reduced" else LocalRows()
    results = []
    for tail in (None, LayerTail(fuse)):
        generator.manual_seed(5)  # the same inputs for the oracle and the tail
        x = torch.randn(rows, cols, dtype=torch.float64, generator=generator).requires_grad_()
        gain_leaf = torch.randn(cols, dtype=torch.float64, generator=generator).requires_grad_()
        res = torch.randn(rows, cols, dtype=torch.float64, generator=generator).requires_grad_()
        gain = gain_leaf * 1 if norm != "none" else None
        residual_input = res if residual else None
        if tail is None:
            square_sum = (x * x).sum(1, keepdim=True) * width / cols if gain is not None else None
            y = _tail_by_autograd(x, square_sum, gain, residual_input, keep, width, eps, rate)
        else:
            y = tail(x, gain, residual_input, ids, statistics=statistics, key=99, col_start=3,
                     width=width, eps=eps, rate=rate)  # fmt: skip
        (
            y * torch.linspace(-1, 1, rows * cols, dtype=torch.float64).view(rows, cols)
        ).sum().backward()
        results.append([y.detach(), x.grad, gain_leaf.grad, res.grad])
        if tail is not None:
            assert tail.fused == fuse
    if norm == "reduced":
        assert statistics.calls == 2  # the square sums forward, their gradient backward
    for expected, got in zip(*results):
        if expected is None:
            assert got is None
        else:
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_a_backward_compile_failure_falls_back_to_eager(monkeypatch):
    tail = LayerTail(fuse=True)

    def broken(*args, **kwargs):
        raise RuntimeError("simulated compiler failure")

    monkeypatch.setitem(tail._compiled, "backward", broken)
    x = torch.randn(7, 4, requires_grad=True)
    y = tail(x, None, None, torch.arange(7), statistics=None, key=1, col_start=0, width=4, eps=0,
             rate=0.5)  # fmt: skip
    y.sum().backward()  # forward ran compiled; backward falls back instead of raising
    assert not tail.fused
    keep = dropout_mask(1, torch.arange(7), 0, 4, 0.5)
    torch.testing.assert_close(x.grad, ((x > 0) & keep).float() * 2)


@pytest.mark.parametrize("blocks", ["one block", "blocks of 4 rows"])
def test_rms_norm_values_and_gradients_match_autograd(monkeypatch, blocks):
    if blocks == "blocks of 4 rows":
        monkeypatch.setattr(elementwise, "_BLOCK_ELEMENTS", 24)
    rows, cols, eps = 29, 6, 1e-6
    runtime = Runtime.single_process()
    spec = ShardSpec(INPUT_LAYOUT, RowPartition.of(torch.arange(rows), 1, runtime.grid.shape), cols)
    weights = torch.linspace(-1, 1, rows * cols, dtype=torch.float64).view(rows, cols)
    results = []
    for fused in (False, True):
        generator = torch.Generator().manual_seed(6)
        x = torch.randn(rows, cols, dtype=torch.float64, generator=generator).requires_grad_()
        gain = torch.randn(cols, dtype=torch.float64, generator=generator).requires_grad_()
        if fused:
            y = rms_norm(x, gain, spec, eps, runtime)
        else:
            y = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + eps) * gain
        (y * weights).sum().backward()
        results.append([y.detach(), x.grad, gain.grad])
    for expected, got in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
