"""Write a file whole or not at all: to a temporary name beside it, then rename."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through ``.NAME.PID.tmp``, which is removed if anything fails."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path
