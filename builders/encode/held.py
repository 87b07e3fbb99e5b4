"""Decoded rows waiting for their turn: in memory up to a stream position, on disk after it.

The stream's own (``builders.encode.stream``, in this process) and each worker's share of a pass
(``builders.encode.share``) hold their rows here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from builders.errors import OutputError

# pieces of the rows held in memory, joined one at a time as they are wanted
MEMORY_PIECES = 8


class Held:
    """Decoded rows waiting for their turn, at positions from ``first``.

    They wait in memory before ``memory_end``, in ``MEMORY_PIECES`` pieces of consecutive
    positions, and on disk after it, in buckets of ``bucket`` positions: Arrow IPC files
    ``NAME-KEY.arrow`` in ``spill``.
    """

    def __init__(self, first: int, memory_end: int, bucket: int, spill: Path, name: str = "bucket"):
        self.first, self.memory_end, self.bucket = first, memory_end, bucket
        self.spill, self.name = spill, name
        # positions of each piece in memory
        self.piece = max(1, math.ceil((memory_end - first) / MEMORY_PIECES))
        # each piece's tables and their positions, as they were added
        self.pieces: dict[int, list[tuple[pa.Table, np.ndarray]]] = {}
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}

    def add(self, table: pa.Table, positions: np.ndarray) -> None:
        near = positions < self.memory_end
        if near.any():
            self._keep(table if near.all() else table.filter(near), positions[near])
        if near.all():
            return
        far, far_positions = table.filter(~near), positions[~near]
        keys = (far_positions - self.memory_end) // self.bucket
        for key in np.unique(keys).tolist():
            part = far.filter(keys == key).append_column(
                "position", pa.array(far_positions[keys == key])
            )
            try:
                if key not in self.writers:
                    self.writers[key] = pa.ipc.new_file(self._path(key), part.schema)
                self.writers[key].write_table(part)
            except OSError as err:
                raise OutputError(
                    f"{self._path(key)}: cannot write the rows that wait on disk "
                    f"({err.strerror or err})"
                ) from err

    def _keep(self, table: pa.Table, positions: np.ndarray) -> None:
        """Keep rows in memory, each in its piece (a copy of them where they span pieces)."""
        keys = (positions - self.first) // self.piece
        distinct = np.unique(keys).tolist()
        for key in distinct:
            self.pieces.setdefault(key, []).append(
                (table, positions)
                if len(distinct) == 1
                else (table.filter(keys == key), positions[keys == key])
            )

    def in_order(self) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """The held rows as tables, each of one piece, with their positions.

        Each piece in memory, then each bucket on disk, in order of their positions (each made
        or read only when the one before is done with); the rows of each in no particular order.
        One piece, because taking rows of a table of many pieces in another order costs more than
        joining them; a piece at a time, because joining them all at once held them twice.
        """
        for key in sorted(self.pieces):
            parts = self.pieces.pop(key)
            table = pa.concat_tables([t for t, _ in parts]).combine_chunks()
            positions = np.concatenate([p for _, p in parts])
            del parts
            yield table, positions
            del table, positions
        for key in sorted(self.writers):
            self.writers.pop(key).close()
            yield _bucket(self._path(key))
            pa.default_memory_pool().release_unused()

    def _path(self, key: int) -> Path:
        return self.spill / f"{self.name}-{key}.arrow"


def _bucket(path: Path) -> tuple[pa.Table, np.ndarray]:
    with pa.OSFile(str(path)) as source:
        part = pa.ipc.open_file(source).read_all()
    path.unlink()
    return part.drop_columns(["position"]).combine_chunks(), part.column("position").to_numpy()
