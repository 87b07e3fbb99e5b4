"""Tool calls in a conversation: what the chat formats check of them.

A conversation's tools reach the template as ``tools=``, its calls as an assistant message's
``tool_calls`` (already normalised by the reader: ``{id?, type: function, function: {name,
arguments}}``), its results as ``tool`` messages (data/ROWS.md, "Tool calls").

- ``tool_fields``: every string the tools and calls put in the render as markup, with where it
  is (the injection refusal reads them);
- ``Injection``: refuses a tool field holding an added token, a stop string or a header;
- ``marked_calls``: a conversation whose calls' names, argument keys and string leaves are
  replaced by markers (the completeness check aligns its render with the real one);
- the probes: ``PROBE_TOOL``, ``TOOL_PROBE`` (an answer after a tool result), and
  ``prints_tools`` (whether a template prints a tool schema at all: every format refuses a
  dataset with tools where it does not, ``builders.formats.render.check_prints_tools``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

from builders.errors import ConversationError

PROBE_NAME = "probe_fn"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}
PROBE_CALL = {"type": "function", "function": {"name": PROBE_NAME, "arguments": {}}}
# an answer after a tool result: the conversation its header is probed with
TOOL_PROBE = [
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]},
    {"role": "tool", "content": "probe"},
]


def row_tools(row: dict) -> list | None:
    """A source row's tools as the template gets them (None: no tools)."""
    tools = row.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ConversationError(f"tools is {type(tools).__name__}, not a list")
    return tools or None


def tool_fields(messages: list[dict], tools: list | None) -> Iterator[tuple[str, str]]:
    """Each tool field: (where it is, its text).

    Every string in ``tools`` (keys too), each call's id, name and arguments (each key and string
    leaf; a string ``arguments`` whole), each tool message's ``tool_call_id`` and ``name``.
    """
    for k, tool in enumerate(tools or ()):
        yield from _strings(tool, f"tools[{k}]")
    for j, message in enumerate(messages):
        where = f"message {j} ({message['role']})"
        for k, call in enumerate(message.get("tool_calls") or ()):
            for key in ("id", "type"):
                if isinstance(call.get(key), str):
                    yield f"{where} call {k} {key}", call[key]
            function = call["function"]
            yield f"{where} call {k} name", function["name"]
            yield from _strings(function.get("arguments"), f"{where} call {k} arguments")
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                yield f"{where} {key}", message[key]


def _strings(value, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield f"{where} key", key
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from _strings(item, f"{where}[{k}]")


def _tool_strings(messages: list[dict], tools: list | None) -> str:
    """Every string (keys too) of the tools and the messages' calls and tool fields, NUL-joined.

    A superset of ``tool_fields``' strings, searched at once; only a hit walks ``tool_fields`` to
    name the field. The two walks must find the same strings: tests/test_tools.py checks that
    the one search refuses exactly what each field's own search does.
    """
    found: list[str] = []
    if tools:
        _all_strings(tools, found)
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            _all_strings(calls, found)
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                found.append(message[key])
    return "\0".join(found)


def _all_strings(value, found: list[str]) -> None:
    """Append each string in ``value`` (and each key) to ``found``, as ``_strings`` walks it."""
    if type(value) is str:
        found.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                found.append(key)
            _all_strings(item, found)
    elif isinstance(value, list):
        for item in value:
            _all_strings(item, found)
    elif isinstance(value, str):
        found.append(value)


class Injection:
    """Refuses a tool field that holds a string only the template's own markup may hold.

    They are the added tokens of ``tokenizer.json``, the ``stop`` strings and the generation
    prompts: a call is supervised markup, so it must hold no header or stop that is not the
    template's.
    """

    def __init__(self, forbidden):
        self.forbidden = tuple(sorted({s for s in forbidden if s}, key=len, reverse=True))
        self._pattern = (
            re.compile("|".join(map(re.escape, self.forbidden))) if self.forbidden else None
        )

    def check(self, messages: list[dict], tools: list | None) -> None:
        # every string of the tools, the calls and the tool messages' fields, searched at once: a
        # superset of the tool fields, so only a match there needs the field found
        if self._pattern is None or not self._pattern.search(_tool_strings(messages, tools)):
            return
        found = self._first(tool_fields(messages, tools))
        if found:
            self._refuse(*found)

    def _first(self, fields) -> tuple[str, str] | None:
        if self._pattern is None:
            return None
        for where, text in fields:
            if match := self._pattern.search(text):
                return where, match.group(0)
        return None

    @staticmethod
    def _refuse(where: str, found: str) -> None:
        raise ConversationError(
            f"{where} holds {found!r}, an added token, stop string or generation prompt of the "
            f"template: a tool field is markup the model is trained on, and may hold none "
            f'(data/ROWS.md, "Tool calls")'
        )


class CallField(NamedTuple):
    """A call's name, argument key or string leaf, replaced by a marker."""

    message: int
    call: int
    # "name", "argument key" or "argument value" (or "arguments": a string kept as-is)
    what: str
    text: str

    def describe(self) -> str:
        return f"call {self.call} ({self.what} {self.text[:40]!r})"


def marked_calls(messages: list[dict], marker: Callable[[CallField], str]) -> list[dict]:
    """``messages`` with each call field replaced by ``marker(field)``.

    A field that is empty stays as it is (nothing to find).
    """

    def mark(j: int, k: int, what: str, text: str) -> str:
        if not text:
            return text
        return marker(CallField(j, k, what, text))

    def marked(j: int, k: int, value):
        if isinstance(value, str):
            return mark(j, k, "argument value", value)
        if isinstance(value, dict):
            return {
                mark(j, k, "argument key", key) if isinstance(key, str) else key: marked(j, k, item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [marked(j, k, item) for item in value]
        return value

    out = []
    for j, message in enumerate(messages):
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        held = []
        for k, call in enumerate(calls):
            function = dict(call["function"])
            function["name"] = mark(j, k, "name", function["name"])
            arguments = function.get("arguments")
            function["arguments"] = (
                mark(j, k, "arguments", arguments)
                if isinstance(arguments, str)
                else marked(j, k, arguments)
            )
            held.append({**call, "function": function})
        out.append({**message, "tool_calls": held})
    return out


def escaped_prints(text: str) -> Iterator[str]:
    """``text`` as a template may print a string field: as it is, or as ``tojson`` escapes it.

    Without the quotes; each form once, in that order, each made only when asked for.
    """
    yield text
    unicode = json.dumps(text, ensure_ascii=False)[1:-1]
    if unicode != text:
        yield unicode
    ascii_only = json.dumps(text)[1:-1]
    if ascii_only not in (text, unicode):
        yield ascii_only


def prints_tools(render: Callable[[list, list], str]) -> bool:
    """Whether a template prints a tool schema given as ``tools=``.

    ``render(messages, tools)`` renders; the probe tool's name must occur.
    """
    return PROBE_NAME in render([{"role": "user", "content": "probe"}], [PROBE_TOOL])
