"""Where conversations are encoded: in this process, or in worker processes.

Both take batches of source rows with their stream positions and leave each encoded
conversation (or the error that names it) at its position; the stream takes them back in
order. Each worker holds its own copy of the tokenizer, template, contract and engine and runs
the same ``ConversationEncoder``, so the rows do not depend on the number of workers. At most
``2 × workers`` batches are in flight in the pool: memory stays bounded. A guarded engine's
cross-check samples come back with each batch and are compared in the main process, beside the
build, so no worker waits for them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from builders import engines
from builders.contract import Contract
from builders.encode import ConversationEncoder
from builders.formats import FormatSpec
from builders.errors import SourceDataError, WorkerError
from builders.records import EncodedConversation

Encoded = dict  # stream position → EncodedConversation, or the SourceDataError of that conversation


def encode_rows(encoder: ConversationEncoder, rows: list[dict], positions) -> list[tuple[int, object]]:
    """Each row's encoded conversation (or its SourceDataError), with its position."""
    positions = [int(p) for p in positions]
    try:
        return list(zip(positions, encoder.encode(rows)))
    except SourceDataError:  # which of them: one at a time
        out = []
        for row, position in zip(rows, positions):
            try:
                out.append((position, encoder.encode([row])[0]))
            except SourceDataError as err:
                out.append((position, err))
        return out


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
    """Encodes in ``workers`` processes (spawned), each with its own encoder."""

    def __init__(self, encoder: ConversationEncoder, workers: int):
        super().__init__(encoder)
        self.depth = 2 * workers
        self.executor = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
            initargs=(encoder.tokenizer.to_str(), encoder.spec, encoder.contract,
                      encoder.engine.name))
        self.pending: set = set()

    def __exit__(self, *exc):
        self.executor.shutdown(wait=True, cancel_futures=True)
        return False

    def submit(self, table: pa.Table, positions: np.ndarray, encoded: Encoded) -> None:
        while len(self.pending) >= self.depth:
            self._collect(encoded)
        try:
            self.pending.add(self.executor.submit(_encode, portable(table), positions))
        except BrokenProcessPool as err:  # a worker died while none of our batches was waiting on it
            raise _died() from err

    def ready(self, encoded: Encoded, position: int) -> bool:
        if position not in encoded and any(future.done() for future in self.pending):
            self._collect(encoded)
        return position in encoded

    def take(self, encoded: Encoded, position: int) -> EncodedConversation:
        while position not in encoded:
            if not self.pending:
                raise RuntimeError(f"stream position {position} was never submitted for encoding")
            self._collect(encoded)
        return _unwrap(encoded.pop(position))

    def _collect(self, encoded: Encoded) -> None:
        done, self.pending = wait(self.pending, return_when=FIRST_COMPLETED)
        for future in done:
            try:
                batch, samples = future.result()
            except BrokenProcessPool as err:
                raise _died() from err
            encoded.update(batch)
            for sample in samples:  # the worker's cross-check samples, compared here beside the build
                self.encoder.engine.check(*sample)


def portable(table: pa.Table) -> pa.Table:
    """``table`` as it should travel to a worker: a slice is serialized with its parent's whole
    buffers, a copy of its rows with only theirs."""
    return table.take(np.arange(table.num_rows))


def _died() -> WorkerError:
    return WorkerError("a tokenizing worker process died before returning its batch (killed, or out of memory); "
                       "nothing was left at the final path")


def encoding(encoder: ConversationEncoder, workers: int) -> InProcess:
    """This process when ``workers`` is 1 (the engine then uses all cores itself), else a pool."""
    return InProcess(encoder) if workers <= 1 else Pool(encoder, workers)


def _unwrap(item) -> EncodedConversation:
    if isinstance(item, SourceDataError):
        raise item
    return item


_ENCODER: ConversationEncoder | None = None


def _start_worker(tokenizer_json: str, spec: FormatSpec, contract: Contract, engine: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and shuts workers down
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    os.environ["RAYON_NUM_THREADS"] = "1"
    global _ENCODER
    tokenizer = Tokenizer.from_str(tokenizer_json)
    _ENCODER = ConversationEncoder(tokenizer, spec, contract, engines.named(engine, tokenizer, tokenizer_json))


def _encode(table: pa.Table, positions: np.ndarray) -> tuple[list[tuple[int, object]], list[tuple]]:
    """A batch encoded in a worker, and its cross-check samples for the main process."""
    encoded = encode_rows(_ENCODER, table.to_pylist(), positions)  # converted here: Arrow travels cheaper
    return encoded, engines.take_deferred(_ENCODER.engine)
