"""Text from data, a template or a card, as it is printed: control characters escaped.

A conversation, a chat template's ``raise_exception`` message, a recipe card's value can hold
escape sequences that clear a terminal, move its cursor or start a line of their own (a forged
``error: all good``). Every message that prints such text prints ``shown(text)``: each control
character written as its escape (``\\x1b``, ``\\r``, ``\\n``, ``\\u202e``), the rest as it is.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# bidirectional controls, which reorder how a line reads (Unicode's category Cf, with others
# such as the zero-width joiner, which emoji need, left as they are)
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def _escape(character: str) -> str:
    code = ord(character)
    return _NAMED.get(character) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


# C0, DEL and C1 controls (category Cc), line and paragraph separators (Zl, Zp), bidi controls
_ESCAPES = {
    code: _escape(chr(code))
    for code in (
        *range(0x20),
        *range(0x7F, 0xA0),
        *(ord(c) for c in _BIDI),
        0x2028,
        0x2029,
    )
}
_ESCAPES_KEEPING_LINES = {
    code: escape for code, escape in _ESCAPES.items() if chr(code) not in "\n\t"
}


def shown(text: object, keep_lines: bool = False) -> str:
    """``text`` (``str(text)``) with its control characters written as escapes.

    On one line; with ``keep_lines``, line breaks and tabs stay (a view of a conversation, a
    message of several lines), every other control character is escaped.
    """
    return str(text).translate(_ESCAPES_KEEPING_LINES if keep_lines else _ESCAPES)
