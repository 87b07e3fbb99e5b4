"""The glm5 loss mask: the model's answers and the stop tokens that end them.

The rendered text is one piece per message (the GLM-4.7-Flash template, no tools). This module
lays the pieces out from the message structure, so it knows where each begins and ends without
scanning tokens; the builder checks that the pieces joined are exactly what the pinned template
rendered, so a template that renders otherwise is refused rather than masked wrongly.

A token belongs to the piece its first byte falls in (byte offsets come from the tokens' own
byte lengths, so they are exact whatever offsets the tokenizer would report). Supervised: in each assistant piece,
everything after its prefill (``<|assistant|></think>``, or ``<|assistant|><think>`` when the
reasoning is shown), and the token right after the piece when it is a stop token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from builders.errors import ConversationError

PREFIX = "[gMASK]<sop>"
EOS = "<|endoftext|>"
STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|observation|>"}
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Layout:
    """The rendered text and, per piece, its UTF-8 byte span and where supervision starts."""

    text: str
    piece_start: np.ndarray  # int64 byte offset of each piece; piece 0 is the prefix
    piece_end: np.ndarray
    supervised_from: np.ndarray  # int64 byte offset, or past the end for unsupervised pieces
    assistant_pieces: tuple[int, ...]  # the pieces of the answers that are trained


def layout(messages: list[dict], untrained: frozenset[int] = frozenset()) -> Layout:
    """Lay out the glm5 pieces of normalized ``messages``.

    The answers at the positions in ``untrained`` (miles' ``step_loss_mask: 0``) are laid out
    like the others but supervise nothing, not even the stop token after them.
    """
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    texts, prefills = [PREFIX], [None]
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "assistant":
            prefill, body = _assistant(message, show_reasoning=i > last_user)
            texts.append(prefill + body)
            prefills.append(None if i in untrained else len(prefill.encode("utf-8")))
        elif role == "tool":
            first_of_run = i == 0 or messages[i - 1]["role"] != "tool"
            opener = ROLE_TOKENS["tool"] if first_of_run else ""
            texts.append(f"{opener}<tool_response>{message['content']}</tool_response>")
            prefills.append(None)
        else:
            texts.append(ROLE_TOKENS[role] + message["content"])
            prefills.append(None)
    lengths = np.array([len(t.encode("utf-8")) for t in texts], dtype=np.int64)
    end = np.cumsum(lengths)
    start = end - lengths
    text = "".join(texts)
    unsupervised = int(end[-1]) + 1
    supervised_from = np.array([unsupervised if p is None else s + p for s, p in zip(start.tolist(), prefills)],
                               dtype=np.int64)
    assistant = tuple(i for i, p in enumerate(prefills) if p is not None)
    return Layout(text, start, end, supervised_from, assistant)


def _assistant(message: dict, show_reasoning: bool) -> tuple[str, str]:
    """The prefill and the rest of an assistant piece, as the GLM-4.7-Flash template renders them."""
    content = message["content"]
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if THINK_CLOSE in content:
            reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
            content = content.split(THINK_CLOSE)[-1].lstrip("\n")
    if show_reasoning and reasoning:
        prefill, think = ROLE_TOKENS["assistant"] + THINK_OPEN, reasoning.strip() + THINK_CLOSE
    else:
        prefill, think = ROLE_TOKENS["assistant"] + THINK_CLOSE, ""
    return prefill, think + content.strip()


def loss_mask(lay: Layout, ids: np.ndarray, token_bytes: np.ndarray, stop_ids: np.ndarray) -> tuple[np.ndarray, bool]:
    """The mask of a conversation's tokens, and whether it ends with a trained answer (so the EOS after it
    is that answer's stop token).

    ``token_bytes`` holds each token's length in bytes of ``lay.text``.
    """
    ends = np.cumsum(token_bytes)
    if (ends[-1] if ends.size else 0) != lay.piece_end[-1]:
        raise ConversationError(f"the tokens cover {int(ends[-1]) if ends.size else 0} bytes of a "
                                f"{int(lay.piece_end[-1])}-byte rendering; the tokenizer does not encode text "
                                f"losslessly, byte for byte, so the glm5 mask cannot be placed")
    starts = ends - token_bytes
    piece = np.searchsorted(lay.piece_start, starts, side="right") - 1
    boundary = lay.supervised_from[piece]
    straddling = np.flatnonzero((ends > lay.piece_end[piece]) | ((starts < boundary) & (ends > boundary)))
    if straddling.size:
        t = int(straddling[0])
        raise ConversationError(f"token {t} (bytes {int(starts[t])}..{int(ends[t])}) straddles the end of message "
                                f"piece {int(piece[t])} or of its prefill; the glm5 mask is undefined for this "
                                f"tokenizer")
    mask = (starts >= boundary).astype(np.uint8)
    # the token right after each answer: supervised when it is a stop token; past the end, the EOS
    after = np.searchsorted(starts, lay.piece_end[list(lay.assistant_pieces)], side="left")
    inside = after[after < len(ids)]
    mask[inside[np.isin(ids[inside], stop_ids)]] = 1
    return mask, bool((after == len(ids)).any())
