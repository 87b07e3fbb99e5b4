"""The glm5 loss mask: the answers and the stop tokens that end them.

The rendered text is one piece per message (the GLM-4.7-Flash template), each made of parts:
the template's markup (role tokens, think tags, tool-response tags, an answer's tool calls) and
the message's own text; a conversation with tools starts with their system block. This module
lays the parts out from the message structure, so it knows where each begins and ends without
scanning tokens; the encoder checks that the parts joined are exactly what the pinned template
rendered, so a template that renders otherwise is refused rather than masked wrongly.

Each token gets a class: what it is under the structure rule (the answer's role token, its
prefill think tag, the rest of the answer, the stop token after an answer, anything else).
A contract reading turns classes into mask values (``builders.formats.glm5``), so one layout
serves every reading. A token belongs to the part its bytes fall in; token byte offsets come
from the tokens' own byte lengths (of the text as the tokenizer sees it: normalized, for a
tokenizer with a normalizer), so they are exact whatever offsets a tokenizer would report.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from builders.errors import ConversationError

PREFIX = "[gMASK]<sop>"
EOS = "<|endoftext|>"
STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
ROLE_TOKENS = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|observation|>",
}
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOLS_HEAD = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_TAIL = (
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key>"
    "<arg_value>{arg-value-2}</arg_value>...</tool_call>"
)

# token classes under the structure rule
# not part of an answer: prefix, system, user and tool pieces, untrained answers
OTHER = 0
# an answer's <|assistant|>
ROLE = 1
# the </think> or <think> right after it: with the role token, the prefill
PREFILL_THINK = 2
# the rest of an answer: reasoning and its </think>, the stripped content
ANSWER = 3
# the token right after an answer when it is <|user|> or <|observation|>
STOP_AFTER = 4
CLASSES = 5


# a part's kind: the template's markup, a message's own text, an answer's tool calls (markup too)
MARKUP, OWN, CALLS = 0, 1, 2


class Layout(NamedTuple):
    """The rendered conversation as pieces of parts, a column for each field of a part.

    A part is a run of the text with one token class and kind; each piece is one or more of them.
    """

    # each part's text
    texts: list[str]
    # each part's token class
    classes: list[int]
    # each part's kind (MARKUP, OWN, CALLS)
    kinds: list[int]
    # the piece each part belongs to: 0 is the prefix, then one per message
    pieces: list[int]
    # the parts joined: what the chat template must render
    text: str
    # each message's role
    roles: tuple[str, ...]
    # the pieces that are trained answers
    answers: tuple[int, ...]
    # the last piece is a trained answer: the EOS after it is its stop token
    ends_with_answer: bool


# an answer's parts' classes, trained or not; with its reasoning shown, and without
_ANSWER_CLASSES = {
    (True, True): (ROLE, PREFILL_THINK, ANSWER, ANSWER, ANSWER),
    (True, False): (ROLE, PREFILL_THINK, ANSWER),
    (False, True): (OTHER,) * 5,
    (False, False): (OTHER,) * 3,
}
_ANSWER_KINDS = {True: (MARKUP, MARKUP, OWN, MARKUP, OWN), False: (MARKUP, MARKUP, OWN)}
_TOOL_CLASSES = {True: (OTHER,) * 4, False: (OTHER,) * 3}
_TOOL_KINDS = {True: (MARKUP, MARKUP, OWN, MARKUP), False: (MARKUP, OWN, MARKUP)}


def layout(
    messages: list[dict], untrained: frozenset[int] = frozenset(), tools: list | None = None
) -> Layout:
    """Lay out the glm5 pieces of normalized ``messages``.

    The answers at the positions in ``untrained`` (miles' ``step_loss_mask: 0``) are laid out
    like the others but supervise nothing, not even the stop token after them. ``tools`` (None: no
    tools) make a system block after the prefix.
    """
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    texts, classes, kinds, pieces = [PREFIX], [OTHER], [MARKUP], [0]
    if tools:
        listed = "".join(_tojson(tool) + "\n" for tool in tools)
        texts.append(TOOLS_HEAD + listed + TOOLS_TAIL)
        classes.append(OTHER)
        kinds.append(MARKUP)
        pieces.append(0)
    answers = []
    roles = []
    for i, message in enumerate(messages):
        role = message["role"]
        roles.append(role)
        if role == "assistant":
            trained = i not in untrained
            shown = _answer(message, i > last_user)
            texts += shown
            classes += _ANSWER_CLASSES[trained, len(shown) == 5]
            kinds += _ANSWER_KINDS[len(shown) == 5]
            if message.get("tool_calls"):
                texts.append(_calls(message["tool_calls"], i))
                classes.append(classes[-1])
                kinds.append(CALLS)
            if trained:
                answers.append(i + 1)
        elif role == "tool":
            opens = i == 0 or messages[i - 1]["role"] != "tool"
            if opens:
                texts.append(ROLE_TOKENS["tool"])
            texts += ("<tool_response>", message["content"], "</tool_response>")
            classes += _TOOL_CLASSES[opens]
            kinds += _TOOL_KINDS[opens]
        else:
            texts += (ROLE_TOKENS[role], message["content"])
            classes += (OTHER, OTHER)
            kinds += (MARKUP, OWN)
        pieces += [i + 1] * (len(texts) - len(pieces))
    return Layout(
        texts,
        classes,
        kinds,
        pieces,
        "".join(texts),
        tuple(roles),
        tuple(answers),
        bool(answers) and answers[-1] == len(messages),
    )


def _answer(message: dict, show_reasoning: bool) -> tuple[str, ...]:
    """An assistant piece's parts' texts as the GLM-4.7-Flash template renders it.

    Five parts with its reasoning shown, else three.
    """
    content = message["content"]
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if THINK_CLOSE in content:
            reasoning = (
                content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
            )
            content = content.split(THINK_CLOSE)[-1].lstrip("\n")
    if show_reasoning and reasoning:
        return (
            ROLE_TOKENS["assistant"],
            THINK_OPEN,
            reasoning.strip(),
            THINK_CLOSE,
            content.strip(),
        )
    return (ROLE_TOKENS["assistant"], THINK_CLOSE, content.strip())


def _calls(calls: list[dict], position: int) -> str:
    """An answer's calls as the template prints them after its content."""
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") or call
        arguments = function.get("arguments")
        if not isinstance(arguments, dict):
            raise ConversationError(
                f"message {position} (assistant) call {k}: arguments is "
                f"{type(arguments).__name__}, and the GLM-4.7-Flash template prints an object's "
                f"keys and values (read them with dataset.arguments: object)"
            )
        out.append(f"<tool_call>{function['name']}")
        for key, value in arguments.items():
            shown = value if isinstance(value, str) else _tojson(value)
            out.append(f"<arg_key>{key}</arg_key><arg_value>{shown}</arg_value>")
        out.append("</tool_call>")
    return "".join(out)


def _tojson(value) -> str:
    """transformers' ``tojson(ensure_ascii=False)``."""
    return json.dumps(value, ensure_ascii=False)


class Placement(NamedTuple):
    """Where each token of a conversation falls in its layout."""

    classes: np.ndarray  # uint8 token class
    message_text: np.ndarray  # bool: the token is part of a message's own text
    in_calls: np.ndarray  # bool: the token is part of an answer's tool calls


def place(
    layouts: list[Layout],
    ids: list[np.ndarray],
    token_bytes: np.ndarray,
    stop_ids: np.ndarray,
    measure: Callable[[str], int],
) -> list[Placement]:
    """Give each token of each conversation its class.

    The class comes from the byte spans of its layout's parts. ``token_bytes`` holds each token
    id's length in bytes of the text as the tokenizer sees it, and ``measure(text)`` a part's
    length in the same bytes. A token must lie inside one part, or inside parts of one class of one
    piece; anything else leaves the mask undefined: a ConversationError whose ``conversation`` is
    the position of the conversation in the batch. The batch is placed with a few array
    operations, its conversations laid end to end.
    """
    if not layouts:
        return []
    parts = [len(lay.texts) for lay in layouts]
    total, chain = sum(parts), itertools.chain.from_iterable
    lengths = np.fromiter(map(measure, chain(lay.texts for lay in layouts)), np.int64, total)
    # pieces numbered across the batch
    piece_base = np.cumsum([0] + [lay.pieces[-1] + 1 for lay in layouts])
    part_piece = np.fromiter(chain(lay.pieces for lay in layouts), np.int64, total) + np.repeat(
        piece_base[:-1], parts
    )
    part_class = np.fromiter(chain(lay.classes for lay in layouts), np.uint8, total)
    kinds = np.fromiter(chain(lay.kinds for lay in layouts), np.uint8, total)
    part_text, part_calls = kinds == OWN, kinds == CALLS
    part_end = np.cumsum(lengths)
    piece_end = np.zeros(piece_base[-1], dtype=np.int64)
    np.maximum.at(piece_end, part_piece, part_end)
    # each conversation's bytes end with its last piece
    rendering_end = piece_end[piece_base[1:] - 1]
    keep = lengths > 0
    part_end, part_piece, part_class, part_text, part_calls = (
        part_end[keep],
        part_piece[keep],
        part_class[keep],
        part_text[keep],
        part_calls[keep],
    )

    counts = np.fromiter((len(i) for i in ids), np.int64, len(ids))
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    sizes = token_bytes[flat]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # of each conversation
    last_token = np.cumsum(counts) - 1
    covered = np.diff(np.where(last_token >= 0, ends[np.maximum(last_token, 0)], 0), prepend=0)
    rendered = np.diff(rendering_end, prepend=0)
    wrong = np.flatnonzero(covered != rendered)
    if wrong.size:
        c = int(wrong[0])
        raise ConversationError.at(
            c,
            f"the tokens cover {int(covered[c])} bytes of a {int(rendered[c])}-byte rendering; "
            f"the tokenizer does not encode the text losslessly, byte for byte, "
            f"so the glm5 mask cannot be placed",
        )
    # the tokens that start in each part: a token belongs to the part its first byte is in
    started = np.searchsorted(starts, part_end, side="left")
    per_part = np.diff(started, prepend=0)
    # a token that runs past the end of its part may only run into parts of the same piece and class
    straddling = np.flatnonzero((started > 0) & (ends[np.maximum(started - 1, 0)] > part_end))
    if straddling.size:
        into = np.searchsorted(part_end, ends[started[straddling] - 1] - 1, side="right")
        bad = (part_piece[into] != part_piece[straddling]) | (
            part_class[into] != part_class[straddling]
        )
        if bad.any():
            p = int(straddling[np.argmax(bad)])
            t = int(started[p] - 1)
            c = int(np.searchsorted(piece_base, part_piece[p], side="right") - 1)
            token, base = t - int(counts[:c].sum()), int(rendering_end[c] - rendered[c])
            raise ConversationError.at(
                c,
                f"token {token} (bytes {int(starts[t]) - base}..{int(ends[t]) - base}) "
                f"straddles the end of message piece {int(part_piece[p] - piece_base[c])} "
                f"or of its prefill; the glm5 mask is undefined for this tokenizer",
            )
    classes = np.repeat(part_class, per_part)
    message_text = np.repeat(part_text, per_part)
    in_calls = np.repeat(part_calls, per_part)
    # the token right after each answer, within its conversation: the stop token that ends it,
    # when it is one
    answers = np.array([k for lay in layouts for k in lay.answers], dtype=np.int64) + np.repeat(
        piece_base[:-1], [len(lay.answers) for lay in layouts]
    )
    answer_conversation = np.searchsorted(piece_base, answers, side="right") - 1
    after = np.searchsorted(starts, piece_end[answers], side="left")
    inside = after < len(flat)
    inside[inside] = starts[after[inside]] < rendering_end[answer_conversation[inside]]
    after = after[inside]
    classes[after[np.isin(flat[after], stop_ids)]] = STOP_AFTER
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return [
        Placement(classes[a:b], message_text[a:b], in_calls[a:b])
        for a, b in itertools.pairwise(bounds)
    ]
