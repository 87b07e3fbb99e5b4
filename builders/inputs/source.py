"""A build's source: the conversations of its datasets.

They are readable by source index, a block at a time. Source index ``i`` counts from 0 over the
datasets in manifest order, each one's files in sorted path order, rows in file order. A block (a
parquet row group, a run of JSON rows: ``builders.inputs.files``) is read as an Arrow table with the
columns ``index`` (the source index), ``id`` (the layout's id field, or the source index where the
layout says ``id: null``), ``source`` (null where a file has none), ``messages`` (each
``{role, content, ...}`` as the chat template names them: the layout's ``keys`` and ``roles``
applied, tool calls normalised: ``builders.inputs.layout``), ``tools`` (the normalised tool list as
JSON text, or null) and ``layout_error`` (null, or why the row cannot be read as its layout says,
naming the file, the row, the id and the field; the encoder raises it when the stream reaches the
row). Every block has one schema, so tables of several files concatenate as they are. Only the rows
a caller converts (``builders.inputs.layout.conversations``) become Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from builders.errors import SourceDataError
from builders.inputs.files import open_file
from builders.inputs.layout import CONVERSATION_CHARS, Layout
from builders.manifest import DatasetPin


@dataclass(frozen=True)
class SourceFile:
    # which of the manifest's datasets
    dataset: int
    # its path in the dataset's snapshot
    name: str
    path: Path


class Source:
    """The concatenation of ``datasets``.

    Each is a pin and its files as ``(name in the snapshot, local path)``.
    """

    def __init__(
        self,
        datasets: list[tuple[DatasetPin, list[tuple[str, Path]]]],
        conversation_chars: int = CONVERSATION_CHARS,
    ):
        """``conversation_chars``: the most a row may hold (``Layout.limit``)."""
        self.pins = [pin for pin, _ in datasets]
        self.conversation_chars = conversation_chars
        self.files = [
            SourceFile(j, name, path)
            for j, (_, files) in enumerate(datasets)
            for name, path in files
        ]
        self._readers = [
            open_file(f.path, f.name, Layout.of(self.pins[f.dataset], conversation_chars))
            for f in self.files
        ]
        groups = [
            (f, b, rows)
            for f, reader in enumerate(self._readers)
            for b, rows in enumerate(reader.block_rows)
        ]
        self._group_file = np.array([f for f, _, _ in groups], dtype=np.int64)
        self._group_block = np.array([b for _, b, _ in groups], dtype=np.int64)
        self._group_start = np.cumsum([0, *(rows for _, _, rows in groups)], dtype=np.int64)
        file_rows = [sum(reader.block_rows) for reader in self._readers]
        self._file_start = np.cumsum([0, *file_rows], dtype=np.int64)
        self.dataset_rows = [
            sum(rows for f, rows in zip(self.files, file_rows, strict=True) if f.dataset == j)
            for j in range(len(self.pins))
        ]
        self.dataset_start = np.cumsum([0, *self.dataset_rows], dtype=np.int64)
        for j, rows in enumerate(self.dataset_rows):
            if rows == 0:
                names = [f.name for f in self.files if f.dataset == j]
                raise SourceDataError(
                    f"dataset {self.pins[j].origin}: no rows ({', '.join(names)}: "
                    "empty, blank, or an empty JSON list)"
                )
        self._message_bytes = sum(reader.message_bytes for reader in self._readers)
        self.num_rows = int(self._group_start[-1])
        self.num_groups = len(groups)

    def bytes_per_row(self) -> float:
        """The mean size of a row's messages, from the files.

        The size is that of uncompressed parquet, or of JSON text.
        """
        return self._message_bytes / max(1, self.num_rows)

    def group_rows(self, group: int) -> tuple[int, int]:
        """The first source index of block ``group`` and its number of rows."""
        return int(self._group_start[group]), int(
            self._group_start[group + 1] - self._group_start[group]
        )

    def group_of(self, indices: np.ndarray) -> np.ndarray:
        """The block of each source index."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            raise IndexError(f"source index out of range 0..{self.num_rows - 1}")
        return np.searchsorted(self._group_start, indices, side="right") - 1

    def dataset_of(self, indices) -> np.ndarray:
        """The dataset (its place in the manifest) of each source index."""
        return (
            np.searchsorted(self.dataset_start, np.asarray(indices, dtype=np.int64), side="right")
            - 1
        )

    def read_group(self, group: int, rows: np.ndarray | None = None) -> pa.Table:
        """Block ``group``'s rows ``rows`` (places in the block; None: all), in that order.

        The whole block is decoded; only those rows are converted.
        """
        f = int(self._group_file[group])
        first, count = self.group_rows(group)
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
        table = self._readers[f].read(int(self._group_block[group]), rows)
        if rows is None:
            rows = np.arange(count, dtype=np.int64)
        pin = self.pins[self.files[f].dataset]
        index = pa.array(first + rows)
        ids = table.column("id") if pin.id else index.cast(pa.string())
        return pa.table(
            {
                "index": index,
                "id": ids,
                "source": table.column("source"),
                "messages": table.column("messages"),
                "tools": table.column("tools"),
                "string_arguments": table.column("string_arguments"),
                "layout_error": _located(
                    table.column("problem"),
                    ids,
                    self.files[f].name,
                    first - int(self._file_start[f]) + rows,
                ),
            }
        )

    def read(self, group: int, members: np.ndarray) -> pa.Table:
        """Rows ``members`` (source indices of block ``group``), in that order."""
        return self.read_group(group, np.asarray(members) - self._group_start[group])

    def take(self, indices) -> pa.Table:
        """The rows at ``indices``, in that order, each block decoded once.

        The indices may come in any order, with repeats.
        """
        indices = np.asarray(indices, dtype=np.int64)
        groups = self.group_of(indices)
        parts = [self.read(int(g), np.unique(indices[groups == g])) for g in np.unique(groups)]
        if not parts:
            return self.read_group(0).slice(0, 0)
        table = pa.concat_tables(parts)
        return table.take(pa.array(np.searchsorted(table.column("index").to_numpy(), indices)))


def _located(problems, ids, name: str, file_rows: np.ndarray) -> pa.Array:
    """Each row's problem, named by its file, its row there (``file_rows``) and its id.

    A null problem: none.
    """
    problems = problems.combine_chunks() if isinstance(problems, pa.ChunkedArray) else problems
    if problems.null_count == len(problems):
        return problems
    out = problems.to_pylist()
    for row in np.flatnonzero(problems.is_valid().to_numpy(zero_copy_only=False)).tolist():
        identity = ids[row].as_py()
        named = "" if identity is None else f" (id {identity!r})"
        out[row] = f"{name} row {int(file_rows[row])}{named}: {out[row]}"
    return pa.array(out, pa.string())
