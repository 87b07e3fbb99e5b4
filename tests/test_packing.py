"""Cutting the stream: windows, skipping, provenance."""

import numpy as np

from builders.encode import EncodedConversation
from builders.packing import RowPacker


def conv(index, n, supervised):
    return EncodedConversation(index=index, id=f"c{index}", source=None, ids=np.arange(n, dtype=np.int32) + 100 * index,
                               mask=np.full(n, 1 if supervised else 0, dtype=np.uint8))


def test_windows_are_consecutive_and_unsupervised_ones_skipped():
    packer = RowPacker(row_tokens=4)
    rows = []
    for c in [conv(1, 3, True), conv(2, 9, False), conv(3, 2, True), conv(4, 3, True), conv(5, 4, False)]:
        rows += packer.add(c)
    stream = np.concatenate([np.arange(3) + 100, np.arange(9) + 200, np.arange(2) + 300, np.arange(3) + 400,
                             np.arange(4) + 500])
    windows = [stream[i:i + 4].tolist() for i in range(0, 20, 4)]
    # windows 1 and 2 hold only conversation 2, which is unsupervised
    assert packer.windows_skipped == 2
    assert [r.input_ids.tolist() for r in rows] == [windows[0], windows[3], windows[4]]
    assert (rows[0].source_index, rows[0].segment_start, rows[0].loss_mask.tolist()) == ([1, 2], [0, 3], [1, 1, 1, 0])
    assert (rows[1].source_index, rows[1].segment_start, rows[1].source_id) == ([3, 4], [0, 2], ["c3", "c4"])
    # conversation 4 continues into the last row, at offset 0
    assert (rows[2].source_index, rows[2].segment_start, rows[2].loss_mask.tolist()) == ([4, 5], [0, 1], [1, 0, 0, 0])
