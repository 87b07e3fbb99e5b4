"""Turn conversations into token ids and glm5 loss masks: render, check the layout, tokenize, mask.

Each conversation is rendered and tokenized once into an ``Annotated`` record that holds what
every contract reading needs (its tokens, their structure-rule classes, the slime rules' masks
when asked for); ``materialize`` turns it into the ids and mask of one reading. A build does
both for its own contract; ``explain`` keeps the records and materializes many readings.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field

import jinja2
import numpy as np
from tokenizers import Tokenizer

from builders import glm5, slime
from builders.chat import ChatRenderer, normalize_messages
from builders.contract import DEFAULT, SLIME_RULES, Contract
from builders.engines import TokenizersEngine
from builders.errors import ConversationError, SourceDataError
from builders.records import EncodedConversation
from builders.vocab import Vocab, char_spans


@dataclass(frozen=True)
class Annotated:
    """One conversation, rendered and tokenized once, with what each reading needs to mask it."""

    ids: np.ndarray  # int32: the rendered text's tokens (add_special_tokens=False)
    placement: glm5.Placement  # each token's glm5 class (the structure rule), and whether it is message text
    ends_with_answer: bool
    cross_checked: bool = False  # the reference engine encoded it too, and agreed
    # per slime rule asked for: (the stop token id it appends or None, mask over ids and that token),
    # or None where the rule finds no answer header (the conversation is left out)
    slime: dict = field(default_factory=dict)


class ConversationEncoder:
    """Renders with a chat template, encodes with a tokenizer, masks as ``contract`` reads the glm5 rule.

    The encoder owns ``tokenizer``: it turns off any truncation or padding that
    ``tokenizer.json`` configures, as transformers does when it encodes a rendered chat.
    """

    def __init__(self, tokenizer: Tokenizer, chat_template: str, contract: Contract = DEFAULT, engine=None):
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.renderer = ChatRenderer(chat_template)
        self.vocab = Vocab(tokenizer)
        self.contract = contract
        self.engine = engine or TokenizersEngine(tokenizer)
        if contract.encode == "add-special":
            self.vocab.post_processor_wrap()  # refuses a post-processor that adds different tokens, before any work
        self._offsets_from_bytes = self.vocab.offsets_are_spans()

    def with_engine(self, engine) -> ConversationEncoder:
        """This encoder, its tokenizer and template shared, encoding with ``engine``."""
        other = copy.copy(self)
        other.engine = engine
        return other

    @property
    def eos_id(self) -> int:
        return self.vocab.eos_id

    def encode(self, rows: list[dict]) -> list[EncodedConversation]:
        """Encode source rows (dicts with ``index``, ``id``, ``messages``, optional ``source``), in order.

        A conversation the contract does not define is a SourceDataError naming its source row.
        """
        rules = () if self.contract.structure_rule else (self.contract.mask_rule,)
        out = []
        for row, annotated in zip(rows, self.annotate(rows, rules)):
            materialized = self.materialize(annotated, self.contract)
            ids, mask, ends = materialized if materialized else (_EMPTY_IDS, _EMPTY_MASK, False)
            out.append(EncodedConversation(row["index"], row["id"], row.get("source"), ids, mask, ends,
                                           left_out=materialized is None, cross_checked=annotated.cross_checked))
        return out

    def encode_messages(self, messages, untrained: frozenset[int] = frozenset()) -> tuple[np.ndarray, np.ndarray, bool]:
        """One conversation's ids and mask under the default contract, and whether it ends with a trained answer.

        The answers at the positions in ``untrained`` supervise nothing (see ``glm5.layout``).
        Raises ConversationError for a conversation the contract does not define.
        """
        lay = self.layout(messages, untrained)
        (ids,) = self.engine.encode([lay.text])
        (placement,) = self.placements([lay], [ids])
        return self.materialize(Annotated(ids, placement, lay.ends_with_answer), DEFAULT)

    def annotate(self, rows: list[dict], rules: Iterable[str] = ()) -> list[Annotated]:
        """Render, check and tokenize source rows once; compute the classes and the ``rules``' slime masks."""
        layouts = self._layouts(rows)
        texts = [lay.text for lay in layouts]
        tokens = self.engine.encode(texts)
        checked = self.engine.cross_check(texts, tokens, [row["index"] for row in rows]) \
            if hasattr(self.engine, "cross_check") else [False] * len(rows)
        try:
            placements = self.placements(layouts, tokens)
        except ConversationError as err:
            with _located(rows[err.conversation]):
                raise
        annotated = [Annotated(ids, placement, lay.ends_with_answer, check)
                     for lay, ids, placement, check in zip(layouts, tokens, placements, checked)]
        rules = [rule for rule in rules if rule in SLIME_RULES]
        if rules:
            offsets = self._offsets(texts, [a.ids for a in annotated])
            for lay, a, spans in zip(layouts, annotated, offsets):
                for rule in rules:
                    a.slime[rule] = self._slime(rule, lay, a.ids, spans)
        return annotated

    def materialize(self, annotated: Annotated, contract: Contract) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """The ids and mask of a conversation under ``contract``; None where its rule leaves it out."""
        ids = annotated.ids
        if contract.structure_rule:
            mask = contract.class_mask()[annotated.placement.classes]
            if contract.final == "append-stop" and annotated.ends_with_answer:
                ids = np.append(ids, np.int32(self.vocab.token_id("<|user|>")))
                mask = np.append(mask, contract.class_mask()[glm5.APPENDED_STOP])
        else:
            entry = annotated.slime[contract.mask_rule]
            if entry is None:
                return None
            appended, mask = entry
            if appended is not None:
                ids = np.append(ids, np.int32(appended))
        if contract.encode == "add-special":
            before, after = self.vocab.post_processor_wrap()
            ids = np.concatenate([before, ids, after])
            mask = np.concatenate([np.zeros(len(before), np.uint8), mask, np.zeros(len(after), np.uint8)])
        return ids, mask, annotated.ends_with_answer

    def layout(self, messages, untrained: frozenset[int] = frozenset()) -> glm5.Layout:
        """The glm5 layout of ``messages``, checked against what the chat template renders."""
        messages = normalize_messages(messages)
        lay = glm5.layout(messages, untrained)
        try:
            rendered = self.renderer.render(messages)
        except jinja2.TemplateError as err:
            raise ConversationError(f"the chat template failed: {err}") from err
        _same(rendered, lay.text)
        return lay

    def _layouts(self, rows: list[dict]) -> list[glm5.Layout]:
        """``layout`` of each row's messages, rendered in one call (a row at a time to find a template error)."""
        conversations, layouts = [], []
        for row in rows:
            with _located(row):
                conversations.append(normalize_messages(row["messages"]))
                layouts.append(glm5.layout(conversations[-1]))
        try:
            rendered = self.renderer.render_all(conversations)
        except jinja2.TemplateError:
            for row in rows:
                with _located(row):
                    self.layout(row["messages"])
            raise
        for row, text, lay in zip(rows, rendered, layouts):
            with _located(row):
                _same(text, lay.text)
        return layouts

    def placements(self, layouts: list[glm5.Layout], ids: list[np.ndarray]) -> list[glm5.Placement]:
        """Where each of the conversations' tokens falls in its layout (its class, whether it is message text)."""
        measure = self.vocab.measure if self.vocab.normalizes else _utf8_length
        return glm5.place(layouts, ids, self.vocab.token_bytes, self.vocab.stop_ids, measure)

    def _offsets(self, texts: list[str], ids: list[np.ndarray]) -> list[np.ndarray]:
        """Each token's character offsets: its own span where the encoding's offsets are those, else the encoding's."""
        if self._offsets_from_bytes:
            return [char_spans(text, self.vocab.token_bytes[i]) for text, i in zip(texts, ids)]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.array(e.offsets, dtype=np.int64).reshape(-1, 2) for e in encodings]

    def _slime(self, rule: str, lay: glm5.Layout, ids: np.ndarray, offsets: np.ndarray):
        text = lay.text
        stop = slime.appended_stop(rule, text, lay.roles[-1])
        characters = slime.character_mask(rule, text + stop, lay.roles.count("assistant"))
        if characters is None:
            return None
        if stop:
            offsets = np.vstack([offsets, [[len(text), len(text) + len(stop)]]])
        return (self.vocab.token_id(stop) if stop else None), slime.token_mask(characters, offsets)


def _same(rendered: str, text: str) -> None:
    """Refuse a rendering that is not the glm5 layout's text."""
    if rendered != text:
        at = next((i for i, (a, b) in enumerate(zip(rendered, text)) if a != b), min(len(rendered), len(text)))
        raise ConversationError(
            f"the chat template renders this conversation differently from the glm5 piece layout (first "
            f"difference at character {at}: template {rendered[at:at + 40]!r}, glm5 {text[at:at + 40]!r}); "
            f"the glm5 mask is only defined for the GLM-4.7-Flash chat format")


def _utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_MASK = np.zeros(0, dtype=np.uint8)


@contextmanager
def _located(row: dict):
    """Turn a ConversationError into a SourceDataError that names the source row."""
    try:
        yield
    except ConversationError as err:
        raise SourceDataError(f"source row {row['index']} (id {row['id']!r}): {err}") from err
