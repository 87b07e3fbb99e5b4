"""A conversation's messages: the roles and fields a build reads, declared and checked once.

Every reader (``builders.inputs``) renames a file's message fields to the names declared here,
refuses any field it was not told about, and normalises each conversation with
``normalize_messages`` and ``normalize_tools`` (data/ROWS.md, "Tool calls"): a call in the OpenAI
form, ``arguments`` parsed or kept as the manifest says, a tool list wrapped. A chat format calls
``normalize_messages`` again with the roles and fields it takes: on messages a reader normalised
it changes nothing, and refuses what the format cannot render. No field is ever dropped unnoticed.
"""

from __future__ import annotations

from builders import strictjson
from builders.errors import ConversationError

ROLES = ("system", "user", "assistant", "tool")
# roles a peer format takes because its peer renders them (miles)
PEER_ROLES = ("developer", "function")
# every role a reader passes on; each chat format says which it takes
READ_ROLES = (*ROLES, *PEER_ROLES)
# what a template may print of a message as text
TEXT_FIELDS = ("content", "reasoning_content")
# read where a file has them; the role and content are the layout's keys
OPTIONAL_TEXT_FIELDS = TEXT_FIELDS[1:]
TOOL_FIELDS = ("tool_calls", "tool_call_id", "name")
# the fields every chat format takes
PLAIN_KEYS = ("role", *TEXT_FIELDS)
# every field a reader reads, by the name the template knows it by
MESSAGE_KEYS = (*PLAIN_KEYS, *TOOL_FIELDS)
# the manifest's ``keys:``, in the order of MESSAGE_KEYS; a stored name defaults to the field's
KEY_NAMES = ("role", "content", "reasoning", *TOOL_FIELDS)
DEFAULT_KEYS = MESSAGE_KEYS
# miles' per-message field: an answer whose value is not 1 is not supervised
STEP_LOSS_MASK = "step_loss_mask"
# dataset ``arguments:``: a string parsed as JSON, or passed unchanged
ARGUMENTS = ("object", "as-is")


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


def normalize_messages(
    messages,
    *,
    fields: tuple[str, ...] = MESSAGE_KEYS,
    roles: tuple[str, ...] = ROLES,
    arguments: str = "as-is",
    names: dict[str, str] | None = None,
    peer: bool = False,
) -> list[dict]:
    """Check the messages, normalise their tool calls, and drop keys whose value is None.

    ``messages`` must be a list of ``{role, content, ...}`` dicts holding only ``fields`` (and
    ``step_loss_mask``, kept as it is, None included), each role one of ``roles``. transformers
    drops None-valued keys too; it is how a parquet struct column's absent fields reach the
    template. ``tool_calls`` (an assistant's only) become ``{id?, type: function, function: {name,
    arguments}}``, ``arguments`` parsed from a JSON string under ``arguments: object``; an answer
    with calls and no content gets ``""``. ``names`` gives the stored name of a field, for the
    messages. ``peer``: what miles takes too (the roles ``developer`` and ``function``, a ``name``
    on any message; elsewhere only a tool result has one). Messages this returned come back
    unchanged.
    """
    names = names or {}
    if peer:
        roles = READ_ROLES
    if not isinstance(messages, list):
        raise ConversationError(f"messages is {type(messages).__name__}, not a list")
    if not messages:
        raise ConversationError(
            "the conversation has no messages (apply_chat_template refuses an empty one)"
        )
    return [
        _message(position, message, fields, roles, arguments, names, peer)
        for position, message in enumerate(messages)
    ]


def _message(
    position: int, message, fields, roles, arguments: str, names: dict, peer: bool
) -> dict:
    """One message of ``normalize_messages``."""
    if not isinstance(message, dict):
        raise ConversationError(f"message {position} is {type(message).__name__}, not a mapping")
    message = {
        key: value for key, value in message.items() if value is not None or key == STEP_LOSS_MASK
    }
    for key in message:
        if key not in fields and key != STEP_LOSS_MASK:
            raise ConversationError(
                f"message {position} has unsupported field {names.get(key, key)!r} "
                f"(supported: {', '.join(names.get(f, f) for f in fields)})"
            )
    role = message.get("role")
    if role not in roles:
        raise ConversationError(
            f"message {position} has role {role!r} (supported: {', '.join(roles)})"
        )
    _check_strings(position, role, message, names)
    if "tool_calls" in message:
        if role != "assistant":
            raise ConversationError(
                f"message {position} ({role}) has {names.get('tool_calls', 'tool_calls')}, "
                "which only an assistant message may have"
            )
        where = f"message {position} ({role})'s {names.get('tool_calls', 'tool_calls')}"
        calls = [
            _call(call, f"{where}[{k}]", arguments)
            for k, call in enumerate(_listed(message["tool_calls"], where))
        ]
        if calls:
            message["tool_calls"] = calls
            message.setdefault("content", "")
        else:
            del message["tool_calls"]
    if "content" not in message:
        raise ConversationError(f"message {position} ({role}) has no content")
    for key, article, only in (
        ("reasoning_content", "an", "assistant"),
        ("tool_call_id", "a", "tool"),
        ("name", "a", "tool"),
    ):
        if key in message and role != only and not (peer and key == "name"):
            raise ConversationError(
                f"message {position} ({role}) has {names.get(key, key)}, which only {article} "
                f"{only} message may have"
            )
    return message


def _check_strings(position: int, role, message: dict, names: dict) -> None:
    """Refuse a text field, ``tool_call_id`` or ``name`` that is not a string."""
    for key in (*TEXT_FIELDS, "tool_call_id", "name"):
        if key in message and not isinstance(message[key], str):
            if key == "content" and isinstance(message[key], list):
                raise ConversationError(
                    f"message {position}'s content is a list (parts such as "
                    "{type: text, text: ...}), not a string: fixed-sft reads text content "
                    "only; join the parts into one string in the source"
                )
            raise ConversationError(
                f"message {position} ({role})'s {names.get(key, key)} is "
                f"{strictjson.kind(message[key])}, not a string"
            )


def _listed(calls, where: str) -> list:
    if not isinstance(calls, list):
        raise ConversationError(f"{where} is {strictjson.kind(calls)}, not a list of calls")
    return calls


def _call(call, where: str, arguments: str) -> dict:
    """One call, ``{id?, type?, function: {name, arguments}}`` or ``{id?, name, arguments}``."""
    if not isinstance(call, dict):
        raise ConversationError(f"{where} is {strictjson.kind(call)}, not an object")
    call = {key: value for key, value in call.items() if value is not None}
    if "function" in call:
        known, function = ("id", "type", "function"), call["function"]
        if not isinstance(function, dict):
            raise ConversationError(
                f"{where}.function is {strictjson.kind(function)}, not an object"
            )
        function = {key: value for key, value in function.items() if value is not None}
        for key in function:
            if key not in ("name", "arguments"):
                raise ConversationError(
                    f"{where}.function has field {key!r} (a call's function has name, arguments)"
                )
        where_function = f"{where}.function"
    else:
        known, function, where_function = ("id", "type", "name", "arguments"), call, where
    for key in call:
        if key not in known:
            raise ConversationError(
                f"{where} has field {key!r} (a call has {', '.join(known)}; or "
                "{id, type, function: {name, arguments}})"
            )
    if call.get("type", "function") != "function":
        raise ConversationError(f"{where}.type is {call['type']!r}, not 'function'")
    if "id" in call and not isinstance(call["id"], str):
        raise ConversationError(f"{where}.id is {strictjson.kind(call['id'])}, not a string")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ConversationError(
            f"{where_function}.name is {strictjson.kind(name) if name != '' else 'empty'}, "
            "not a function name"
        )
    if "arguments" not in function:
        raise ConversationError(f"{where_function} has no arguments")
    return {
        **({"id": call["id"]} if "id" in call else {}),
        "type": "function",
        "function": {
            "name": name,
            "arguments": _arguments(
                function["arguments"], f"{where_function}.arguments", arguments
            ),
        },
    }


def _arguments(value, where: str, arguments: str):
    """A call's arguments: an object, or under ``as-is`` a JSON string kept as it is."""
    if arguments == "as-is" and isinstance(value, (str, dict)):
        return value
    if isinstance(value, str):
        try:
            value = strictjson.loads(value)
        except ValueError as err:
            raise ConversationError(f"{where} (a JSON string) is {err}") from None
        if not isinstance(value, dict):
            raise ConversationError(
                f"{where} (a JSON string) holds {strictjson.kind(value)}, not an object"
            )
        return value
    if isinstance(value, dict):
        return value
    raise ConversationError(
        f"{where} is {strictjson.kind(value)}, not an object or a JSON string of one"
    )


def normalize_tools(tools, where: str = "tools") -> list[dict] | None:
    """A conversation's tool list as the template takes it (None: no tools).

    A list of objects, or a JSON string of one; null, ``""`` and ``[]`` are no tools. A tool
    ``{name, description, parameters}`` is wrapped as ``{type: function, function: ...}``; every
    other is passed as stored, key order kept. Lists this returned come back unchanged.
    """
    if isinstance(tools, str):
        if not tools:
            return None
        try:
            tools = strictjson.loads(tools)
        except ValueError as err:
            raise ConversationError(f"{where} (a JSON string) is {err}") from None
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ConversationError(
            f"{where} is {strictjson.kind(tools)}, not a list of tools (or a JSON string of one)"
        )
    out = []
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ConversationError(f"{where}[{k}] is {strictjson.kind(tool)}, not an object")
        if "function" in tool:
            if not isinstance(tool["function"], dict):
                raise ConversationError(
                    f"{where}[{k}].function is {strictjson.kind(tool['function'])}, not an object"
                )
            out.append(tool)
        elif "type" not in tool and isinstance(tool.get("name"), str) and tool["name"]:
            out.append({"type": "function", "function": tool})
        else:
            raise ConversationError(
                f"{where}[{k}] is neither {{type, function: {{name, ...}}}} nor "
                "{name, description, parameters}"
            )
    return out
