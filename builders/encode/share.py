"""A worker's share of a pass: what it keeps of its row groups until the build asks for it.

A pool's worker decodes the row groups the build hands it (``builders.encode.worker``). Of each
group's rows in the pass, it encodes those before the pass's eager bound at once and keeps them
encoded; it keeps the later ones (the held rows) decoded, in memory before the pass's memory bound
and on disk after it (``builders.encode.held``, files named after the worker's process and the
pass in the build's spill folder). The build then asks each worker for its positions of each
stretch of the stream, in stream order (``taken``): the encoded ones are handed over, the held
ones encoded then. The bounds are the stream's, over all workers together: the positions before
the eager bound, and those between it and the memory bound, are each at most half of
``MEMORY_ROWS_BYTES``'s rows, however they are spread over the workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from builders.encode.held import Held

# rows with a ``position`` column → each one's (position, encoded conversation or refusal)
Encode = Callable[[pa.Table], list[tuple[int, object]]]


class Share:
    """A worker's rows of one pass (``bounds``, as the build sends them), until asked for."""

    def __init__(self, bounds: dict):
        self.start, self.eager = bounds["start"], bounds["eager"]
        self.encoded: dict[int, object] = {}
        self.held = Held(
            self.eager,
            bounds["memory_end"],
            bounds["bucket"],
            Path(bounds["spill"]),
            name=f"held-{os.getpid()}-{self.start}",
        )
        # the held rows, a part (memory, then each bucket) at a time, as they are asked for
        self._parts: Iterator[tuple[pa.Table, np.ndarray]] | None = None
        # the part being taken: its rows, their positions in order, and where each lies
        self._part: tuple[pa.Table, np.ndarray, np.ndarray] | None = None

    def add(self, rows: pa.Table, encode: Encode) -> None:
        """Keep a row group's ``rows`` of the pass (with their ``position``).

        Those before the eager bound are encoded now, in stream order; the others are held.
        """
        positions = rows.column("position").to_numpy()
        now = np.flatnonzero(positions < self.eager)
        now = now[np.argsort(positions[now], kind="stable")]
        if len(now):
            self.encoded.update(encode(rows.take(pa.array(now))))
        later = positions >= self.eager
        if later.any():
            self.held.add(rows.filter(pa.array(later)).drop_columns(["position"]), positions[later])

    def taken(self, positions: np.ndarray, encode: Encode) -> list[tuple[int, object]]:
        """The conversations at ``positions`` (ascending, each asked for once), given up.

        Encoded ones as they were kept; held ones encoded now.
        """
        early = positions < self.eager
        try:
            out = [(p, self.encoded.pop(p)) for p in positions[early].tolist()]
        except KeyError as err:
            raise RuntimeError(f"stream position {err} was not kept by this worker") from None
        later = positions[~early]
        while len(later):
            table, ordered, rows = self._current()
            # the positions asked for in this part, a prefix of those asked for
            inside = later[later <= ordered[-1]]
            if not len(inside):
                raise RuntimeError(f"stream position {later[0]} was not held by this worker")
            places = np.searchsorted(ordered, inside)
            if not np.array_equal(ordered[places], inside):
                raise RuntimeError(
                    f"stream positions {inside.tolist()} not all held by this worker"
                )
            out += encode(
                table.take(pa.array(rows[places])).append_column(
                    "position", pa.array(inside, pa.int64())
                )
            )
            if inside[-1] == ordered[-1]:
                # done with
                self._part = None
            later = later[len(inside) :]
        return out

    def _current(self) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        if self._part is None:
            if self._parts is None:
                self._parts = self.held.in_order()
            try:
                table, positions = next(self._parts)
            except StopIteration:
                raise RuntimeError("more held rows asked for than this worker holds") from None
            rows = np.argsort(positions, kind="stable")
            self._part = table, positions[rows], rows
        return self._part
