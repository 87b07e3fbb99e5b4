"""The order in which source conversations enter the stream.

It is a seeded permutation of the source. The contract's order (reading
``order: numpy-generator``) is ``numpy.random.default_rng(seed).permutation(n)``; the other
readings are the orders other builders reach for (``builders.contract``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import random

import numpy as np

from builders.errors import UsageError


def permutation(seed: int, n: int, reading: str = "numpy-generator") -> np.ndarray:
    """The source indices in stream order, under an ``order`` reading.

    They are int64.
    """
    if reading == "numpy-generator":
        return np.random.default_rng(seed).permutation(n)
    if reading == "numpy-legacy":
        return np.random.RandomState(seed).permutation(n).astype(np.int64)
    if reading == "python-random":
        order = list(range(n))
        random.Random(seed).shuffle(order)
        return np.array(order, dtype=np.int64)
    if reading == "torch":
        try:
            import torch
        except ImportError as err:
            raise UsageError(
                "contract reading order: torch needs torch, which is not installed here"
            ) from err
        return (
            torch.randperm(n, generator=torch.Generator().manual_seed(seed))
            .numpy()
            .astype(np.int64)
        )
    if reading == "source":
        return np.arange(n, dtype=np.int64)
    raise ValueError(f"unknown order reading {reading!r}")


def kept_rows(seed: int, counts: list[int], takes: list[int | None]) -> np.ndarray:
    """The source indices a build's datasets keep, in source order.

    Every row of dataset ``j``, or with ``take: K`` the rows at
    ``sorted(default_rng([seed, j]).permutation(N_j)[:K])`` of it.
    """
    parts, start = [], 0
    for j, (n, take) in enumerate(zip(counts, takes, strict=True)):
        rows = (
            np.arange(n, dtype=np.int64)
            if take is None
            else np.sort(np.random.default_rng([seed, j]).permutation(n)[:take]).astype(np.int64)
        )
        parts.append(start + rows)
        start += n
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def torch_available() -> bool:
    """Whether the ``order: torch`` reading can run here.

    It finds out without importing torch.
    """
    return importlib.util.find_spec("torch") is not None


def permutation_sha256(order: np.ndarray) -> str:
    """The sha256 of an order, as a manifest pins it.

    It is taken of the order as little-endian int64 bytes.
    """
    return hashlib.sha256(np.asarray(order).astype("<i8", copy=False).tobytes()).hexdigest()
