"""A conversation's messages: the roles and fields a build reads.

They are checked once for every chat format. Every reader (``builders.inputs``) hands the chat
formats messages with the fields named here; ``normalize_messages`` refuses anything else, so no
field is ever dropped unnoticed.
"""

from __future__ import annotations

from builders.errors import ConversationError

ROLES = ("system", "user", "assistant", "tool")
# what a template may print of a message
TEXT_FIELDS = ("content", "reasoning_content")
# read where a file has them; the role and content are the layout's keys
OPTIONAL_TEXT_FIELDS = TEXT_FIELDS[1:]
MESSAGE_KEYS = ("role", *TEXT_FIELDS)
# miles' per-message field: an answer whose value is not 1 is not supervised
STEP_LOSS_MASK = "step_loss_mask"


def split_step_loss_mask(messages) -> tuple[list, frozenset[int]]:
    """Messages without ``step_loss_mask``, and the answers it unsupervises.

    ``messages`` without miles' ``step_loss_mask`` fields, and the positions of the answers the
    field unsupervises. The template never sees the field; a null one is absent (as a parquet
    struct column's is).
    """
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and STEP_LOSS_MASK in m for m in messages
    ):
        return messages, frozenset()
    untrained = frozenset(
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict) and m.get(STEP_LOSS_MASK) not in (None, 1)
    )
    return [
        {k: v for k, v in m.items() if k != STEP_LOSS_MASK} if isinstance(m, dict) else m
        for m in messages
    ], untrained


def normalize_messages(messages) -> list[dict]:
    """Check the messages, and drop keys whose value is None.

    ``messages`` must be a list of ``{role, content}`` dicts. transformers drops None-valued keys
    too; it is how a parquet struct column's absent fields (``reasoning_content`` in a Tulu-shaped
    schema) reach the template.
    """
    if not isinstance(messages, list):
        raise ConversationError(f"messages is {type(messages).__name__}, not a list")
    if not messages:
        raise ConversationError(
            "the conversation has no messages (apply_chat_template refuses an empty one)"
        )
    normalized = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ConversationError(
                f"message {position} is {type(message).__name__}, not a mapping"
            )
        message = {key: value for key, value in message.items() if value is not None}
        for key in message:
            if key not in MESSAGE_KEYS:
                raise ConversationError(
                    f"message {position} has unsupported field {key!r} "
                    f"(supported: {', '.join(MESSAGE_KEYS)})"
                )
        role = message.get("role")
        if role not in ROLES:
            raise ConversationError(
                f"message {position} has role {role!r} (supported: {', '.join(ROLES)})"
            )
        for key in TEXT_FIELDS:
            if key in message and not isinstance(message[key], str):
                raise ConversationError(
                    f"message {position} ({role}) has {key} of type "
                    f"{type(message[key]).__name__}, not a string"
                )
        if "content" not in message:
            raise ConversationError(f"message {position} ({role}) has no content")
        if "reasoning_content" in message and role != "assistant":
            raise ConversationError(
                f"message {position} ({role}) has reasoning_content, which only an "
                f"assistant message may have"
            )
        normalized.append(message)
    return normalized
