"""Reading rows for training: epochs, shares, segments, verify.

Expected values come from data/ROWS.md's text, computed here a second way (``rows_md_order``,
tests/reference.py's segments), or from the file as pyarrow reads it.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders.errors import VerificationError
from builders.manifest import load_manifest
from builders.rows import RowReader
from helpers import (
    MANIFESTS,
    REPO,
    SELF_CONTAINED,
    manifest_names,
    reference_for,
    write_random_rows,
)
from reference import segments_sha256


def rows_md_key(seed, epoch, kind, i) -> int:
    digest = hashlib.sha256(f"fixed-sft/shuffle/v1:{seed}:{epoch}:{kind}:{i}".encode()).hexdigest()
    return int(digest[:16], 16)


def rows_md_order(group_sizes, seed, epoch, window_groups=16) -> list[int]:
    """data/ROWS.md's "Reading order", step by step."""
    first_row = [sum(group_sizes[:g]) for g in range(len(group_sizes))]
    groups = sorted(
        range(len(group_sizes)), key=lambda g: (rows_md_key(seed, epoch, "group", g), g)
    )
    order = []
    while groups:
        window, groups = groups[:window_groups], groups[window_groups:]
        rows = [first_row[g] + k for g in window for k in range(group_sizes[g])]
        order += sorted(rows, key=lambda i: (rows_md_key(seed, epoch, "row", i), i))
    return order


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    """200 rows of 16 tokens: row groups of 64, 64, 64 and 8."""
    return write_random_rows(tmp_path_factory.mktemp("small") / "small.parquet", 200)


def test_the_reading_order_is_the_one_rows_md_states(small_file):
    reader = RowReader(small_file)
    assert reader.group_sizes == [64, 64, 64, 8]
    for seed, epoch, window in [(7, 0, 2), (7, 1, 2), (0, 3, 16), (123, 0, 1), (5, 2, 3)]:
        assert reader.order(seed, epoch, window).tolist() == rows_md_order(
            reader.group_sizes, seed, epoch, window
        )
    # data/ROWS.md's test vectors
    assert rows_md_key(42, 0, "group", 0) == 0x9AA35C30DE8F2925
    assert rows_md_order([64] * 100, 42, 0)[:8] == [5915, 5910, 4974, 1696, 2143, 6149, 5935, 2111]
    assert reader.order().tolist() == list(range(200))


def test_each_epoch_is_another_permutation(small_file):
    reader = RowReader(small_file)
    epochs = [reader.order(seed=7, epoch=e).tolist() for e in range(3)]
    assert all(sorted(order) == list(range(200)) for order in epochs)
    assert len({tuple(order) for order in epochs}) == 3
    assert reader.order(seed=8).tolist() != epochs[0]


def test_a_shuffled_epoch_decodes_each_group_once(small_file, monkeypatch):
    reader = RowReader(small_file)
    reads = []
    original = reader._parquet.read_row_group
    monkeypatch.setattr(
        reader._parquet, "read_row_group", lambda g, **kw: reads.append(g) or original(g, **kw)
    )
    rows = [row["index"] for row in reader.rows(seed=3, epoch=1, window_groups=2)]
    assert rows == reader.order(3, 1, 2).tolist()
    assert sorted(reads) == [0, 1, 2, 3]


@pytest.mark.parametrize("remainder, each", [("drop", 12), ("wrap", 13)])
def test_64_rows_over_5_ranks(tmp_path, remainder, each):
    reader = RowReader(write_random_rows(tmp_path / "64.parquet", 64))
    shares = [
        reader.shard(rank=r, world_size=5, seed=1, remainder=remainder).tolist() for r in range(5)
    ]
    assert [len(share) for share in shares] == [each] * 5
    order = reader.order(seed=1).tolist()
    # step k of the ranks is positions k*5 .. k*5+4 of the order, whatever the rank count
    steps = [shares[r][k] for k in range(each) for r in range(5)]
    assert steps == (order + order)[: 5 * each]


def test_start_is_a_position_in_the_order(small_file):
    reader = RowReader(small_file)
    whole = reader.shard(rank=1, world_size=3, seed=2).tolist()
    assert reader.shard(start=12, rank=1, world_size=3, seed=2).tolist() == whole[4:]
    assert list(reader.rows(start=500)) == []
    for bad in (-5, -1):
        with pytest.raises(ValueError, match="start must be a position >= 0"):
            reader.rows(start=bad)
    with pytest.raises(ValueError, match="remainder"):
        reader.rows(remainder="pad")
    with pytest.raises(ValueError, match=r"rank 3 is not in 0\.\.2"):
        reader.rows(rank=3, world_size=3)


@pytest.mark.parametrize("name", manifest_names())
def test_segments_are_the_references_and_their_hash_is_pinned(name, row_file, hub):
    manifest = load_manifest(MANIFESTS / f"{name}.yaml")
    segments = []
    reference_for(manifest, hub, segments)
    assert segments_sha256(segments) == manifest.expect.segments_sha256
    rows = list(RowReader(row_file(name)).rows(boundaries=True))
    assert [row["segment_start"] for row in rows] == segments
    for row, starts in zip(rows, segments, strict=True):
        ends = [*starts[1:], manifest.row_tokens]
        assert row["seq_lengths"].tolist() == [e - s for s, e in zip(starts, ends, strict=True)]
        assert row["position_ids"].tolist() == [
            t - s for s, e in zip(starts, ends, strict=True) for t in range(s, e)
        ]


def rewritten(path: Path, out: Path, row_group_size: int, change=None) -> Path:
    table = pq.read_table(path)
    if change is not None:
        table = change(table)
    pq.write_table(table, out, row_group_size=row_group_size)
    return out


def test_verify_names_a_rewritten_file_whose_rows_match(row_file, tmp_path):
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    other = rewritten(row_file(SELF_CONTAINED), tmp_path / "other.parquet", 10)
    assert pq.ParquetFile(other).metadata.num_row_groups == 5
    with pytest.raises(VerificationError) as refused:
        RowReader(other, manifest, verify=True)
    message = str(refused.value)
    assert "rows_sha256" not in message.split("; the rows")[0]
    assert "the rows are exactly the pinned rows (rows_sha256 matches)" in message
    assert "only the file differs (parquet_sha256 and parquet_bytes): its bytes, not its rows" in (
        message
    )
    assert "row groups hold 8, 10 rows, where fixed-sft's writer writes 64" in message
    assert len(RowReader(other)) == 48


def test_verify_refuses_a_changed_segment_start(row_file, tmp_path):
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")

    def move_a_start(table):
        metadata = table.column("metadata").to_pylist()
        starts = metadata[2]["segment_start"]
        metadata[2]["segment_start"] = [*starts[:-1], starts[-1] + 1]
        return table.set_column(2, "metadata", pa.array(metadata, type=table.schema[2].type))

    changed = rewritten(row_file(SELF_CONTAINED), tmp_path / "moved.parquet", 64, move_a_start)
    with pytest.raises(VerificationError, match="segments_sha256 expected 87429e9f") as refused:
        RowReader(changed, manifest, verify=True)
    assert "the tokens and masks are the pinned ones, but the rows' segments" in str(refused.value)


def test_boundaries_of_a_damaged_row_are_refused(row_file, tmp_path):
    def unsorted_starts(table):
        metadata = table.column("metadata").to_pylist()
        metadata[5]["segment_start"] = [0, 300, 200]
        return table.set_column(2, "metadata", pa.array(metadata, type=table.schema[2].type))

    damaged = rewritten(row_file(SELF_CONTAINED), tmp_path / "bad.parquet", 64, unsorted_starts)
    with pytest.raises(VerificationError, match=r"row 5: segment_start .* not strictly increasing"):
        list(RowReader(damaged).rows(boundaries=True))


def only_these_packages(tmp_path: Path, names: list[str]) -> Path:
    """A virtualenv holding ``names`` and this project.

    The packages are this interpreter's. Nothing else: no pip, no transformers.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    for name in names:
        module = __import__(name)
        folder = Path(module.__file__).parent
        for path in folder.parent.iterdir():
            if path.name == folder.name or path.name.startswith(f"{folder.name}."):
                (site / path.name).symlink_to(path)
    # the project without its dependencies, as `pip install --no-deps -e .` gives it
    (site / "fixed_sft.pth").write_text(f"{REPO}\n")
    return venv / "bin" / "python"


def test_verify_needs_only_numpy_pyarrow_and_pyyaml(row_file, tmp_path):
    python = only_these_packages(tmp_path, ["numpy", "pyarrow", "yaml"])
    code = (
        "import sys\n"
        "from builders.manifest import shipped_manifest\n"
        "from builders.rows import RowReader\n"
        f"reader = RowReader({str(row_file(SELF_CONTAINED))!r}, "
        f"shipped_manifest({SELF_CONTAINED!r}), verify=True)\n"
        "row = next(reader.rows(seed=1, boundaries=True))\n"
        "heavy = {'transformers', 'tokenizers', 'jinja2', 'huggingface_hub', 'torch', 'datasets'}\n"
        "print(len(reader), sorted({n.split('.')[0] for n in sys.modules} & heavy))\n"
        "import transformers\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.stdout.split("\n")[0] == "48 []", done.stderr
    # the virtualenv has no transformers: the last line fails
    assert "No module named 'transformers'" in done.stderr
