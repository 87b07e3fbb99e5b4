"""Where conversations are encoded: this process or worker processes.

Both take batches of source rows with their stream positions and leave each encoded conversation (or
the error that names it) at its position; the stream takes them back in order. Each worker
(``builders.encode.worker``) holds its own copy of the tokenizer, template, contract and engine and
runs the same ``ConversationEncoder``, so the rows do not depend on the number of workers. A pool's
workers also choose the engine (its probes), decode the source's row groups themselves
(``submit_group``) and cross-check their own samples: what scales with the source runs in them, and
the main process only orders, cuts and writes. At most ``2 × workers`` tasks are in flight: memory
stays bounded. Either way the engine is chosen while the build plans, and ``settle`` waits for that
choice; a pool's interpreters start before the build opens its inputs.

``--workers auto`` (``worker_count``) is one process where the machine has at most
``IN_PROCESS_UP_TO`` cores (the engine's own threads use them; measured fastest there, see
docs/performance.md), else a worker for each core the process may use.

The pool waits on every worker's own channel at once: a worker that dies, at any moment, ends
its channel, and the build stops with ``WorkerError`` (exit 7); the other workers are ended and
reaped as the pool closes, on any way out (an error, Ctrl-C or SIGTERM). Nothing is respawned.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait
from typing import Protocol

import numpy as np
import pyarrow as pa

from builders.encode import engines
from builders.encode.encoder import ConversationEncoder, EncodedConversation
from builders.encode.worker import Worker, encode_rows
from builders.errors import EngineDisagreement, SourceDataError
from builders.inputs.layout import conversations
from builders.inputs.source import Source

# stream position → EncodedConversation, or the SourceDataError of that conversation
Encoded = dict
# cores on which --workers auto encodes in this process
IN_PROCESS_UP_TO = 2


def worker_count(requested: str | int) -> int:
    """The worker processes ``--workers`` asks for.

    ``--workers`` gives a number, or ``auto`` for this machine.
    """
    if requested != "auto":
        return int(requested)
    cores = len(os.sched_getaffinity(0))
    return 1 if cores <= IN_PROCESS_UP_TO else cores


class Encoding(Protocol):
    """Where the stream's conversations are encoded, as the stream uses it.

    It is ``InProcess`` or ``Pool``.
    """

    # the workers decode the source's row groups themselves (``submit_group``)
    decodes_groups: bool
    # batches handed out before the stream takes the oldest
    ahead: int

    def start(
        self, encoder: ConversationEncoder, engine: str, tokenizer_json: str, source: Source
    ) -> None: ...
    def settle(self) -> engines.Choice: ...
    def finish(self) -> None: ...
    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None: ...
    def ready(self, encoded: Encoded, position: int) -> bool: ...
    def take(self, encoded: Encoded, position: int) -> EncodedConversation: ...


class InProcess:
    """Encodes in this process, at once.

    The engine's own threads use the cores; the engine is chosen in a thread of its own while the
    build plans.
    """

    # the stream decodes the source here
    decodes_groups = False
    # batches the stream hands out before it takes the oldest:
    # none, each is encoded as it is handed out
    ahead = 0

    def __enter__(self):
        self._chooser = ThreadPoolExecutor(1, thread_name_prefix="engine-choice")
        return self

    def __exit__(self, *exc):
        self._chooser.shutdown(wait=True, cancel_futures=True)
        return False

    def start(
        self, encoder: ConversationEncoder, engine: str, tokenizer_json: str, source: Source
    ) -> None:
        """Begin choosing the engine for ``encoder``.

        ``engine`` is what ``--engine`` asks for; ``encoder`` the format and contract, with the
        reference engine until ``settle``; ``tokenizer_json`` is the pinned file's text.
        """
        self.encoder = encoder
        self._choice = self._chooser.submit(
            engines.choose, engine, encoder.tokenizer, tokenizer_json, encoder.spec.chat_template
        )

    def settle(self) -> engines.Choice:
        """The engine chosen; encode with it from now on.

        A refused ``--engine`` raises here.
        """
        choice = self._choice.result()
        self.encoder = self.encoder.with_engine(choice.engine)
        return choice

    def finish(self) -> None:
        """Let the engine's last cross-checks finish (a disagreement raises)."""
        self.encoder.engine.finish()

    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None:
        encoded.update(encode_rows(self.encoder, conversations(table), positions))

    def ready(self, encoded: Encoded, position: int) -> bool:
        return position in encoded

    def take(self, encoded: Encoded, position: int) -> EncodedConversation:
        return _unwrap(encoded.pop(position))


class Pool(InProcess):
    """Encodes in ``workers`` processes.

    Each has its own encoder, its own choice of the engine and its own reader of the source's
    files. Their interpreters start (and import) when the pool is entered, before the build has
    opened its inputs; ``start`` tells them what to encode with.
    """

    # the stream hands row groups to the workers (``submit_group``)
    decodes_groups = True

    def __init__(self, workers: int):
        self.count, self.depth = workers, 2 * workers
        # every worker busy with two batches while the build takes the oldest
        self.ahead = self.depth
        self.workers: list[Worker] = []
        self.source: Source | None = None
        # takes the rows a group sends back
        self.hold: Callable[[pa.Table, np.ndarray], None] | None = None

    def __enter__(self):
        try:
            # all start at once; each then waits for its start-up message
            for _ in range(self.count):
                self.workers.append(Worker())
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def start(
        self, encoder: ConversationEncoder, engine: str, tokenizer_json: str, source: Source | None
    ) -> None:
        """Send each worker what it encodes with.

        That is ``encoder``'s format and contract, the ``engine`` asked for, ``tokenizer_json``
        (the pinned file's text, which ``encoder``'s tokenizer was loaded from), and the ``source``
        whose row groups it decodes.
        """
        self.encoder, self.source = encoder, source
        for worker in self.workers:
            worker.send_start_up(encoder, engine, tokenizer_json, source)

    def settle(self) -> engines.Choice:
        """The engine every worker chose once it started.

        A worker that could not start, or a refused ``--engine``, raises here.
        """
        while not all(worker.started for worker in self.workers):
            self._collect({}, block=True)
        chosen = {json.dumps(worker.choice, sort_keys=True) for worker in self.workers}
        if len(chosen) > 1:
            raise EngineDisagreement(
                f"the worker processes chose different engines ({'; '.join(sorted(chosen))}); "
                f"build with --engine tokenizers"
            )
        return engines.Choice(**self.workers[0].choice)

    def finish(self) -> None:
        """Nothing: each worker's cross-checks passed before it sent its batch."""

    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None:
        self._least_busy(encoded).send_batch(table, positions)

    def submit_group(
        self,
        group: int,
        rows: np.ndarray,
        positions: np.ndarray,
        eager: int,
        encoded: Encoded,
        hold: Callable[[pa.Table, np.ndarray], None],
    ) -> None:
        """Have a worker decode row group ``group`` and encode rows of it.

        It encodes its ``rows`` at ``positions`` before ``eager`` and sends back the others, which
        go to ``hold`` (rows, positions).
        """
        self.hold = hold
        self._least_busy(encoded).send_group(
            group, self.source.group_rows(group), rows, positions, eager
        )

    def wait_all(self, encoded: Encoded) -> None:
        """Take every answer still on its way.

        Then each group's held-back rows are held.
        """
        while any(worker.in_flight for worker in self.workers):
            self._collect(encoded, block=True)

    def ready(self, encoded: Encoded, position: int) -> bool:
        if position not in encoded:
            self._collect(encoded, block=False)
        return position in encoded

    def take(self, encoded: Encoded, position: int) -> EncodedConversation:
        while position not in encoded:
            if not any(worker.in_flight for worker in self.workers):
                raise RuntimeError(f"stream position {position} was never submitted for encoding")
            self._collect(encoded, block=True)
        return _unwrap(encoded.pop(position))

    def _collect(self, encoded: Encoded, block: bool) -> None:
        """Take what the workers have sent.

        With ``block``, wait for something. A worker that failed or died raises here.
        """
        by_channel = {worker.channel: worker for worker in self.workers}
        for channel in wait(list(by_channel), timeout=None if block else 0):
            batch, later = by_channel[channel].receive()
            encoded.update(batch)
            if later is not None:
                self.hold(later.drop_columns(["position"]), later.column("position").to_numpy())

    def _least_busy(self, encoded: Encoded) -> Worker:
        while sum(worker.in_flight for worker in self.workers) >= self.depth:
            self._collect(encoded, block=True)
        return min(self.workers, key=lambda worker: worker.in_flight)

    def _stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []


def encoding(workers: int) -> Encoding:
    """This process when ``workers`` is 1, else a pool of processes.

    The pool has ``workers`` processes; in this process the engine uses all cores itself. Either is
    told what to encode with by ``start``.
    """
    return InProcess() if workers <= 1 else Pool(workers)


def _unwrap(item) -> EncodedConversation:
    if isinstance(item, SourceDataError):
        raise item
    return item
