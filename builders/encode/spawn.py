"""Starting worker processes, light enough to do before the command's own imports.

A worker is a fresh interpreter (``python -c``, so the caller's main module is never
re-imported) in a session of its own (a terminal's Ctrl-C reaches only the build), with one end
of a socket pair that no other process holds as its only channel (``builders.encode.worker``
says what travels on it). This module imports nothing heavy: ``fixed-sft build`` and ``plan``
start their workers (``early``) before they read the manifest and import the build's modules,
so a worker's imports run beside the command's, and the pool takes them (``taken``).

``--workers auto`` (``worker_count``) is one process where the machine has at most
``IN_PROCESS_UP_TO`` cores (the engine's own threads use them; measured fastest there, see
docs/performance.md), else a worker for each core the process may use. Tool traces are the
exception: their renders and alignment are Python on the build's thread, so on two cores they
get a worker a core too; the build knows it once the manifest is read, so ``early`` starts none
for them and the pool starts its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

from builders.errors import WorkerError
from builders.runtime import stopping

# cores on which --workers auto encodes in this process
IN_PROCESS_UP_TO = 2
# workers ``early`` starts at once
STARTING_AT_ONCE = 4
# the folder that holds this package: workers run the same code
ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "sys.path.insert(0, sys.argv[1]); "
    "from builders.encode.worker import serve; serve(int(sys.argv[2]))"
)

NOTHING_LEFT = "nothing was left at the final path"
Started = tuple[subprocess.Popen, Connection]
# started by ``early``, not yet taken by a pool
_waiting: list[Started] = []


def worker_count(requested: str | int, tool_traces: bool = False) -> int:
    """The worker processes ``--workers`` asks for.

    ``--workers`` gives a number, or ``auto`` for this machine; with ``tool_traces`` (a dataset
    names a tools field) ``auto`` spreads them over workers from two cores up.
    """
    if requested != "auto":
        return int(requested)
    cores = len(os.sched_getaffinity(0))
    in_process_up_to = 1 if tool_traces else IN_PROCESS_UP_TO
    return 1 if cores <= in_process_up_to else cores


def start() -> Started:
    """Start one worker process; its channel is the build's end of the socket pair.

    The system refusing it (no process or file descriptor left) is a ``WorkerError``.
    """
    # one thread each: the workers are the parallelism
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    try:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            process = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, str(ROOT), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
            )
            return process, Connection(ours.detach())
    except OSError as err:
        raise WorkerError(
            f"a tokenizing worker process could not start: {err}; {NOTHING_LEFT}"
        ) from err


@contextmanager
def early(requested: str | int) -> Iterator[list[Started]]:
    """Start the workers ``--workers`` asks for now; a pool entered in the block takes them.

    It gives them (none where the build encodes in this process, where only the manifest can say
    whether it does, on ``IN_PROCESS_UP_TO`` cores or fewer, or where the system refuses one). All,
    taken or not, are ended and reaped as the block ends, on any way out; a stop (SIGINT, SIGTERM)
    waits while one starts or while they are reaped, so none is left running.
    """
    count = worker_count(requested)
    started: list[Started] = []
    try:
        _start_into(started, count if count > 1 else 0)
        _waiting[:] = started
        yield started[:]
    finally:
        _waiting.clear()
        # a pool that took them ended them already, unless it was stopped as it took them
        with stopping.deferred():
            for one in started:
                stop(one)


def _start_into(started: list[Started], count: int) -> None:
    """Start ``count`` workers into ``started``, or none where the system refuses one.

    Each start waits for its interpreter's exec, so they go ``STARTING_AT_ONCE`` at a time, from
    threads (where the system has none to give, from this one); a stop waits until all have
    started. The pool then starts them itself where the system refused one, and says why it
    cannot where the build did before; any other fault is raised once all are ended.
    """
    outcomes: list[Started | Exception | None] = [None] * count

    def start_every(first: int) -> None:
        for k in range(first, count, STARTING_AT_ONCE):
            try:
                outcomes[k] = start()
            except Exception as err:
                # kept, so that every thread is joined and every worker started is known
                outcomes[k] = err

    with stopping.deferred():
        helpers = []
        for first in range(1, min(count, STARTING_AT_ONCE)):
            helper = threading.Thread(target=start_every, args=(first,), name="worker-start")
            try:
                helper.start()
                helpers.append(helper)
            except RuntimeError:
                # no thread to be had (the system's limit on processes)
                start_every(first)
        start_every(0)
        for helper in helpers:
            helper.join()
        started.extend(o for o in outcomes if o is not None and not isinstance(o, Exception))
        if len(started) < count:
            while started:
                stop(started.pop())
        # a fault other than the system's refusal is raised, once every worker is ended
        for fault in outcomes:
            if isinstance(fault, Exception) and not isinstance(fault, WorkerError):
                raise fault


def taken(count: int) -> list[Started]:
    """The ``count`` workers ``early`` started, or none (it started another number, or none)."""
    if len(_waiting) != count:
        return []
    started = _waiting[:]
    _waiting.clear()
    return started


def stop(started: Started) -> None:
    """Close a worker's channel, end the process and reap it (again: nothing more)."""
    process, channel = started
    channel.close()
    if process.poll() is None:
        process.kill()
    process.wait()
