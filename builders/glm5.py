"""The glm5 loss mask: the model's answers and the stop tokens that end them.

The rendered text is one piece per message (the GLM-4.7-Flash template, no tools), each made
of parts: the template's markup (role tokens, think tags, tool-response tags) and the
message's own text. This module lays the parts out from the message structure, so it knows
where each begins and ends without scanning tokens; the encoder checks that the parts joined
are exactly what the pinned template rendered, so a template that renders otherwise is
refused rather than masked wrongly.

Each token gets a class: what it is under the structure rule (the answer's role token, its
prefill think tag, the rest of the answer, the stop token after an answer, anything else).
A contract reading turns classes into mask values (``builders.contract``), so one layout
serves every reading. A token belongs to the part its bytes fall in; token byte offsets come
from the tokens' own byte lengths (of the text as the tokenizer sees it: normalized, for a
tokenizer with a normalizer), so they are exact whatever offsets a tokenizer would report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from builders.errors import ConversationError

PREFIX = "[gMASK]<sop>"
EOS = "<|endoftext|>"
STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|observation|>"}
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# token classes under the structure rule
OTHER = 0  # not part of an answer: prefix, system, user and tool pieces, untrained answers
ROLE = 1  # an answer's <|assistant|>
PREFILL_THINK = 2  # the </think> or <think> right after it: with the role token, the prefill
ANSWER = 3  # the rest of an answer: reasoning and its </think>, the stripped content
STOP_AFTER = 4  # the token right after an answer when it is <|user|> or <|observation|>
APPENDED_STOP = 5  # a stop token appended after a final answer (contract reading final: append-stop)
CLASSES = 6


@dataclass(frozen=True)
class Part:
    text: str
    token_class: int
    message_text: bool  # a message's own text (False: the template's markup)


@dataclass(frozen=True)
class Layout:
    """The rendered conversation as pieces of parts."""

    pieces: tuple[tuple[Part, ...], ...]  # piece 0 is the prefix, then one per message
    roles: tuple[str, ...]  # each message's role
    answers: tuple[int, ...]  # the pieces that are trained answers
    ends_with_answer: bool  # the last piece is a trained answer: the EOS after it is its stop token

    @property
    def text(self) -> str:
        return "".join(part.text for piece in self.pieces for part in piece)


def layout(messages: list[dict], untrained: frozenset[int] = frozenset()) -> Layout:
    """Lay out the glm5 pieces of normalized ``messages``.

    The answers at the positions in ``untrained`` (miles' ``step_loss_mask: 0``) are laid out
    like the others but supervise nothing, not even the stop token after them.
    """
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    pieces = [(Part(PREFIX, OTHER, False),)]
    answers = []
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "assistant":
            pieces.append(_answer(message, show_reasoning=i > last_user, trained=i not in untrained))
            if i not in untrained:
                answers.append(len(pieces) - 1)
        elif role == "tool":
            first_of_run = i == 0 or messages[i - 1]["role"] != "tool"
            pieces.append(((Part(ROLE_TOKENS["tool"], OTHER, False),) if first_of_run else ())
                          + (Part("<tool_response>", OTHER, False), Part(message["content"], OTHER, True),
                             Part("</tool_response>", OTHER, False)))
        else:
            pieces.append((Part(ROLE_TOKENS[role], OTHER, False), Part(message["content"], OTHER, True)))
    return Layout(tuple(pieces), tuple(m["role"] for m in messages), tuple(answers),
                  bool(answers) and answers[-1] == len(pieces) - 1)


def _answer(message: dict, show_reasoning: bool, trained: bool) -> tuple[Part, ...]:
    """An assistant piece as the GLM-4.7-Flash template renders it."""
    content = message["content"]
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if THINK_CLOSE in content:
            reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
            content = content.split(THINK_CLOSE)[-1].lstrip("\n")

    def cls(token_class: int) -> int:
        return token_class if trained else OTHER

    if show_reasoning and reasoning:
        think = (Part(THINK_OPEN, cls(PREFILL_THINK), False), Part(reasoning.strip(), cls(ANSWER), True),
                 Part(THINK_CLOSE, cls(ANSWER), False))
    else:
        think = (Part(THINK_CLOSE, cls(PREFILL_THINK), False),)
    return (Part(ROLE_TOKENS["assistant"], cls(ROLE), False), *think, Part(content.strip(), cls(ANSWER), True))


@dataclass(frozen=True)
class Placement:
    """Where each token of a conversation falls in its layout."""

    classes: np.ndarray  # uint8 token class
    message_text: np.ndarray  # bool: the token is part of a message's own text


def place(lay: Layout, ids: np.ndarray, token_bytes: np.ndarray, stop_ids: np.ndarray,
          measure: Callable[[Part], int]) -> Placement:
    """Give each token of ``ids`` its class, from the byte spans of the layout's parts.

    ``token_bytes`` holds each token's length in bytes of the text as the tokenizer sees it, and
    ``measure(part)`` each part's length in the same bytes. A token must lie inside one part, or
    inside parts of one class of one piece; anything else leaves the mask undefined: an error.
    """
    parts = [(k, part) for k, piece in enumerate(lay.pieces) for part in piece]
    lengths = np.array([measure(part) for _, part in parts], dtype=np.int64)
    keep = lengths > 0
    part_end = np.cumsum(lengths)[keep]
    part_start = part_end - lengths[keep]
    part_piece = np.array([k for k, _ in parts], dtype=np.int64)[keep]
    part_class = np.array([part.token_class for _, part in parts], dtype=np.uint8)[keep]
    part_text = np.array([part.message_text for _, part in parts], dtype=bool)[keep]
    total = int(part_end[-1]) if part_end.size else 0

    ends = np.cumsum(token_bytes)
    covered = int(ends[-1]) if ends.size else 0
    if covered != total:
        raise ConversationError(f"the tokens cover {covered} bytes of a {total}-byte rendering; the tokenizer does "
                                f"not encode the text losslessly, byte for byte, so the glm5 mask cannot be placed")
    starts = ends - token_bytes
    first = np.searchsorted(part_start, starts, side="right") - 1
    last = np.searchsorted(part_start, ends - 1, side="right") - 1
    straddling = np.flatnonzero((part_piece[first] != part_piece[last]) | (part_class[first] != part_class[last]))
    if straddling.size:
        t = int(straddling[0])
        raise ConversationError(f"token {t} (bytes {int(starts[t])}..{int(ends[t])}) straddles the end of message "
                                f"piece {int(part_piece[first[t]])} or of its prefill; the glm5 mask is undefined for "
                                f"this tokenizer")
    classes = part_class[first].copy()
    # the token right after each answer: the stop token that ends it, when it is one
    answer_end = np.array([part_end[part_piece == k][-1] for k in lay.answers], dtype=np.int64)
    after = np.searchsorted(starts, answer_end, side="left")
    after = after[after < len(ids)]
    classes[after[np.isin(ids[after], stop_ids)]] = STOP_AFTER
    return Placement(classes, part_text[first])
