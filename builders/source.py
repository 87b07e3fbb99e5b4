"""Random access to a Tulu-shaped source: sharded parquet files with ``id``, ``messages``, ``source``.

Source index ``i`` counts from 0 over the files in the given order, rows in file order. Rows
are read a row group at a time, as Arrow tables with the columns ``index`` (the source index),
``id``, ``source`` (null where a file has none) and ``messages``, in one schema for every file
(a message field one file lacks is null), so tables of several files concatenate as they are.
Only the rows a caller converts become Python objects.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from builders.errors import PinnedInputError

COLUMNS = ("id", "messages", "source")


class ParquetSource:
    """The concatenation of ``files``, readable by source index."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self._parquet = [_open(path) for path in self.files]
        self._columns = [[c for c in COLUMNS if c in pf.schema_arrow.names] for pf in self._parquet]
        groups = [(f, g, pf.metadata.row_group(g)) for f, pf in enumerate(self._parquet)
                  for g in range(pf.metadata.num_row_groups)]
        self._group_file = np.array([f for f, _, _ in groups], dtype=np.int64)
        self._group_index = np.array([g for _, g, _ in groups], dtype=np.int64)
        self._group_start = np.cumsum([0] + [md.num_rows for _, _, md in groups], dtype=np.int64)
        self._message_bytes = sum(md.column(c).total_uncompressed_size for _, _, md in groups
                                  for c in range(md.num_columns) if md.column(c).path_in_schema.startswith("messages"))
        self.num_rows = int(self._group_start[-1])
        self.num_groups = len(groups)
        self.message_type = _message_type([pf.schema_arrow for pf in self._parquet])

    def bytes_per_row(self) -> float:
        """The mean uncompressed size of a row's messages, from the files' metadata."""
        return self._message_bytes / max(1, self.num_rows)

    def group_rows(self, group: int) -> tuple[int, int]:
        """The first source index of row group ``group`` and its number of rows."""
        return int(self._group_start[group]), int(self._group_start[group + 1] - self._group_start[group])

    def group_of(self, indices: np.ndarray) -> np.ndarray:
        """The row group of each source index."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            raise IndexError(f"source index out of range 0..{self.num_rows - 1}")
        return np.searchsorted(self._group_start, indices, side="right") - 1

    def read_group(self, group: int) -> pa.Table:
        """Every row of row group ``group``, decoded."""
        f, g = int(self._group_file[group]), int(self._group_index[group])
        try:
            # a file handle of its own: reads of one ParquetFile from several threads are not safe; no
            # threads of its own: the caller decodes several groups at once (nested threads cost twice the CPU)
            table = pq.ParquetFile(self.files[f]).read_row_group(g, columns=self._columns[f], use_threads=False)
        except (pa.ArrowException, OSError) as err:
            raise PinnedInputError(f"{self.files[f]}: cannot read row group {g}: {err}") from err
        first, count = self.group_rows(group)
        source = table.column("source") if "source" in table.column_names else pa.nulls(count, pa.string())
        return pa.table({"index": pa.array(np.arange(first, first + count, dtype=np.int64)),
                         "id": table.column("id").cast(pa.string()), "source": source,
                         "messages": _conform(table.column("messages").combine_chunks(), self.message_type)})

    def read(self, group: int, members: np.ndarray) -> pa.Table:
        """Rows ``members`` (source indices of row group ``group``), in that order."""
        return self.read_group(group).take(pa.array(np.asarray(members) - self._group_start[group]))

    def take(self, indices) -> pa.Table:
        """The rows at ``indices`` (any order, repeats allowed), in that order, each group decoded once."""
        indices = np.asarray(indices, dtype=np.int64)
        groups = self.group_of(indices)
        parts = [self.read(int(g), np.unique(indices[groups == g])) for g in np.unique(groups)]
        if not parts:
            return self.read_group(0).slice(0, 0)
        table = pa.concat_tables(parts)
        return table.take(pa.array(np.searchsorted(table.column("index").to_numpy(), indices)))


def _message_type(schemas: list[pa.Schema]) -> pa.DataType:
    """One ``list<struct>`` type holding every message field of every file (first seen first)."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema.field("messages").type.value_type:
            fields.setdefault(field.name, field)
    return pa.list_(pa.struct(list(fields.values())))


def _conform(messages: pa.Array, target: pa.DataType) -> pa.Array:
    """``messages`` in the ``target`` list<struct> type: fields it lacks are null."""
    if messages.type == target:
        return messages
    values = messages.values
    children = [values.field(f.name) if values.type.get_field_index(f.name) >= 0 else pa.nulls(len(values), f.type)
                for f in target.value_type]
    structs = pa.StructArray.from_arrays(children, fields=list(target.value_type), mask=values.is_null())
    offsets = messages.offsets.cast(pa.int32())
    return pa.ListArray.from_arrays(offsets, structs, type=target, mask=messages.is_null())


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
