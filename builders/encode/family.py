"""The workers' parent: what every worker shares, made once, and the workers forked from it.

``spawn.start`` runs ``serve_family`` in a fresh interpreter with one end of a socket pair per
worker and a control socket. The parent reads the first channel's two start-up messages (where
the pinned ``tokenizer.json`` lies, then the chat format, contract, engine and source), parses the
tokenizer, imports the renderer and makes the encoder, and forks a worker per channel from that
state: no worker imports, parses or makes anything again. It says on the control channel each
worker's process id and, as it reaps it, its exit status. A process forks with one thread only (a
lock held by another thread at the fork would stay held in the child).

Where the engine asked for may be fastokens and the machine has more than 2 cores
(``_samples_first``), two generations serve each channel, so that the first batch does not wait
for fastokens' load (over a second of one core, about 3 times the tokenizer's parse):

- before it loads anything, the parent forks the *sampler*, which parses the tokenizer and makes
  the encoder too, and forks a *sample worker* per channel: it says it is ready, encodes the
  plan's sample with the reference (``tokenizers``), and, once the build says the sample is over
  (``{"sampled": true}``), reads no further and exits with ``HANDED_OVER``;
- meanwhile the parent loads fastokens in a thread beside its own parse, joins it, and, as each
  sample worker hands over, forks the channel's *worker* for the rest of the build, with
  fastokens loaded: it chooses its engine (its probes) and serves every task after the sample.

The sampler tells the parent what it forks and reaps, on a pipe; the parent tells the build. A
process whose parent ends is ended by the kernel (``PR_SET_PDEATHSIG``): the sampler and every
worker with the parent, the sample workers with the sampler. The parent keeps every channel open
until the channel's worker is forked, or the channel's sample worker has ended otherwise, which
it then says and closes the channel.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import traceback
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NoReturn

from tokenizers import Tokenizer

from builders.contract import Contract
from builders.encode import engines, spawn
from builders.encode.encoder import ConversationEncoder
from builders.encode.worker import REST, SAMPLE, WHOLE, checked_text, fail, format_spec, serve
from builders.runtime import no_pandas

# the sampler takes a core of its own while fastokens loads: on 2 cores it costs the build more
# than the first batch gains (docs/performance.md). FIXED_SFT_SAMPLER=1 (or 0) forks it (or not)
# whatever the cores
SAMPLER = "FIXED_SFT_SAMPLER"
SAMPLER_FROM_CORES = 3
# a sample worker's exit status once it has served the plan's sample and handed its channel over
HANDED_OVER = 3
# prctl(2): the signal a process gets when its parent ends; the process's name (``ps``, ``top``)
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
# each process's name, by what it does
NAMES = {WHOLE: b"sft-worker", REST: b"sft-worker", SAMPLE: b"sft-sample"}


@dataclass(frozen=True)
class Messages:
    """The build's two start-up messages, as sent (``raw``), and what they say."""

    raw: tuple[bytes, bytes]
    tokenizer_json: str
    start_up: dict

    @classmethod
    def read(cls, channel: Connection) -> Messages:
        """Read them from ``channel``; the renderer is imported while the first is awaited."""
        if not channel.poll(0):
            _import_renderer()
        tokenizer_message = channel.recv_bytes()
        tokenizer_json = checked_text(json.loads(tokenizer_message))
        # it follows at once, while the build checks its other inputs
        start_up_message = channel.recv_bytes()
        return cls(
            (tokenizer_message, start_up_message), tokenizer_json, json.loads(start_up_message)
        )


@dataclass(frozen=True)
class Prepared:
    """What every worker of a generation shares, made once by its parent.

    ``fast``: fastokens, loaded (None: not loaded here, not asked for, or it cannot load).
    """

    messages: Messages
    tokenizer: Tokenizer
    encoder: ConversationEncoder
    fast: engines.FastokensEngine | None


def serve_family(control_fd: int, fds: list[int]) -> None:
    """The workers' parent, until every worker is reaped (the module says how)."""
    no_pandas.refuse()
    _name(b"sft-parent")
    control = Connection(control_fd)
    channels = [Connection(fd) for fd in fds]
    try:
        messages = Messages.read(channels[0])
    except (EOFError, OSError):
        # the build is gone
        return
    except Exception as err:
        _fail_all(channels, err)
        return
    sampler = None
    if _samples_first(messages.start_up["engine"]):
        sampler = Sampler.start(channels, control, messages)
    workers = Children(channels, control)
    try:
        prepared: Prepared | Exception = _prepare(messages, load_fast=True)
    except Exception as err:
        if sampler is None:
            _fail_all(channels, err)
            return
        # the sampler met it too, and said so; a sample worker that hands over is told
        prepared = err
    if sampler is None:
        workers.fork_all(prepared, WHOLE)
    else:
        workers.closing.append(sampler.reports)
        sampler.follow(workers, prepared)
    workers.reap()


class Children:
    """The workers a process forks, one per channel, and what it says of them on ``reports``."""

    def __init__(self, channels: list[Connection], reports: Connection):
        self.channels, self.reports = channels, reports
        # what a forked worker closes besides the other channels and the reports
        self.closing: list[Connection] = []
        self.places: dict[int, int] = {}  # process id → place

    def fork_all(self, prepared: Prepared, role: str) -> None:
        """Fork a worker for every channel; where the system refuses, the rest are told why."""
        for place in range(len(self.channels)):
            refused = self.fork(place, prepared, role)
            if refused:
                for unforked in self.channels[place + 1 :]:
                    fail(unforked, refused)
                    unforked.close()
                return

    def fork(self, place: int, prepared: Prepared | Exception, role: str) -> OSError | None:
        """Fork channel ``place``'s worker, in ``role``; the system's refusal is returned.

        Where ``prepared`` is the error its making met, or the system refuses, the channel is told
        why and closed instead.
        """
        channel = self.channels[place]
        refused = None
        if not isinstance(prepared, Exception):
            parent = os.getpid()
            _flush()
            try:
                pid = os.fork()
            except OSError as err:
                refused = err
            else:
                if pid == 0:
                    _forked(place, self, prepared, role, parent)
                self.places[pid] = place
                channel.close()
                self.say("pid", place, pid)
                return None
        fail(channel, refused or prepared)
        channel.close()
        return refused

    def ended(self, place: int, code: int) -> None:
        """Channel ``place``'s worker ended, forked by another process: close it, and say so."""
        self.channels[place].close()
        self.say("exit", place, code)

    def reap(self) -> None:
        """Reap every worker forked here, saying each one's exit status."""
        while self.places:
            pid, status = os.wait()
            if pid in self.places:
                self.say("exit", self.places.pop(pid), os.waitstatus_to_exitcode(status))

    def say(self, kind: str, place: int, value: int | None) -> None:
        """Report a worker's process id (``pid``; None: none now) or exit status (``exit``)."""
        # OSError: whoever reads the reports is gone
        with suppress(OSError):
            self.reports.send_bytes(json.dumps([kind, place, value]).encode("utf-8"))


class Sampler:
    """The parent's handle on the sampler: its process id and the end of its reports' pipe."""

    def __init__(self, pid: int, reports: Connection):
        self.pid, self.reports = pid, reports

    @classmethod
    def start(
        cls, channels: list[Connection], control: Connection, messages: Messages
    ) -> Sampler | None:
        """Fork the sampler; None where the system refuses (the workers then start later)."""
        read, write = os.pipe()
        parent = os.getpid()
        _flush()
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return None
        if pid == 0:
            os.close(read)
            _sample(channels, [control], messages, Connection(write, readable=False), parent)
        os.close(write)
        return cls(pid, Connection(read, writable=False))

    def follow(self, workers: Children, prepared: Prepared | Exception) -> None:
        """Pass on the sampler's reports; fork a channel's worker as its sample worker hands over.

        Once the sampler has ended, a channel whose sample worker it never reported ended ended
        with it (the kernel ended a forked one; one not forked, the sampler said why).
        """
        forked: dict[int, int] = {}
        handled = set()
        while True:
            try:
                kind, place, value = json.loads(self.reports.recv_bytes())
            except (EOFError, OSError):
                break
            if kind == "pid":
                forked[place] = value
                workers.say("pid", place, value)
                continue
            handled.add(place)
            if value == HANDED_OVER:
                workers.say("pid", place, None)
                workers.fork(place, prepared, REST)
            else:
                workers.ended(place, value)
        self.reports.close()
        _, status = os.waitpid(self.pid, 0)
        for place in range(len(workers.channels)):
            if place in handled:
                continue
            if place in forked:
                spawn.wait_gone(forked[place])
            workers.ended(
                place, -signal.SIGKILL if place in forked else os.waitstatus_to_exitcode(status)
            )


def _sample(
    channels: list[Connection],
    closing: list[Connection],
    messages: Messages,
    reports: Connection,
    parent: int,
) -> NoReturn:
    """The sampler's life: the sample workers forked and reaped, each reported on ``reports``."""
    code = 1
    try:
        _ends_with(parent)
        _name(b"sft-sampler")
        for connection in closing:
            connection.close()
        try:
            prepared = _prepare(messages, load_fast=False)
        except Exception as err:
            _fail_all(channels, err)
        else:
            workers = Children(channels, reports)
            workers.fork_all(prepared, SAMPLE)
            workers.reap()
        code = 0
    except BaseException:
        with suppress(BaseException):
            traceback.print_exc()
    finally:
        _exit(code)


def _forked(place: int, siblings: Children, prepared: Prepared, role: str, parent: int) -> NoReturn:
    """A forked worker's life: it serves the build on channel ``place``, then exits.

    It never returns into its parent's code, whatever happens (``os._exit``).
    """
    code = 1
    try:
        _ends_with(parent)
        _name(NAMES[role])
        for connection in [siblings.reports, *siblings.closing]:
            connection.close()
        for other, channel in enumerate(siblings.channels):
            if other != place:
                channel.close()
        handed_over = serve(
            siblings.channels[place],
            prepared,
            role,
            # a sample worker's are its parent's: the first channel's were read before the fork
            reads_messages=role != REST and place > 0,
        )
        code = HANDED_OVER if handed_over else 0
    except BaseException:
        with suppress(BaseException):
            traceback.print_exc()
    finally:
        _exit(code)


def _prepare(messages: Messages, load_fast: bool) -> Prepared:
    """The tokenizer, the encoder and (``load_fast``, where asked for) fastokens.

    fastokens loads in a thread beside the parse and the renderer's import; the thread has ended
    by the time this returns (workers are forked from one thread). What is made here is left out
    of the garbage collector's passes: fewer of its pages are copied in each worker.
    """
    start_up = messages.start_up
    fast = engines.loading_fast(
        start_up["engine"] if load_fast else "tokenizers", messages.tokenizer_json
    )
    try:
        tokenizer = Tokenizer.from_str(messages.tokenizer_json)
        _import_renderer()
        encoder = ConversationEncoder(
            tokenizer, format_spec(start_up["format"]), Contract(**start_up["contract"])
        )
    finally:
        loaded = fast()
    gc.freeze()
    return Prepared(messages, tokenizer, encoder, loaded)


def _samples_first(engine: str) -> bool:
    """Whether the sampler is forked, for the ``engine`` asked for, on this machine."""
    forced = os.environ.get(SAMPLER)
    if forced in ("0", "1"):
        wanted = forced == "1"
    else:
        wanted = len(os.sched_getaffinity(0)) >= SAMPLER_FROM_CORES
    return wanted and engines.may_load_fast(engine)


def _fail_all(channels: list[Connection], err: Exception) -> None:
    for channel in channels:
        fail(channel, err)


def _ends_with(parent: int) -> None:
    """Have the kernel end this process (SIGKILL) when ``parent``, its parent, ends.

    Where the system refuses (a sandbox's filter), it ends anyway at the end of its channel, which
    the build closes as it stops.
    """
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        # it ended before the request took
        os._exit(1)


def _name(name: bytes) -> None:
    """Name this process (``ps``, ``top``); where the system refuses, it keeps its name."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name))


def _flush() -> None:
    """Write what is buffered, so that no forked process writes it again."""
    sys.stdout.flush()
    sys.stderr.flush()


def _exit(code: int) -> NoReturn:
    with suppress(BaseException):
        _flush()
    os._exit(code)


def _import_renderer() -> None:
    """Import what every chat format renders with (transformers); again: nothing."""
    import builders.formats.render  # noqa: F401
