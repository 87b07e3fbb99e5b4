"""Pinned inputs that are not what they claim are refused.

The file and the problem are named.
"""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders.errors import PinnedInputError
from builders.fixture.hf_cache import MESSAGE, parquet_shards, put_snapshot
from builders.inputs.layout import conversations
from builders.inputs.pinned import Hub, dataset_files, dataset_repo, resolve_snapshot
from builders.inputs.source import Source
from builders.manifest import DatasetPin

ROWS = [
    {
        "id": f"r{i}",
        "source": "s",
        "messages": [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ],
    }
    for i in range(10)
]


def lay_out(tmp_path, files):
    """A dataset repo in an offline HF cache.

    Its pin and its resolved snapshot folder.
    """
    commit = put_snapshot(tmp_path, "o/d", "dataset", files)
    pin = DatasetPin(repo="o/d", revision=commit, split="train")
    return pin, resolve_snapshot(dataset_repo(pin), Hub(tmp_path / "hub", offline=True))


def parquet_bytes(table):
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_source_index_spans_files_and_row_groups(tmp_path):
    pin, snapshot = lay_out(
        tmp_path, parquet_shards(ROWS, shards=3, row_group_rows=2, message_type=MESSAGE)
    )
    source = Source([(pin, dataset_files(pin, snapshot))])
    assert source.num_rows == 10
    taken = conversations(source.take([9, 0, 4, 4, 7]))
    assert [r["id"] for r in taken] == ["r9", "r0", "r4", "r4", "r7"]
    assert [r["index"] for r in taken] == [9, 0, 4, 4, 7]
    assert taken[0]["messages"][1] == {"role": "assistant", "content": "a9"}


def test_split_without_parquet_files(tmp_path):
    pin, snapshot = lay_out(
        tmp_path, {"data/test-00000-of-00001.parquet": b"x", "README.md": b"hi"}
    )
    with pytest.raises(PinnedInputError, match=r"no files match data/train-\*\.parquet"):
        dataset_files(pin, snapshot)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"not parquet at all", "not a readable parquet file"),
        (parquet_bytes(pa.table({"id": ["a"], "text": ["b"]})), "no column 'messages'"),
        (
            parquet_bytes(pa.table({"id": ["a"], "messages": ["b"]})),
            "column 'messages' has type string",
        ),
        (
            parquet_bytes(pa.table({"id": [1], "messages": [[{"role": "user", "content": "x"}]]})),
            "column 'id'",
        ),
    ],
)
def test_bad_shard_is_named(tmp_path, content, problem):
    good = parquet_shards(ROWS, shards=1, row_group_rows=4, message_type=MESSAGE)
    files = {**good, "data/train-00001-of-00002.parquet": content}
    pin, snapshot = lay_out(tmp_path, files)
    with pytest.raises(PinnedInputError) as err:
        Source([(pin, dataset_files(pin, snapshot))])
    assert "train-00001-of-00002.parquet" in str(err.value) and problem in str(err.value)


def test_truncated_shard_is_named(tmp_path):
    files = parquet_shards(ROWS, shards=1, row_group_rows=4, message_type=MESSAGE)
    name, data = next(iter(files.items()))
    pin, snapshot = lay_out(tmp_path, {name: data[: len(data) // 2]})
    with pytest.raises(PinnedInputError, match=r"train-00000-of-00001\.parquet"):
        Source([(pin, dataset_files(pin, snapshot))])
