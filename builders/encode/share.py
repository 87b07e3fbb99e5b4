"""A worker's share of a pass: what it keeps of its row groups until the build asks for it.

A pool's worker decodes the row groups the build hands it (``builders.encode.worker``) and keeps
each group's rows of the pass decoded (``builders.encode.held``): in memory before the pass's
memory bound, on disk after it (files named after the worker's process and the pass in the
build's spill folder). The build then asks each worker for its positions of each stretch of the
stream, in stream order (``taken``), and the worker encodes them then, with the engine it chose.
So the pass's decoding, which must end before the first stretch is complete (a stretch's rows
lie in nearly every row group), is not held up by encoding, and the encoding runs while the build
packs and writes what came before. The bounds are the stream's, over all workers together: the
rows before the memory bound are at most ``MEMORY_ROWS_BYTES``'s, however they are spread over
the workers.
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
        self.start = bounds["start"]
        self.held = Held(
            self.start,
            bounds["memory_end"],
            bounds["bucket"],
            Path(bounds["spill"]),
            name=f"held-{os.getpid()}-{self.start}",
        )
        # the held rows, a part (memory, then each bucket) at a time, as they are asked for
        self._parts: Iterator[tuple[pa.Table, np.ndarray]] | None = None
        # the part being taken: its rows, their positions in order, and where each lies
        self._part: tuple[pa.Table, np.ndarray, np.ndarray] | None = None

    def add(self, rows: pa.Table) -> None:
        """Keep a row group's ``rows`` of the pass (with their ``position``), decoded."""
        self.held.add(rows.drop_columns(["position"]), rows.column("position").to_numpy())

    def taken(self, positions: np.ndarray, encode: Encode) -> list[tuple[int, object]]:
        """The conversations at ``positions`` (ascending, each asked for once), encoded now."""
        out = []
        while len(positions):
            table, ordered, rows = self._current()
            # the positions asked for in this part, a prefix of those asked for
            inside = positions[positions <= ordered[-1]]
            if not len(inside):
                raise RuntimeError(f"stream position {positions[0]} was not held by this worker")
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
            positions = positions[len(inside) :]
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
