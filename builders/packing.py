"""Cut the EOS-joined token stream into fixed-length rows, skipping rows with no supervised token."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from builders.encode import EncodedConversation


@dataclass(frozen=True)
class Row:
    input_ids: np.ndarray  # int32, row_tokens long
    loss_mask: np.ndarray  # uint8, row_tokens long
    source_index: list[int]  # the conversations whose tokens the row holds, in order
    source_id: list[str]
    segment_start: list[int]  # where each of them starts in the row (0 for one continued from before)


@dataclass
class RowPacker:
    """Consumes conversations in stream order and returns each completed, non-skipped row."""

    row_tokens: int
    windows_skipped: int = 0
    _ids: np.ndarray = field(init=False)
    _mask: np.ndarray = field(init=False)
    _fill: int = field(init=False, default=0)
    _segments: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self._ids = np.empty(self.row_tokens, dtype=np.int32)
        self._mask = np.empty(self.row_tokens, dtype=np.uint8)

    def add(self, conversation: EncodedConversation) -> list[Row]:
        rows, taken, total = [], 0, len(conversation.ids)
        while taken < total:
            n = min(self.row_tokens - self._fill, total - taken)
            self._ids[self._fill:self._fill + n] = conversation.ids[taken:taken + n]
            self._mask[self._fill:self._fill + n] = conversation.mask[taken:taken + n]
            self._segments.append((conversation.index, conversation.id, self._fill))
            self._fill += n
            taken += n
            if self._fill == self.row_tokens:
                row = self._cut()
                if row is None:
                    self.windows_skipped += 1
                else:
                    rows.append(row)
        return rows

    def _cut(self) -> Row | None:
        segments, self._segments, self._fill = self._segments, [], 0
        if not self._mask.any():
            return None
        return Row(
            input_ids=self._ids.copy(),
            loss_mask=self._mask.copy(),
            source_index=[s[0] for s in segments],
            source_id=[s[1] for s in segments],
            segment_start=[s[2] for s in segments],
        )
