"""A tokenizing worker process, and everything that travels between it and the build.

The build starts each worker as a fresh interpreter (``python -c``, so the caller's main module
is never re-imported) in a session of its own (a terminal's Ctrl-C reaches only the build),
with one end of a socket pair that no other process holds as its only channel. A dead worker
therefore closes its channel at once: the build sees the end of it, or a broken pipe, and no
lock or pipe shared with other processes can be left blocked. Only JSON and Arrow IPC travel on
the channel:

- build → worker: the start-up message (contract, engine name and chat template, as JSON), the
  tokenizer's JSON text, then batches: Arrow IPC streams of source rows with a ``position``
  column (their stream positions). Closing the channel ends the worker.
- worker → build: a JSON header for each message: ``ready`` once it has loaded what it encodes
  with; for each batch ``batch`` (with the conversations the contract cannot encode, by position
  and message), followed by two Arrow IPC streams, the encoded conversations and the engine's
  cross-check samples; or ``failed`` with the reason, after which it exits.

A worker reads its channel in a thread of its own, so the build's sends never wait for an
encoding to finish, and it exits quietly when the channel ends (the build finished, or died).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from builders import engines
from builders.contract import Contract
from builders.encode import ConversationEncoder
from builders.errors import SourceDataError, WorkerError
from builders.records import EncodedConversation

ROOT = Path(__file__).resolve().parents[1]  # the folder that holds this package: workers run the same code
BOOTSTRAP = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.path.insert(0, sys.argv[1]); "
             "from builders.worker import serve; serve(int(sys.argv[2]))")
NOTHING_LEFT = "nothing was left at the final path"


class Worker:
    """The build's handle on one worker process: its channel, and the batches it holds."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false",  # one thread each: the workers are
                       "RAYON_NUM_THREADS": "1"}                          # the parallelism
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, str(ROOT), str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, env=environment, start_new_session=True)
        self.channel = Connection(ours.detach())
        self.started = False  # it said ready
        self.in_flight = 0  # batches sent, not yet returned

    def send_start_up(self, encoder: ConversationEncoder) -> None:
        self._send(json.dumps({"contract": encoder.contract.as_dict(), "engine": encoder.engine.name,
                               "chat_template": encoder.renderer.chat_template}).encode("utf-8"))
        self._send(encoder.tokenizer.to_str().encode("utf-8"))

    def send_batch(self, table: pa.Table, positions: np.ndarray) -> None:
        self._send(batch_message(table, positions))
        self.in_flight += 1

    def receive(self) -> tuple[list[tuple[int, object]], tuple[list, list, list]]:
        """The next message: for a batch, each position's EncodedConversation or SourceDataError,
        and the engine's cross-check samples (texts, ids, source indices); nothing for ``ready``.
        A worker that failed or died raises WorkerError (a fault in the builder, RuntimeError)."""
        try:
            header = json.loads(self.channel.recv_bytes())
            if "batch" in header:
                results, samples = _read(self.channel.recv_bytes()), _read(self.channel.recv_bytes())
        except (EOFError, OSError):
            raise self._died() from None
        if "failed" in header:
            if self.started:  # a fault in the builder, as it would be without workers
                raise RuntimeError(f"a tokenizing worker failed while encoding a batch:\n{header['traceback']}")
            raise WorkerError(f"a tokenizing worker process could not start: {header['failed']}; {NOTHING_LEFT}")
        if "ready" in header:
            self.started = True
            return [], ([], [], [])
        self.in_flight -= 1
        errors = [(position, SourceDataError(message)) for position, message in header["errors"]]
        return _conversations(results) + errors, (samples.column("text").to_pylist(), _split(
            samples.column("ids"), np.int32), samples.column("index").to_pylist())

    def stop(self) -> None:
        """Close the channel, end the process and reap it (it holds nothing worth a goodbye)."""
        self.channel.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def _send(self, data) -> None:
        try:
            self.channel.send_bytes(data)
        except OSError:
            raise self._died() from None

    def _died(self) -> WorkerError:
        self.channel.close()
        try:
            code = self.process.wait(timeout=5)  # its channel is closed: it has exited, or is exiting
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            status = f"killed by {signal.Signals(-code).name}: killed, or out of memory"
        else:
            status = f"exit code {code}; what it printed, if anything, is above" if code is not None else \
                "its channel closed, but it did not exit"
        when = "while starting" if not self.started else "before returning its batch"
        return WorkerError(f"a tokenizing worker process died {when} ({status}); {NOTHING_LEFT}")


def serve(fd: int) -> None:
    """A worker's life: start up, then encode each batch the build sends until the channel ends."""
    channel = Connection(fd)
    batches: queue.SimpleQueue = queue.SimpleQueue()
    try:
        start_up = json.loads(channel.recv_bytes())
        tokenizer_json = channel.recv_bytes().decode("utf-8")
        threading.Thread(target=_receive, args=(channel, batches), daemon=True).start()
        tokenizer = Tokenizer.from_str(tokenizer_json)
        engine = engines.named(start_up["engine"], tokenizer, tokenizer_json)
        encoder = ConversationEncoder(tokenizer, start_up["chat_template"], Contract(**start_up["contract"]), engine)
    except (EOFError, OSError):
        return  # the build is gone
    except Exception as err:  # noqa: BLE001 (reported to the build, which names it)
        _fail(channel, err)
        return
    try:
        channel.send_bytes(json.dumps({"ready": True}).encode("utf-8"))
        for batch in iter(batches.get, None):
            try:
                results = encode_rows(encoder, *read_batch(batch))
                samples = engines.take_deferred(encoder.engine)
            except Exception as err:  # noqa: BLE001 (a fault in the builder: the build raises it)
                _fail(channel, err)
                return
            errors = [(position, str(item)) for position, item in results if isinstance(item, SourceDataError)]
            channel.send_bytes(json.dumps({"batch": len(results), "errors": errors}).encode("utf-8"))
            channel.send_bytes(_ipc(_conversations_table(
                [(p, c) for p, c in results if isinstance(c, EncodedConversation)])))
            channel.send_bytes(_ipc(_samples_table(samples)))
    except OSError:
        return  # the build is gone


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


def batch_message(table: pa.Table, positions: np.ndarray) -> pa.Buffer:
    """Source rows and their stream positions as they travel to a worker: Arrow IPC, which
    carries a slice's own rows only."""
    return _ipc(table.append_column("position", pa.array(positions, pa.int64())))


def read_batch(message) -> tuple[list[dict], np.ndarray]:
    """A batch message's rows (as the encoder takes them) and their positions."""
    table = _read(message)
    return table.drop_columns(["position"]).to_pylist(), table.column("position").to_numpy()


def _receive(channel: Connection, batches: queue.SimpleQueue) -> None:
    try:
        while True:
            batches.put(channel.recv_bytes())
    except (EOFError, OSError):
        batches.put(None)


def _fail(channel: Connection, err: Exception) -> None:
    try:
        channel.send_bytes(json.dumps({"failed": f"{type(err).__name__}: {err}",
                                       "traceback": "".join(traceback.format_exception(err))}).encode("utf-8"))
    except OSError:
        pass  # the build is gone


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _lists(arrays: list[np.ndarray], dtype) -> pa.Array:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))


def _split(column: pa.ChunkedArray, dtype) -> list[np.ndarray]:
    lists = column.combine_chunks()
    offsets = (lists.offsets.to_numpy() - lists.offsets[0].as_py()).tolist()
    values = lists.flatten().to_numpy().astype(dtype)  # a copy of its own, writable
    return [values[start:end] for start, end in zip(offsets[:-1], offsets[1:])]


def _conversations_table(results: list[tuple[int, EncodedConversation]]) -> pa.Table:
    conversations = [c for _, c in results]
    return pa.table({
        "position": pa.array([p for p, _ in results], pa.int64()),
        "index": pa.array([c.index for c in conversations], pa.int64()),
        "id": pa.array([c.id for c in conversations], pa.string()),
        "source": pa.array([c.source for c in conversations], pa.string()),
        "ids": _lists([c.ids for c in conversations], np.int32),
        "mask": _lists([c.mask for c in conversations], np.uint8),
        "ends_with_answer": pa.array([c.ends_with_answer for c in conversations], pa.bool_()),
        "left_out": pa.array([c.left_out for c in conversations], pa.bool_()),
        "cross_checked": pa.array([c.cross_checked for c in conversations], pa.bool_()),
    })


def _conversations(table: pa.Table) -> list[tuple[int, EncodedConversation]]:
    columns = {name: table.column(name).to_numpy().tolist() for name in
               ("position", "index", "ends_with_answer", "left_out", "cross_checked")}
    columns |= {name: table.column(name).to_pylist() for name in ("id", "source")}
    ids, mask = _split(table.column("ids"), np.int32), _split(table.column("mask"), np.uint8)
    return [(columns["position"][k], EncodedConversation(
        columns["index"][k], columns["id"][k], columns["source"][k], ids[k], mask[k], columns["ends_with_answer"][k],
        left_out=columns["left_out"][k], cross_checked=columns["cross_checked"][k])) for k in range(table.num_rows)]


def _samples_table(samples: list[tuple]) -> pa.Table:
    return pa.table({
        "text": pa.array([t for texts, _, _ in samples for t in texts], pa.string()),
        "ids": _lists([a for _, ids, _ in samples for a in ids], np.int32),
        "index": pa.array([i for _, _, indices in samples for i in indices], pa.int64()),
    })
