"""Conversations as the chat template sees them: validation and rendering.

Rendering is transformers' own (``render_jinja_template``: sandboxed Jinja with ``trim_blocks``
and ``lstrip_blocks``), called the way ``apply_chat_template(messages, tokenize=False,
add_generation_prompt=False)`` calls it, with no tools and no extra variables.
"""

from __future__ import annotations

import os

# transformers advises at import that "PyTorch was not found": rendering a template needs no torch
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

from builders.errors import ConversationError

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "reasoning_content")


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
    """Renders conversations with one chat template."""

    def __init__(self, chat_template: str):
        self.chat_template = chat_template

    def render(self, messages: list[dict]) -> str:
        return self.render_all([messages])[0]

    def render_all(self, conversations: list[list[dict]]) -> list[str]:
        """Several conversations in one call (transformers renders them one by one, without the per-call cost)."""
        rendered, _ = render_jinja_template(
            conversations=conversations, chat_template=self.chat_template, add_generation_prompt=False
        )
        return rendered
