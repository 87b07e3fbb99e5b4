"""What a long step tells the user: progress bars, or log lines.

Progress bars on a terminal, plain log lines elsewhere.

On a terminal, a step shows a tqdm bar with counts, rate and ETA. Otherwise (CI logs, pipes)
it logs a line every ``LOG_EVERY`` seconds of wall time and one at the end, each with the rate
over the wall time so far, so logs stay short and readable at any speed. Verbosity 0 is
``--quiet`` (errors and the result only), 1 the default, 2 ``-v`` (details too).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from tqdm import tqdm

# seconds between log lines when not on a terminal
LOG_EVERY = 10.0


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
    def progress(self, step: str, total: int | None, unit: str):
        if self.verbosity == 0:
            yield _Silent()
        elif self.interactive:
            with tqdm(
                total=total, desc=step, unit=f" {unit}", file=self.stream, dynamic_ncols=True
            ) as bar:
                yield bar
        else:
            lines = _Lines(step, total, unit, self.stream)
            yield lines
            lines.finish()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


class _Lines:
    """Log lines of a step's progress, every ``every`` seconds and at the end.

    Each line is ``step: done/total unit (pct), rate over wall time``.
    """

    def __init__(
        self,
        step: str,
        total: int,
        unit: str,
        stream,
        every: float = LOG_EVERY,
        clock=time.monotonic,
    ):
        self.step, self.total, self.unit, self.stream = step, total, unit, stream
        self.every, self.clock = every, clock
        self.done, self.logged = 0, None
        self.started = self.last = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.clock() - self.last >= self.every:
            self._line()

    def finish(self) -> None:
        if self.logged != self.done:
            self._line()

    def _line(self) -> None:
        self.last, self.logged = self.clock(), self.done
        elapsed = max(self.last - self.started, 1e-9)
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        print(
            f"{self.step}: {self.done}{'' if self.total is None else f'/{self.total}'} "
            f"{self.unit}{share}, "
            f"{self.done / elapsed:.1f} {self.unit}/s over {elapsed:.0f} s",
            file=self.stream,
            flush=True,
        )
