"""JSON as the builder reads it: strict, every refusal a ``ValueError`` with its reason.

Python's ``json`` takes a duplicate key's last value, reads ``NaN`` and ``Infinity`` and turns
``1e999`` into infinity; pyarrow's JSON reader crashes on some input. Every JSON text a build reads
(a dataset row, a tool list, a call's arguments) goes through ``loads``, which refuses each of
those, and too deep a nesting, with one message.
"""

from __future__ import annotations

import json
import math


def _pairs(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in one object")
            seen.add(key)
    return obj


def _constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)


def loads(text: str):
    """The value of the JSON ``text``.

    Raises ValueError naming why it is refused: not JSON (with the character where it fails),
    a duplicate key, NaN or Infinity, a number out of range, nesting too deep.
    """
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at character {err.pos})") from None
    except RecursionError:
        raise ValueError("not readable JSON (nested too deeply)") from None
    except ValueError as err:
        raise ValueError(f"not readable JSON ({err})") from None


def kind(value) -> str:
    """What a JSON value is, in words (``an object``, ``a list``, ...)."""
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), "a number")
