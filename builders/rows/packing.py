"""The token stream and its rows.

Conversations are joined by EOS and cut into fixed-length windows. The stream is ``ids(c_0) EOS
ids(c_1) EOS ...``. The EOS after a conversation is supervised when the conversation ends with an
answer: it is that answer's stop token. The stream is cut into consecutive windows of ``row_tokens``
tokens; a window with no supervised token is skipped. (The contract readings ``eos`` and ``skip``
choose otherwise: see ``builders.contract``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
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


@dataclass
class Packer:
    """Cuts the stream into rows.

    It is given one conversation at a time, in stream order.
    """

    row_tokens: int
    eos_id: int
    contract: Contract = DEFAULT
    windows_skipped: int = 0
    _ids: np.ndarray = field(init=False)
    _mask: np.ndarray = field(init=False)
    _fill: int = field(init=False, default=0)
    _segments: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self._ids = np.empty(self.row_tokens, dtype=np.int32)
        self._mask = np.empty(self.row_tokens, dtype=np.uint8)

    @property
    def filled(self) -> int:
        """Tokens of the stream in the window not yet full."""
        return self._fill

    def joined(self, conversation: EncodedConversation) -> tuple[np.ndarray, np.ndarray]:
        """The conversation's part of the stream (``with_eos``)."""
        return with_eos(
            conversation.ids,
            conversation.mask,
            conversation.ends_with_answer,
            self.eos_id,
            self.contract,
        )

    def cut(self, ids: np.ndarray, mask: np.ndarray, index: int, id_: str) -> Iterator[Row]:
        """Append a conversation's part of the stream; yield the rows it completes.

        The part is what ``joined`` gives.
        """
        taken = 0
        while taken < len(ids):
            n = min(self.row_tokens - self._fill, len(ids) - taken)
            self._ids[self._fill : self._fill + n] = ids[taken : taken + n]
            self._mask[self._fill : self._fill + n] = mask[taken : taken + n]
            self._segments.append((index, id_, self._fill))
            self._fill += n
            taken += n
            if self._fill == self.row_tokens:
                segments, self._segments, self._fill = self._segments, [], 0
                if self._mask.any() or self.contract.keeps_unsupervised_windows:
                    yield Row(
                        self._ids.copy(),
                        self._mask.copy(),
                        [s[0] for s in segments],
                        [s[1] for s in segments],
                        [s[2] for s in segments],
                    )
                else:
                    self.windows_skipped += 1
