"""The records that pass between the stages of a build: an encoded conversation, a row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EncodedConversation:
    index: int  # source index
    id: str
    source: str | None  # the source dataset's ``source`` column (which Tulu subset)
    ids: np.ndarray  # int32: the conversation's tokens (the EOS that follows it is the stream's)
    mask: np.ndarray  # uint8, same length
    ends_with_answer: bool  # whether the last piece is an answer, so the EOS after it is its stop token
    left_out: bool = False  # a mask rule that finds no answer header in it leaves it out of the stream (slime readings)
    cross_checked: bool = False  # encoded by the reference engine too (a fast engine's sample), and agreed


@dataclass(frozen=True)
class Row:
    input_ids: np.ndarray  # int32, row_tokens long
    loss_mask: np.ndarray  # uint8, row_tokens long
    source_index: list[int]  # the conversations whose tokens the row holds, in order
    source_id: list[str]
    segment_start: list[int]  # where each of them starts in the row (0 for one continued from before)
