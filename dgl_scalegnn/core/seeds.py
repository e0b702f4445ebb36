"""Seeds derived from integers, so that every rank computes the same ones without a message."""

from __future__ import annotations

__all__ = ["mix_seed", "step_seed"]

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Deterministic 63-bit seed from integers (a splitmix64 chain); order matters."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (int(part) & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def step_seed(base_seed: int, dp_rank: int, step: int) -> int:
    """Seed of the sample of data-parallel group ``dp_rank`` at global step ``step``."""
    return mix_seed(base_seed, dp_rank, step)
