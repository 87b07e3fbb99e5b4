"""Peer formats: the ids and loss masks another training tool makes.

Each reproduces what that tool makes of a conversation.

- ``miles-qwen``, ``miles-qwen3``: miles 78527b91 ``MultiTurnLossMaskGenerator(tokenizer,
  "qwen" | "qwen3").get_loss_mask(messages)`` (``miles/utils/mask_utils.py``), with the tokenizer a
  ``PreTrainedTokenizerFast`` over the pinned ``tokenizer.json`` and template. What that code does,
  reproduced here step by step:

  * at construction it measures ``system_message_length`` and ``gen_token_length`` by rendering
    two user messages "FOR TESTING ONLY" (``_measure``);
  * ``qwen`` renders and tokenizes every message alone (``[m]``); ``qwen3`` wraps it with a dummy
    user message "FOR CALCULATING LOSS MASK ONLY": ``[m, dummy]`` less the dummy's token count
    from the end for the first message, ``[dummy, m]`` less it from the start for the others;
  * from every message after the first that is not a system message, the first
    ``system_message_length`` tokens are cut;
  * an assistant message's tokens after the first ``gen_token_length`` are supervised, unless
    its ``step_loss_mask`` is present and not 1 (null included); everything else is 0; the
    pieces are concatenated;
  * a conversation's tools go to the first message's render only;
  * ``qwen`` becomes ``distill_qwen`` when the vocabulary has the added token ``<｜Assistant｜>``:
    the first message rendered with the generation prompt (0), then the last message's content
    tokenized alone (1, or 0 when its ``step_loss_mask`` is not 1); the messages between are
    dropped.

- ``hf-generation``: transformers' ``apply_chat_template(messages, tools=tools, tokenize=True,
  return_dict=True, return_assistant_tokens_mask=True)``: ``input_ids`` and ``assistant_masks``: the
  render's
  ``{% generation %}`` spans, a token supervised when its offsets overlap a span (transformers'
  one pass over the tokens, reproduced in ``_overlap_mask``).

The renders are transformers' own (``ChatRenderer``, with the variables ``apply_chat_template``
would pass: the pinned special-token strings, then ``template_vars``); each distinct piece is
rendered once per batch, and the texts are tokenized in one batch (``add_special_tokens=False``, as
``PreTrainedTokenizerFast`` tokenizes). The messages reach the template as the peer gives them,
``step_loss_mask`` included, null fields dropped (as transformers drops them); a peer takes what
miles takes: the roles ``developer`` and ``function``, a ``name`` on any message. Under a peer
format the EOS joined after a conversation is unsupervised, so no conversation "ends with an
answer"; ``stop`` and ``prefills`` do not apply.
"""

from __future__ import annotations

import json
import re

import jinja2
import numpy as np

from builders.contract import Contract
from builders.errors import ConversationError, UsageError
from builders.formats.base import SUPERVISED, Annotated, ChatFormat, located
from builders.formats.render import ChatRenderer
from builders.formats.tools import row_tools
from builders.messages import STEP_LOSS_MASK, normalize_messages

MILES_TEST_STRING = "FOR TESTING ONLY"
MILES_DUMMY = {"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}
DISTILL_MARKER = "<｜Assistant｜>"
# the check transformers makes before it warns that a template has no generation blocks
GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")


class PeerFormat(ChatFormat):
    """A peer tool's ids and mask, rendered as transformers renders.

    Its classes are ``UNSUPERVISED`` and ``SUPERVISED``.
    """

    classes = 2

    def __init__(self, spec, tokenizer, vocab):
        super().__init__(spec, tokenizer, vocab)
        self.renderer = ChatRenderer(spec.chat_template, spec.render_date, spec.limits.render_chars)
        self.variables = {**spec.special_tokens, **spec.template_vars}

    def class_mask(self, contract: Contract) -> np.ndarray:
        return np.array([0, 1], dtype=np.uint8)

    def describe(self) -> dict:
        return {"loss_mask": self.name, "eos": self.eos, "template": self.spec.template_source}

    def annotate(self, rows: list[dict], engine, rules: tuple[str, ...] = ()) -> list[Annotated]:
        conversations, tools = [], []
        for row in rows:
            with located(row):
                conversations.append(peer_messages(row["messages"]))
                tools.append(row_tools(row))
        try:
            # the pinned tokenizer's own ids, as the peer has them
            encoded = self.encode_all(conversations, tools)
        except ConversationError as err:
            with located(rows[err.conversation]):
                raise
        return [
            Annotated(ids, mask, np.zeros(len(ids), dtype=bool), False) for ids, mask in encoded
        ]

    def encode_all(
        self, conversations: list[list[dict]], tools: list | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each conversation's int32 ids and uint8 mask (``tools``: each one's, or None).

        Where the peer fails on one: a ConversationError with ``.conversation``.
        """
        raise NotImplementedError

    def _ids(self, texts: list[str]) -> list[np.ndarray]:
        """The texts' ids from the pinned tokenizer.

        They are the ids ``PreTrainedTokenizerFast`` gives.
        """
        return [
            np.array(e.ids, dtype=np.int32)
            for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ]

    def _render(
        self,
        conversations: list[list[dict]],
        spans: bool = False,
        add_generation_prompt: bool = False,
        tools: list | None = None,
        **variables,
    ):
        """The renders (with ``spans``: and their generation spans).

        They are rendered with the format's variables and ``variables``, each conversation with its
        ``tools`` (None: none); a template error names the conversation.
        """
        variables = {**self.variables, **variables}
        tools = [None] * len(conversations) if tools is None else tools

        def render(batch, batch_tools):
            if spans:
                return self.renderer.render_with_spans(batch, variables, batch_tools)
            return self.renderer.render_all(batch, variables, add_generation_prompt, batch_tools)

        try:
            return render(conversations, tools)
        except jinja2.TemplateError:
            for position, (conversation, own) in enumerate(zip(conversations, tools, strict=True)):
                try:
                    render([conversation], [own])
                except jinja2.TemplateError as err:
                    raise ConversationError.at(
                        position, f"the chat template failed ({self.spec.template_source}): {err}"
                    ) from err
            raise


def peer_messages(messages) -> list[dict]:
    """The messages as a peer passes them to the template.

    They are checked as every format checks them (with the roles and fields miles takes),
    None-valued keys dropped; miles' ``step_loss_mask`` is kept, a null one as ``None``, which
    miles reads as "not 1".
    """
    plain = (
        [
            {k: v for k, v in m.items() if k != STEP_LOSS_MASK} if isinstance(m, dict) else m
            for m in messages
        ]
        if isinstance(messages, list)
        else messages
    )
    checked = normalize_messages(plain, peer=True)
    return [
        {**m, STEP_LOSS_MASK: original[STEP_LOSS_MASK]} if STEP_LOSS_MASK in original else m
        for m, original in zip(checked, messages, strict=True)
    ]


def trained(message: dict) -> bool:
    """miles' ``message.get("step_loss_mask", 1) == 1``."""
    return message.get(STEP_LOSS_MASK, 1) == 1


def shown(message: dict) -> dict:
    """The message as transformers renders it: null fields dropped."""
    return {key: value for key, value in message.items() if value is not None}


class MilesFormat(PeerFormat):
    """miles' ``MultiTurnLossMaskGenerator``.

    That is ``MultiTurnLossMaskGenerator(tokenizer, kind).get_loss_mask(messages)``.
    """

    kind: str  # qwen or qwen3

    def __init__(self, spec, tokenizer, vocab):
        super().__init__(spec, tokenizer, vocab)
        added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
        self.rule = "distill_qwen" if self.kind == "qwen" and DISTILL_MARKER in added else self.kind
        self.system_message_length, self.gen_token_length = self._measure()

    def describe(self) -> dict:
        return {
            **super().describe(),
            "miles_rule": self.rule,
            "system_message_length": self.system_message_length,
            "gen_token_length": self.gen_token_length,
        }

    def _measure(self) -> tuple[int, int]:
        """``get_system_message_length``: miles' arithmetic.

        It measures two rendered test messages.
        """
        test = [{"role": "user", "content": MILES_TEST_STRING}] * 2
        try:
            (text,) = self._render([test], add_special_tokens=False)
            (prompted,) = self._render([test], add_special_tokens=False, add_generation_prompt=True)
        except ConversationError as err:
            raise UsageError(
                f"loss_mask {self.name}: miles measures the template on two user messages, "
                f"and {err}"
            ) from err
        raw, ids, prompted_ids = self._ids([MILES_TEST_STRING, text, prompted])
        found = [
            i for i in range(len(ids) - len(raw) + 1) if np.array_equal(ids[i : i + len(raw)], raw)
        ]
        if len(found) != 2:
            raise UsageError(
                f"loss_mask {self.name}: miles cannot measure this template's system message "
                f"length: the tokens of {MILES_TEST_STRING!r} occur {len(found)} times (not 2) "
                f"in its render of two user messages {text!r}, where miles raises"
            )
        first, second = found
        end_interval = len(ids) - len(raw) - second
        return first - ((second - first) - end_interval - len(raw)), len(prompted_ids) - len(ids)

    def encode_all(self, conversations, tools=None):
        tools = [None] * len(conversations) if tools is None else tools
        if self.rule == "distill_qwen":
            return self._distill(conversations, tools)
        keys = [
            [self._piece_key(i, m, own) for i, m in enumerate(c)]
            for c, own in zip(conversations, tools, strict=True)
        ]
        distinct = list(dict.fromkeys(key for conversation in keys for key in conversation))
        pieces = dict(zip(distinct, self._pieces(distinct, keys), strict=True))
        return [
            self._join(position, messages, [pieces[key] for key in conversation])
            for position, (messages, conversation) in enumerate(
                zip(conversations, keys, strict=True)
            )
        ]

    def _piece_key(self, position: int, message: dict, tools: list | None) -> tuple:
        # qwen renders every message alone, the first one with the tools; qwen3 wraps the first
        # one otherwise than the others
        first = position == 0
        return (
            self.rule == "qwen3" and first,
            json.dumps(shown(message), ensure_ascii=False, default=repr),
            json.dumps(tools, ensure_ascii=False, default=repr) if first and tools else None,
        )

    def _pieces(self, distinct: list[tuple], keys: list[list[tuple]]) -> list[np.ndarray]:
        """Each distinct message's tokens as miles cuts them from its render.

        They are the tokens before the system cut.
        """
        renders, tools = [], []
        for first, message_json, tools_json in distinct:
            message = json.loads(message_json)
            renders.append(
                [message]
                if self.rule == "qwen"
                else [message, MILES_DUMMY]
                if first
                else [MILES_DUMMY, message]
            )
            tools.append(None if tools_json is None else json.loads(tools_json))
        if self.rule == "qwen3":
            renders.append([MILES_DUMMY])
            tools.append(None)
        try:
            texts = self._render(renders, tools=tools)
        except ConversationError as err:
            # name the first conversation that holds the message
            key = distinct[err.conversation]
            raise ConversationError.at(
                next(p for p, c in enumerate(keys) if key in c), str(err)
            ) from err
        ids = self._ids(texts)
        if self.rule == "qwen":
            return ids
        dummy = len(ids.pop())
        return [
            piece[:-dummy] if first else piece[dummy:]
            for (first, *_), piece in zip(distinct, ids, strict=True)
        ]

    def _join(
        self, position: int, messages: list[dict], pieces: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        all_ids, all_masks = [], []
        for i, (message, ids) in enumerate(zip(messages, pieces, strict=True)):
            if message["role"] != "system" and i > 0:
                ids = ids[self.system_message_length :]
            mask = np.zeros(len(ids), np.uint8)
            if message["role"] == "assistant" and trained(message):
                if len(ids) < self.gen_token_length:
                    raise ConversationError.at(
                        position,
                        f"message {i} (assistant) keeps {len(ids)} tokens after miles' cut, fewer "
                        f"than its {self.gen_token_length}-token header: miles' mask would be "
                        f"longer than its ids",
                    )
                mask[self.gen_token_length :] = SUPERVISED
            all_ids.append(ids)
            all_masks.append(mask)
        return np.concatenate(all_ids).astype(np.int32), np.concatenate(all_masks)

    def _distill(self, conversations, tools):
        """miles' distill_qwen: the first message as a prompt, then the last.

        The last message's content is tokenized alone.
        """
        prompts = self._render(
            [[shown(c[0])] for c in conversations], add_generation_prompt=True, tools=tools
        )
        ids = self._ids(prompts + [c[-1]["content"] for c in conversations])
        out = []
        for conversation, prompt, response in zip(
            conversations, ids[: len(prompts)], ids[len(prompts) :], strict=True
        ):
            last = trained(conversation[-1])
            mask = np.concatenate(
                [np.zeros(len(prompt), np.uint8), np.full(len(response), last, np.uint8)]
            )
            out.append((np.concatenate([prompt, response]).astype(np.int32), mask))
        return out


class MilesQwenFormat(MilesFormat):
    name, kind = "miles-qwen", "qwen"


class MilesQwen3Format(MilesFormat):
    name, kind = "miles-qwen3", "qwen3"


class HFGenerationFormat(PeerFormat):
    """transformers' ids and ``assistant_masks``.

    They are what ``apply_chat_template(..., return_assistant_tokens_mask=True)`` gives.
    """

    name = "hf-generation"

    def __init__(self, spec, tokenizer, vocab):
        if not GENERATION_TAG.search(spec.chat_template):
            raise UsageError(
                f"loss_mask hf-generation needs a chat template with {{% generation %}} blocks "
                f"(the text transformers' return_assistant_tokens_mask supervises); "
                f"{spec.template_source} has none, so every mask would be 0"
            )
        super().__init__(spec, tokenizer, vocab)

    def encode_all(self, conversations, tools=None):
        # transformers knows no step_loss_mask: a null one is dropped as any null field
        texts, spans = self._render([list(map(shown, c)) for c in conversations], True, tools=tools)
        # the offsets are needed
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [
            (
                np.array(e.ids, dtype=np.int32),
                overlap_mask(np.array(e.offsets, dtype=np.int64).reshape(-1, 2), span),
            )
            for e, span in zip(encodings, spans, strict=True)
        ]


def overlap_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """transformers' pass over the tokens, marking those in a span.

    For each token in order, skip the spans that end at or before its start; stop when none is
    left; mark it when it ends after the current span's start.
    """
    mask = np.zeros(len(offsets), np.uint8)
    if not spans or not len(offsets):
        return mask
    span = np.array(spans, dtype=np.int64).reshape(-1, 2)
    starts, ends = offsets[:, 0], offsets[:, 1]
    if np.all(np.diff(starts) >= 0) and np.all(np.diff(span[:, 1]) >= 0):
        # with both in order, the span a token reaches is the first one that ends after its start
        current = np.searchsorted(span[:, 1], starts, side="right")
        inside = current < len(span)
        mask[inside] = ends[inside] > span[current[inside], 0]
        return mask
    current = 0
    for token, (start, end) in enumerate(offsets.tolist()):
        while current < len(span) and start >= span[current, 1]:
            current += 1
        if current == len(span):
            break
        mask[token] = end > span[current, 0]
    return mask
