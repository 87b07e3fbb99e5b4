"""Turn conversations into token ids and glm5 loss masks: render, check the layout, tokenize, mask."""

from __future__ import annotations

from contextlib import contextmanager

import jinja2
import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

from builders import glm5
from builders.chat import ChatRenderer, normalize_messages
from builders.errors import ConversationError, PinnedInputError, SourceDataError
from builders.records import EncodedConversation


class ConversationEncoder:
    """Renders with a chat template, encodes with a tokenizer, applies the glm5 mask.

    The encoder owns ``tokenizer``: it turns off any truncation or padding that
    ``tokenizer.json`` configures, as transformers does when it encodes a rendered chat.
    """

    def __init__(self, tokenizer: Tokenizer, chat_template: str):
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.renderer = ChatRenderer(chat_template)
        self.token_bytes = token_byte_lengths(self.tokenizer)
        self.eos_id = self._token_id(glm5.EOS)
        self.stop_ids = np.array([self._token_id(t) for t in glm5.STOP_TOKENS], dtype=np.int64)

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise PinnedInputError(f"the tokenizer has no token {token!r}, which the glm5 mask needs")
        return token_id

    def encode(self, rows: list[dict]) -> list[EncodedConversation]:
        """Encode source rows (dicts with ``index``, ``id``, ``messages``, optional ``source``), in order.

        A conversation the contract does not define is a SourceDataError naming its source row.
        """
        layouts = []
        for row in rows:
            with _located(row):
                layouts.append(self.layout(row["messages"]))
        conversations = []
        for row, lay, ids in zip(rows, layouts, self._tokenize(layouts)):
            with _located(row):
                mask, ends_with_answer = self._mask(lay, ids)
            conversations.append(EncodedConversation(row["index"], row["id"], row.get("source"), ids, mask,
                                                     ends_with_answer))
        return conversations

    def encode_messages(self, messages, untrained: frozenset[int] = frozenset()) -> tuple[np.ndarray, np.ndarray, bool]:
        """One conversation's ids and mask, and whether it ends with a trained answer.

        The answers at the positions in ``untrained`` supervise nothing (see ``glm5.layout``).
        Raises ConversationError for a conversation the contract does not define.
        """
        lay = self.layout(messages, untrained)
        (ids,) = self._tokenize([lay])
        return (ids, *self._mask(lay, ids))

    def layout(self, messages, untrained: frozenset[int] = frozenset()) -> glm5.Layout:
        """The glm5 layout of ``messages``, checked against what the chat template renders."""
        messages = normalize_messages(messages)
        lay = glm5.layout(messages, untrained)
        try:
            rendered = self.renderer.render(messages)
        except jinja2.TemplateError as err:
            raise ConversationError(f"the chat template failed: {err}") from err
        if rendered != lay.text:
            at = next((i for i, (a, b) in enumerate(zip(rendered, lay.text)) if a != b),
                      min(len(rendered), len(lay.text)))
            raise ConversationError(
                f"the chat template renders this conversation differently from the glm5 piece layout (first "
                f"difference at character {at}: template {rendered[at:at + 40]!r}, glm5 {lay.text[at:at + 40]!r}); "
                f"the glm5 mask is only defined for the GLM-4.7-Flash chat format")
        return lay

    def _tokenize(self, layouts: list[glm5.Layout]) -> list[np.ndarray]:
        # the fast variant skips character offsets, which the mask does not use (it counts token bytes)
        encodings = self.tokenizer.encode_batch_fast([lay.text for lay in layouts], add_special_tokens=False)
        return [np.array(encoding.ids, dtype=np.int32) for encoding in encodings]

    def _mask(self, lay: glm5.Layout, ids: np.ndarray) -> tuple[np.ndarray, bool]:
        return glm5.loss_mask(lay, ids, self.token_bytes[ids], self.stop_ids)


@contextmanager
def _located(row: dict):
    """Turn a ConversationError into a SourceDataError that names the source row."""
    try:
        yield
    except ConversationError as err:
        raise SourceDataError(f"source row {row['index']} (id {row['id']!r}): {err}") from err


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
