"""Starting worker processes, light enough to do before the command's own imports.

A build's workers are forked by one interpreter, their parent (``python -c``, so the caller's main
module is never re-imported), started in a session of its own (a terminal's Ctrl-C reaches only
the build). The parent imports what a worker needs, parses the pinned ``tokenizer.json``, loads
fastokens and makes the encoder once, then forks every worker from that state
(``builders.encode.family``, which also says how the plan's sample is encoded while fastokens
loads): no worker imports, parses or makes anything again, so sixteen workers cost about one's
start-up (docs/performance.md). Each worker holds one end of a
socket pair that no other process holds as its only channel (``builders.encode.worker`` says what
travels on it); the parent tells the build, on a channel of its own, each worker's process id
and, once it has reaped it, its exit status.
The kernel ends a worker whose parent is gone (``PR_SET_PDEATHSIG``).

This module imports nothing heavy: ``fixed-sft build`` and ``plan`` start their workers
(``early``) before they read the manifest and import the build's modules, so the parent's imports
run beside the command's, and the pool takes them (``taken``).

``--workers auto`` (``worker_count``) is one process where the machine has at most
``IN_PROCESS_UP_TO`` cores (the engine's own threads use them; measured fastest there, see
docs/performance.md), else a worker for each core the process may use. Tool traces are the
exception: their renders and alignment are Python on the build's thread, so on two cores they
get a worker a core too; the build knows it once the manifest is read, so ``early`` starts none
for them and the pool starts its own.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from pathlib import Path

from builders.errors import WorkerError
from builders.runtime import stopping

# cores on which --workers auto encodes in this process
IN_PROCESS_UP_TO = 2
# the folder that holds this package: workers run the same code
ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "sys.path.insert(0, sys.argv[1]); "
    "from builders.encode.family import serve_family; "
    "serve_family(int(sys.argv[2]), [int(fd) for fd in sys.argv[3:]])"
)
# the parent forks its workers: no thread may be running in it then (a thread's lock held at the
# fork stays held in the child), so the libraries' own thread pools are not started there
PARENT_ENVIRONMENT = {
    # one thread each: the workers are the parallelism
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
    # numpy's OpenBLAS starts its threads at import
    "OPENBLAS_NUM_THREADS": "1",
    # pyarrow's jemalloc starts a purging thread at import
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}

NOTHING_LEFT = "nothing was left at the final path"


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


class Family:
    """The interpreter that forks a build's workers, and what it says of them.

    It reports each worker's process id as it forks it, and each worker's exit status as it
    reaps it; a worker it never forked ended with it.
    """

    def __init__(self, process: subprocess.Popen, control: Connection, count: int):
        self.process, self.control, self.count = process, control, count
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}

    def pid(self, place: int) -> int | None:
        """Worker ``place``'s process id, if it has been forked (and not reaped)."""
        self._hear_all()
        return None if place in self.codes else self.pids.get(place)

    def code(self, place: int, timeout: float | None) -> int | None:
        """Worker ``place``'s exit status once it has ended; None if it runs after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while place not in self.codes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._hear(left):
                return None
        if len(self.codes) == self.count and timeout is None:
            # the parent exits once it has reaped every worker: reap it in turn
            while self._hear(None):
                pass
        return self.codes[place]

    def end(self) -> None:
        """End the parent, and with it every worker (the kernel ends them)."""
        if self.process.poll() is None:
            self.process.kill()

    def _hear_all(self) -> None:
        while self._hear(0):
            pass

    def _hear(self, timeout: float | None) -> bool:
        """Take one report within ``timeout``; False if none came, or nothing is left to come.

        A stop waits while a report is read and kept (one read half would leave the channel out
        of step, and a report lost, a wait for it unending).
        """
        if self.control.closed:
            return False
        try:
            if not self.control.poll(timeout):
                return False
            with stopping.deferred():
                kind, place, value = json.loads(self.control.recv_bytes())
                (self.pids if kind == "pid" else self.codes)[place] = value
        except (EOFError, OSError):
            self._ended()
        return True

    def _ended(self) -> None:
        """The parent is gone: its workers not reaped by it ended with it.

        A stop waits until every worker's status is kept.
        """
        with stopping.deferred():
            self.control.close()
            code = self.process.wait()
            for place in range(self.count):
                if place in self.codes:
                    continue
                if self.pids.get(place) is not None:
                    # the kernel sent it SIGKILL as the parent died (``PR_SET_PDEATHSIG``)
                    wait_gone(self.pids[place])
                    self.codes[place] = -signal.SIGKILL
                else:
                    self.codes[place] = code


class Forked:
    """A forked worker's process: what the build does with a ``subprocess.Popen``."""

    def __init__(self, family: Family, place: int):
        self.family, self.place = family, place

    def poll(self) -> int | None:
        return self.family.code(self.place, 0)

    def kill(self) -> None:
        """SIGKILL to the worker; where it has not been forked, its parent ends (and all)."""
        pid = self.family.pid(self.place)
        if self.place in self.family.codes:
            return
        if pid is None:
            self.family.end()
            return
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        code = self.family.code(self.place, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.place}", timeout)
        return code


Started = tuple[Forked, Connection]
# started by ``early``, not yet taken by a pool
_waiting: list[Started] = []


def wait_gone(pid: int) -> None:
    """Wait until process ``pid`` (not this process's child) has exited.

    Where the system cannot say (no pidfd before Linux 5.3), it does not wait: the build has
    closed the process's channel, and a worker ends at the end of its channel.
    """
    try:
        descriptor = os.pidfd_open(pid)
    except OSError:
        return
    try:
        # readable once the process has exited
        waiting = select.poll()
        waiting.register(descriptor, select.POLLIN)
        waiting.poll()
    finally:
        os.close(descriptor)


def start(count: int) -> list[Started]:
    """Start ``count`` workers: their parent, which forks them once it has what they share.

    Each worker's channel is the build's end of its socket pair. The system refusing the parent
    (no process or file descriptor left) is a ``WorkerError``.
    """
    environment = {**os.environ, **PARENT_ENVIRONMENT}
    pairs: list[tuple[socket.socket, socket.socket]] = []
    try:
        for _ in range(count + 1):
            pairs.append(socket.socketpair())
        theirs = [pair[1].fileno() for pair in pairs]
        process = subprocess.Popen(
            [sys.executable, "-c", BOOTSTRAP, str(ROOT), *map(str, theirs)],
            pass_fds=theirs,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
    except BaseException as err:
        for ours, theirs_end in pairs:
            ours.close()
            theirs_end.close()
        if isinstance(err, OSError):
            raise WorkerError(
                f"a tokenizing worker process could not start: {err}; {NOTHING_LEFT}"
            ) from err
        raise
    channels = []
    for ours, theirs_end in pairs:
        theirs_end.close()
        channels.append(Connection(ours.detach()))
    family = Family(process, channels[0], count)
    return [(Forked(family, place), channel) for place, channel in enumerate(channels[1:])]


@contextmanager
def early(requested: str | int) -> Iterator[list[Started]]:
    """Start the workers ``--workers`` asks for now; a pool entered in the block takes them.

    It gives them (none where the build encodes in this process, where only the manifest can say
    whether it does, on ``IN_PROCESS_UP_TO`` cores or fewer, or where the system refuses their
    parent). All, taken or not, are ended and reaped as the block ends, on any way out; a stop
    (SIGINT, SIGTERM) waits while they start or while they are reaped, so none is left running.
    """
    count = worker_count(requested)
    started: list[Started] = []
    try:
        if count > 1:
            # the pool starts its own where the system refuses them, and says why it cannot
            with stopping.deferred(), suppress(WorkerError):
                started = start(count)
        _waiting[:] = started
        yield started[:]
    finally:
        _waiting.clear()
        # a pool that took them ended them already, unless it was stopped as it took them
        with stopping.deferred():
            stop(started)


def taken(count: int) -> list[Started]:
    """The ``count`` workers ``early`` started, or none (it started another number, or none)."""
    if len(_waiting) != count:
        return []
    started = _waiting[:]
    _waiting.clear()
    return started


def stop(started: list[Started]) -> None:
    """Close the workers' channels, end them and reap them (again: nothing more).

    Every channel is closed first: a worker ends at the end of its channel, so none waits for
    the others to be ended.
    """
    for _, channel in started:
        channel.close()
    for process, _ in started:
        if process.poll() is None:
            process.kill()
    for process, _ in started:
        process.wait()
