"""The order in which source conversations enter the stream: a seeded permutation of the source."""

from __future__ import annotations

import hashlib

import numpy as np


def permutation(seed: int, n: int) -> np.ndarray:
    """The row contract's order: ``numpy.random.default_rng(seed).permutation(n)``."""
    return np.random.default_rng(seed).permutation(n)


def permutation_sha256(order: np.ndarray) -> str:
    """The sha256 of an order as little-endian int64 bytes, as a manifest pins it."""
    return hashlib.sha256(np.asarray(order).astype("<i8", copy=False).tobytes()).hexdigest()
