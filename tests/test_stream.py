"""The stream: row groups read once, spills, passes, error order.

The stream reads each row group once, spills what memory cannot hold, makes another pass when its
estimate falls short, and reports a bad conversation in stream order, whatever the decoding order.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from builders.build import build
from builders.encode import stream
from builders.errors import SourceDataError
from builders.fixture.conversations import synthetic
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from builders.rows.order import permutation
from helpers import in_workers, lay_out_build

ROWS = [
    {"id": f"c{k}", "source": "synthetic", "messages": m} for k, m in enumerate(synthetic(21, 600))
]


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory):
    """600 conversations in 60 row groups.

    800 rows of 256 tokens consume nearly all of them (849 is all).
    """
    hf_home = tmp_path_factory.mktemp("stream")
    manifest = lay_out_build(
        hf_home, ROWS, name="stream", row_tokens=256, build_rows=800, shards=3, row_group_rows=10
    )
    return load_manifest(manifest), Hub(hf_home / "hub", offline=True)


def build_with(laid_out, tmp_path, monkeypatch, workers=1, **constants):
    for name, value in constants.items():
        monkeypatch.setattr(stream, name, value)
    manifest, hub = laid_out
    result = build(manifest, tmp_path, hub, card=False, workers=workers)
    report = json.loads(result.report.read_text())
    return result.parquet.read_bytes(), report["source_reading"], report["stats"]


@pytest.fixture(scope="module")
def plain(laid_out, tmp_path_factory):
    manifest, hub = laid_out
    result = build(manifest, tmp_path_factory.mktemp("plain"), hub, card=False, workers=1)
    return result.parquet.read_bytes(), json.loads(result.report.read_text())


# the fixture's 60 row groups once, and the plan's sample's 8 (each group's first rows) before
GROUPS_DECODED = 60 + 8


def test_each_row_group_is_decoded_once_a_pass(plain):
    _, report = plain
    reading = report["source_reading"]
    assert (
        reading["passes"] == 1
        and reading["row_groups_decoded"] == GROUPS_DECODED
        and reading["rows_spilled"] == 0
    )
    # nearly the whole source
    assert report["stats"]["conversations_consumed"] > 0.8 * len(ROWS)


def test_the_plans_sample_converts_only_its_rows(laid_out, plain, tmp_path, monkeypatch):
    """The sample's groups are converted for its rows alone, and again for the pass's own.

    Converting a group of tool traces whole took ten times as long as its first 64 rows.
    """
    from builders.inputs.source import Source

    read, real = [], Source.read_group

    def recorded(self, group, rows=None):
        read.append((group, None if rows is None else np.asarray(rows).tolist()))
        return real(self, group, rows)

    monkeypatch.setattr(Source, "read_group", recorded)
    data, _, _ = build_with(laid_out, tmp_path, monkeypatch, SAMPLE_ROWS=3)
    assert data == plain[0]
    assert all(rows is not None for _, rows in read)
    sampled = [group for group, rows in read if rows == [0, 1, 2]]
    # 8 groups spread over the 60, each read for its first 3 rows, then for the pass's
    assert len(set(sampled)) == 8 and {0, 59} <= set(sampled)
    assert len(read) == 60 + 8


def test_workers_decode_the_row_groups_and_change_nothing(laid_out, plain, tmp_path, monkeypatch):
    """With 3 workers each row group is decoded once a pass, by a worker; the rows are the same."""
    data, reading, stats = build_with(laid_out, tmp_path, monkeypatch, workers=3)
    assert data == plain[0] and stats == plain[1]["stats"]
    assert reading == plain[1]["source_reading"]


@pytest.mark.parametrize("workers", [1, 2])
def test_rows_beyond_memory_wait_on_disk_and_change_nothing(
    laid_out, plain, tmp_path, monkeypatch, workers
):
    data, reading, _ = build_with(
        laid_out, tmp_path, monkeypatch, workers, MEMORY_ROWS_BYTES=1, ENCODE_BATCH=16
    )
    # 32 rows in memory at once, the rest on disk
    assert data == plain[0]
    assert (
        reading["passes"] == 1
        and reading["row_groups_decoded"] == GROUPS_DECODED
        and reading["rows_spilled"] > 400
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_a_short_estimate_makes_another_pass_and_changes_nothing(
    laid_out, plain, tmp_path, monkeypatch, workers
):
    data, reading, _ = build_with(
        laid_out,
        tmp_path,
        monkeypatch,
        workers,
        HORIZON_MARGIN=0.5,
        EAGER_SHARE=0.3,
        ENCODE_BATCH=16,
    )
    assert data == plain[0]
    assert reading["passes"] >= 2 and reading["horizon"] < 0.6 * len(ROWS)


@pytest.mark.parametrize(
    "constants",
    [
        {"MEMORY_ROWS_BYTES": 1, "ENCODE_BATCH": 16},
        # outrun: later passes with nothing eager, their held rows spilled
        {"MEMORY_ROWS_BYTES": 1, "ENCODE_BATCH": 16, "HORIZON_MARGIN": 0.5, "EAGER_SHARE": 0.3},
    ],
)
def test_workers_keep_their_rows_spilled_and_send_them_in_order(
    laid_out, plain, tmp_path, monkeypatch, constants
):
    """Three workers keep their rows, most on disk; each conversation comes back once.

    The rows and the reading's figures are those of this process with the same bounds; the build
    sends the workers only a row group's wanted row numbers and their positions, or positions,
    and receives only encoded conversations, each position once: no row travels either way.
    """
    from builders.encode import worker

    here = build_with(laid_out, tmp_path / "here", monkeypatch, 1, **constants)
    sent, received = [], []
    real_send, real_read = worker.Worker._send_task, worker._read

    def send(self, header, body):
        sent.append((header, real_read(body)))
        return real_send(self, header, body)

    def read(data):
        table = real_read(data)
        received.append(table)
        return table

    monkeypatch.setattr(worker.Worker, "_send_task", send)
    monkeypatch.setattr(worker, "_read", read)
    data, reading, stats = build_with(laid_out, tmp_path / "there", monkeypatch, 3, **constants)
    assert data == plain[0] == here[0] and stats == here[2]
    assert reading == here[1] and reading["rows_spilled"] > 400
    if "HORIZON_MARGIN" in constants:
        assert reading["passes"] >= 2
    groups = [(h, t) for h, t in sent if "group" in h]
    assert {tuple(t.column_names) for _, t in groups} == {("row", "position")}
    assert {tuple(t.column_names) for h, t in sent if "wanted" in h} == {("position",)}
    assert len(groups) + len([h for h, _ in sent if "wanted" in h]) == len(sent)
    # a pass's group task: the source rows of that group (10 a group) at its positions, which
    # are each position of the passes once
    manifest, _ = laid_out
    position = np.argsort(permutation(manifest.seed, len(ROWS)))
    kept = [(h, t) for h, t in groups if h["share"] is not None]
    for header, table in kept:
        assert header["bounds"] == [10 * header["group"], 10]
        rows, at = table.column("row").to_numpy(), table.column("position").to_numpy()
        assert np.array_equal(position[10 * header["group"] + rows], at)
    asked = np.sort(np.concatenate([t.column("position").to_numpy() for _, t in kept]))
    assert np.array_equal(asked, np.arange(len(asked))) and len(asked) <= len(ROWS)
    conversation_columns = set(worker._conversations_table([]).column_names)
    assert all(set(t.column_names) == conversation_columns for t in received)
    positions = [p for t in received for p in t.column("position").to_pylist()]
    # the sample's (the first 10 rows of 8 groups, at positions 64 * k + row), then each
    # position of the passes, once
    sampled = stream.SAMPLE_GROUPS * 10
    assert len(positions) == len(set(positions)) + sampled
    assert set(range(stats["conversations_consumed"])) <= set(positions)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("constants", [{}, {"MEMORY_ROWS_BYTES": 1}, {"EAGER_SHARE": 0.0}])
def test_the_first_bad_conversation_in_stream_order_is_the_one_reported(
    tmp_path, monkeypatch, constants, workers
):
    """Of two bad conversations, the error names the stream's first.

    Two conversations the contract cannot render, in different row groups: whichever is decoded or
    encoded first, the error names the one the stream reaches first.
    """
    for name, value in constants.items():
        monkeypatch.setattr(stream, name, value)
    order = permutation(3, len(ROWS)).tolist()
    early, late = order[40], order[300]
    rows = [dict(r) for r in ROWS]
    for k in (early, late):
        rows[k] = {
            **rows[k],
            "messages": rows[k]["messages"] + [{"role": "narrator", "content": "x"}],
        }
    manifest = lay_out_build(
        tmp_path / "hf",
        rows,
        name="bad",
        row_tokens=256,
        build_rows=800,
        shards=3,
        row_group_rows=10,
    )
    with pytest.raises(SourceDataError, match=rf"source row {early} \(id 'c{early}'\)"):
        build(
            load_manifest(manifest),
            tmp_path / "out",
            Hub(tmp_path / "hf" / "hub", offline=True),
            card=False,
            workers=workers,
        )


def test_rows_are_the_stream_prefix(plain, laid_out):
    """The plain build's rows start with the permutation's first.

    The first conversation of the permutation.
    """
    table = pq.read_table(__import__("io").BytesIO(plain[0]))
    first = table.column("metadata").to_pylist()[0]
    manifest, _ = laid_out
    assert first["source_index"][0] == int(permutation(manifest.seed, len(ROWS))[0])


def test_a_pool_s_stream_is_this_process_s(tmp_path):
    """A pool's conversations and refusals are those of this process, through the stream.

    Each field of every conversation of the source, dtypes included; the source's sources are
    text or missing, and one conversation the contract cannot encode is left out, at its place.
    """
    from builders.build import prepared
    from builders.runtime.progress import Reporter
    from builders.runtime.timings import Timings

    rows = [{**row, "source": "s" if k % 2 else None} for k, row in enumerate(ROWS[:60])]
    rows[7] = {**rows[7], "messages": rows[7]["messages"] + [{"role": "function", "content": "x"}]}
    manifest = load_manifest(lay_out_build(tmp_path / "hf", rows, row_tokens=256, build_rows=10))
    hub = Hub(tmp_path / "hf" / "hub", offline=True)

    def encoded(workers: int) -> tuple[list, list]:
        with prepared(
            manifest, hub, Reporter.silent(), workers, "tokenizers", Timings(), whole_source=True
        ) as inputs:
            inputs.stream.spill_into(tmp_path)
            out = [c for run in inputs.stream for c in run]
            return out, [r.as_dict() for r in inputs.stream.refused]

    (here, here_refused), (there, there_refused) = encoded(1), encoded(2)
    assert len(here_refused) == 1 and "role 'function'" in here_refused[0]["reason"]
    assert there_refused == here_refused and here_refused[0]["source_index"] == 7
    assert len(there) == len(here) == len(rows) - 1
    fields = ("index", "id", "source", "ends_with_answer", "left_out", "cross_checked")
    for mine, theirs in zip(here, there, strict=True):
        assert [getattr(theirs, f) for f in fields] == [getattr(mine, f) for f in fields]
        assert theirs.tool_counts == mine.tool_counts
        assert theirs.ids.dtype == mine.ids.dtype and np.array_equal(theirs.ids, mine.ids)
        assert theirs.mask.dtype == mine.mask.dtype and np.array_equal(theirs.mask, mine.mask)
    assert {c.source for c in there} == {"s", None}


def test_a_format_that_json_cannot_carry_is_refused_before_workers_start():
    """Template variables whose JSON form differs.

    A key that is not text would render otherwise in a worker.
    """
    import dataclasses

    from builders.encode.worker import start_up_message
    from builders.errors import UsageError
    from builders.fixture.make import FIXTURE_TEMPLATE
    from helpers import encoder

    enc = encoder(FIXTURE_TEMPLATE.read_text(encoding="utf-8"))
    sent = json.loads(start_up_message(enc.spec, enc.contract))
    assert sent["format"]["chat_template"] == enc.spec.chat_template
    spec = dataclasses.replace(enc.spec, template_vars={"table": {1: "one"}})
    with pytest.raises(UsageError, match="build with --workers 1"):
        start_up_message(spec, enc.contract)


def test_held_rows_come_back_a_piece_at_a_time_in_order(tmp_path):
    """Rows held in memory come back in pieces of consecutive positions, then each bucket.

    Each row once, with its own position; the pieces and buckets in order of position.
    """
    import pyarrow as pa

    from builders.encode.held import MEMORY_PIECES, Held

    first, memory_end, bucket = 100, 180, 25
    held = Held(first, memory_end, bucket, tmp_path)
    positions = np.random.default_rng(0).permutation(np.arange(first, 260))
    for part in np.array_split(positions, 3):
        held.add(pa.table({"twice": pa.array(2 * part)}), part)
    parts = list(held.in_order())
    ranges = [(p.min(), p.max()) for _, p in parts]
    # a piece of 10 positions in memory at a time, then the buckets of 25
    expected = [(s, s + 9) for s in range(first, memory_end, 10)] + [
        (s, min(259, s + 24)) for s in range(memory_end, 260, bucket)
    ]
    assert len([r for r in ranges if r[1] < memory_end]) == MEMORY_PIECES
    assert ranges == expected
    for table, at in parts:
        assert table.column("twice").to_pylist() == (2 * at).tolist()
    assert sorted(np.concatenate([p for _, p in parts]).tolist()) == list(range(first, 260))
    assert not list(tmp_path.iterdir())


def test_a_full_disk_in_a_worker_s_spill_fails_the_build_clearly(laid_out, tmp_path, monkeypatch):
    """A worker that cannot write its held rows: exit 6 naming the file, nothing left."""
    from builders.errors import OutputError

    site = in_workers(
        tmp_path,
        "import errno, os\n"
        "import pyarrow.ipc\n"
        "def full(*args, **kwargs):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "pyarrow.ipc.new_file = full\n",
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    out = tmp_path / "out"
    with pytest.raises(
        OutputError, match=r"\.spill/held-[0-9]+-0-[0-9]+\.arrow: cannot write .*space"
    ):
        build_with(laid_out, out, monkeypatch, 2, MEMORY_ROWS_BYTES=1, ENCODE_BATCH=16)
    assert OutputError.exit_code == 6
    assert not list(out.iterdir())


def test_a_build_that_stops_before_its_eager_bound_reads_alike_with_workers(tmp_path, monkeypatch):
    """The reading figures are the pass's plan, whatever the workers or when the rows complete.

    Here the rows complete within the first few positions, long before every group decoded or
    every spilled row written: one process counted only what it had done by then (and what its
    threads had started), the workers what they were handed.
    """
    manifest_path = lay_out_build(
        tmp_path / "hf",
        ROWS[:300],
        name="early",
        row_tokens=256,
        build_rows=3,
        shards=3,
        row_group_rows=1,
    )
    constants = {
        "ENCODE_BATCH": 16,
        "HORIZON_MARGIN": 20.0,
        "MEMORY_ROWS_BYTES": 1,
        "EAGER_SHARE": 3.0,
    }
    laid_out = load_manifest(manifest_path), Hub(tmp_path / "hf" / "hub", offline=True)
    here = build_with(laid_out, tmp_path / "one", monkeypatch, 1, **constants)
    there = build_with(laid_out, tmp_path / "three", monkeypatch, 3, **constants)
    assert here[0] == there[0] and here[2] == there[2]
    # the rows complete before the eager bound (at most 16 positions: half of 32 in memory)
    assert here[2]["conversations_consumed"] < 16
    assert here[1] == there[1]
    # every position from the memory bound (16) to the horizon waits on disk
    assert here[1]["rows_spilled"] == here[1]["horizon"] - 32 > 0
