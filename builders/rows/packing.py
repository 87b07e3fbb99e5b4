"""The token stream and its rows.

Conversations are joined by EOS and cut into fixed-length windows. The stream is ``ids(c_0) EOS
ids(c_1) EOS ...``. The EOS after a conversation is supervised when the conversation ends with an
answer: it is that answer's stop token. The stream is cut into consecutive windows of ``row_tokens``
tokens; a window with no supervised token is skipped. (The contract readings ``eos`` and ``skip``
choose otherwise: see ``builders.contract``.)

The packer takes a run of consecutive conversations at a time (``Parts``), so that its work is a
few array operations per run and per row, not per conversation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from builders.contract import DEFAULT, Contract

if TYPE_CHECKING:
    from builders.encode.encoder import EncodedConversation


@dataclass(frozen=True)
class Row:
    input_ids: np.ndarray  # int32, row_tokens long
    loss_mask: np.ndarray  # uint8, row_tokens long
    # the conversations whose tokens the row holds, in order
    source_index: list[int]
    source_id: list[str]
    # where each of them starts in the row (0 for one continued from before)
    segment_start: list[int]


@dataclass(frozen=True)
class Parts:
    """Consecutive conversations' parts of the stream, joined (``Packer.joined``)."""

    ids: np.ndarray  # int32
    mask: np.ndarray  # uint8
    lengths: np.ndarray  # int64: each conversation's part (its tokens and the EOS after them)
    index: np.ndarray  # int64: each conversation's source index
    id: list[str]


def with_eos(
    ids: np.ndarray,
    mask: np.ndarray,
    ends_with_answer: bool,
    eos_id: int,
    contract: Contract = DEFAULT,
) -> tuple[np.ndarray, np.ndarray]:
    """A conversation's part of the stream: its tokens, then the EOS.

    The EOS is supervised after an answer.
    """
    eos = contract.eos_mask(ends_with_answer)
    if eos is None:
        return ids, mask
    return np.append(ids, np.int32(eos_id)), np.append(mask, np.uint8(eos))


_NO_IDS = np.zeros(0, np.int32)
_NO_MASK = np.zeros(0, np.uint8)
_NO_INTS = np.zeros(0, np.int64)


class Packer:
    """Cuts the stream into rows.

    It is given runs of consecutive conversations (``joined``, then ``cut``), in stream order.
    """

    def __init__(self, row_tokens: int, eos_id: int, contract: Contract = DEFAULT):
        self.row_tokens, self.eos_id, self.contract = row_tokens, eos_id, contract
        self.windows_skipped = 0
        # the window not yet full: its tokens, and the parts in it (their source index and id,
        # where each starts and ends, relative to the window's start: a continued one starts
        # before it)
        self._ids, self._mask = _NO_IDS, _NO_MASK
        self._index, self._id = _NO_INTS, []
        self._start, self._end = _NO_INTS, _NO_INTS

    @property
    def filled(self) -> int:
        """Tokens of the stream in the window not yet full."""
        return len(self._ids)

    def joined(self, conversations: Sequence[EncodedConversation]) -> Parts:
        """The conversations' parts of the stream, each ``with_eos``, in order.

        One concatenation of their tokens with an EOS after each (the EOS and its mask value are
        one-token arrays, shared).
        """
        count = len(conversations)
        if not count:
            return Parts(_NO_IDS, _NO_MASK, _NO_INTS, _NO_INTS, [])
        lengths = np.fromiter((len(c.ids) for c in conversations), np.int64, count)
        answered, other = self.contract.eos_mask(True), self.contract.eos_mask(False)
        if answered is None:
            ids = [c.ids for c in conversations]
            mask = [c.mask for c in conversations]
        else:
            eos = np.array([self.eos_id], np.int32)
            answered, other = np.array([answered], np.uint8), np.array([other], np.uint8)
            ids, mask = [], []
            for c in conversations:
                ids += (c.ids, eos)
                mask += (c.mask, answered if c.ends_with_answer else other)
            lengths += 1
        return Parts(
            np.concatenate(ids).astype(np.int32, copy=False),
            np.concatenate(mask).astype(np.uint8, copy=False),
            lengths,
            np.fromiter((c.index for c in conversations), np.int64, count),
            [c.id for c in conversations],
        )

    def cut(self, parts: Parts) -> Iterator[tuple[Row, int]]:
        """Append ``parts`` to the stream; yield the rows they complete.

        Each row comes with how many of the parts it reaches into (its last conversation is
        ``parts``' that many minus one). Consume every row before the next ``cut``.
        """
        size = self.row_tokens
        fill = self.filled
        ids, mask = np.concatenate([self._ids, parts.ids]), np.concatenate([self._mask, parts.mask])
        ends = fill + np.cumsum(parts.lengths)
        # a part with no tokens is in no row
        shown = np.flatnonzero(parts.lengths)
        start = np.concatenate([self._start, (ends - parts.lengths)[shown]])
        end = np.concatenate([self._end, ends[shown]])
        index = np.concatenate([self._index, parts.index[shown]])
        names = self._id + [parts.id[k] for k in shown.tolist()]
        # which of ``parts`` each is (-1: in the window before them)
        which = np.concatenate([np.full(len(self._start), -1, np.int64), shown])
        full = len(ids) // size
        windows, masks = (
            ids[: full * size].reshape(full, size),
            mask[: full * size].reshape(full, size),
        )
        kept = (
            np.ones(full, bool) if self.contract.keeps_unsupervised_windows else masks.any(axis=1)
        ).tolist()
        offsets = np.arange(full + 1, dtype=np.int64) * size
        first = np.searchsorted(end, offsets[:-1], side="right").tolist()
        last = np.searchsorted(start, offsets[1:], side="left").tolist()
        for j in range(full):
            if not kept[j]:
                self.windows_skipped += 1
                continue
            lo, hi = first[j], last[j]
            yield (
                Row(
                    windows[j],
                    masks[j],
                    index[lo:hi].tolist(),
                    names[lo:hi],
                    np.maximum(start[lo:hi] - offsets[j], 0).tolist(),
                ),
                int(which[hi - 1]) + 1,
            )
        rest = full * size
        self._ids, self._mask = ids[rest:].copy(), mask[rest:].copy()
        open_ = end > rest
        self._index = index[open_]
        self._id = [name for name, keep in zip(names, open_.tolist(), strict=True) if keep]
        self._start, self._end = start[open_] - rest, end[open_] - rest
