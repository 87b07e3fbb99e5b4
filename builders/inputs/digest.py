"""The sha256 of files, and a process that hashes a build's sources.

A build hashes every source file's bytes (gigabytes) while it builds. That work runs in a process
of its own, ``HashingProcess``, so that it takes none of the build's own process, whose CPU is
what limits a build with many workers (docs/performance.md). It is started as the workers are:
a fresh interpreter (``python -c``) in a session of its own (a terminal's Ctrl-C reaches only the
build), importing nothing but this module. It reads a JSON list of ``[path, git]`` on stdin and
writes one JSON line per file, in order: ``[sha256, size, git blob id]`` (the id only where
``git`` asks for it, else null), or ``{"errno", "strerror"}`` for a file it cannot read. A
process that dies before it has hashed every file is a ``WorkerError`` (exit 7), like a worker
that dies.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

from builders.errors import WorkerError

# the folder that holds this package: the process runs the same code
ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); from builders.inputs.digest import serve; serve()"
)


def file_digest(path: Path | str) -> tuple[str, int]:
    """The sha256 and size of a file, read in blocks."""
    sha256, size, _ = file_digests(path)
    return sha256, size


def file_digests(path: Path | str, git: bool = False) -> tuple[str, int, str | None]:
    """The sha256 and size of a file, and with ``git`` its git blob id, in one read.

    A git blob id is the sha1 of ``blob SIZE\\0`` and the bytes: the name git (and the HF cache,
    for a file stored in git rather than LFS) gives the file.
    """
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        blob = hashlib.sha1(f"blob {os.fstat(f.fileno()).st_size}\0".encode()) if git else None
        while block := f.read(1 << 22):
            sha.update(block)
            if blob is not None:
                blob.update(block)
            size += len(block)
    return sha.hexdigest(), size, blob.hexdigest() if blob is not None else None


class HashingProcess:
    """Hashes ``paths`` in a process of its own.

    ``digests[k]`` is the Future of path k's ``(sha256, size, git blob id)`` (an OSError where it
    cannot be read, a WorkerError where the process died); the git blob id is computed only where
    ``git_blob_ids[k]`` asks for it, else None.
    """

    def __init__(self, paths: list[Path], git_blob_ids: list[bool] | None = None):
        self.digests: list[Future] = [Future() for _ in paths]
        self.process = subprocess.Popen(
            [sys.executable, "-c", BOOTSTRAP, str(ROOT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name="source-hashes", daemon=True)
        self._reader.start()
        try:
            git = git_blob_ids or [False] * len(paths)
            asked = [[str(p), g] for p, g in zip(paths, git, strict=True)]
            self.process.stdin.write(json.dumps(asked).encode("utf-8"))
            self.process.stdin.close()
        except OSError:
            # it died at once: its digests say so
            pass
        except BaseException:
            # interrupted (Ctrl-C) while it starts: it goes with the build
            self.stop()
            raise

    def stop(self) -> None:
        """End the process (where it is still hashing) and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join()

    def _read(self) -> None:
        lines = iter(self.process.stdout)
        for digest in self.digests:
            line = next(lines, None)
            if line is None:
                break
            result = json.loads(line)
            if isinstance(result, dict):
                digest.set_exception(OSError(result["errno"], result["strerror"]))
            else:
                digest.set_result(tuple(result))
        self.process.stdout.close()
        code = self.process.wait()
        for digest in self.digests:
            if not digest.done():
                status = (
                    f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                )
                digest.set_exception(
                    WorkerError(
                        f"the process hashing the source files died before it had hashed "
                        f"them all ({status}); nothing was left at the final path"
                    )
                )


def serve() -> None:
    """The hashing process: the paths from stdin, a line for each on stdout."""
    try:
        paths = json.loads(sys.stdin.read())
    except ValueError:
        # the build stopped before it had said which files: nothing to hash
        return
    for path, git in paths:
        try:
            line = json.dumps(file_digests(path, git))
        except OSError as err:
            line = json.dumps({"errno": err.errno, "strerror": err.strerror or str(err)})
        print(line, flush=True)
