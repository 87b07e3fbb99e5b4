"""A stop that a signal asked for (SIGINT, SIGTERM), remembered; the command line's entry point.

The handler raises KeyboardInterrupt, which unwinds the build (its temporaries are removed, exit
130). But where the signal lands while a finalizer or a weak reference's callback runs (a
``__del__``, in any library), Python swallows it and the build goes on. So the handler also
remembers the stop, and the build checks it (``check``) at every row and before and after it puts
its outputs in place; Python's "Exception ignored" report of that swallowed stop is left out
(``quiet_stop``), so a stop still ends with one line. A
block that must not be left half done (starting a worker and keeping its handle, reaping them)
holds a stop back until it ends (``deferred``).

``run_command_line`` installs the handler before anything heavy is imported, so a stop ends the
same way from the moment it is installed; ``-v`` (or ``FIXED_SFT_SAY_STARTED=1``) says when.
This module imports nothing of the project's but its package.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

INTERRUPTED = 130
STOPPED = "error: interrupted; nothing was left at the final path"
# set to 1: say on stderr when the stop handler is installed, as -v does
SAY_STARTED = "FIXED_SFT_SAY_STARTED"

_asked = threading.Event()
# blocks a stop does not break into (``deferred``), one inside another
_deferring = 0


def ask(signum, frame) -> None:
    """The signal handler: remember the stop, and unwind (in a ``deferred`` block, as it ends)."""
    _asked.set()
    if not _deferring:
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """A block that a stop does not break into: it unwinds as the block ends.

    For what must not be left half done, such as starting a process and keeping its handle. A
    block inside another unwinds as the outer one ends.
    """
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        check()


def check() -> None:
    """Unwind if a stop was asked for.

    Its KeyboardInterrupt may have been swallowed.
    """
    if _asked.is_set():
        raise KeyboardInterrupt


def install() -> None:
    """Make SIGINT and SIGTERM unwind (and be remembered)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, ask)
    sys.unraisablehook = quiet_stop


def quiet_stop(unraisable) -> None:
    """``sys.unraisablehook``: a stop swallowed in a finalizer is not reported.

    It was remembered (``check`` unwinds); anything else is reported as Python reports it.
    """
    if unraisable.exc_type is KeyboardInterrupt and _asked.is_set():
        return
    sys.__unraisablehook__(unraisable)


def run_command_line() -> int:
    """``fixed-sft``: install the stop handler, then load and run the command line.

    A stop from then on, while the command line loads or later, ends with one line and exit 130.
    """
    try:
        install()
        if os.environ.get(SAY_STARTED) == "1" or {"-v", "--verbose"} & set(sys.argv[1:]):
            print(
                f"started: pid {os.getpid()}; stop handler installed", file=sys.stderr, flush=True
            )
        from builders.cli import main

        check()
        return main()
    except KeyboardInterrupt:
        print(STOPPED, file=sys.stderr)
        return INTERRUPTED
