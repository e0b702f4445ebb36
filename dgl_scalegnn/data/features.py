r"""Feature scaling applied when a graph is loaded (``data.feature_norm``).

``none``
    The features as the file holds them.
``row``
    Every row divided by the sum of its absolute values (Kipf & Welling's
    preprocessing, which DGL's Planetoid classes apply): :math:`x_v / \lVert x_v \rVert_1`;
    a row of zeros stays zero.
``standardize``
    Every column shifted to mean 0 and scaled to variance 1 over all vertices:
    :math:`(x_{v,j} - \mu_j) / \sigma_j`; a constant column becomes zero.

Row scaling is applied block by block; standardising needs the columns' statistics
first (:func:`column_moments`, one pass over the blocks in float64).

Example
-------
>>> import numpy as np
>>> features = np.array([[1.0, 3.0], [0.0, 0.0], [2.0, 2.0]], dtype=np.float32)
>>> scale_features(features, "row").tolist()
[[0.25, 0.75], [0.0, 0.0], [0.5, 0.5]]
>>> standard = scale_features(features, "standardize", column_moments([features]))
>>> standard.astype(np.float64).round(3).tolist()
[[0.0, 1.069], [-1.225, -1.336], [1.225, 0.267]]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np

from dgl_scalegnn.config import FEATURE_NORMS
from dgl_scalegnn.data.source import GraphSource

__all__ = ["FEATURE_NORMS", "column_moments", "scale_features", "scaled_source"]


def column_moments(blocks: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of every column over the rows of ``blocks``.

    Returns
    -------
    mean, std : np.ndarray
        float64 ``(D,)``; ``std`` is 1 where a column is constant (it then becomes zero).
    """
    count, total, squares = 0, None, None
    for block in blocks:
        block = np.asarray(block, dtype=np.float64)
        if total is None:
            total, squares = np.zeros(block.shape[1]), np.zeros(block.shape[1])
        count += block.shape[0]
        total += block.sum(axis=0)
        squares += np.square(block).sum(axis=0)
    if total is None or count == 0:
        return np.zeros(0), np.ones(0)
    mean = total / count
    variance = np.maximum(squares / count - np.square(mean), 0.0)
    std = np.sqrt(variance)
    return mean, np.where(std > 1e-12 * np.maximum(np.abs(mean), 1.0), std, 1.0)


def scale_features(
    block: np.ndarray, norm: str, moments: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """``block`` (rows of features) scaled by ``norm`` (one of :data:`FEATURE_NORMS`), as
    float32; ``standardize`` needs the columns' ``moments`` over all rows."""
    block = np.asarray(block, dtype=np.float32)
    if norm == "none":
        return block
    if norm == "row":
        sums = np.abs(block).sum(axis=1, keepdims=True, dtype=np.float64)
        return (block / np.where(sums > 0, sums, 1.0)).astype(np.float32)
    if norm == "standardize":
        if moments is None:
            raise ValueError("standardize needs the columns' moments (column_moments)")
        mean, std = moments
        return ((block - mean) / std).astype(np.float32)
    raise ValueError(f"feature norm {norm!r}; give one of {', '.join(FEATURE_NORMS)}")


def scaled_source(source: GraphSource, norm: str) -> GraphSource:
    """``source`` whose feature blocks and rows come scaled by ``norm`` (the same source
    for ``none``); standardising reads the blocks once first for the columns' moments."""
    if norm == "none":
        return source
    moments = column_moments(source.feature_blocks()) if norm == "standardize" else None

    def feature_blocks() -> Iterator[np.ndarray]:
        for block in source.feature_blocks():
            yield scale_features(block, norm, moments)

    rows = source.feature_rows
    return dataclasses.replace(
        source,
        feature_blocks=feature_blocks,
        feature_rows=None
        if rows is None
        else (lambda ids: scale_features(rows(ids), norm, moments)),
    )
