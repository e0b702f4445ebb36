"""Dropout masks as a hash of global (vertex, column) coordinates and a key, so that
the mask of an element is the same on every grid shape.
"""

from __future__ import annotations

import torch

__all__ = ["hash32", "dropout_hashes", "keep_threshold", "dropout_keep", "dropout_mask"]


_MIX = 0x45D9F3B  # odd, so multiplying by it permutes the 32-bit integers


def _unsigned_shift16(x: torch.Tensor) -> torch.Tensor:
    """``x >> 16`` of int32 ``x`` read as unsigned (torch shifts int32 arithmetically)."""
    return (x >> 16) & 0xFFFF


def _int32(value: int) -> int:
    """The low 32 bits of ``value`` as a signed 32-bit integer (what an int32 tensor holds)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (two multiply-xorshift rounds) on int32 tensors.

    Multiplication wraps modulo :math:`2^{32}` (two's complement), shifts are logical:
    the result is the unsigned 32-bit hash of the bits of ``x``, stored as int32.

    >>> hash32(torch.tensor([0, 1], dtype=torch.int32)).dtype
    torch.int32
    """
    x = (_unsigned_shift16(x) ^ x) * _MIX
    x = (_unsigned_shift16(x) ^ x) * _MIX
    return _unsigned_shift16(x) ^ x


def dropout_hashes(
    key: int, row_ids: torch.Tensor, col_start: int, num_cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(rows, 1)`` and per-column ``(1, num_cols)`` int32 hashes of a shard.

    ``key`` mixes the seed, step and layer (a Python int: it reaches the device as a
    kernel argument, not as a copy); its low 32 bits salt the rows, its high bits the
    columns. Row ids are global vertex ids (below :math:`2^{31}`).
    """
    rows = row_ids.to(torch.int32).reshape(-1, 1)
    row_hash = hash32(rows ^ _int32(key))
    cols = torch.arange(num_cols, dtype=torch.int32, device=row_ids.device).reshape(1, -1)
    col_hash = hash32(hash32(cols + _int32(col_start + (key >> 32))))
    return row_hash, col_hash


def keep_threshold(rate: float) -> int:
    """The signed 32-bit mixed hash at and above which an element is kept (rate ``rate``).

    >>> keep_threshold(0.5)
    0
    """
    return min(int(rate * (1 << 32)) - (1 << 31), (1 << 31) - 1)


def dropout_keep(row_hash: torch.Tensor, col_hash: torch.Tensor, rate: float) -> torch.Tensor:
    """Keep-mask from :func:`dropout_hashes` as bytes (1 keep, 0 drop): one multiply per
    element mixes the pair.

    The product :math:`h = (r_i \\oplus c_j) \\cdot m \\bmod 2^{32}`, read as a signed
    int32, is uniform on :math:`[-2^{31}, 2^{31})` (``m`` odd permutes the integers);
    an element is kept when :math:`h \\ge -2^{31} + \\lfloor p\\, 2^{32} \\rfloor`, i.e.
    with probability :math:`1 - p`. Bytes, not bools: on CPU comparing into a byte tensor
    and multiplying by it are each about three times faster than with a bool mask.
    """
    mixed = (row_hash ^ col_hash).mul_(_MIX)  # in place: one int32 buffer per mask
    return torch.ge(mixed, keep_threshold(rate), out=torch.empty_like(mixed, dtype=torch.uint8))


def dropout_mask(
    key: int, row_ids: torch.Tensor, col_start: int, num_cols: int, rate: float
) -> torch.Tensor:
    """Keep-mask ``(len(row_ids), num_cols)`` as a hash of (key, global row, global column).

    ``key`` (an int) mixes the seed, step and layer; the mask of an element depends only
    on its global coordinates, so it is the same on every grid shape.

    >>> mask = dropout_mask(7, torch.arange(100), 0, 50, rate=0.2)
    >>> mask.shape, 0.75 < mask.float().mean().item() < 0.85
    (torch.Size([100, 50]), True)
    """
    return dropout_keep(*dropout_hashes(key, row_ids, col_start, num_cols), rate).bool()
