"""A row's segments: its runs of tokens from one conversation.

data/ROWS.md ("Segments") defines them from ``metadata.segment_start``: segment ``j`` spans
``[segment_start[j], segment_start[j + 1])``, the last one to the row's end. A trainer that keeps
conversations apart gives each segment positions from 0 and attends within it alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np


def check_starts(starts, row_tokens: int) -> np.ndarray:
    """``segment_start`` as int64, or ValueError saying what is wrong.

    It must start at 0 and increase strictly, below ``row_tokens``.
    """
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size == 0 or starts[0] != 0:
        raise ValueError(f"segment_start {starts.tolist()[:4]} does not begin with 0")
    if (np.diff(starts) <= 0).any() or starts[-1] >= row_tokens:
        raise ValueError(
            f"segment_start {starts.tolist()[:8]}... is not strictly increasing below {row_tokens}"
        )
    return starts


def seq_lengths(starts, row_tokens: int) -> np.ndarray:
    """Each segment's length (int32); they sum to ``row_tokens``."""
    starts = check_starts(starts, row_tokens)
    return np.diff(np.append(starts, row_tokens)).astype(np.int32)


def position_ids(starts, row_tokens: int) -> np.ndarray:
    """Each token's position in its segment (int32), from 0 in every segment."""
    starts = check_starts(starts, row_tokens)
    lengths = np.diff(np.append(starts, row_tokens))
    return (np.arange(row_tokens, dtype=np.int64) - np.repeat(starts, lengths)).astype(np.int32)


class SegmentHash:
    """``segments_sha256`` of rows given in order.

    Per row: its number of segments, then its ``segment_start`` values, all little-endian uint32.
    """

    def __init__(self):
        self._sha = hashlib.sha256()

    def add(self, rows_starts: Iterable) -> None:
        """Add the ``segment_start`` of each row of a batch."""
        for starts in rows_starts:
            starts = np.asarray(starts, dtype="<u4")
            self._sha.update(np.asarray([starts.size], dtype="<u4").tobytes())
            self._sha.update(starts.tobytes())

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def supervised_segment_starts(loss_mask: np.ndarray, rows_starts: Iterable) -> int:
    """Supervised tokens at a segment start other than position 0.

    Training with boundaries leaves them out (nothing before them in their segment predicts
    them); whole-row training trains them.
    """
    mask = np.atleast_2d(loss_mask)
    return sum(
        int(np.count_nonzero(row[np.asarray(starts, dtype=np.int64)[1:]] == 1))
        for row, starts in zip(mask, rows_starts, strict=True)
    )
