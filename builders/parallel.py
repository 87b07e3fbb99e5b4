"""Where conversations are encoded: in this process, or in worker processes.

Both take batches of source rows with their stream positions and leave each encoded
conversation (or the error that names it) at its position; the stream takes them back in
order. Each worker (``builders.worker``) holds its own copy of the tokenizer, template, contract
and engine and runs the same ``ConversationEncoder``, so the rows do not depend on the number of
workers. At most ``2 × workers`` batches are in flight: memory stays bounded. A guarded engine's
cross-check samples come back with each batch and are compared in the main process, beside the
build, so no worker waits for them.

The pool waits on every worker's own channel at once: a worker that dies, at any moment, ends
its channel, and the build stops with ``WorkerError`` (exit 7); the other workers are ended and
reaped as the pool closes, on any way out (an error, Ctrl-C or SIGTERM). Nothing is respawned.
"""

from __future__ import annotations

from multiprocessing.connection import wait

import numpy as np
import pyarrow as pa

from builders.encode import ConversationEncoder
from builders.errors import SourceDataError
from builders.records import EncodedConversation
from builders.worker import Worker, encode_rows

Encoded = dict  # stream position → EncodedConversation, or the SourceDataError of that conversation


class InProcess:
    """Encodes in this process, at once (the engine's own threads use the cores)."""

    def __init__(self, encoder: ConversationEncoder):
        self.encoder = encoder

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None:
        encoded.update(encode_rows(self.encoder, table.to_pylist(), positions))

    def ready(self, encoded: Encoded, position: int) -> bool:
        return position in encoded

    def take(self, encoded: Encoded, position: int) -> EncodedConversation:
        return _unwrap(encoded.pop(position))


class Pool(InProcess):
    """Encodes in ``workers`` processes, each with its own encoder; they start when the pool is entered."""

    def __init__(self, encoder: ConversationEncoder, workers: int):
        super().__init__(encoder)
        self.count, self.depth = workers, 2 * workers
        self.workers: list[Worker] = []

    def __enter__(self):
        try:
            for _ in range(self.count):  # all start at once; each then reads its start-up message
                self.workers.append(Worker())
            for worker in self.workers:
                worker.send_start_up(self.encoder)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None:
        while sum(worker.in_flight for worker in self.workers) >= self.depth:
            self._collect(encoded, block=True)
        min(self.workers, key=lambda worker: worker.in_flight).send_batch(table, positions)

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
        """Take what the workers have sent (waiting for something when ``block``); a worker that
        failed or died raises here."""
        by_channel = {worker.channel: worker for worker in self.workers}
        for channel in wait(list(by_channel), timeout=None if block else 0):
            batch, samples = by_channel[channel].receive()
            encoded.update(batch)
            if samples[0]:  # the worker's cross-check samples, compared here beside the build
                self.encoder.engine.check(*samples)

    def _stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []


def encoding(encoder: ConversationEncoder, workers: int) -> InProcess:
    """This process when ``workers`` is 1 (the engine then uses all cores itself), else a pool."""
    return InProcess(encoder) if workers <= 1 else Pool(encoder, workers)


def _unwrap(item) -> EncodedConversation:
    if isinstance(item, SourceDataError):
        raise item
    return item
