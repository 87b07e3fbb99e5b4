"""Turn source conversations into token ids and glm5 loss masks, each followed by its EOS."""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

from builders import glm5
from builders.chat import ChatRenderer, ConversationError, normalize_messages
from builders.errors import PinnedInputError, SourceDataError
from builders.pinned import PinnedTokenizer


@dataclass(frozen=True)
class EncodedConversation:
    index: int  # source index
    id: str
    source: str | None  # the source dataset's ``source`` column (which Tulu subset)
    ids: np.ndarray  # int32: the conversation's tokens, then EOS
    mask: np.ndarray  # uint8, same length


class ConversationEncoder:
    """Renders with the pinned template, encodes with the pinned tokenizer, applies the glm5 mask.

    The encoder owns ``pinned.tokenizer``: it turns off any truncation or padding that
    ``tokenizer.json`` configures, as transformers does when it encodes a rendered chat.
    """

    def __init__(self, pinned: PinnedTokenizer):
        self.tokenizer = pinned.tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.renderer = ChatRenderer(pinned.chat_template)
        self.token_bytes = token_byte_lengths(self.tokenizer)
        self.eos_id = self._token_id(glm5.EOS)
        self.stop_ids = np.array([self._token_id(t) for t in glm5.STOP_TOKENS], dtype=np.int64)

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise PinnedInputError(f"the pinned tokenizer has no token {token!r}, which the glm5 mask needs")
        return token_id

    def encode(self, rows: list[dict]) -> list[EncodedConversation]:
        """Encode source rows (dicts with ``index``, ``id``, ``messages``, optional ``source``), in order."""
        layouts = [self._layout(row) for row in rows]
        # the fast variant skips character offsets, which the mask does not use (it counts token bytes)
        encodings = self.tokenizer.encode_batch_fast([lay.text for lay in layouts], add_special_tokens=False)
        return [self._masked(row, lay, enc) for row, lay, enc in zip(rows, layouts, encodings)]

    def _layout(self, row: dict) -> glm5.Layout:
        try:
            messages = normalize_messages(row["messages"])
            lay = glm5.layout(messages)
            rendered = self.renderer.render(messages)
        except ConversationError as err:
            raise SourceDataError(f"{_where(row)}: {err}") from None
        except jinja2.TemplateError as err:
            raise SourceDataError(f"{_where(row)}: the chat template failed: {err}") from None
        if rendered != lay.text:
            at = next((i for i, (a, b) in enumerate(zip(rendered, lay.text)) if a != b),
                      min(len(rendered), len(lay.text)))
            raise SourceDataError(
                f"{_where(row)}: the pinned template renders this conversation differently from the glm5 piece "
                f"layout (first difference at character {at}: template {rendered[at:at + 40]!r}, glm5 "
                f"{lay.text[at:at + 40]!r}); the glm5 mask is only defined for the GLM-4.7-Flash chat format")
        return lay

    def _masked(self, row: dict, lay: glm5.Layout, encoding) -> EncodedConversation:
        ids = np.array(encoding.ids, dtype=np.int32)
        try:
            mask, eos_supervised = glm5.loss_mask(lay, ids, self.token_bytes[ids], self.stop_ids)
        except ConversationError as err:
            raise SourceDataError(f"{_where(row)}: {err}") from None
        return EncodedConversation(
            index=row["index"], id=row["id"], source=row.get("source"),
            ids=np.append(ids, np.int32(self.eos_id)),
            mask=np.append(mask, np.uint8(eos_supervised)),
        )


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """Each token id's length in bytes of the text it encodes, for a byte-level BPE tokenizer.

    A regular token is spelled in the byte-level alphabet, one character per byte; an added
    token matches its content literally. Ids that are neither get 0, which the mask's
    coverage check turns into a clear error if such a token is ever produced.
    """
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    lengths = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        if alphabet.issuperset(token):
            lengths[token_id] = len(token)
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        lengths[token_id] = len(added.content.encode("utf-8"))
    return lengths


def _where(row: dict) -> str:
    return f"source row {row['index']} (id {row['id']!r})"
