"""Decoded rows waiting for their turn: in memory up to a stream position, on disk after it.

The stream's own (``builders.encode.stream``, in this process) and each worker's share of a pass
(``builders.encode.share``) hold their rows here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from builders.errors import OutputError


class Held:
    """Decoded rows waiting for their turn.

    They wait in memory before ``memory_end``, on disk after it, in buckets of ``bucket``
    positions: Arrow IPC files ``NAME-KEY.arrow`` in ``spill``.
    """

    def __init__(self, memory_end: int, bucket: int, spill: Path, name: str = "bucket"):
        self.memory_end, self.bucket, self.spill, self.name = memory_end, bucket, spill, name
        self.tables: list[pa.Table] = []
        self.positions: list[np.ndarray] = []
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        self.spilled = 0

    def add(self, table: pa.Table, positions: np.ndarray) -> None:
        near = positions < self.memory_end
        if near.all():
            # no copy of the rows
            self.tables.append(table)
            self.positions.append(positions)
            return
        if near.any():
            self.tables.append(table.filter(near))
            self.positions.append(positions[near])
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
            self.spilled += part.num_rows

    def in_order(self) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """The held rows as tables, each of one piece, with their positions.

        Memory first (a stretch of positions), then each bucket (each read only when the one before
        is done with, so one is in memory at a time); the rows of each in no particular order. One
        piece, because taking rows of a table of many pieces in another order costs more than
        joining them, and a take of all of them at once would hold them twice.
        """
        if self.tables:
            tables, positions = self.tables, self.positions
            self.tables, self.positions = [], []
            table = pa.concat_tables(tables).combine_chunks()
            del tables
            yield table, np.concatenate(positions)
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
