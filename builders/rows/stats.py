"""What a build consumed, for the report and card.

Per-conversation and per-row counts, summarized.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from builders.rows.packing import Parts, Row

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


@dataclass(frozen=True)
class Consumed:
    """What a run of consecutive conversations consumed (``BuildStats.consumed``).

    ``left_out``, ``cross_checked`` and ``datasets`` hold one value for each conversation of the
    run, the others one for each conversation not left out.
    """

    left_out: np.ndarray  # bool
    cross_checked: np.ndarray  # bool
    datasets: np.ndarray  # int64
    sources: list
    ids: list
    tokens: np.ndarray  # int64: each with its EOS
    supervised: np.ndarray  # int64
    # supervised tokens other than stop tokens
    other_supervised: np.ndarray  # int64
    tool_counts: np.ndarray  # int64, one row of ``EncodedConversation.tool_counts`` each


def _per_part(flags: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of ``flags`` are set in each part, the parts ending at ``ends``."""
    counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return np.diff(counts[np.concatenate([[0], ends])])


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
        the dataset (its place in the manifest) of each.
        """
        ends = np.cumsum(parts.lengths)
        supervised = parts.mask != 0
        # supervised tokens other than stop tokens: a comparison per stop token (a few)
        other = supervised.copy()
        for stop_id in self.stop_ids.tolist():
            other &= parts.ids != stop_id
        return Consumed(
            np.fromiter((c.left_out for c in conversations), bool, len(conversations)),
            np.fromiter((c.cross_checked for c in conversations), bool, len(conversations)),
            np.asarray(datasets, np.int64),
            [c.source or NO_SOURCE for c in conversations if not c.left_out],
            [c.id for c in conversations if not c.left_out],
            parts.lengths,
            _per_part(supervised, ends),
            _per_part(other, ends),
            np.array([c.tool_counts for c in conversations if not c.left_out], np.int64).reshape(
                -1, 5
            ),
        )

    def add(self, consumed: Consumed, first: int = 0, stop: int | None = None) -> None:
        """Count conversations ``[first, stop)`` of a run (``consumed``), in order."""
        left_out = consumed.left_out[first:stop]
        # the parts (conversations not left out) among them
        lo = first - int(np.count_nonzero(consumed.left_out[:first]))
        hi = lo + len(left_out) - int(np.count_nonzero(left_out))
        self.left_out += len(left_out) - (hi - lo)
        self.cross_checked += int(np.count_nonzero(consumed.cross_checked[first:stop]))
        if hi == lo:
            return
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
        tools, strings, objects, tool_messages, in_calls = consumed.tool_counts[lo:hi].T
        calls = strings + objects
        for key, value in zip(
            TOOL_COUNTS,
            (tools, calls > 0, calls, strings, objects, tool_messages, in_calls),
            strict=True,
        ):
            self.tool_uses[key] += int(value.sum())
        supervised = consumed.supervised[lo:hi]
        self.datasets += consumed.datasets[first:stop][~left_out].tolist()
        self.sources += consumed.sources[lo:hi]
        self.conversation_tokens += consumed.tokens[lo:hi].tolist()
        self.conversation_supervised += supervised.tolist()
        self.unsupervised += int(np.count_nonzero(supervised == 0))
        self.only_stop_tokens += int(
            np.count_nonzero((supervised > 0) & (consumed.other_supervised[lo:hi] == 0))
        )

    def add_row(self, row: Row) -> None:
        self.row_supervised.append(int(np.count_nonzero(row.loss_mask)))

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
