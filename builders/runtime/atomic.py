"""Write a build's files whole and together, or not at all.

Each file is written as ``.FINAL.PID.tmp`` in its folder; ``Outputs.commit`` syncs every one to
disk (``fsync``), renames them into place and syncs the folder, so neither a crash nor a power
loss leaves a partial file at a final path. A write that fails (a full disk, no permission) is an
``OutputError`` naming the file, and leaves nothing of the build: its temporaries are removed, and
files already put in place by a commit that failed half-way are removed again.
A build's rows that wait on disk go in its spill folder, ``.NAME.PID.spill`` beside them
(``spill_folder``). ``remove_stale_temporaries`` removes the temporaries and spill folders of
processes that no longer exist (a build killed outright cannot remove its own).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from glob import escape
from pathlib import Path

from builders.errors import OutputError
from builders.runtime import stopping

_LEFT_BY_A_PROCESS = re.compile(r"\.(?P<final>.+)\.(?P<pid>[0-9]+)\.(tmp|spill)")


class Staged:
    """A file being written under its temporary name.

    It is to be put at ``final`` (by default the path it was staged for).
    """

    def __init__(self, path: Path):
        self.path = path
        self.final = path
        self.temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")


class Outputs:
    """The files of one build in ``folder``.

    They are staged one by one, and put in place together by ``commit``.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self._staged: list[Staged] = []

    @contextmanager
    def writing(self, name: str) -> Iterator[Staged]:
        """Stage file ``name``; the block writes ``.temporary``.

        An OSError in the block is an OutputError naming the file.
        """
        file = Staged(self.folder / name)
        self._staged.append(file)
        with self._naming(file.path):
            yield file

    def write(self, name: str, data: bytes) -> Staged:
        """Stage file ``name`` with ``data``."""
        with self.writing(name) as file:
            file.temporary.write_bytes(data)
        return file

    def commit(self, last: Staged) -> None:
        """Sync every staged file, then rename each to its final path.

        ``last`` is renamed last (it is the file the others describe). If any of this fails, the
        files already renamed are removed again: all or nothing.
        """
        stopping.check()
        files = [*(file for file in self._staged if file is not last), last]
        for file in files:
            with self._naming(file.final):
                _sync(file.temporary)
        placed = []
        try:
            for file in files:
                with self._naming(file.final):
                    os.replace(file.temporary, file.final)
                placed.append(file.final)
            with self._naming(self.folder):
                _sync(self.folder)
            # a stop asked for while the files were put in place
            stopping.check()
        except BaseException:
            for path in placed:
                path.unlink(missing_ok=True)
            raise

    def remove_temporaries(self) -> None:
        for file in self._staged:
            file.temporary.unlink(missing_ok=True)

    @contextmanager
    def _naming(self, path: Path) -> Iterator[None]:
        """An OSError in the block is an OutputError naming ``path``, in one line."""
        try:
            yield
        except OSError as err:
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise OutputError(
                f"cannot write {path}: {reason}; nothing was put in {self.folder}"
            ) from err


@contextmanager
def outputs(folder: Path) -> Iterator[Outputs]:
    """The outputs of a build into ``folder``.

    Whatever ends the block, no temporary outlives it.
    """
    files = Outputs(folder)
    try:
        yield files
    finally:
        files.remove_temporaries()


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all.

    A failure is an OutputError naming the path.
    """
    with outputs(path.parent) as files:
        files.commit(last=files.write(path.name, data))
    return path


def _sync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def spill_folder(folder: Path, name: str) -> Iterator[Path]:
    """The folder where build ``name``'s rows wait on disk: ``folder/.NAME.PID.spill``.

    It is beside the build's temporaries, on the output's disk; whatever ends the block, it is
    removed with what it holds. One a build killed outright leaves, the next build of ``name``
    removes (``remove_stale_temporaries``).
    """
    path = folder / f".{name}.{os.getpid()}.spill"
    try:
        path.mkdir(exist_ok=True)
    except OSError as err:
        raise OutputError(
            f"cannot write {path}: {os.strerror(err.errno) if err.errno else err}; nothing was "
            f"put in {folder}"
        ) from err
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_temporaries(folder: Path, name: str) -> None:
    """Remove the stale temporaries and spill folders of build ``NAME``'s files (``NAME.*``).

    One is stale where the process that wrote it no longer exists.
    """
    pattern = f".{escape(name)}.*"
    for path in [*folder.glob(f"{pattern}.tmp"), *folder.glob(f"{pattern}.spill")]:
        match = _LEFT_BY_A_PROCESS.fullmatch(path.name)
        if match and not _alive(int(match["pid"])):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
