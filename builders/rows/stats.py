"""What a build consumed, for the report and card.

Per-conversation and per-row counts, summarized.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from builders.rows.packing import Parts

if TYPE_CHECKING:
    from builders.encode.encoder import EncodedConversation

PERCENTILES = (0, 10, 50, 90, 99, 100)
# repeated conversation ids the report and card name (all are counted)
DUPLICATE_EXAMPLES = 5


# a conversation whose row has no ``source`` value
NO_SOURCE = "(none)"
TOOL_COUNTS = (
    "conversations_with_tools",
    "conversations_with_calls",
    "calls",
    "calls_string_arguments",
    "calls_object_arguments",
    "tool_messages",
    "supervised_in_calls",
)


# what ``Consumed.totals`` sums, after ``TOOL_COUNTS``
TOTALS = (*TOOL_COUNTS, "unsupervised", "only_stop_tokens", "cross_checked")


@dataclass(frozen=True)
class Consumed:
    """What a run of consecutive conversations consumed (``BuildStats.consumed``).

    The lists and ``tokens`` and ``supervised`` hold one value for each conversation not left out
    (each part of the stream), in order.
    """

    # of the run's first k conversations, how many are not left out (k from 0 to all)
    parts_before: np.ndarray
    datasets: np.ndarray  # int64
    sources: list
    ids: list
    tokens: np.ndarray  # int64: each with its EOS
    supervised: np.ndarray  # int64
    # of the run's first k conversations (k from 0 to all), the ``TOTALS``
    totals: np.ndarray


def _per_part(flags: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """How many of ``flags`` are set in each part, the parts ``lengths`` long, end to end."""
    counts = np.zeros(len(lengths), np.int64)
    shown = np.flatnonzero(lengths)
    if shown.size:
        starts = (np.cumsum(lengths) - lengths)[shown]
        counts[shown] = np.add.reduceat(flags.view(np.uint8), starts, dtype=np.int64)
    return counts


@dataclass
class BuildStats:
    row_tokens: int
    # each of the manifest's datasets, named for a reader
    dataset_names: list = field(default_factory=list)
    # per conversation: which dataset it came from
    datasets: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    conversation_tokens: list = field(default_factory=list)  # each with its EOS
    conversation_supervised: list = field(default_factory=list)
    row_supervised: list = field(default_factory=list)
    # tokens that end an answer
    stop_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    windows_skipped: int = 0
    # conversations a slime mask rule leaves out (no answer header found)
    left_out: int = 0
    # conversations the reference engine encoded too
    cross_checked: int = 0
    # conversations whose supervised tokens are all stop tokens: every answer empty
    only_stop_tokens: int = 0
    # conversations with no supervised token at all
    unsupervised: int = 0
    # rows: all: the stream's tokens after the last full window, dropped
    remainder_tokens: int | None = None
    # the datasets whose pin says ``tools: null``: a ``tools`` field deliberately not read
    tools_unread: list = field(default_factory=list)
    # over the consumed conversations: with tools given, with calls, calls whose arguments were
    # stored as a JSON string and as an object, tool messages
    tool_uses: dict = field(default_factory=lambda: dict.fromkeys(TOOL_COUNTS, 0))
    # the consumed conversations' ids; those whose id an earlier consumed one has (not refused:
    # counted, with the first few)
    ids_seen: set = field(default_factory=set)
    duplicate_ids: int = 0
    duplicate_id_examples: list = field(default_factory=list)

    def consumed(
        self, conversations: Sequence[EncodedConversation], parts: Parts, datasets: np.ndarray
    ) -> Consumed:
        """What each of a run of consecutive conversations consumed, for ``add``.

        ``parts`` is the stream's part of those not left out (``Packer.joined``), ``datasets``
        the dataset (its place in the manifest) of each of those.
        """
        count = len(conversations)
        kept = np.fromiter((not c.left_out for c in conversations), bool, count)
        supervised_tokens = parts.mask != 0
        supervised = _per_part(supervised_tokens, parts.lengths)
        # supervised tokens other than stop tokens: a comparison per stop token (a few)
        for stop_id in self.stop_ids.tolist():
            supervised_tokens &= parts.ids != stop_id
        other = _per_part(supervised_tokens, parts.lengths)
        tools, strings, objects, tool_messages, in_calls = (
            np.array([c.tool_counts for c in conversations], np.int64).reshape(count, 5).T
        )
        calls = strings + objects
        each = np.zeros((count, len(TOTALS)), np.int64)
        each[kept, : len(TOTALS) - 1] = np.stack(
            [
                tools[kept],
                calls[kept] > 0,
                calls[kept],
                strings[kept],
                objects[kept],
                tool_messages[kept],
                in_calls[kept],
                supervised == 0,
                (supervised > 0) & (other == 0),
            ],
            axis=1,
        )
        each[:, -1] = np.fromiter((c.cross_checked for c in conversations), bool, count)
        totals = np.zeros((count + 1, len(TOTALS)), np.int64)
        np.cumsum(each, axis=0, out=totals[1:])
        parts_before = np.zeros(count + 1, np.int64)
        np.cumsum(kept, out=parts_before[1:])
        return Consumed(
            parts_before,
            np.asarray(datasets, np.int64),
            [c.source or NO_SOURCE for c in conversations if not c.left_out],
            parts.id,
            parts.lengths,
            supervised,
            totals,
        )

    def add(self, consumed: Consumed, first: int = 0, stop: int | None = None) -> None:
        """Count conversations ``[first, stop)`` of a run (``consumed``), in order."""
        stop = len(consumed.parts_before) - 1 if stop is None else stop
        if stop <= first:
            return
        lo, hi = consumed.parts_before[first], consumed.parts_before[stop]
        self.left_out += (stop - first) - int(hi - lo)
        totals = (consumed.totals[stop] - consumed.totals[first]).tolist()
        for key, value in zip(TOOL_COUNTS, totals[: len(TOOL_COUNTS)], strict=True):
            self.tool_uses[key] += value
        self.unsupervised += totals[-3]
        self.only_stop_tokens += totals[-2]
        self.cross_checked += totals[-1]
        ids = consumed.ids[lo:hi]
        fresh = set(ids)
        # a conversation with no id is not compared
        fresh.discard(None)
        if len(fresh) == len(ids) - ids.count(None) and self.ids_seen.isdisjoint(fresh):
            self.ids_seen |= fresh
        else:
            for conversation_id in ids:
                if conversation_id is None:
                    continue
                if conversation_id in self.ids_seen:
                    self.duplicate_ids += 1
                    if len(self.duplicate_id_examples) < DUPLICATE_EXAMPLES:
                        self.duplicate_id_examples.append(conversation_id)
                self.ids_seen.add(conversation_id)
        self.datasets += consumed.datasets[lo:hi].tolist()
        self.sources += consumed.sources[lo:hi]
        self.conversation_tokens += consumed.tokens[lo:hi].tolist()
        self.conversation_supervised += consumed.supervised[lo:hi].tolist()

    def add_rows(self, loss_masks: np.ndarray) -> None:
        """Count rows given in order, by their masks (2-D)."""
        self.row_supervised += np.count_nonzero(loss_masks, axis=1).tolist()

    def by_source(self) -> list[dict]:
        """What each value of the data's ``source`` field gave, most tokens first.

        For each value: the conversations, tokens and supervised tokens consumed.
        """
        table = self._totals(self.sources)
        return [
            {"source": s, "conversations": c, "tokens": t, "supervised_tokens": u}
            for s, (c, t, u) in sorted(table.items(), key=lambda item: (-item[1][1], item[0]))
        ]

    def by_dataset(self) -> list[dict]:
        """What each of the manifest's datasets gave, in its order.

        Nothing, for one the stream did not reach.
        """
        table = self._totals(self.datasets)
        return [
            {
                "dataset": name,
                "conversations": table[j][0],
                "tokens": table[j][1],
                "supervised_tokens": table[j][2],
            }
            for j, name in enumerate(self.dataset_names)
        ]

    def has_source(self) -> bool:
        """Whether any consumed conversation has a ``source`` value."""
        return any(source != NO_SOURCE for source in self.sources)

    def _totals(self, keys: list) -> dict:
        table = defaultdict(lambda: [0, 0, 0])
        for key, tokens, supervised in zip(
            keys, self.conversation_tokens, self.conversation_supervised, strict=True
        ):
            entry = table[key]
            entry[0] += 1
            entry[1] += tokens
            entry[2] += supervised
        return table

    def summary(self) -> dict:
        lengths = np.asarray(self.conversation_tokens, dtype=np.int64)
        return {
            "conversations_consumed": len(self.conversation_tokens),
            "stream_tokens_consumed": int(lengths.sum()),
            "windows_skipped": self.windows_skipped,
            **(
                {}
                if self.remainder_tokens is None
                else {"remainder_tokens_dropped": self.remainder_tokens}
            ),
            "conversations_left_out": self.left_out,
            "conversations_training_only_stop_tokens": self.only_stop_tokens,
            "conversations_unsupervised": self.unsupervised,
            "conversations_with_a_repeated_id": self.duplicate_ids,
            "repeated_ids": self.duplicate_id_examples,
            "conversation_tokens_percentiles": {
                f"p{p}": int(np.percentile(lengths, p, method="inverted_cdf")) for p in PERCENTILES
            }
            if lengths.size
            else {},
            "by_source": self.by_source(),
            "by_dataset": self.by_dataset(),
            "tool_calls": {
                **self.tool_uses,
                # of the consumed conversations' supervised tokens, those inside answers' calls
                "supervised_share_in_calls": round(
                    self.tool_uses["supervised_in_calls"]
                    / max(1, sum(self.conversation_supervised)),
                    4,
                ),
                "tools_field_unread": self.tools_unread,
            },
        }
