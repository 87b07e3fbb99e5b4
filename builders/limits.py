"""What one conversation may cost: the manifest's ``limits:``.

A conversation's characters and the characters its render prints are bounded, so that one hostile
row or template ends the build with exit 4 naming it instead of taking the machine's memory. The
defaults are far beyond any real SFT conversation; the limits refuse, they never change rows, so
they are recorded in the report but are not part of the recipe a build's rows are named by.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    """The bounds on one conversation (the manifest's ``limits:``)."""

    # the characters of a conversation's text, as read (every message's fields together)
    conversation_chars: int = 4_000_000
    # the characters a render of one conversation may print, and any value it builds on the way
    render_chars: int = 8_000_000

    def as_dict(self) -> dict:
        return asdict(self)


DEFAULT_LIMITS = Limits()
LIMIT_KEYS = tuple(DEFAULT_LIMITS.as_dict())
