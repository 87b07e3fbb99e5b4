"""Where conversations are encoded: this process or worker processes.

Both leave each encoded conversation (or the error that names it) at its stream position, and the
stream takes them back in order. In this process, the stream decodes the source and hands over
batches of rows with their positions (``InProcess.submit``). A pool's workers decode the source's
row groups themselves (``keep_group``) and keep their rows of a pass until the stream asks for
them in order (``ask``: ``builders.encode.share``); no source row travels between the processes.
Each worker (``builders.encode.worker``) holds its own copy of the tokenizer, template, contract
and engine and runs the same ``ConversationEncoder``, so the rows do not depend on the number of
workers; it also chooses the engine (its probes) and cross-checks its own samples: what scales
with the source runs in them, and the main process only orders, cuts and writes, holding no more
than the answers in flight. At most ``2 × workers`` tasks are in flight: memory stays bounded.

Start-up, where a pool's workers wait for nothing the build does not need to give them: their
parent's interpreter starts (and imports) before the command imports the build (``spawn.early``);
it parses the pinned ``tokenizer.json`` (``load``) while the build checks the other inputs, loads
fastokens beside that, makes the encoder once it has the chat format (``start``), which the build
reads from the checked files before it parses the tokenizer itself, and forks the workers, which
share all that; each encodes its first tasks, the plan's sample (``sample``, handed out before
the build parses the tokenizer or imports transformers), with the reference engine; the engine
asked for is chosen (its probes) beside it from the worker's first answer on
(``engines.Choosing``). The build hands
out tasks without waiting for them, and ``settle`` (after the rows) gives the engine every worker
chose. In this process the engine is chosen in a thread while the build plans (from ``begin``),
and the first batch waits for it.

``--workers auto``: ``builders.encode.spawn.worker_count``.

The pool waits on every worker's own channel at once: a worker that dies, at any moment, ends
its channel, and the build stops with ``WorkerError`` (exit 7); the other workers are ended and
reaped as the pool closes, on any way out (an error, Ctrl-C or SIGTERM). Nothing is respawned.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from builders.contract import Contract
from builders.encode import engines, spawn
from builders.encode.encoder import ConversationEncoder, EncodedConversation
from builders.encode.worker import Worker, encode_rows
from builders.errors import EngineDisagreement, RefusedConversation
from builders.inputs.layout import conversations
from builders.inputs.source import Source
from builders.runtime import stopping

if TYPE_CHECKING:
    from builders.inputs.pinned import TokenizerFiles

# stream position → EncodedConversation, or the RefusedConversation of that conversation
Encoded = dict


class Encoding(Protocol):
    """Where the stream's conversations are encoded: what ``InProcess`` and ``Pool`` share.

    The stream feeds them differently, as ``decodes_groups`` says: ``InProcess`` the rows it
    decoded (``submit``); a ``Pool`` row groups to decode and positions to send (``sample``,
    ``sampled``, ``keep_group``, ``ask`` and its ``count`` of workers).
    """

    # False: the stream decodes the source and submits rows; True: the workers decode the row
    # groups themselves and keep their rows of each pass until the stream asks for them
    decodes_groups: bool

    def load(self, tokenizer_file: Path, sha256: str) -> None: ...
    def start(
        self, pinned: TokenizerFiles, contract: Contract, engine: str, source: Source | None
    ) -> None: ...
    def begin(self, encoder: ConversationEncoder) -> None: ...
    def settle(self) -> engines.Choice: ...
    def finish(self) -> None: ...
    def take(
        self, encoded: Encoded, position: int
    ) -> EncodedConversation | RefusedConversation: ...


class InProcess:
    """Encodes in this process, at once.

    The engine's own threads use the cores; the engine is chosen in a thread of its own while the
    build plans (``begin``).
    """

    # the stream decodes the source here
    decodes_groups = False

    def __enter__(self):
        self._chooser = ThreadPoolExecutor(1, thread_name_prefix="engine-choice")
        return self

    def __exit__(self, *exc):
        self._chooser.shutdown(wait=True, cancel_futures=True)
        return False

    def load(self, tokenizer_file: Path, sha256: str) -> None:
        """Nothing: this process parses the tokenizer as it checks the inputs."""

    def start(
        self, pinned: TokenizerFiles, contract: Contract, engine: str, source: Source | None
    ) -> None:
        """Keep what the engine is chosen from (``begin`` starts the choice).

        ``engine`` is what ``--engine`` asks for.
        """
        self._engine, self._tokenizer_json = engine, pinned.tokenizer_json
        self.encoder = None

    def begin(self, encoder: ConversationEncoder) -> None:
        """Encode with ``encoder``'s format and contract, and the engine chosen beside.

        The choice runs in a thread from now on, while the build plans: its probes use the
        tokenizer, which ``encoder`` has set up (a tokenizer cannot be changed while another thread
        encodes with it). The first batch waits for the choice.
        """
        self._reference = encoder
        self._choice = self._chooser.submit(
            engines.choose,
            self._engine,
            encoder.tokenizer,
            self._tokenizer_json,
            encoder.spec.chat_template,
        )

    def settle(self) -> engines.Choice:
        """The engine chosen; a refused ``--engine`` raises here."""
        return self._choice.result()

    def finish(self) -> None:
        """Let the engine's last cross-checks finish (a disagreement raises)."""
        self._encoder().engine.finish()

    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None:
        """Encode source rows ``table`` (decoded by the stream) at their ``positions``."""
        encoded.update(encode_rows(self._encoder(), conversations(table), positions))

    def _encoder(self) -> ConversationEncoder:
        """The encoder, with the engine chosen (which it waits for the first time)."""
        if self.encoder is None:
            self.encoder = self._reference.with_engine(self.settle().engine)
        return self.encoder

    def take(self, encoded: Encoded, position: int) -> EncodedConversation | RefusedConversation:
        """The conversation at ``position``, or why the contract refused it."""
        return encoded.pop(position)


class Pool:
    """Encodes in ``workers`` processes.

    Each has its own encoder (made by their parent, which forks them), its own choice of the
    engine and its own reader of the source's files. Their parent starts (and imports) when the
    pool is entered, or earlier (``spawn.early``), before the build has opened its inputs;
    ``load`` and ``start`` tell it what to encode with.
    """

    # the stream hands row groups to the workers (``keep_group``)
    decodes_groups = True

    def __init__(self, workers: int):
        # every worker busy with two tasks while the build takes the oldest answers
        self.count, self.depth = workers, 2 * workers
        self.workers: list[Worker] = []
        self.source: Source | None = None
        # each row group's worker in the pass (its place in ``workers``; -1: none)
        self.holder = np.zeros(0, dtype=np.int64)
        # the workers were told the plan's sample is over (``_end_sample``)
        self.sample_ended = False

    def __enter__(self):
        try:
            # started before the command's imports (``spawn.early``), else now; their parent
            # then waits for its start-up message
            self.workers = [Worker(started) for started in spawn.taken(self.count)]
            if not self.workers:
                # a stop while they start lands once their handles are kept (and reaped)
                with stopping.deferred():
                    self.workers = [Worker(started) for started in spawn.start(self.count)]
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def load(self, tokenizer_file: Path, sha256: str) -> None:
        """Have the workers' parent parse the pinned ``tokenizer.json``, for all of them.

        It reads ``tokenizer_file`` itself and checks it against ``sha256``.
        """
        for worker in self.workers:
            worker.send_tokenizer(tokenizer_file, sha256)

    def start(
        self, pinned: TokenizerFiles, contract: Contract, engine: str, source: Source | None
    ) -> None:
        """Send each worker what it encodes with besides the tokenizer (``load``).

        That is ``pinned``'s chat format, the ``contract``, the ``engine`` asked for, and the
        ``source`` whose row groups it decodes.
        """
        self.source = source
        self.holder = np.full(0 if source is None else source.num_groups, -1, dtype=np.int64)
        for worker in self.workers:
            worker.send_start_up(pinned.spec, contract, engine, source)

    def begin(self, encoder: ConversationEncoder) -> None:
        """Nothing: the workers encode as soon as they can, with encoders of their own."""

    def settle(self) -> engines.Choice:
        """The engine every worker chose.

        Answers to tasks still on their way are not wanted. A worker that could not start, or a
        refused ``--engine``, raises here.
        """
        self._end_sample()
        while not all(worker.choice is not None for worker in self.workers):
            self._collect({}, block=True)
        chosen = {json.dumps(worker.choice, sort_keys=True) for worker in self.workers}
        if len(chosen) > 1:
            raise EngineDisagreement(
                f"the worker processes chose different engines ({'; '.join(sorted(chosen))}); "
                f"build with --engine tokenizers"
            )
        return engines.Choice(**self.workers[0].choice)

    def finish(self) -> None:
        """Nothing: each worker's cross-checks passed before it answered."""

    def sample(self, rows_of: dict[int, np.ndarray]) -> None:
        """Have the workers encode the rows ``rows_of`` each row group (places in it).

        The stream's plan; handed out at once, ready or not, and taken by ``sampled``.
        """
        taken = 0
        for k, (group, rows) in enumerate(rows_of.items()):
            worker = self.workers[k % self.count]
            positions = taken + np.arange(len(rows), dtype=np.int64)
            worker.send_group(group, self.source.group_rows(group), rows, positions)
            taken += len(rows)

    def sampled(self) -> list[EncodedConversation | RefusedConversation]:
        """The sample's conversations (``sample``), encoded, in no particular order."""
        encoded: Encoded = {}
        self.wait_all(encoded)
        self._end_sample()
        return list(encoded.values())

    def keep_group(
        self,
        group: int,
        rows: np.ndarray,
        positions: np.ndarray,
        share: dict,
        encoded: Encoded,
    ) -> None:
        """Have a worker decode row group ``group`` and keep its ``rows`` at ``positions``.

        It keeps them as its ``share`` of the pass says (``builders.encode.share``) until the
        stream asks for them (``ask``).
        """
        self._end_sample()
        worker = self._least_busy(encoded)
        worker.send_group(group, self.source.group_rows(group), rows, positions, share)
        self.holder[group] = self.workers.index(worker)

    def ask(self, positions: np.ndarray, groups: np.ndarray, encoded: Encoded) -> None:
        """Have each worker holding some of ``positions`` (ascending) send them.

        ``groups`` is each one's row group; the answers land in ``encoded``.
        """
        self._end_sample()
        holders = self.holder[groups]
        for k in np.unique(holders).tolist():
            self._when_room(encoded, self.workers[k]).send_wanted(positions[holders == k])

    def wait_all(self, encoded: Encoded) -> None:
        """Take every answer still on its way."""
        while any(worker.in_flight for worker in self.workers):
            self._collect(encoded, block=True)

    def take(self, encoded: Encoded, position: int) -> EncodedConversation | RefusedConversation:
        while position not in encoded:
            if not any(worker.in_flight for worker in self.workers):
                raise RuntimeError(f"stream position {position} was never asked of a worker")
            self._collect(encoded, block=True)
        return encoded.pop(position)

    def _end_sample(self) -> None:
        """Tell every worker the plan's sample is over, before any later task (again: nothing).

        A sample worker then hands its channel to the worker that serves the rest
        (``builders.encode.family``).
        """
        if not self.sample_ended:
            self.sample_ended = True
            for worker in self.workers:
                worker.send_sampled()

    def _collect(self, encoded: Encoded, block: bool) -> None:
        """Take what the workers have sent.

        With ``block``, wait for something. A worker that failed or died raises here.
        """
        by_channel = {worker.channel: worker for worker in self.workers}
        for channel in wait(list(by_channel), timeout=None if block else 0):
            encoded.update(by_channel[channel].receive())

    def _least_busy(self, encoded: Encoded) -> Worker:
        return self._when_room(encoded, None)

    def _when_room(self, encoded: Encoded, chosen: Worker | None) -> Worker:
        """``chosen`` (None: the least busy) once fewer than ``depth`` tasks are in flight."""
        while sum(worker.in_flight for worker in self.workers) >= self.depth:
            self._collect(encoded, block=True)
        return chosen or min(self.workers, key=lambda worker: worker.in_flight)

    def _stop(self) -> None:
        # a stop waits while they are reaped, so none is left running
        with stopping.deferred():
            spawn.stop([(worker.process, worker.channel) for worker in self.workers])
            self.workers = []


def encoding(workers: int) -> Encoding:
    """This process when ``workers`` is 1, else a pool of processes.

    The pool has ``workers`` processes; in this process the engine uses all cores itself. Either is
    told what to encode with by ``start``.
    """
    return InProcess() if workers <= 1 else Pool(workers)
