"""A stop that a signal asked for (SIGINT, SIGTERM), remembered.

The handler raises KeyboardInterrupt, which unwinds the build (its temporaries are removed, exit
130). But where the signal lands while a finalizer runs (a ``__del__``, in any library), Python
prints "Exception ignored" and the build goes on. So the handler also remembers the stop, and the
build checks it (``check``) at every row and before and after it puts its outputs in place.
"""

from __future__ import annotations

import threading

_asked = threading.Event()


def ask(signum, frame) -> None:
    """The signal handler: remember the stop, and unwind."""
    _asked.set()
    raise KeyboardInterrupt


def check() -> None:
    """Unwind if a stop was asked for.

    Its KeyboardInterrupt may have been swallowed.
    """
    if _asked.is_set():
        raise KeyboardInterrupt
