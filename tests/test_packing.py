"""The stream and its rows: EOS joins, windows, skipping, provenance."""

import numpy as np

from builders.encode.encoder import EncodedConversation
from builders.rows.packing import Packer

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
    rows = [row for c in conversations for row in packer.cut(*packer.joined(c), c.index, c.id)]
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
