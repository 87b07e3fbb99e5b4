"""A full disk at any write of a build ends in exit 6, cleanly.

Exit 6 with one clear line naming the file, and nothing of the build left in the output folder: no
temporary, nothing at a final path (issue 16, item 2). Each write is tested on a real small
filesystem (a tmpfs, where this process may mount one) and by an injected ENOSPC (everywhere).
"""

import errno
import math
import os
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders import cli
from builders.fixture.make import synthetic_rows
from builders.rows import rowfile
from builders.rows.card import PLOTS
from helpers import SELF_CONTAINED, lay_out_build, run_cli

# every file a build writes, in the order it writes them (the parquet first, its report last)
OUTPUTS = [
    f"{SELF_CONTAINED}.parquet",
    *(f"{SELF_CONTAINED}.{plot}.png" for plot in PLOTS),
    f"{SELF_CONTAINED}.md",
    "README.md",
    f"{SELF_CONTAINED}.report.json",
]
PAGE = 4096
NO_SPACE = os.strerror(errno.ENOSPC)


def assert_failed_cleanly(returncode: int, stderr: str, out: Path, file: str) -> None:
    assert returncode == 6, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert NO_SPACE in lines[0] and file in lines[0], stderr
    assert sorted(p.name for p in out.iterdir()) == [], "the failed build left files behind"


# --- an injected ENOSPC, in this process


@pytest.fixture
def build_command(fixture_cache, tmp_path):
    """Run the command line in this process on the self-contained fixture.

    Return its exit code and stderr.
    """
    out = tmp_path / "out"

    def run(capsys) -> tuple[int, str]:
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = cli.main(
                [
                    "-q",
                    "--build",
                    SELF_CONTAINED,
                    "--out",
                    str(out),
                    "--fixture-cache",
                    str(fixture_cache),
                ]
            )
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        return code, capsys.readouterr().err

    run.out = out
    return run


def no_space() -> OSError:
    return OSError(errno.ENOSPC, NO_SPACE)


@pytest.mark.parametrize("file", OUTPUTS[1:])
def test_injected_enospc_while_writing_each_card_file_and_the_report(
    build_command, capsys, monkeypatch, file
):
    """Half the file is written, then the disk is full."""
    real_write_bytes = Path.write_bytes

    def write_bytes(path, data):
        if file in path.name:
            real_write_bytes(path, data[: len(data) // 2])
            raise no_space()
        return real_write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    code, stderr = build_command(capsys)
    assert_failed_cleanly(code, stderr, build_command.out, file)


@pytest.mark.parametrize("when", ["a row group", "the footer"])
def test_injected_enospc_in_the_parquet_writer_thread(build_command, capsys, monkeypatch, when):
    """As pyarrow does on a full disk.

    The write that fails closes the file, and every later one fails with ``ArrowInvalid: Operation
    on closed file``. Row groups of 8 rows make the fixture's 48 rows six groups, so the build is
    still writing rows when the second group fails.
    """
    monkeypatch.setattr(rowfile, "ROW_GROUP_ROWS", 8)
    real_write_table, real_close = pq.ParquetWriter.write_table, pq.ParquetWriter.close
    calls = []

    def write_table(writer, table, row_group_size=None):
        # not the build's parquet (the fixture's shards)
        if not str(writer.where).endswith(".tmp"):
            return real_write_table(writer, table, row_group_size=row_group_size)
        calls.append(table.num_rows)
        if when == "a row group" and len(calls) >= 2:
            raise no_space() if len(calls) == 2 else pa.ArrowInvalid("Operation on closed file")
        return real_write_table(writer, table, row_group_size=row_group_size)

    def close(writer):
        real_close(writer)
        if when == "the footer" and str(writer.where).endswith(".tmp"):
            raise no_space()

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    monkeypatch.setattr(pq.ParquetWriter, "close", close)
    code, stderr = build_command(capsys)
    assert_failed_cleanly(code, stderr, build_command.out, OUTPUTS[0])
    assert len(calls) >= 2


def test_injected_enospc_when_the_outputs_are_synced(build_command, capsys, monkeypatch):
    """A file system that reports the full disk only at the sync.

    As NFS or delayed allocation do: the written data fails when it is synced; every output is
    complete, none may be put in place.
    """
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise no_space()
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code, stderr = build_command(capsys)
    # the first one synced
    assert_failed_cleanly(code, stderr, build_command.out, OUTPUTS[1])


# --- a real full disk: a tmpfs just too small for one of the files


@contextmanager
def small_filesystem(folder: Path, size: int):
    """A tmpfs of ``size`` bytes mounted at ``folder``.

    Skips where this process may not mount one.
    """
    folder.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        pytest.skip("no mount command here: the injected-ENOSPC tests cover a full disk")
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}; "
            f"it needs root or CAP_SYS_ADMIN): the injected-ENOSPC tests cover a full disk"
        )
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def pages(path: Path) -> int:
    return math.ceil(path.stat().st_size / PAGE)


@pytest.mark.parametrize("file", OUTPUTS)
def test_a_real_full_disk_while_writing_each_file(built, fixture_cache, tmp_path, file):
    """The tmpfs holds each file written before ``file``, and half of it."""
    complete = built(SELF_CONTAINED).parquet.parent
    before = OUTPUTS[: OUTPUTS.index(file)]
    size = PAGE * (
        sum(pages(complete / name) for name in before) + (pages(complete / file) - 1) // 2
    )
    with small_filesystem(tmp_path / "disk", size) as disk:
        out = disk / "out"
        done = run_cli("--build", SELF_CONTAINED, "--out", str(out), "-q", hf_home=fixture_cache)
        assert_failed_cleanly(done.returncode, done.stderr, out, file)


@pytest.fixture(scope="module")
def many_row_groups(tmp_path_factory):
    """A build of 320 rows (five row groups) and the size of its parquet."""
    hf_home = tmp_path_factory.mktemp("many")
    manifest = lay_out_build(
        hf_home, synthetic_rows(seed=11, count=1200), name="many", build_rows=320, row_tokens=256
    )
    out = tmp_path_factory.mktemp("many-out")
    done = run_cli("--manifest", str(manifest), "--out", str(out), "--no-card", hf_home=hf_home)
    assert done.returncode == 0, done.stderr
    return hf_home, manifest, (out / "many.parquet").stat().st_size


def test_a_real_full_disk_while_the_writer_thread_writes_row_groups(many_row_groups, tmp_path):
    """The disk fills up in the third of five row groups.

    The build is still making rows then.
    """
    hf_home, manifest, parquet_bytes = many_row_groups
    with small_filesystem(tmp_path / "disk", PAGE * math.ceil(parquet_bytes / 2 / PAGE)) as disk:
        out = disk / "out"
        done = run_cli("--manifest", str(manifest), "--out", str(out), "-q", hf_home=hf_home)
        assert_failed_cleanly(done.returncode, done.stderr, out, "many.parquet")
