"""Wall time of a build's stages, as its report records them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timings:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (in seconds, whether or not it raises)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - started

    def as_dict(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self.seconds.items()}
