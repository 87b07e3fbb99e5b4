"""The reading order of an epoch, and each rank's share of it.

data/ROWS.md ("Reading order") states the rule, so that any reader can reproduce it: SHA-256 keys
sort the row groups, then the rows within windows of ``window_groups`` groups. A reader decodes
each group once an epoch and holds one window's groups. Pure Python and numpy: no numpy random
stream, whose values are promised within one numpy version only.
"""

from __future__ import annotations

import hashlib

import numpy as np

SHUFFLE_RULE = "fixed-sft/shuffle/v1"
WINDOW_GROUPS = 16
REMAINDERS = ("drop", "wrap")


def shuffle_key(seed: int, epoch: int, kind: str, index: int) -> int:
    """``K(seed, epoch, kind, i)`` of data/ROWS.md.

    The first 8 bytes, big-endian, of the SHA-256 of ``fixed-sft/shuffle/v1:{seed}:{epoch}:
    {kind}:{i}``.
    """
    text = f"{SHUFFLE_RULE}:{seed}:{epoch}:{kind}:{index}".encode("ascii")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def epoch_order(
    group_sizes: list[int], seed: int | None, epoch: int = 0, window_groups: int = WINDOW_GROUPS
) -> np.ndarray:
    """The file's row indices in epoch ``epoch``'s order.

    Without a seed, the file order.
    """
    starts = np.concatenate([[0], np.cumsum(group_sizes, dtype=np.int64)]).astype(np.int64)
    if seed is None:
        return np.arange(starts[-1], dtype=np.int64)
    check_order_options(seed, epoch, window_groups)
    groups = sorted(
        range(len(group_sizes)), key=lambda g: (shuffle_key(seed, epoch, "group", g), g)
    )
    order: list[int] = []
    for first in range(0, len(groups), window_groups):
        window = [
            i
            for g in groups[first : first + window_groups]
            for i in range(int(starts[g]), int(starts[g + 1]))
        ]
        window.sort(key=lambda i: (shuffle_key(seed, epoch, "row", i), i))
        order += window
    return np.asarray(order, dtype=np.int64)


def check_order_options(seed: int | None, epoch: int, window_groups: int) -> None:
    """ValueError unless the options name an order."""
    for name, value in (("seed", seed), ("epoch", epoch)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")
    if not isinstance(window_groups, int) or window_groups < 1:
        raise ValueError(f"window_groups must be a whole number >= 1, not {window_groups!r}")


def rank_share(
    order: np.ndarray, rank: int, world_size: int, start: int = 0, remainder: str = "drop"
) -> np.ndarray:
    """Rank ``rank``'s rows of ``order``.

    They are the positions ``p >= start`` with ``p ≡ rank (mod world_size)``. Every rank gets
    as many: ``drop`` leaves out the last ``N mod world_size`` positions of the order, ``wrap``
    repeats its first ``(-N) mod world_size``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"start must be a position >= 0 in the reading order, not {start!r}")
    if remainder not in REMAINDERS:
        raise ValueError(f"remainder must be one of {', '.join(REMAINDERS)}, not {remainder!r}")
    if remainder == "drop":
        order = order[: len(order) - len(order) % world_size]
    else:
        order = np.concatenate([order, np.resize(order, (-len(order)) % world_size)])
    first = start + (rank - start) % world_size
    return order[first::world_size]


def worker_blocks(stream: np.ndarray, batch_size: int, worker: int, workers: int) -> np.ndarray:
    """A data-loader worker's rows of its rank's ``stream``.

    The stream is cut into blocks of ``batch_size`` rows; worker ``w`` of ``n`` takes blocks
    ``w, w + n, ...``. The loader's round-robin over its workers then yields the stream in order.
    """
    position = np.arange(len(stream))
    return stream[(position // batch_size) % workers == worker]
