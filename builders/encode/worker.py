"""A tokenizing worker process, and what travels to and from it.

The build starts the workers' parent (``builders.encode.spawn``), a fresh interpreter in a
session of its own, with one end of a socket pair for each worker. The parent reads the first
worker's start-up messages, makes what every worker shares (the parsed tokenizer, fastokens, the
encoder) and forks a worker for each socket (``builders.encode.family``, which also says when a
sample worker serves a socket before it); each worker holds its own end and
no other, so a dead worker closes its channel at once: the build sees the end of it, or a broken
pipe, and no lock or pipe shared with other processes can be left blocked. Only JSON and Arrow IPC
travel on the channel:

- build → worker: where the pinned ``tokenizer.json`` lies and its sha256 (the parent reads,
  checks and parses it while the build checks its other inputs), the start-up message (contract,
  the engine ``--engine`` asks for, the chat format's inputs and the source's files; every
  worker's the same, and a worker checks that they are its parent's), then tasks,
  each a JSON header and an Arrow IPC stream:
  ``{"group": G, "bounds": B, "share": S}`` and the rows of source row group G the pass wants
  (``row`` in the group, ``position``): the worker decodes the group itself, converting only
  those rows. With S, the pass's bounds (``builders.encode.share``), it keeps them decoded, in
  memory or spilled to the build's spill folder; without (the plan's sample), it encodes them
  all and answers with them. ``{"wanted": true}`` and ``position``s (ascending, all of them its
  own): it encodes those conversations it keeps and sends them, with the engine it chose (it
  waits for the choice if need be). ``{"sampled": true}`` and an empty body, once, before any
  task after the plan's sample: a sample worker reads no further and hands its channel over; any
  other worker reads on. Closing the channel ends the worker.
- worker → build: a JSON header for each message: ``ready`` once it can encode (with the
  reference engine, the plan's sample, while the engine asked for is chosen beside it from its
  first answer on: ``engines.Choosing``; the parent loaded fastokens for all); ``engine``
  once it has chosen (``builders.encode.engines.choose``: the same probes in every worker), and
  encodes with that from then on; for a group it keeps, ``kept``; for the sample's groups and
  the positions wanted, ``batch`` (with the conversations the contract cannot encode, by position
  and message), followed by an Arrow IPC stream of the encoded conversations; or ``failed`` with
  the reason (and, for an error the user can cause, its class), after which it exits. Source rows
  travel in neither direction.

A guarded engine's cross-check runs in the worker, on its own samples, and an answer is sent only
once its comparisons passed: the build never re-encodes anything.

A worker reads its channel in a thread of its own, so the build's sends never wait for an
encoding to finish, and it exits quietly when the channel ends (the build finished, or died).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import signal
import subprocess
import threading
import traceback
from contextlib import suppress
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from builders import errors
from builders.contract import Contract
from builders.encode import engines, spawn
from builders.encode.encoder import ConversationEncoder, EncodedConversation
from builders.encode.share import Share
from builders.errors import (
    BuildError,
    RefusedConversation,
    UsageError,
    WorkerError,
)
from builders.formats import FormatSpec
from builders.inputs.layout import conversations
from builders.inputs.source import Source
from builders.limits import Limits
from builders.manifest import DatasetPin

if TYPE_CHECKING:
    from builders.encode.family import Prepared

# the task a worker finds in its queue once it has chosen its engine
CHOSEN = (None, None)
# the reader's mark in a sample worker's queue: the build said the sample is over
HAND_OVER = ("sampled", None)
# what a forked worker serves (``builders.encode.family``): every task (``WHOLE``); the plan's
# sample, with the reference, until the build says it is over (``SAMPLE``); or every task after
# it, once the channel's sample worker has handed it over (``REST``)
WHOLE, SAMPLE, REST = "whole", "sample", "rest"


class Worker:
    """The build's handle on one worker process.

    It holds the worker's channel, and counts the worker's tasks not yet answered.
    """

    def __init__(self, started: spawn.Started):
        """Take a worker ``started`` (``spawn.start``)."""
        self.process, self.channel = started
        self.started = False  # it said ready
        # the engine it chose (``Choice.as_dict``), once it said so
        self.choice: dict | None = None
        self.in_flight = 0  # tasks sent, not yet answered

    def send_tokenizer(self, path: Path, sha256: str) -> None:
        """Tell the worker where the pinned ``tokenizer.json`` lies (``path``), and its sha256.

        The first worker's parent parses it (for every worker) if the file's sha256 is
        ``sha256``.
        """
        self._send(json.dumps({"tokenizer": str(path), "sha256": sha256}).encode("utf-8"))

    def send_start_up(
        self, spec: FormatSpec, contract: Contract, engine: str, source: Source | None
    ) -> None:
        """Send what the worker encodes with besides the tokenizer, and the source it decodes.

        That is the chat format ``spec``, the ``contract``, the ``engine`` asked for, and the
        source whose row groups it decodes.
        """
        self._send(start_up_message(spec, contract, engine, source))

    def send_group(
        self,
        group: int,
        bounds: tuple[int, int],
        rows: np.ndarray,
        positions: np.ndarray,
        share: dict | None = None,
    ) -> None:
        """Row group ``group`` to decode in the worker.

        ``bounds`` is its first source index and rows, which the worker's reading must match. The
        worker takes its ``rows`` (in the group) at ``positions``. With a pass's ``share`` (its
        bounds, ``builders.encode.share``) it keeps them until asked for (``send_wanted``) and
        answers that it has; without (the plan's sample), it encodes them all and sends
        them back.
        """
        self._send_task(
            {"group": group, "bounds": list(bounds), "share": share},
            _ipc(pa.table({"row": _int64(rows), "position": _int64(positions)})),
        )

    def send_sampled(self) -> None:
        """Say that the plan's sample is over: a sample worker hands its channel over."""
        self._send(json.dumps({"sampled": True}).encode("utf-8"))
        self._send(b"")

    def send_wanted(self, positions: np.ndarray) -> None:
        """Have the worker send its kept conversations at ``positions`` (ascending)."""
        self._send_task({"wanted": True}, _ipc(pa.table({"position": _int64(positions)})))

    def receive(self) -> list[tuple[int, object]]:
        """The next message.

        For a task, each position's EncodedConversation or RefusedConversation (none for a group
        kept); nothing for ``ready``. A worker that died raises WorkerError; one that failed, the
        user's error it met, or RuntimeError (a fault in the builder).
        """
        try:
            header = json.loads(self.channel.recv_bytes())
            if "batch" in header:
                results = _read(self.channel.recv_bytes())
        except (EOFError, OSError):
            raise self._died() from None
        if "failed" in header:
            # the user's error, as it would be without workers
            if header.get("error"):
                raise getattr(errors, header["error"])(header["message"])
            # a fault in the builder, as it would be without workers
            if self.started:
                raise RuntimeError(
                    f"a tokenizing worker failed while encoding a batch:\n{header['traceback']}"
                )
            raise WorkerError(
                f"a tokenizing worker process could not start: {header['failed']}; "
                + spawn.NOTHING_LEFT
            )
        if "ready" in header:
            self.started = True
            return []
        if "engine" in header:
            self.choice = header["engine"]
            return []
        self.in_flight -= 1
        if "kept" in header:
            return []
        failed = [(error[0], RefusedConversation(*error[1:])) for error in header["errors"]]
        return _conversations(results) + failed

    def _send_task(self, header: dict, body: pa.Buffer) -> None:
        self._send(json.dumps(header).encode("utf-8"))
        self._send(body)
        self.in_flight += 1

    def _send(self, data) -> None:
        try:
            self.channel.send_bytes(data)
        except OSError:
            self._last_words()
            raise self._died() from None

    def _last_words(self) -> None:
        """Raise what a worker whose channel broke said before it went.

        That is a failure to start, if it said it.
        """
        with suppress(EOFError, OSError):
            while self.channel.poll(0):
                self.receive()

    def _died(self) -> WorkerError:
        self.channel.close()
        try:
            # its channel is closed: it has exited, or is exiting
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            status = f"killed by {signal.Signals(-code).name}: killed, or out of memory"
        else:
            status = (
                f"exit code {code}; what it printed, if anything, is above"
                if code is not None
                else "its channel closed, but it did not exit"
            )
        when = "while starting" if not self.started else "before answering its task"
        return WorkerError(
            f"a tokenizing worker process died {when} ({status}); {spawn.NOTHING_LEFT}"
        )


def serve(channel: Connection, prepared: Prepared, role: str, reads_messages: bool) -> bool:
    """A worker's life after its parent forked it, in ``role``; True once it has handed over.

    ``prepared`` is what its parent made. Its start-up
    messages are its parent's (``reads_messages``: read them, the same). It says it is ready (not
    in ``REST``: its predecessor did), then does each task the build sends; in ``WHOLE`` and
    ``REST`` the engine asked for is chosen (its probes) once its first answer is sent (or it
    waits for a task). In ``SAMPLE`` it encodes with the reference, and hands over where the build
    says the sample is over, having read no further.
    """
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    messages = prepared.messages
    try:
        if reads_messages and any(channel.recv_bytes() != sent for sent in messages.raw):
            raise RuntimeError("the build sent its workers different start-up messages")
        threading.Thread(
            target=_receive, args=(channel, tasks, role == SAMPLE), daemon=True
        ).start()
        choosing = None
        if role != SAMPLE:
            # the reference encodes until the engine asked for has passed its probes
            choosing = engines.Choosing(
                messages.start_up["engine"],
                prepared.tokenizer,
                messages.tokenizer_json,
                prepared.encoder.spec.chat_template,
                chosen=lambda: tasks.put(CHOSEN),
                fast=prepared.fast,
            )
    except (EOFError, OSError):
        # the build is gone
        return False
    except Exception as err:
        fail(channel, err)
        return False
    try:
        if role != REST:
            channel.send_bytes(json.dumps({"ready": True}).encode("utf-8"))
        return _work(channel, tasks, prepared, choosing)
    except OSError:
        # the build is gone
        return False


def _work(
    channel: Connection,
    tasks: queue.SimpleQueue,
    prepared: Prepared,
    choosing: engines.Choosing | None,
) -> bool:
    """Do each task in ``tasks`` until the channel ends (False) or the worker hands over (True).

    With ``choosing``, the reference encodes until the choice is made, and the chosen engine
    after; without, the reference encodes.
    """
    start_up = prepared.messages.start_up
    doing = _Tasks((start_up["source"], start_up["conversation_chars"]))
    encoder = prepared.encoder
    if choosing is not None:
        encoder = encoder.with_engine(choosing.provisional)

    def encode(rows: pa.Table) -> list[tuple[int, object]]:
        return encode_rows(
            encoder,
            conversations(rows.drop_columns(["position"])),
            rows.column("position").to_numpy(),
        )

    while (task := _next_task(tasks, choosing)) is not None:
        if task is HAND_OVER:
            return True
        header, body = task
        try:
            # the build's rows are encoded with the engine chosen: the reference costs many times
            # the fast engine's CPU (docs/performance.md)
            wanted = header is not None and "wanted" in header
            if choosing is not None and (choosing.done() or wanted):
                choosing.start()
                choice, choosing = choosing.result(), None
                encoder = encoder.with_engine(choice.engine)
                channel.send_bytes(json.dumps({"engine": choice.as_dict()}).encode("utf-8"))
            if header is None:
                # CHOSEN: no task
                continue
            answer = doing.task(header, _read(body), encode)
            # its cross-checks passed before it is sent
            encoder.engine.finish()
        except Exception as err:
            fail(channel, err)
            return False
        if isinstance(answer, dict):
            channel.send_bytes(json.dumps(answer).encode("utf-8"))
        else:
            _send_results(channel, answer)
        if choosing is not None:
            choosing.start()
    return False


class _Tasks:
    """What a worker does with each task, and what it keeps from one task to the next."""

    def __init__(self, datasets: tuple[list, int]):
        self.datasets = datasets
        # opened at the first group
        self.source: Source | None = None
        # what it keeps of the pass, until the build asks for it
        self.share: Share | None = None

    def task(self, header: dict, table: pa.Table, encode) -> list[tuple[int, object]] | dict:
        """A task's conversations; for a group kept, the answer that says so."""
        if "wanted" in header:
            return self.share.taken(table.column("position").to_numpy(), encode)
        self.source = self.source or _source(*self.datasets)
        rows = _wanted_rows(self.source, header, table).append_column(
            "position", table.column("position")
        )
        bounds = header["share"]
        if bounds is None:
            return encode(rows)
        if self.share is None or self.share.start != bounds["start"]:
            self.share = Share(bounds)
        self.share.add(rows)
        return {"kept": True}


def _send_results(channel: Connection, results: list[tuple[int, object]]) -> None:
    """A task's conversations: a header naming the refused ones, then the encoded as Arrow IPC."""
    failed = [
        (position, item.index, item.id, item.reason)
        for position, item in results
        if isinstance(item, RefusedConversation)
    ]
    channel.send_bytes(json.dumps({"batch": len(results), "errors": failed}).encode("utf-8"))
    channel.send_bytes(
        _ipc(
            _conversations_table([(p, c) for p, c in results if isinstance(c, EncodedConversation)])
        )
    )


def _next_task(tasks: queue.SimpleQueue, choosing: engines.Choosing | None):
    """The next task; before waiting for one, the engine's choice starts."""
    if choosing is not None and tasks.empty():
        choosing.start()
    return tasks.get()


def _int64(values: np.ndarray) -> pa.Array:
    """``values`` as an Arrow int64 array, made from its buffer (``pa.array`` looks for pandas)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def start_up_message(
    spec: FormatSpec,
    contract: Contract,
    engine: str = "tokenizers",
    source: Source | None = None,
) -> bytes:
    """What a worker's encoder is made of besides the tokenizer, as JSON.

    That is the ``contract``, the ``engine`` asked for (``--engine``) and the chat format's inputs
    (``spec``), and the source it decodes (each dataset's pin and files). A format whose template
    variables JSON does not carry exactly (a mapping with keys that are not text, binary data) is
    refused here: workers would render otherwise.
    """
    fields = asdict(spec)
    try:
        text = json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError):
        text = None
    if text is None or format_spec(json.loads(text)) != spec:
        raise UsageError(
            "tokenizer.template_vars and tokenizer.prefills hold data other than plain JSON (text "
            "keys, text, numbers, lists): worker processes could not render as this process does; "
            "build with --workers 1"
        )
    datasets = (
        []
        if source is None
        else [
            (asdict(pin), [(f.name, str(f.path)) for f in source.files if f.dataset == j])
            for j, pin in enumerate(source.pins)
        ]
    )
    return json.dumps(
        {
            "contract": contract.as_dict(),
            "engine": engine,
            "format": fields,
            "source": datasets,
            "conversation_chars": None if source is None else source.conversation_chars,
        }
    ).encode("utf-8")


def checked_text(message: dict) -> str:
    """The text of the ``tokenizer.json`` a message names, if its sha256 is the message's."""
    data = Path(message["tokenizer"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != message["sha256"]:
        raise RuntimeError(f"{message['tokenizer']}: its sha256 changed since the build checked it")
    return data.decode("utf-8")


def _source(datasets: list, conversation_chars: int) -> Source:
    """The source a start-up message describes, opened again in the worker."""

    def pin(data: dict) -> DatasetPin:
        roles = data["roles"]
        return DatasetPin(
            **{
                **data,
                "keys": tuple(data["keys"]),
                "roles": None if roles is None else tuple(tuple(r) for r in roles),
            }
        )

    return Source(
        [(pin(data), [(name, Path(path)) for name, path in files]) for data, files in datasets],
        conversation_chars,
    )


def format_spec(data: dict) -> FormatSpec:
    return FormatSpec(
        **{
            **data,
            "stop": tuple(data["stop"]),
            "prefills": tuple(data["prefills"]),
            "limits": Limits(**data["limits"]),
        }
    )


def _wanted_rows(source: Source, header: dict, wanted: pa.Table) -> pa.Table:
    """The ``wanted`` rows of the row group a task names, decoded, in ``wanted``'s order.

    Only they are converted to the layout.
    """
    number = header["group"]
    if list(source.group_rows(number)) != header["bounds"]:
        raise RuntimeError(
            f"row group {number}: the worker reads rows {source.group_rows(number)}, the build "
            f"{header['bounds']}"
        )
    return source.read_group(number, wanted.column("row").to_numpy())


def encode_rows(
    encoder: ConversationEncoder, rows: list[dict], positions
) -> list[tuple[int, object]]:
    """Each row's encoded conversation (or its RefusedConversation).

    Each comes with its position.
    """
    positions = [int(p) for p in positions]
    try:
        return list(zip(positions, encoder.encode(rows), strict=True))
    except RefusedConversation:
        # which of them: one at a time
        out = []
        for row, position in zip(rows, positions, strict=True):
            try:
                out.append((position, encoder.encode([row])[0]))
            except RefusedConversation as err:
                out.append((position, err))
        return out


def _receive(channel: Connection, tasks: queue.SimpleQueue, hands_over: bool) -> None:
    """Queue each task the build sends; where the sample is over, a sample worker stops reading."""
    try:
        while True:
            header, body = json.loads(channel.recv_bytes()), channel.recv_bytes()
            if "sampled" not in header:
                tasks.put((header, body))
            elif hands_over:
                tasks.put(HAND_OVER)
                return
    except (EOFError, OSError):
        tasks.put(None)


def fail(channel: Connection, err: Exception) -> None:
    user = isinstance(err, BuildError) and getattr(errors, type(err).__name__, None) is type(err)
    # OSError: the build is gone
    with suppress(OSError):
        channel.send_bytes(
            json.dumps(
                {
                    "failed": f"{type(err).__name__}: {err}",
                    "message": str(err),
                    "error": type(err).__name__ if user else None,
                    "traceback": "".join(traceback.format_exception(err)),
                }
            ).encode("utf-8")
        )


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


def _split(lists: pa.Array, dtype) -> list[np.ndarray]:
    """Each list of ``lists`` (one piece) as a view of the answer's buffer (read-only).

    Nothing writes a conversation's tokens.
    """
    offsets = lists.offsets.to_numpy().tolist()
    values = lists.values.to_numpy().astype(dtype, copy=False)
    return [values[start:end] for start, end in itertools.pairwise(offsets)]


def _conversations_table(results: list[tuple[int, EncodedConversation]]) -> pa.Table:
    conversations = [c for _, c in results]
    return pa.table(
        {
            "position": pa.array([p for p, _ in results], pa.int64()),
            "index": pa.array([c.index for c in conversations], pa.int64()),
            "id": pa.array([c.id for c in conversations], pa.string()),
            "source": pa.array([c.source for c in conversations], pa.string()),
            "ids": _lists([c.ids for c in conversations], np.int32),
            "mask": _lists([c.mask for c in conversations], np.uint8),
            "ends_with_answer": pa.array([c.ends_with_answer for c in conversations], pa.bool_()),
            "left_out": pa.array([c.left_out for c in conversations], pa.bool_()),
            "cross_checked": pa.array([c.cross_checked for c in conversations], pa.bool_()),
            "tool_counts": pa.array(
                [list(c.tool_counts) for c in conversations], pa.list_(pa.int32())
            ),
        }
    )


def _conversations(table: pa.Table) -> list[tuple[int, EncodedConversation]]:
    if not table.num_rows:
        return []
    # one piece (an answer is one batch: nothing is copied), its columns as arrays
    (columns,) = table.combine_chunks().to_batches()
    flags = {
        name: columns.column(name).to_numpy(zero_copy_only=False).tolist()
        for name in ("position", "index", "ends_with_answer", "left_out", "cross_checked")
    }
    # each conversation's five counts (``EncodedConversation.tool_counts``)
    counts = columns.column("tool_counts").flatten().to_numpy().reshape(-1, 5).tolist()
    return [
        (
            position,
            EncodedConversation(
                index,
                id_,
                source,
                ids,
                mask,
                ends,
                left_out=left_out,
                cross_checked=checked,
                tool_counts=tuple(counts),
            ),
        )
        for position, index, id_, source, ids, mask, ends, left_out, checked, counts in zip(
            flags["position"],
            flags["index"],
            columns.column("id").to_pylist(),
            columns.column("source").to_pylist(),
            _split(columns.column("ids"), np.int32),
            _split(columns.column("mask"), np.uint8),
            flags["ends_with_answer"],
            flags["left_out"],
            flags["cross_checked"],
            counts,
            strict=True,
        )
    ]
