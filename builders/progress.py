"""What a long step tells the user: progress bars on a terminal, plain log lines elsewhere.

On a terminal, a step shows a tqdm bar with counts, rate and ETA. Otherwise (CI logs, pipes)
it logs a line at each tenth of the way, so logs stay short and readable. Verbosity 0 is
``--quiet`` (errors and the result only), 1 the default, 2 ``-v`` (details too).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from tqdm import tqdm


class Reporter:
    def __init__(self, verbosity: int = 1, stream=None):
        self.verbosity = verbosity
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    @classmethod
    def silent(cls) -> Reporter:
        return cls(verbosity=0)

    def info(self, message: str) -> None:
        if self.verbosity >= 1:
            print(message, file=self.stream, flush=True)

    def detail(self, message: str) -> None:
        if self.verbosity >= 2:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def progress(self, step: str, total: int, unit: str):
        if self.verbosity == 0:
            yield _Silent()
        elif self.interactive:
            with tqdm(total=total, desc=step, unit=f" {unit}", file=self.stream, dynamic_ncols=True) as bar:
                yield bar
        else:
            lines = _Lines(step, total, unit, self.stream)
            yield lines
            lines.finish()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


class _Lines:
    """Logs ``step: done/total unit (pct), rate`` at each tenth of ``total``."""

    def __init__(self, step: str, total: int, unit: str, stream):
        self.step, self.total, self.unit, self.stream = step, total, unit, stream
        self.done, self.next_tenth = 0, 1
        self.started = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        while self.total and self.next_tenth <= 10 and self.done * 10 >= self.next_tenth * self.total:
            self._line()
            self.next_tenth += 1

    def finish(self) -> None:
        if self.next_tenth <= 10:
            self._line()

    def _line(self) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        print(f"{self.step}: {self.done}/{self.total} {self.unit}{share}, {self.done / elapsed:.1f} {self.unit}/s",
              file=self.stream, flush=True)
