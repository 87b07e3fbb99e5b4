"""Encode batches of conversations in parallel, in order, never far ahead of the consumer.

Each worker holds its own copy of the pinned tokenizer and template and runs the same
``ConversationEncoder`` as a single-process build, and results come back in submission order,
so the rows do not depend on the number of workers. At most ``2 × workers`` batches are in
flight: a build that stops early leaves little work behind, and memory stays bounded.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pyarrow as pa
from tokenizers import Tokenizer

from builders.encode import ConversationEncoder
from builders.errors import WorkerError
from builders.records import EncodedConversation

_ENCODER: ConversationEncoder | None = None


def encode_batches(encoder: ConversationEncoder, batches: Iterable[pa.Table],
                   workers: int) -> Iterator[EncodedConversation]:
    """Encoded conversations of ``batches``, in order: with ``encoder`` in this process when
    ``workers`` is 1 (its tokenizer then uses all cores itself), else in ``workers`` processes that
    each build the same encoder from its tokenizer and template."""
    if workers <= 1:
        for batch in batches:
            yield from encoder.encode(batch.to_pylist())
        return
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker,
                                   initargs=(encoder.tokenizer.to_str(), encoder.renderer.chat_template))
    try:
        yield from _in_order(executor, _encode, batches, depth=2 * workers)
    except BrokenProcessPool as err:
        raise WorkerError("a tokenizing worker process died before returning its batch (killed, or out of "
                          "memory); nothing was left at the final path") from err
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _in_order(executor, encode, batches: Iterable[pa.Table], depth: int) -> Iterator[EncodedConversation]:
    """``encode`` each batch on ``executor``, at most ``depth`` at a time, yielding results in order."""
    in_flight: deque = deque()
    try:
        for batch in batches:
            in_flight.append(executor.submit(encode, batch))
            if len(in_flight) >= depth:
                yield from in_flight.popleft().result()
        while in_flight:
            yield from in_flight.popleft().result()
    finally:
        for future in in_flight:
            future.cancel()


def _start_worker(tokenizer_json: str, chat_template: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and shuts workers down
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    global _ENCODER
    _ENCODER = ConversationEncoder(Tokenizer.from_str(tokenizer_json), chat_template)


def _encode(batch: pa.Table) -> list[EncodedConversation]:
    return _ENCODER.encode(batch.to_pylist())  # converted here: Arrow tables travel cheaper than dicts
