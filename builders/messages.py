"""A conversation's messages: the roles and fields a build reads.

They are checked once for every chat format. Every reader (``builders.inputs``) hands the chat
formats messages with the fields named here; ``normalize_messages`` refuses anything else, so no
field is ever dropped unnoticed.
"""

from __future__ import annotations

from builders.errors import ConversationError

ROLES = ("system", "user", "assistant", "tool")
# roles miles passes to the template as they are (the peer formats take them too)
PEER_ROLES = ("developer", "function")
# what a template may print of a message
TEXT_FIELDS = ("content", "reasoning_content")
# read where a file has them; the role and content are the layout's keys
OPTIONAL_TEXT_FIELDS = TEXT_FIELDS[1:]
# an assistant's calls (normalised: ``{id?, type: function, function: {name, arguments}}``), a tool
# result's call id, a tool's (a peer: any message's) name
TOOL_FIELDS = ("tool_calls", "tool_call_id", "name")
MESSAGE_KEYS = ("role", *TEXT_FIELDS, *TOOL_FIELDS)
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


def normalize_messages(messages, peer: bool = False) -> list[dict]:
    """Check the messages, and drop keys whose value is None.

    ``messages`` must be a list of ``{role, content}`` dicts. transformers drops None-valued keys
    too; it is how a parquet struct column's absent fields (``reasoning_content`` in a Tulu-shaped
    schema) reach the template. ``peer``: what miles takes too (the roles ``developer`` and
    ``function``, a ``name`` on any message).
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
        roles = ROLES + PEER_ROLES if peer else ROLES
        if role not in roles:
            raise ConversationError(
                f"message {position} has role {role!r} (supported: {', '.join(roles)})"
            )
        for key in TEXT_FIELDS:
            if key in message and not isinstance(message[key], str):
                raise ConversationError(
                    f"message {position} ({role}) has {key} of type "
                    f"{type(message[key]).__name__}, not a string"
                )
        _calls_content(message)
        if "content" not in message:
            raise ConversationError(f"message {position} ({role}) has no content")
        _check_tool_fields(message, position, role, peer)
        if "reasoning_content" in message and role != "assistant":
            raise ConversationError(
                f"message {position} ({role}) has reasoning_content, which only an "
                f"assistant message may have"
            )
        normalized.append(message)
    return normalized


def _calls_content(message: dict) -> None:
    """Drop an empty list of calls; an answer with calls and no content has content ``""``."""
    if not message.get("tool_calls", True):
        del message["tool_calls"]
    if "tool_calls" in message and message["role"] == "assistant":
        message.setdefault("content", "")


def _check_tool_fields(message: dict, position: int, role: str, peer: bool) -> None:
    """Refuse tool fields on a message that may not have them, or of the wrong type."""
    owners = {"tool_calls": ("assistant",), "tool_call_id": ("tool",), "name": ("tool",)}
    for key, roles in owners.items():
        if key not in message:
            continue
        if role not in roles and not (peer and key == "name"):
            raise ConversationError(
                f"message {position} ({role}) has field {key!r}, which only "
                f"{' or '.join(roles)} messages may have"
            )
        if key != "tool_calls" and not isinstance(message[key], str):
            raise ConversationError(
                f"message {position} ({role}) has {key} of type "
                f"{type(message[key]).__name__}, not a string"
            )
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise ConversationError(
            f"message {position} ({role}) has tool_calls of type {type(calls).__name__}, not a list"
        )
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ConversationError(
                f"message {position} ({role}) has tool_calls call {k} that is not "
                f"{{type: function, function: {{name, arguments}}}}"
            )
