"""``loss_mask: glm5``: the GLM-4.7-Flash chat format.

It is laid out by hand from the message structure. Its pieces and token classes are
``builders.formats.glm5_layout``'s; its own-rule readings of ``mask_rule`` are slime's text
searches (``builders.formats.slime``). Every conversation is checked: the layout joined must be
exactly what the pinned template renders, or the conversation is refused.
"""

from __future__ import annotations

import jinja2
import numpy as np

from builders.contract import READINGS, SLIME_RULES, Contract
from builders.errors import ConversationError
from builders.formats import glm5_layout as glm5
from builders.formats import slime
from builders.formats.base import Annotated, ChatFormat, located
from builders.formats.render import ChatRenderer
from builders.formats.tools import row_tools
from builders.formats.vocab import char_spans
from builders.messages import normalize_messages, split_step_loss_mask

# readings that refine the structure rule, not the slime rules
STRUCTURE_ONLY = ("prefill", "stop", "final")


class Glm5Format(ChatFormat):
    name = "glm5"
    classes = glm5.CLASSES

    def __init__(self, spec, tokenizer, vocab):
        super().__init__(spec, tokenizer, vocab)
        self.renderer = ChatRenderer(spec.chat_template, render_chars=spec.limits.render_chars)
        self.stop_ids = np.array(
            [vocab.token_id(t, self.name) for t in glm5.STOP_TOKENS], dtype=np.int64
        )
        self._offsets_from_bytes = vocab.offsets_are_spans()

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        return glm5.STOP_TOKENS

    @property
    def eos(self) -> str:
        return glm5.EOS

    def class_mask(self, contract: Contract) -> np.ndarray:
        values = np.zeros(glm5.CLASSES, dtype=np.uint8)
        values[glm5.ROLE] = contract.prefill == "whole-piece"
        values[glm5.PREFILL_THINK] = contract.prefill in ("after-role", "whole-piece")
        values[glm5.ANSWER] = 1
        values[glm5.STOP_AFTER] = contract.stop == "supervised"
        return values

    def appended_stop(self) -> str:
        return glm5.ROLE_TOKENS["user"]

    def describe(self) -> dict:
        return {**super().describe(), "stop": list(glm5.STOP_TOKENS)}

    @classmethod
    def redundant(cls, contract: Contract) -> bool:
        """Under a slime rule ``prefill``, ``stop``, ``final`` change nothing.

        Such a reading makes the slime reading's own rows.
        """
        return not contract.structure_rule and any(
            getattr(contract, key) != READINGS[key][0] for key in STRUCTURE_ONLY
        )

    def annotate(self, rows: list[dict], engine, rules: tuple[str, ...] = ()) -> list[Annotated]:
        layouts = self._layouts(rows)
        texts = [lay.text for lay in layouts]
        tokens = engine.encode(texts)
        checked = engine.cross_check(texts, tokens, [row["index"] for row in rows])
        try:
            placements = self.placements(layouts, tokens)
        except ConversationError as err:
            with located(rows[err.conversation]):
                raise
        annotated = [
            Annotated(
                ids,
                placement.classes,
                placement.message_text,
                lay.ends_with_answer,
                check,
                in_calls=placement.in_calls,
            )
            for lay, ids, placement, check in zip(layouts, tokens, placements, checked, strict=True)
        ]
        rules = [rule for rule in rules if rule in SLIME_RULES]
        if rules:
            offsets = self._offsets(texts, [a.ids for a in annotated])
            for lay, a, spans in zip(layouts, annotated, offsets, strict=True):
                for rule in rules:
                    a.rules[rule] = self._slime(rule, lay, spans)
        return annotated

    def layout(
        self, messages, untrained: frozenset[int] = frozenset(), tools: list | None = None
    ) -> glm5.Layout:
        """The glm5 layout of ``messages``, checked against the template.

        The layout's text must be what the chat template renders.
        """
        messages = normalize_messages(messages)
        lay = glm5.layout(messages, untrained, tools)
        try:
            rendered = self.renderer.render(messages, tools)
        except jinja2.TemplateError as err:
            raise ConversationError(
                f"the chat template failed ({self.spec.template_source}): {err}"
            ) from err
        _same(rendered, lay.text)
        return lay

    def _layouts(self, rows: list[dict]) -> list[glm5.Layout]:
        """``layout`` of each row's messages, rendered in one call.

        Where the template fails, the rows are rendered a row at a time to find the error.
        """
        conversations, tools, layouts = [], [], []
        try:
            for row in rows:
                messages, untrained = split_step_loss_mask(row["messages"])
                conversations.append(normalize_messages(messages))
                tools.append(row_tools(row))
                layouts.append(glm5.layout(conversations[-1], untrained, tools[-1]))
        except ConversationError:
            with located(row):
                raise
        try:
            rendered = self.renderer.render_all(conversations, tools=tools)
        except jinja2.TemplateError:
            for row, row_tool_list in zip(rows, tools, strict=True):
                with located(row):
                    self.layout(*split_step_loss_mask(row["messages"]), row_tool_list)
            raise
        for row, text, lay in zip(rows, rendered, layouts, strict=True):
            if text != lay.text:
                with located(row):
                    _same(text, lay.text)
        return layouts

    def placements(self, layouts: list[glm5.Layout], ids: list[np.ndarray]) -> list[glm5.Placement]:
        """Where each of the conversations' tokens falls in its layout.

        It gives each token's class, and whether it is message text.
        """
        measure = self.vocab.measure if self.vocab.normalizes else _utf8_length
        return glm5.place(layouts, ids, self.vocab.token_bytes, self.stop_ids, measure)

    def _offsets(self, texts: list[str], ids: list[np.ndarray]) -> list[np.ndarray]:
        """Each token's character offsets.

        They are its own span where the encoding's offsets are those, else the encoding's.
        """
        if self._offsets_from_bytes:
            return [
                char_spans(text, self.vocab.token_bytes[i])
                for text, i in zip(texts, ids, strict=True)
            ]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.array(e.offsets, dtype=np.int64).reshape(-1, 2) for e in encodings]

    def _slime(self, rule: str, lay: glm5.Layout, offsets: np.ndarray):
        text = lay.text
        stop = slime.appended_stop(rule, text, lay.roles[-1])
        characters = slime.character_mask(rule, text + stop, lay.roles.count("assistant"))
        if characters is None:
            return None
        if stop:
            offsets = np.vstack([offsets, [[len(text), len(text) + len(stop)]]])
        stop_id = self.vocab.token_id(stop, self.name) if stop else None
        return stop_id, slime.token_mask(characters, offsets)


def _same(rendered: str, text: str) -> None:
    """Refuse a rendering that is not the glm5 layout's text."""
    if rendered != text:
        at = next(
            (i for i, (a, b) in enumerate(zip(rendered, text, strict=False)) if a != b),
            min(len(rendered), len(text)),
        )
        raise ConversationError(
            f"the chat template renders this conversation differently from the glm5 piece layout "
            f"(first difference at character {at}: template {rendered[at : at + 40]!r}, "
            f"glm5 {text[at : at + 40]!r}); "
            f"the glm5 mask is only defined for the GLM-4.7-Flash chat format"
        )


def _utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))
