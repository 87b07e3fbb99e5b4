"""The stream and its rows: EOS joins, windows, skipping, provenance."""

import itertools
import random

import numpy as np
import pytest

from builders.contract import Contract
from builders.encode.encoder import EncodedConversation
from builders.rows.packing import Packer
from builders.rows.stats import BuildStats

EOS = 999


def conv(index, n, supervised):
    return EncodedConversation(
        index=index,
        id=f"c{index}",
        source=None,
        ids=np.arange(n, dtype=np.int32) + 100 * index,
        mask=np.full(n, 1 if supervised else 0, dtype=np.uint8),
        ends_with_answer=supervised,
    )


def test_windows_are_consecutive_and_unsupervised_ones_skipped():
    packer = Packer(row_tokens=4, eos_id=EOS)
    conversations = [
        conv(1, 2, True),
        conv(2, 8, False),
        conv(3, 1, True),
        conv(4, 2, True),
        conv(5, 3, False),
    ]
    rows = [row for row, _ in packer.cut(packer.joined(conversations))]
    stream = np.concatenate([np.append(c.ids, EOS) for c in conversations])
    windows = [stream[i : i + 4].tolist() for i in range(0, 20, 4)]
    # windows 1 and 2 hold only conversation 2, which is unsupervised (and so is the EOS after it)
    assert packer.windows_skipped == 2
    assert [r.input_ids.tolist() for r in rows] == [windows[0], windows[3], windows[4]]
    assert windows[0] == [100, 101, EOS, 200]
    assert (rows[0].source_index, rows[0].segment_start, rows[0].loss_mask.tolist()) == (
        [1, 2],
        [0, 3],
        [1, 1, 1, 0],
    )
    assert (rows[1].source_index, rows[1].segment_start, rows[1].source_id) == (
        [3, 4],
        [0, 2],
        ["c3", "c4"],
    )
    # conversation 4 continues into the last row, at offset 0; the EOS after an answer is its stop
    # token
    assert (rows[2].source_index, rows[2].segment_start, rows[2].loss_mask.tolist()) == (
        [4, 5],
        [0, 1],
        [1, 0, 0, 0],
    )
    assert rows[2].input_ids.tolist() == [EOS, 500, 501, 502]


def reference_rows(conversations, row_tokens, contract):
    """The rows by slicing the whole stream, one conversation's part at a time."""
    stream, mask, owner = [], [], []
    for k, c in enumerate(conversations):
        eos = contract.eos_mask(c.ends_with_answer)
        part = c.ids.tolist() + ([] if eos is None else [EOS])
        stream += part
        mask += c.mask.tolist() + ([] if eos is None else [eos])
        owner += [k] * len(part)
    rows = []
    for start in range(0, len(stream) - row_tokens + 1, row_tokens):
        window = slice(start, start + row_tokens)
        if not any(mask[window]) and not contract.keeps_unsupervised_windows:
            continue
        owners = owner[window]
        segments = [j for j, k in enumerate(owners) if j == 0 or k != owners[j - 1]]
        rows.append(
            (
                stream[window],
                mask[window],
                [conversations[owners[j]].index for j in segments],
                segments,
                # the conversation that completes it
                owners[-1],
            )
        )
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_rows_do_not_depend_on_how_the_stream_is_split_into_runs(seed):
    """Runs of any length give the rows of the whole stream sliced.

    Conversations of 0 to 30 tokens (some unsupervised), rows of 7, under each EOS reading; an
    empty run (every conversation of it left out) changes nothing.
    """
    rng = random.Random(seed)
    contract = Contract(
        eos=["after-answer", "none", "supervised"][seed % 3],
        skip="keep-all" if seed == 5 else Contract().skip,
    )
    conversations = [
        conv(k + 1, rng.choice([0, 1, 3, 7, 12, 30]), rng.random() < 0.6) for k in range(80)
    ]
    packer = Packer(row_tokens=7, eos_id=EOS, contract=contract)
    rows, first = [], 0
    while first < len(conversations):
        run = conversations[first : first + rng.choice([0, 1, 2, 5, 17])]
        rows += [(row, first + reached - 1) for row, reached in packer.cut(packer.joined(run))]
        first += len(run)
    expected = reference_rows(conversations, 7, contract)
    assert len(rows) == len(expected) > 10
    for (row, last), (ids, mask, index, starts, owner) in zip(rows, expected, strict=True):
        assert row.input_ids.dtype == np.int32 and row.loss_mask.dtype == np.uint8
        assert (row.input_ids.tolist(), row.loss_mask.tolist()) == (ids, mask)
        assert (row.source_index, row.segment_start) == (index, starts)
        assert row.source_id == [f"c{i}" for i in index]
        assert last == owner


def test_a_run_counted_in_slices_is_counted_as_one_conversation_at_a_time():
    """``BuildStats.add`` over slices of a run gives each conversation's counts, in order.

    Left-out conversations, repeated ids, conversations with no id, nothing supervised, or only
    stop tokens supervised; the expected counts come from the conversations one at a time.
    """
    rng = random.Random(3)
    run = []
    for k in range(60):
        n = rng.choice([0, 2, 5])
        ids = np.array([rng.choice([7, 8, 9]) for _ in range(n)], np.int32)
        mask = np.array([rng.random() < 0.5 for _ in range(n)], np.uint8)
        run.append(
            EncodedConversation(
                index=k,
                id=rng.choice(["a", "b", None, f"c{k}", f"c{k}"]),
                source=rng.choice([None, "s"]),
                ids=ids,
                mask=mask,
                ends_with_answer=rng.random() < 0.5,
                left_out=rng.random() < 0.1,
                cross_checked=rng.random() < 0.3,
                tool_counts=tuple(rng.choice([0, 1, 2]) for _ in range(5)),
            )
        )
    stats = BuildStats(8, ["d"], stop_ids=np.array([EOS, 7], np.int64))
    kept = [c for c in run if not c.left_out]
    consumed = stats.consumed(run, Packer(8, EOS).joined(kept), np.zeros(len(kept), np.int64))
    for first, stop in itertools.pairwise([0, 1, 1, 7, 30, 31, 60]):
        stats.add(consumed, first, stop)
    seen, repeated, only_stop, unsupervised = set(), [], 0, 0
    for c in kept:
        if c.id is not None:
            if c.id in seen:
                repeated.append(c.id)
            seen.add(c.id)
        tokens, mask = [*c.ids.tolist(), EOS], [*c.mask.tolist(), c.ends_with_answer]
        supervised = [t for t, m in zip(tokens, mask, strict=True) if m]
        unsupervised += not supervised
        only_stop += bool(supervised) and set(supervised) <= {EOS, 7}
    assert (stats.left_out, stats.cross_checked) == (
        len(run) - len(kept),
        sum(c.cross_checked for c in run),
    )
    assert stats.conversation_tokens == [len(c.ids) + 1 for c in kept]
    assert stats.conversation_supervised == [int(c.mask.sum()) + c.ends_with_answer for c in kept]
    assert stats.sources == [c.source or "(none)" for c in kept]
    assert (stats.duplicate_ids, stats.duplicate_id_examples) == (len(repeated), repeated[:5])
    assert (stats.only_stop_tokens, stats.unsupervised) == (only_stop, unsupervised)
    assert stats.tool_uses["calls"] == sum(c.tool_counts[1] + c.tool_counts[2] for c in kept)
    assert stats.tool_uses["conversations_with_calls"] == sum(
        c.tool_counts[1] + c.tool_counts[2] > 0 for c in kept
    )
    assert stats.tool_uses["supervised_in_calls"] == sum(c.tool_counts[4] for c in kept)
