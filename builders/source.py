"""Random access to a Tulu-shaped source: sharded parquet files with ``id``, ``messages``, ``source``.

Source index ``i`` counts from 0 over the files in the given order, rows in file order. Only
the row groups that hold requested rows are decoded, and only the requested rows become Python
objects, so memory follows what a build consumes, not the size of the source.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from builders.errors import PinnedInputError

COLUMNS = ("id", "messages", "source")
READ_THREADS = 2  # row groups decoded at once; the order of results does not depend on it


class ParquetSource:
    """The concatenation of ``files``, readable by source index."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self._parquet = [_open(path) for path in self.files]
        self._columns = [[c for c in COLUMNS if c in pf.schema_arrow.names] for pf in self._parquet]
        groups = [(f, g, pf.metadata.row_group(g).num_rows)
                  for f, pf in enumerate(self._parquet) for g in range(pf.metadata.num_row_groups)]
        self._group_file = np.array([f for f, _, _ in groups], dtype=np.int64)
        self._group_index = np.array([g for _, g, _ in groups], dtype=np.int64)
        self._group_start = np.cumsum([0] + [n for _, _, n in groups], dtype=np.int64)
        self.num_rows = int(self._group_start[-1])

    def take(self, indices) -> pa.Table:
        """The rows at ``indices`` (any order, repeats allowed), in that order.

        Columns: ``index`` (the source index), ``id``, ``source`` (null where the files have
        none) and ``messages``; still Arrow data, so a caller converts only what it consumes.
        """
        return next(self.take_batches(indices, max(1, len(indices))))

    def take_batches(self, indices, batch_size: int) -> Iterator[pa.Table]:
        """``take(indices)`` in consecutive batches of ``batch_size`` rows.

        Each row group that holds a wanted row is decoded once, and only the wanted rows are
        kept, in one table; each batch then copies out just its own rows.
        """
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            raise IndexError(f"source index out of range 0..{self.num_rows - 1}")
        wanted, position = np.unique(indices, return_inverse=True)
        groups = np.searchsorted(self._group_start, wanted, side="right") - 1
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:  # decoding releases the GIL
            parts = list(pool.map(lambda group: self._pick(group, wanted[groups == group]), np.unique(groups)))
        if not parts:
            parts = [pa.table({"index": pa.array([], pa.int64()), "id": pa.array([], pa.string()),
                               "source": pa.array([], pa.string()),
                               "messages": pa.array([], self._parquet[0].schema_arrow.field("messages").type)})]
        # one contiguous table of the wanted rows: taking from hundreds of chunks is slow for nested columns
        rows = pa.concat_tables(parts, promote_options="permissive").combine_chunks()
        del parts
        position = position.reshape(-1)
        for start in range(0, max(1, len(position)), batch_size):
            yield rows.take(pa.array(position[start:start + batch_size], type=pa.int64()))

    def _pick(self, group: int, members: np.ndarray) -> pa.Table:
        """Rows ``members`` (source indices) of row group ``group``, in the columns ``take`` returns."""
        f, g = int(self._group_file[group]), int(self._group_index[group])
        try:
            # a file handle of its own: reads of one ParquetFile from several threads are not safe
            table = pq.ParquetFile(self.files[f]).read_row_group(g, columns=self._columns[f])
        except (pa.ArrowException, OSError) as err:
            raise PinnedInputError(f"{self.files[f]}: cannot read row group {g}: {err}") from err
        picked = table.take(pa.array(members - self._group_start[group]))
        source = picked.column("source") if "source" in picked.column_names else pa.nulls(len(members), pa.string())
        return pa.table({"index": pa.array(members), "id": picked.column("id").cast(pa.string()),
                         "source": source, "messages": picked.column("messages")})


def _open(path: Path) -> pq.ParquetFile:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise PinnedInputError(f"{path}: not a readable parquet file: {err}") from err
    _check_schema(path, pf.schema_arrow)
    return pf


def _check_schema(path: Path, schema: pa.Schema) -> None:
    def fail(problem: str):
        raise PinnedInputError(f"{path}: {problem}; expected id: string, messages: list<struct<role: string, "
                               f"content: string, ...>>, source: string (optional)")

    for name in ("id", "messages"):
        if name not in schema.names:
            fail(f"no column {name!r}")
    if not pa.types.is_string(schema.field("id").type) and not pa.types.is_large_string(schema.field("id").type):
        fail(f"column 'id' has type {schema.field('id').type}")
    if "source" in schema.names and not pa.types.is_string(schema.field("source").type):
        fail(f"column 'source' has type {schema.field('source').type}")
    messages = schema.field("messages").type
    if not (pa.types.is_list(messages) or pa.types.is_large_list(messages)) \
            or not pa.types.is_struct(messages.value_type):
        fail(f"column 'messages' has type {messages}")
    fields = {messages.value_type.field(i).name: messages.value_type.field(i).type
              for i in range(messages.value_type.num_fields)}
    for name in ("role", "content"):
        if name not in fields or not pa.types.is_string(fields[name]):
            fail(f"column 'messages' has type {messages}")
