"""Conversations as the chat template sees them: validation and rendering.

Rendering is transformers' own (the steps of ``render_jinja_template``: sandboxed Jinja with
``trim_blocks`` and ``lstrip_blocks``), as ``apply_chat_template(messages, tokenize=False)``
renders, with no tools; a chat format passes the variables it pins.
"""

from __future__ import annotations

import os
from datetime import datetime

# transformers advises at import that "PyTorch was not found": rendering a template needs no torch
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
from transformers.utils.chat_template_utils import (  # noqa: E402
    _cached_compile_jinja_template,
    _render_with_assistant_indices,
)

try:  # the message normalization of transformers 5.23 and later (the lock's)
    from transformers.utils.chat_template_utils import _alias_reasoning_fields, _plain_template_data
except ImportError:  # earlier releases (miles' pinned 5.12.1) render the messages as they are given

    def _alias_reasoning_fields(messages):
        return messages

    def _plain_template_data(data):
        return data

from builders.errors import ConversationError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "reasoning_content")
STEP_LOSS_MASK = "step_loss_mask"  # miles' per-message field: an answer whose value is not 1 is not supervised


def split_step_loss_mask(messages) -> tuple[list, frozenset[int]]:
    """``messages`` without miles' ``step_loss_mask`` fields, and the positions of the answers it unsupervises.

    The template never sees the field; a null one is absent (as a parquet struct column's is).
    """
    if not isinstance(messages, list) or not any(isinstance(m, dict) and STEP_LOSS_MASK in m for m in messages):
        return messages, frozenset()
    untrained = frozenset(i for i, m in enumerate(messages)
                          if isinstance(m, dict) and m.get(STEP_LOSS_MASK) not in (None, 1))
    return [{k: v for k, v in m.items() if k != STEP_LOSS_MASK} if isinstance(m, dict) else m
            for m in messages], untrained


def normalize_messages(messages) -> list[dict]:
    """Check that ``messages`` is a list of ``{role, content}`` dicts and drop keys whose value is None.

    transformers drops None-valued keys too; it is how a parquet struct column's absent fields
    (``reasoning_content`` in a Tulu-shaped schema) reach the template.
    """
    if not isinstance(messages, list):
        raise ConversationError(f"messages is {type(messages).__name__}, not a list")
    if not messages:
        raise ConversationError("the conversation has no messages (apply_chat_template refuses an empty one)")
    normalized = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ConversationError(f"message {position} is {type(message).__name__}, not a mapping")
        message = {key: value for key, value in message.items() if value is not None}
        for key in message:
            if key not in MESSAGE_KEYS:
                raise ConversationError(f"message {position} has unsupported field {key!r} "
                                        f"(supported: {', '.join(MESSAGE_KEYS)})")
        role = message.get("role")
        if role not in ROLES:
            raise ConversationError(f"message {position} has role {role!r} (supported: {', '.join(ROLES)})")
        for key in ("content", "reasoning_content"):
            if key in message and not isinstance(message[key], str):
                raise ConversationError(f"message {position} ({role}) has {key} of type "
                                        f"{type(message[key]).__name__}, not a string")
        if "content" not in message:
            raise ConversationError(f"message {position} ({role}) has no content")
        if "reasoning_content" in message and role != "assistant":
            raise ConversationError(f"message {position} ({role}) has reasoning_content, which only an "
                                    f"assistant message may have")
        normalized.append(message)
    return normalized


class ChatRenderer:
    """Renders conversations with one chat template, as ``apply_chat_template`` does.

    The template is compiled by transformers into an environment of its own, so that
    ``strftime_now`` can print ``render_date`` (ISO text) instead of the clock; without one it
    is transformers' own. Variables (special-token strings, a manifest's ``template_vars``)
    reach the template as ``apply_chat_template``'s keyword arguments do.
    """

    def __init__(self, chat_template: str, render_date: str | None = None):
        self.chat_template = chat_template
        self.render_date = render_date
        self._compiled = None

    def environment(self):
        return self._template().environment

    def _template(self):
        if self._compiled is None:
            compiled = _cached_compile_jinja_template(self.chat_template)  # uncached: a fresh environment
            if self.render_date is not None:
                compiled.globals["strftime_now"] = datetime.fromisoformat(self.render_date).strftime
            self._compiled = compiled
        return self._compiled

    def render(self, messages: list[dict]) -> str:
        return self.render_all([messages])[0]

    def render_all(self, conversations: list[list[dict]], variables: dict | None = None,
                   add_generation_prompt: bool = False) -> list[str]:
        """Several conversations, each as ``render_jinja_template`` renders it with no tools or documents."""
        template = self._template()
        kwargs = _plain_template_data(variables or {})
        return [template.render(messages=_alias_reasoning_fields(_plain_template_data(chat)), tools=None,
                                documents=None, add_generation_prompt=add_generation_prompt, **kwargs)
                for chat in conversations]

    def render_with_spans(self, conversations: list[list[dict]], variables: dict | None = None
                          ) -> tuple[list[str], list[list[tuple[int, int]]]]:
        """``render_all``, with each conversation's ``{% generation %}`` spans (character start, end) as
        ``apply_chat_template(..., return_assistant_tokens_mask=True)`` records them."""
        template = self._template()
        kwargs = _plain_template_data(variables or {})
        rendered = [_render_with_assistant_indices(template, _alias_reasoning_fields(_plain_template_data(chat)),
                                                   None, None, False, **kwargs) for chat in conversations]
        return [text for text, _ in rendered], [spans for _, spans in rendered]
