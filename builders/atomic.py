"""Write files whole or not at all: to a temporary name beside the final one, synced, then renamed.

A file is written as ``.FINAL.PID.tmp`` in its folder, flushed to disk (``fsync``), renamed
into place, and the folder is synced, so neither a crash nor a power loss leaves a partial file
at the final path. ``remove_stale_temporaries`` removes the temporaries of processes that no
longer exist (a build killed outright cannot remove its own).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from glob import escape
from pathlib import Path

_TEMPORARY = re.compile(r"\.(?P<final>.+)\.(?P<pid>[0-9]+)\.tmp")


class Staged:
    """A file being written under its temporary name; ``commit`` puts it at its final path."""

    def __init__(self, path: Path):
        self.path = path
        self.temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")

    def commit(self, final: Path | None = None) -> Path:
        """Sync the temporary file, rename it to ``final`` (default: the path it was staged for), sync the folder."""
        final = final or self.path
        with open(self.temporary, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(self.temporary, final)
        folder = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        return final


@contextmanager
def staged(path: Path) -> Iterator[Staged]:
    """Stage ``path``: write ``.temporary``, then ``commit()``; the temporary never outlives the block."""
    file = Staged(path)
    try:
        yield file
    finally:
        file.temporary.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all."""
    with staged(path) as file:
        file.temporary.write_bytes(data)
        return file.commit()


def remove_stale_temporaries(folder: Path, name: str) -> None:
    """Remove the temporaries of files named ``NAME.*`` whose writing process no longer exists."""
    for path in folder.glob(f".{escape(name)}.*.tmp"):
        match = _TEMPORARY.fullmatch(path.name)
        if match and not _alive(int(match["pid"])):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
