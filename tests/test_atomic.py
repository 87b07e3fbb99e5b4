"""Files are written whole or not at all, synced to disk.

A killed build's temporaries are removed.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders.build import build
from builders.errors import OutputError
from builders.manifest import load_manifest
from builders.rows.card import PLOTS
from builders.runtime.atomic import outputs, remove_stale_temporaries, write_atomic
from helpers import MANIFESTS, SELF_CONTAINED


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_stale_temporaries_of_every_output_are_removed_by_the_next_build(hub, tmp_path):
    """A killed build's temporaries are removed by the next build.

    A build killed while writing its parquet, report, card or plots leaves temporaries; the next
    build of that name removes those of dead processes and leaves a running one's alone.
    """
    out = tmp_path / "out"
    out.mkdir()
    finals = [
        f"{SELF_CONTAINED}.parquet",
        f"{SELF_CONTAINED}.report.json",
        f"{SELF_CONTAINED}.md",
        *(f"{SELF_CONTAINED}.{plot}.png" for plot in PLOTS),
        "README.md",
    ]
    stale = [out / f".{final}.{dead_pid()}.tmp" for final in finals]
    # a live process, not this one
    running = out / f".{SELF_CONTAINED}.md.{os.getppid()}.tmp"
    other_build = out / f".another-build.md.{dead_pid()}.tmp"
    for path in [*stale, running, other_build]:
        path.write_bytes(b"partial")
    build(load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml"), out, hub)
    assert not any(path.exists() for path in stale)
    assert running.exists() and other_build.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(finals)


def test_commit_syncs_the_files_and_their_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd)
    )
    with outputs(tmp_path) as files:
        last = files.write("last.bin", b"last")
        files.write("first.bin", b"first")
        files.commit(last=last)
    pid = os.getpid()
    assert synced == [
        str(tmp_path / f".first.bin.{pid}.tmp"),
        str(tmp_path / f".last.bin.{pid}.tmp"),
        str(tmp_path),
    ]
    assert (tmp_path / "first.bin").read_bytes() == b"first" and (
        tmp_path / "last.bin"
    ).read_bytes() == b"last"


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), outputs(tmp_path) as files:
        files.write("done.bin", b"whole")
        with files.writing("file.bin") as file:
            file.temporary.write_bytes(b"half")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    # nothing to do, nothing fails
    remove_stale_temporaries(tmp_path, "file")


def test_a_commit_that_fails_half_way_removes_what_it_put_in_place(tmp_path, monkeypatch):
    real_replace = os.replace

    def replace(source, target):
        if str(target).endswith("last.bin"):
            raise OSError(28, os.strerror(28))
        return real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    with (
        pytest.raises(OutputError, match=r"last\.bin: No space left on device"),
        outputs(tmp_path) as files,
    ):
        last = files.write("last.bin", b"last")
        files.write("first.bin", b"first")
        files.commit(last=last)
    assert list(tmp_path.iterdir()) == []


def test_write_atomic_fails_as_an_output_error_naming_the_file(tmp_path, monkeypatch):
    def write_bytes(path, data):
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    with pytest.raises(
        OutputError, match=r"cannot write .*manifest\.yaml: No space left on device"
    ):
        write_atomic(tmp_path / "manifest.yaml", b"name: x\n")
    assert list(tmp_path.iterdir()) == []
