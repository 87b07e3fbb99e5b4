"""The glm5 masks of THUDM/slime's open pull requests.

They are readings of ``mask_rule``, as data/ROWS.md describes them. Both find each answer by
searching the rendered text, not from the message structure, and mark characters; a token is
supervised when any of its characters is (by the offsets of the encoding). They differ from the
structure rule on two answers in a row and on role-token text inside a message. Written from
data/ROWS.md and the PRs' ``gen_multi_turn_loss_mask_glm5``:

- ``slime-pr1844`` (commit 471265d): when the last message is an answer and the text does not end
  with a stop token, ``<|user|>`` is appended (``<|observation|>`` after tool calls, which the
  glm5 contract does not have). Each answer's span runs from its ``<|assistant|>`` (searched
  from the end of the previous span) to the first ``<|endoftext|>``, ``<|user|>`` or
  ``<|observation|>`` after it, or the end; supervision starts after leading whitespace and one
  ``<think>`` or ``</think>``, and covers the span and the stop token that ends it.
- ``slime-pr1824`` (commit 617ffdd): nothing is appended; a span runs to the first ``<|user|>``,
  ``<|assistant|>``, ``<|system|>`` or ``<|observation|>`` after its header; supervision starts
  after a leading ``</think>``, or after the first ``</think>`` that follows a leading ``<think>``
  inside the span; the marker is not supervised.

A conversation whose answer header cannot be found (where slime raises) has no mask: the build
leaves it out of the stream and counts it.
"""

from __future__ import annotations

import numpy as np

from builders.formats.glm5_layout import ROLE_TOKENS, STOP_TOKENS, THINK_CLOSE, THINK_OPEN

HEADER = ROLE_TOKENS["assistant"]
PR1824_ENDS = ("<|user|>", "<|assistant|>", "<|system|>", "<|observation|>")


def appended_stop(rule: str, text: str, last_role: str) -> str:
    """The stop token the rule appends to the rendered text ("" for none)."""
    if rule == "slime-pr1844" and last_role == "assistant" and not text.endswith(STOP_TOKENS):
        return "<|user|>"
    return ""


def character_mask(rule: str, text: str, answers: int) -> np.ndarray | None:
    """Which characters of ``text`` (with the appended stop) are supervised.

    None if a header is missing. ``answers`` is the number of assistant messages: each is searched
    for in turn.
    """
    mask = np.zeros(len(text), dtype=bool)
    cursor = 0
    for _ in range(answers):
        header = text.find(HEADER, cursor)
        if header < 0:
            return None
        content = header + len(HEADER)
        if rule == "slime-pr1844":
            stops = [
                (at, marker) for marker in STOP_TOKENS if (at := text.find(marker, content)) >= 0
            ]
            end, marker = min(stops) if stops else (len(text), "")
            cursor = end
            start = content
            while start < end and text[start].isspace():
                start += 1
            for tag in (THINK_OPEN, THINK_CLOSE):
                if text.startswith(tag, start):
                    start += len(tag)
                    break
            mask[start : end + len(marker)] = True
        else:
            ends = [at for marker in PR1824_ENDS if (at := text.find(marker, content)) >= 0]
            end = min(ends, default=len(text))
            cursor = end
            start = content
            if text.startswith(THINK_CLOSE, start):
                start += len(THINK_CLOSE)
            elif text.startswith(THINK_OPEN, start):
                close = text.find(THINK_CLOSE, start)
                if 0 <= close < end:
                    start = close + len(THINK_CLOSE)
            mask[start:end] = True
    return mask


def token_mask(characters: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A token is supervised when any character in its offsets is.

    The offsets are ``[start, end)``; a token whose span is empty never is.
    """
    prefix = np.concatenate([[0], np.cumsum(characters, dtype=np.int64)])
    start, end = offsets[:, 0], offsets[:, 1]
    return ((end > start) & (prefix[np.maximum(end, start)] - prefix[start] > 0)).astype(np.uint8)
