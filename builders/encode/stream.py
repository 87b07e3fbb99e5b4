"""The source's conversations in stream order, encoded.

Each row group is decoded once a pass. A build consumes a prefix of the permutation whose length
depends on the tokens, so it is known only at the end. The stream plans for it:

- a sample of rows from a few row groups (only those rows converted), encoded, gives the mean
  tokens per conversation, and from it the *horizon*: ``HORIZON_MARGIN`` times the conversations
  the rows need (the whole source for a build that consumes all of it);
- one pass decodes every row group once (``READ_THREADS`` at a time) and keeps its rows whose
  stream position lies before the horizon: in memory up to ``MEMORY_ROWS_BYTES`` of decoded rows
  (in this process, half of them already encoded), the rest spilled to disk in position buckets
  (Arrow IPC files in the build's spill folder, ``OUT/.NAME.PID.spill``, beside its outputs) and
  read back in order;
- in this process, the conversations surely consumed (before ``EAGER_SHARE`` of the estimate)
  are encoded as soon as their row group is decoded, in whatever order, while the other groups
  decode (the engine's threads encode beside the reading); the rest are encoded in stream order,
  in batches, only as far as the rows need;
- with workers, each decodes its own row groups and keeps its rows of the pass decoded
  (``builders.encode.share``); the stream then asks the workers for them in stream order, a
  stretch at a time, ``ASKED_AHEAD`` stretches ahead, and each encodes what it is asked for
  while this process packs and writes the stretches before: this process holds only what is in
  flight (the same memory bound, over all workers together);
- a build that outruns the horizon (the estimate was short) makes another pass for the next
  stretch of the permutation, decoding the groups again; the report counts the passes.

The order of decoding and encoding never reaches the rows: every conversation takes its stream
position, and a conversation the contract cannot encode is reported when the stream reaches it,
so the error is always the first bad conversation in stream order. A manifest's
``leave_out_refused: N`` leaves up to N such conversations out instead, each recorded (``refused``)
in stream order; the next one is the error.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa

from builders.encode.encoder import EncodedConversation
from builders.encode.held import Held
from builders.encode.pool import Encoding, encode_rows
from builders.errors import RefusedConversation, SourceDataError
from builders.inputs.layout import conversations
from builders.inputs.source import Source

READ_THREADS = 2  # row groups decoded at once
# row groups decoded or decoding, not yet taken apart
READ_AHEAD = 2 * READ_THREADS
# rows kept past the estimate of what the build consumes
HORIZON_MARGIN = 1.3
# of the estimate, encoded as soon as its row group is decoded
EAGER_SHARE = 0.85
# row groups spread over the source, and rows of each, for the estimate
SAMPLE_GROUPS, SAMPLE_ROWS = 8, 64
# decoded rows held in memory; the rest of a pass waits on disk
MEMORY_ROWS_BYTES = 320 << 20
ENCODE_BATCH = 256  # conversations encoded together
# with workers: stretches of the stream asked for before the oldest is taken
ASKED_AHEAD = 2


@dataclass
class StreamStats:
    passes: int = 0  # passes over the source's row groups
    # the passes' row groups (each decoded by its pass) and the sample's
    row_groups_decoded: int = 0
    # the passes' rows that wait on disk for their turn
    rows_spilled: int = 0
    estimated_conversations: int = 0
    horizon: int = 0  # stream positions the first pass kept

    def as_dict(self) -> dict:
        return asdict(self)


class Stream:
    """Encoded conversations in permutation order.

    Stop iterating when the rows are complete.
    """

    def __init__(
        self,
        source: Source,
        order: np.ndarray,
        needed_tokens: int | None,
        leave_out: int | None = 0,
    ):
        """``order``: the source indices in stream order.

        That is all of them, or what a mixture's ``take`` keeps. ``needed_tokens`` None: the rows
        need the whole stream. ``leave_out``: how many refused conversations to leave out (None:
        any number), 0 stops at the first.
        """
        self.source, self.order, self.needed_tokens = source, order, needed_tokens
        self.leave_out = leave_out
        # the conversations left out, in stream order
        self.refused: list[RefusedConversation] = []
        # set by encoded_with, and spill_into (before the stream is read)
        self.encoding: Encoding | None = None
        self.spill: Path | None = None
        # -1: not in the stream
        self.position = np.full(source.num_rows, -1, dtype=np.int64)
        self.position[order] = np.arange(len(order), dtype=np.int64)
        self.stats = StreamStats()
        # the sample's rows, as they decode (``sample``)
        self._sampling: list[Future] = []

    def sample(self) -> None:
        """Start the plan's sample (``plan`` takes it).

        It is the first ``SAMPLE_ROWS`` rows of ``SAMPLE_GROUPS`` row groups spread over the
        source; only those rows are converted (a group of tool traces converted whole took ten
        times as long). The workers of a pool decode and encode it at once, whatever the build
        does meanwhile; here, its groups are decoded in threads of their own (pyarrow releases the
        GIL), all at once. The pass decodes them again, for its own rows.
        """
        groups = np.unique(
            np.linspace(0, self.source.num_groups - 1, SAMPLE_GROUPS).astype(np.int64)
        ).tolist()
        self.stats.row_groups_decoded += len(groups)
        if self.encoding.decodes_groups:
            self.encoding.sample({group: sample_rows(self.source, group) for group in groups})
            return
        readers = ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="sample")
        self._sampling = [
            readers.submit(self.source.read_group, group, sample_rows(self.source, group))
            for group in groups
        ]
        # the threads end with their group
        readers.shutdown(wait=False)

    def plan(self, encoder) -> None:
        """Estimate how many conversations the rows need, from the sample (``sample``).

        The estimate comes from the sample's mean tokens, each conversation encoded by ``encoder``
        here, or by the workers (any engine: only their lengths count).
        """
        if self.encoding.decodes_groups:
            sample = self.encoding.sampled()
        else:
            rows = conversations(pa.concat_tables([future.result() for future in self._sampling]))
            self._sampling = []
            sample = [c for _, c in encode_rows(encoder, rows, range(len(rows)))]
        tokens = [len(c.ids) + 1 for c in sample if isinstance(c, EncodedConversation)]
        mean = max(1.0, sum(tokens) / max(1, len(tokens)))
        self.stats.estimated_conversations = (
            len(self.order)
            if self.needed_tokens is None
            else max(ENCODE_BATCH, math.ceil(self.needed_tokens / mean))
        )

    def encoded_with(self, encoding: Encoding) -> Stream:
        """Encode with ``encoding``.

        It is this process, or a pool (``builders.encode.pool``).
        """
        self.encoding = encoding
        return self

    def spill_into(self, folder: Path) -> None:
        """Rows wanted later than memory allows wait in ``folder``, an existing folder.

        A build's is beside its outputs (``builders.runtime.atomic.spill_folder``); a plan's,
        a temporary folder of the system's. Either outlives the workers that write there.
        """
        self.spill = folder

    def __iter__(self) -> Iterator[list[EncodedConversation]]:
        """The encoded conversations in stream order, in runs of up to ``ENCODE_BATCH``.

        Refused ones are left out up to the bound: a refused conversation ends a run, and is
        refused (or left out) only when the run after it is asked for. While the stream is read,
        the objects made before it (the imports, the tokenizer, the template: the start-up's)
        are left out of the garbage collector's passes (``gc.freeze``): each full pass over them
        cost about 0.15 s, a tenth of a build's CPU in this process (docs/performance.md).
        """
        gc.freeze()
        try:
            run = []
            for item in self._in_order():
                if isinstance(item, RefusedConversation):
                    if run:
                        yield run
                        run = []
                    self._refuse(item)
                else:
                    run.append(item)
                    if len(run) == ENCODE_BATCH:
                        yield run
                        run = []
            if run:
                yield run
        finally:
            gc.unfreeze()

    def _refuse(self, refused: RefusedConversation) -> None:
        if self.leave_out == 0:
            raise refused
        if self.leave_out is not None and len(self.refused) >= self.leave_out:
            raise SourceDataError(
                f"{refused}; {len(self.refused)} refused conversations were left out before it, "
                f"the most leave_out_refused: {self.leave_out} allows"
            ) from refused
        self.refused.append(refused)

    def _in_order(self) -> Iterator[EncodedConversation | RefusedConversation]:
        n = len(self.order)
        estimate = self.stats.estimated_conversations
        end = (
            n
            if HORIZON_MARGIN * estimate >= n
            else math.ceil(HORIZON_MARGIN * estimate) + ENCODE_BATCH
        )
        self.stats.horizon = min(n, end)
        start, end, eager = 0, min(n, end), min(n, int(EAGER_SHARE * estimate))
        while start < n:
            yield from self._pass(start, end, eager, self.spill)
            # outrun: another stretch as long
            start, end, eager = end, min(n, 2 * end - start), end

    def _read(self, group: int, start: int, end: int) -> pa.Table:
        """Group ``group``'s rows at positions [start, end)."""
        return self.source.read_group(group, self._wanted(group, start, end)[0])

    def _wanted(self, group: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The places in ``group`` of its rows at positions [start, end), and the positions."""
        first, count = self.source.group_rows(group)
        positions = self.position[first : first + count]
        rows = np.flatnonzero((positions >= start) & (positions < end))
        return rows, positions[rows]

    def _pass(
        self, start: int, end: int, eager: int, spill: Path
    ) -> Iterator[EncodedConversation | RefusedConversation]:
        """Decode every row group once for positions [start, end).

        Yield them encoded, in order.
        """
        self.stats.passes += 1
        wanted = self.order[start:end]
        groups = np.unique(self.source.group_of(wanted)).tolist()
        # rows in memory at once (here, half encoded early, half waiting as Arrow data; in the
        # workers, all waiting as Arrow data); the rest waits on disk
        in_memory = max(
            2 * ENCODE_BATCH, int(MEMORY_ROWS_BYTES / max(1.0, self.source.bytes_per_row()))
        )
        eager = min(eager, end, start + in_memory // 2)
        # the same bound with workers (where nothing is eager), so the reading's figures are too
        memory_end = eager + in_memory // 2
        # the pass's plan, whatever the workers or the moment the rows complete: every group
        # decoded, every position from the memory bound on waiting on disk
        self.stats.row_groups_decoded += len(groups)
        self.stats.rows_spilled += max(0, end - memory_end)
        if self.encoding.decodes_groups:
            share = {
                "start": start,
                "memory_end": memory_end,
                "bucket": in_memory // 2,
                "spill": str(spill),
            }
            yield from self._asked(groups, (start, end), share)
            return
        held = Held(eager, memory_end, in_memory // 2, spill)
        encoded: dict[int, EncodedConversation | RefusedConversation] = {}
        position = start
        # after each row group decoded: the prefix encoded so far
        for _ in self._decode(groups, (start, end, eager), encoded, held):
            while position < eager and position in encoded:
                yield self.encoding.take(encoded, position)
                position += 1
        yield from self._taken(encoded, position, eager)
        position = eager
        # held rows are the positions from eager to end, in order
        for table, positions in held.in_order():
            order = np.argsort(positions, kind="stable")
            for first in range(0, table.num_rows, ENCODE_BATCH):
                batch = order[first : first + ENCODE_BATCH]
                self.encoding.submit(table.take(pa.array(batch)), positions[batch], encoded)
                yield from self._taken(encoded, position, position + len(batch))
                position += len(batch)
            # before the next bucket is read
            del table, positions, order

    def _asked(
        self, groups: list[int], bounds: tuple[int, int], share: dict
    ) -> Iterator[EncodedConversation | RefusedConversation]:
        """Have the workers decode the groups, each its own, and keep their rows (``share``).

        Then ask them for positions [start, end) in stream order, a stretch of ``ENCODE_BATCH``
        for each worker at a time, ``ASKED_AHEAD`` stretches ahead of the one taken: this process
        holds only the answers in flight. A worker does its tasks in the order they were sent, so
        it has kept its groups before it is asked for their rows.
        """
        start, end = bounds
        encoded: dict[int, EncodedConversation | RefusedConversation] = {}
        for group in groups:
            rows, positions = self._wanted(group, start, end)
            self.encoding.keep_group(group, rows, positions, share, encoded)
        # each worker answers after its groups: asked for now, a worker done with its groups
        # sends while the others decode
        of_group = self.source.group_of(self.order[start:end])
        stretch = ENCODE_BATCH * self.encoding.count
        asked: deque[tuple[int, int]] = deque()
        for first in range(start, end, stretch):
            last = min(end, first + stretch)
            self.encoding.ask(
                np.arange(first, last, dtype=np.int64),
                of_group[first - start : last - start],
                encoded,
            )
            asked.append((first, last))
            while len(asked) > ASKED_AHEAD:
                yield from self._taken(encoded, *asked.popleft())
        while asked:
            yield from self._taken(encoded, *asked.popleft())

    def _taken(
        self, encoded: dict, start: int, end: int
    ) -> Iterator[EncodedConversation | RefusedConversation]:
        """The encoded conversations at positions [start, end), in order.

        It waits for each.
        """
        for position in range(start, end):
            yield self.encoding.take(encoded, position)

    def _decode(
        self, groups: list[int], bounds: tuple[int, int, int], encoded: dict, held: Held
    ) -> Iterator[None]:
        """Decode the groups here and take each apart.

        ``READ_THREADS`` groups are decoded at a time.
        """
        with ThreadPoolExecutor(max_workers=READ_THREADS) as readers:
            # decoded groups wait for the encoder: at most READ_AHEAD of them at once
            queue = iter(groups)
            start, end, _ = bounds

            def submit(count: int) -> set[Future]:
                return {
                    readers.submit(self._read, group, start, end) for group in islice(queue, count)
                }

            pending = submit(READ_AHEAD)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                pending |= submit(len(done))
                for future in done:
                    self._take_apart(future.result(), bounds, encoded, held)
                yield

    def _take_apart(
        self, table: pa.Table, bounds: tuple[int, int, int], encoded: dict, held: Held
    ) -> None:
        """Hand a decoded group's rows on.

        Those in [start, eager) go to the encoder, those in [eager, end) to ``held``.
        """
        start, end, eager = bounds
        positions = self.position[table.column("index").to_numpy()]
        inside = (positions >= start) & (positions < end)
        now, later = inside & (positions < eager), inside & (positions >= eager)
        if now.any():
            self.encoding.submit(*_in_order(table.filter(now), positions[now]), encoded)
        if later.any():
            held.add(table.filter(later), positions[later])


def sample_rows(source: Source, group: int) -> np.ndarray:
    """The plan's sample's rows of ``group``: its first ``SAMPLE_ROWS``."""
    return np.arange(min(SAMPLE_ROWS, source.group_rows(group)[1]), dtype=np.int64)


def _in_order(table: pa.Table, positions: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    order = np.argsort(positions, kind="stable")
    return table.take(pa.array(order)), positions[order]
