"""Every source shard's bytes are hashed and checked during the build.

They are checked against the LFS object id that names them in the HF cache; a shard changed in the
cache is refused (exit 3) before any output reaches its final path (issue 16, item 3).
"""

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders.errors import PinnedInputError
from builders.fixture.hf_cache import MESSAGE_WITH_REASONING, parquet_shards
from builders.fixture.make import synthetic_rows
from builders.inputs.pinned import PinnedFile, hashed_files, pinned_files
from helpers import lay_out_build, run_cli

EDITED_SHARD = "data/train-00001-of-00004.parquet"


def snapshot_file(hf_home: Path, repo_path: str) -> Path:
    """A file of the laid-out dataset snapshot (a link to its blob)."""
    snapshot = next((hf_home / "hub" / "datasets--someone--custom-chat" / "snapshots").iterdir())
    return snapshot / repo_path


def rewrite_blob(link: Path, data: bytes) -> None:
    """Change the bytes of the blob ``link`` points at.

    The blob keeps its name (its claimed sha256).
    """
    blob = Path(os.path.realpath(link))
    blob.write_bytes(data)


def edited_shard(rows: list[dict], edit) -> bytes:
    """Shard 1 of 4 of ``rows`` with ``edit`` applied to its rows.

    The same row count, other content.
    """
    shards = parquet_shards(rows, shards=4, row_group_rows=5, message_type=MESSAGE_WITH_REASONING)
    table = pq.read_table(pa.BufferReader(shards[EDITED_SHARD]))
    part = [edit(row) for row in table.to_pylist()]
    edited = parquet_shards(part, shards=1, row_group_rows=5, message_type=MESSAGE_WITH_REASONING)
    assert len(part) == table.num_rows
    return next(iter(edited.values()))


def answer_changed(row: dict) -> dict:
    row["messages"][-1]["content"] += " (edited)"
    return row


def unrenderable(row: dict) -> dict:
    row["messages"] = [{"role": "tool-of-nobody", "content": "x", "reasoning_content": None}]
    return row


@pytest.mark.parametrize(
    "edit", [answer_changed, unrenderable], ids=["content edited", "edited to be unrenderable"]
)
def test_a_shard_edited_in_the_cache_is_refused_before_any_output(tmp_path, edit):
    rows = synthetic_rows(seed=5, count=120)
    hf_home = tmp_path / "hf"
    manifest = lay_out_build(hf_home, rows, build_rows=20)
    link = snapshot_file(hf_home, EDITED_SHARD)
    claimed = Path(os.path.realpath(link)).name
    edited = edited_shard(rows, edit)
    rewrite_blob(link, edited)
    out = tmp_path / "out"
    done = run_cli("-q", "--manifest", str(manifest), "--out", str(out), hf_home=hf_home)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
        done.stderr
    )
    assert EDITED_SHARD.split("/")[-1] in done.stderr
    assert hashlib.sha256(edited).hexdigest() in done.stderr and claimed in done.stderr
    assert not out.exists() or [p.name for p in out.iterdir()] == []


def test_the_report_records_the_sha256_of_the_bytes_read(tmp_path):
    rows = synthetic_rows(seed=5, count=120)
    hf_home = tmp_path / "hf"
    manifest = lay_out_build(hf_home, rows, build_rows=20)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=hf_home)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "custom.report.json").read_text())
    snapshot = snapshot_file(hf_home, "data")
    expected = [
        {
            "name": f"data/{p.name}",
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in sorted(snapshot.iterdir())
    ]
    assert [
        {k: f[k] for k in ("name", "bytes", "sha256")} for f in report["source_files"]
    ] == expected
    card = (out / "custom.md").read_text()
    assert all(f["sha256"] in card for f in expected)


def test_each_file_is_checked_against_the_id_its_blob_is_named_by(tmp_path):
    """An LFS file against its sha256, a git-stored one against its git blob id.

    A file stored in git itself (not LFS) has a blob named by its git blob id (a sha1 of a header
    and the bytes); one named by neither id is hashed and recorded only.
    """
    plain, lfs = tmp_path / "plain.jsonl", tmp_path / "lfs.parquet"
    plain.write_bytes(b'{"a": 1}\n')
    lfs.write_bytes(b"PAR1 and more")
    data = b'[{"messages": []}]'
    blob = tmp_path / "blobs" / hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    blob.parent.mkdir()
    blob.write_bytes(data)
    (tmp_path / "linked.json").symlink_to(blob)
    files = pinned_files(
        {"data/plain.jsonl": plain, "data/linked.json": tmp_path / "linked.json"}.items()
    )
    assert [(f.expected_sha256, f.expected_git_blob) for f in files] == [
        (None, None),
        (None, blob.name),
    ]
    named = [
        PinnedFile(
            "data/lfs.parquet",
            lfs,
            hashlib.sha256(lfs.read_bytes()).hexdigest(),
            "its LFS object id",
        )
    ]
    with hashed_files(files + named) as hashes:
        recorded = hashes.checked()
    assert recorded == [
        {
            "name": "data/plain.jsonl",
            "bytes": len(plain.read_bytes()),
            "sha256": hashlib.sha256(plain.read_bytes()).hexdigest(),
            "checked_against": None,
        },
        {
            "name": "data/linked.json",
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "checked_against": "its git blob id (the name of its blob in the HF cache)",
        },
        {
            "name": "data/lfs.parquet",
            "bytes": len(lfs.read_bytes()),
            "sha256": named[0].expected_sha256,
            "checked_against": "its LFS object id",
        },
    ]


def test_a_mismatch_names_the_file_and_where_its_sha256_came_from(tmp_path):
    path = tmp_path / "shard.parquet"
    path.write_bytes(b"edited bytes")
    claimed = hashlib.sha256(b"original bytes").hexdigest()
    with (
        hashed_files(
            [PinnedFile("data/shard.parquet", path, claimed, "its LFS object id")]
        ) as hashes,
        pytest.raises(PinnedInputError) as err,
    ):
        hashes.checked()
    message = str(err.value)
    assert (
        str(path) in message
        and claimed in message
        and hashlib.sha256(b"edited bytes").hexdigest() in message
    )
    assert "LFS object id" in message


def test_an_unreadable_file_is_a_pinned_input_error(tmp_path):
    with (
        hashed_files(
            [PinnedFile("data/gone.parquet", tmp_path / "gone.parquet", None, None)]
        ) as hashes,
        pytest.raises(PinnedInputError, match=r"gone\.parquet: cannot read"),
    ):
        hashes.checked()


def test_a_hashing_process_that_dies_is_a_worker_error(tmp_path):
    """The source files are hashed in a process of their own.

    One killed before it has hashed them all (here while it waits to read a named pipe) is exit 7,
    as a worker that dies; the files it hashed before keep their digests.
    """
    from builders.errors import WorkerError
    from builders.inputs.digest import HashingProcess

    first, fifo = tmp_path / "first.parquet", tmp_path / "shard.parquet"
    first.write_bytes(b"PAR1")
    os.mkfifo(fifo)
    hashing = HashingProcess([first, fifo])
    assert hashing.digests[0].result(timeout=30) == (
        hashlib.sha256(b"PAR1").hexdigest(),
        4,
        None,
    )
    hashing.process.kill()
    with pytest.raises(
        WorkerError, match=r"the process hashing the source files died .*killed by SIGKILL"
    ):
        hashing.digests[1].result(timeout=30)
    hashing.stop()
    assert WorkerError.exit_code == 7
