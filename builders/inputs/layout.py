"""A dataset's layout applied to one row: its fields read, renamed, checked and normalised.

A row as a file stores it (a JSON object, or a parquet row as Python) becomes the row the build
reads: its id and ``source``, its messages with the fields the template knows (``keys:`` renamed,
``roles:`` mapped, tool calls normalised: ``builders.messages``), its tools (``tools:``) normalised.
A message field the layout does not name, holding a value, is refused: nothing is dropped
unnoticed. Every refusal is a ConversationError whose message names the field (and the message);
the reader adds the file, the row and the id. In a table the rows are ``ROW_SCHEMA``: a call list,
a tool list and ``step_loss_mask`` travel as JSON text (their keys vary from row to row) and
``conversations`` turns a table back into the rows the chat formats take.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

from builders.errors import ConversationError
from builders.limits import DEFAULT_LIMITS
from builders.manifest import DatasetPin
from builders.messages import (
    MESSAGE_KEYS,
    READ_ROLES,
    STEP_LOSS_MASK,
    normalize_messages,
    normalize_tools,
)
from builders.strictjson import kind

# the most a row may hold (data/ROWS.md, "Reading a dataset"): its text in a JSON file, in bytes;
# the UTF-8 bytes of its message strings in parquet
CONVERSATION_CHARS = DEFAULT_LIMITS.conversation_chars
LIMIT_KEY = "limits.conversation_chars"
# message fields held in a table as JSON text
JSON_HELD = ("tool_calls", STEP_LOSS_MASK)
MESSAGE_TYPE = pa.list_(pa.struct([(key, pa.string()) for key in (*MESSAGE_KEYS, STEP_LOSS_MASK)]))
# a block of rows as a reader gives it: ``problem`` is why a row cannot be read (null: none)
ROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("messages", MESSAGE_TYPE),
        ("tools", pa.string()),
        # the calls whose arguments the file stores as a JSON string (null: none)
        ("string_arguments", pa.int32()),
        ("problem", pa.string()),
    ]
)
# the row field a pin that names no tools field expects to find empty, if there at all
TOOLS_FIELD = "tools"
# ``json.dumps(value, ensure_ascii=False)``, its encoder made once
_JSON_TEXT = json.JSONEncoder(ensure_ascii=False).encode


@dataclass(frozen=True)
class Layout:
    """How a dataset pin stores its rows, and what a row may cost."""

    messages: str
    id: str | None
    # the stored field of each message key (MESSAGE_KEYS order)
    keys: tuple[str, ...]
    # stored role -> template role; None: as stored
    roles: tuple[tuple[str, str], ...] | None
    # the field holding the tools; None: none
    tools: str | None
    # a field that must hold no tools (the pin names none); None: none is checked
    unread_tools: str | None
    arguments: str
    limit: int = CONVERSATION_CHARS

    @classmethod
    def of(cls, pin: DatasetPin, limit: int = CONVERSATION_CHARS) -> Layout:
        return cls(
            pin.messages,
            pin.id,
            pin.keys,
            pin.roles,
            pin.tools,
            None if pin.tools is not None or pin.tools_unused else TOOLS_FIELD,
            pin.arguments,
            limit,
        )

    @cached_property
    def stored(self) -> dict[str, str]:
        """Each message key and the stored field holding it."""
        return dict(zip(MESSAGE_KEYS, self.keys, strict=True))

    @cached_property
    def role_map(self) -> dict[str, str] | None:
        """Stored role -> the template's (None: as stored)."""
        return None if self.roles is None else dict(self.roles)

    @cached_property
    def canonical(self) -> dict[str, str]:
        """Each stored field the layout reads and the message key it holds."""
        return {stored: key for key, stored in self.stored.items()}

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The row fields a reader reads (besides ``source``)."""
        return tuple(
            f for f in (self.messages, self.id, self.tools, self.unread_tools) if f is not None
        )

    def too_long(self, size: int, what: str) -> str:
        """The problem of a row of ``size`` bytes, longer than the limit."""
        return (
            f"{what} is {size:,} bytes, longer than {LIMIT_KEY} ({self.limit:,}); refused "
            "unread (raise the limit in the manifest, or split the conversation in the source)"
        )

    def row(self, raw: dict, structs: frozenset[str] = frozenset()) -> dict:
        """The row ``raw`` as the build reads it (a ``ROW_SCHEMA`` row).

        ``structs``: what of ``arguments`` and ``tools`` the file stores as parquet structs
        (refused where a row holds them: absent keys read back as null).
        """
        identity = _id(raw.get(self.id), self.id) if self.id is not None else None
        source = raw.get("source")
        if source is not None and not isinstance(source, str):
            raise ConversationError(f"field 'source' is {kind(source)}, not a string")
        if self.unread_tools is not None:
            try:
                unread = normalize_tools(raw.get(self.unread_tools))
            except ConversationError:
                unread = True
            if unread:
                raise ConversationError(
                    f"field {self.unread_tools!r} holds tools, but the dataset names no tools "
                    f"field: its calls would be trained without their schema (dataset tools: "
                    f"{self.unread_tools}; or tools: null to leave the field unread)"
                )
        tools = None
        if "tools" in structs and raw.get(self.tools or self.unread_tools):
            raise ConversationError(
                f"field {self.tools or self.unread_tools!r} is stored as a parquet list of "
                "structs: absent keys read back as null; store the tools as a JSON string"
            )
        if self.tools is not None:
            tools = normalize_tools(raw.get(self.tools), f"field {self.tools!r}")
        messages = raw.get(self.messages)
        if messages is None:
            raise ConversationError(f"no conversation (field {self.messages!r} is missing or null)")
        if not isinstance(messages, list):
            raise ConversationError(
                f"field {self.messages!r} is {kind(messages)}, not a list of messages"
            )
        renamed = [
            self._renamed(message, position, "arguments" in structs)
            for position, message in enumerate(messages)
        ]
        try:
            normalized = normalize_messages(
                renamed,
                fields=MESSAGE_KEYS,
                peer=True,
                arguments=self.arguments,
                names=self.stored,
            )
        except ConversationError as err:
            raise ConversationError(f"field {self.messages!r}: {err}") from None
        return {
            "id": identity,
            "source": source,
            "messages": [_held(m) for m in normalized],
            "tools": None if tools is None else _JSON_TEXT(tools),
            "string_arguments": sum(
                isinstance((call.get("function") or call).get("arguments"), str)
                for m in renamed
                for call in m.get("tool_calls") or ()
            )
            or None,
            "problem": None,
        }

    def _renamed(self, message, position: int, struct_arguments: bool) -> dict:
        """A stored message with the template's field names, its role mapped."""

        def fail(problem: str):
            raise ConversationError(f"field {self.messages!r}: message {position} {problem}")

        if message is None:
            fail("is null")
        if not isinstance(message, dict):
            fail(f"is {kind(message)}, not an object")
        canonical = self.canonical
        out = {}
        for field, value in message.items():
            if field in canonical:
                out[canonical[field]] = value
            elif field == STEP_LOSS_MASK:
                out[field] = value
            elif value is not None:
                fail(
                    f"has field {field!r}, which the layout does not read (it reads "
                    f"{', '.join(self.keys)}, {STEP_LOSS_MASK}; name the field in keys:, or "
                    "remove it from the source)"
                )
        for key in ("role", "content"):
            if out.get(key) is None and not (key == "content" and out.get("tool_calls")):
                fail(f"has no field {self.stored[key]!r} (the layout's keys.{key})")
        out["role"] = self._mapped(out["role"], fail)
        if struct_arguments:
            self._no_struct_arguments(out.get("tool_calls"), fail)
        return out

    def _mapped(self, role, fail) -> str:
        """A stored role as the template names it."""
        if not isinstance(role, str):
            fail(f"has {self.stored['role']!r} {kind(role)}, not a string")
        mapped = self.role_map
        if mapped is None and role not in READ_ROLES:
            fail(
                f"has role {role!r}, not one of {', '.join(READ_ROLES)}: a dataset that names its "
                "roles otherwise maps them with the layout's roles: (ShareGPT's: roles: {system: "
                "system, human: user, gpt: assistant}; docs/datasets.md)"
            )
        if mapped is None:
            return role
        if role not in mapped:
            fail(
                f"has role {role!r}, which the layout's roles do not map (they map "
                f"{', '.join(repr(k) for k in mapped)})"
            )
        return mapped[role]

    def _no_struct_arguments(self, calls, fail) -> None:
        """Refuse a call whose arguments a parquet struct holds."""
        for k, call in enumerate(calls if isinstance(calls, list) else []):
            holder = call.get("function") or call if isinstance(call, dict) else None
            if isinstance(holder, dict) and holder.get("arguments") is not None:
                fail(
                    f"has {self.stored['tool_calls']}[{k}] arguments stored as a parquet "
                    "struct: absent keys read back as null; store arguments as JSON strings"
                )


def _id(value, field: str) -> str | None:
    """A row's id: a string, or a whole number read as its text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ConversationError(
        f"field {field!r} (the id) is {kind(value)}, not a string or a whole number"
    )


def _held(message: dict) -> dict:
    """A normalised message as a table holds it."""
    return {key: _JSON_TEXT(value) if key in JSON_HELD else value for key, value in message.items()}


def rows_table(rows: list[dict]) -> pa.Table:
    """``ROW_SCHEMA`` rows as a table.

    A row holding a string no UTF-8 text can hold (half a surrogate pair, from a JSON escape)
    becomes the row of that problem.
    """
    try:
        return _table(rows)
    except UnicodeEncodeError:
        out = []
        for row in rows:
            try:
                _table([row])
            except UnicodeEncodeError:
                row = problem_row(
                    "a string holds half of a surrogate pair (a \\ud800-\\udfff escape alone): "
                    "not text",
                    row["id"] if _encodes(row["id"]) else None,
                    row["source"] if _encodes(row["source"]) else None,
                )
            out.append(row)
        return _table(out)


def _encodes(text: str | None) -> bool:
    """Whether ``text`` (None: none) is text UTF-8 can hold."""
    try:
        text is None or text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _table(rows: list[dict]) -> pa.Table:
    """``ROW_SCHEMA`` rows as a table, column by column (nested dicts convert slowly)."""
    fields = {f.name: [] for f in MESSAGE_TYPE.value_type}
    offsets, valid = [0], []
    for row in rows:
        messages = row["messages"]
        valid.append(messages is not None)
        for message in messages or ():
            for key, values in fields.items():
                values.append(message.get(key))
        offsets.append(len(fields["role"]))
    structs = pa.StructArray.from_arrays(
        [pa.array(values, pa.string()) for values in fields.values()],
        fields=list(MESSAGE_TYPE.value_type),
    )
    messages = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        structs,
        type=MESSAGE_TYPE,
        mask=pa.array([not v for v in valid], pa.bool_()),
    )
    columns = {
        f.name: messages
        if f.name == "messages"
        else pa.array([row[f.name] for row in rows], f.type)
        for f in ROW_SCHEMA
    }
    return pa.table(columns, schema=ROW_SCHEMA)


def problem_row(problem: str, identity: str | None = None, source: str | None = None) -> dict:
    """A ``ROW_SCHEMA`` row that cannot be read, and why."""
    return {
        "id": identity,
        "source": source,
        "messages": None,
        "tools": None,
        "string_arguments": None,
        "problem": problem,
    }


def tool_counts(row: dict) -> tuple[int, int, int, int]:
    """What a row holds of tool use, for the report and card.

    Its tools given (1 or 0), its calls whose arguments were stored as a JSON string and as an
    object, and its tool messages.
    """
    messages = row.get("messages") or ()
    calls = sum(len(m.get("tool_calls") or ()) for m in messages)
    strings = row.get("string_arguments") or 0
    return (
        int(row.get("tools") is not None),
        strings,
        calls - strings,
        sum(m.get("role") == "tool" for m in messages),
    )


def conversations(table: pa.Table) -> list[dict]:
    """A table's rows as the chat formats take them.

    Each a dict with its messages (absent fields left out; calls and ``step_loss_mask`` from
    their JSON text) and ``tools`` (None, or the normalised list).
    """
    rows = table.to_pylist()
    for row in rows:
        if row.get("messages") is not None:
            row["messages"] = [
                {
                    key: json.loads(value) if key in JSON_HELD else value
                    for key, value in message.items()
                    if value is not None
                }
                for message in row["messages"]
            ]
        if row.get("tools") is not None:
            row["tools"] = json.loads(row["tools"])
    return rows
