"""The built parquet file: its schema, a writer and a streaming reader.

The writer is byte-deterministic. The file's bytes are a pure function of the rows and the pyarrow
version: every writer option is explicit, tables are built from numpy (no pandas), and row groups
hold exactly ``ROW_GROUP_ROWS`` rows (the last one the rest).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from builders.errors import UsageError, VerificationError
from builders.rows.packing import Row

ROW_GROUP_ROWS = 64
PARQUET_MAGIC = b"PAR1"  # a parquet file begins and ends with it
# the leaf of the metadata that holds each row's segments (data/ROWS.md, "Segments")
SEGMENT_START = "metadata.segment_start"
METADATA_TYPE = pa.struct(
    [
        ("row_index", pa.int64()),
        ("source_index", pa.list_(pa.int64())),
        ("source_id", pa.list_(pa.string())),
        ("segment_start", pa.list_(pa.int32())),
    ]
)
SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("metadata", METADATA_TYPE),
    ]
)
WRITER_OPTIONS = dict(
    version="2.6",
    compression="zstd",
    compression_level=3,
    use_dictionary=False,
    write_statistics=False,
    write_page_index=False,
    write_page_checksum=False,
    use_byte_stream_split=False,
    data_page_version="1.0",
    data_page_size=1 << 20,
    write_batch_size=1024,
    store_schema=True,
    use_compliant_nested_type=True,
)


def writer_version() -> str:
    """The writer's version, as a manifest's ``expect.writer`` records it."""
    return f"pyarrow {pa.__version__}"


@dataclass(frozen=True)
class RowGroup:
    """Consecutive rows stacked, as one row group of the file holds them (``RowWriter.write``)."""

    input_ids: np.ndarray  # int32, rows × row length
    loss_mask: np.ndarray  # uint8, rows × row length
    source_index: list[list[int]]
    source_id: list[list[str]]
    segment_start: list[list[int]]

    @classmethod
    def of(cls, rows: list[Row]) -> RowGroup:
        return cls(
            np.stack([r.input_ids for r in rows]).astype(np.int32, copy=False),
            np.stack([r.loss_mask for r in rows]).astype(np.uint8, copy=False),
            [r.source_index for r in rows],
            [r.source_id for r in rows],
            [r.segment_start for r in rows],
        )


class RowWriter:
    """Writes rows to ``path`` in fixed-size row groups.

    Each row group's rows are stacked (``RowGroup``) as it completes, and handed to a thread of
    its own that makes the group's table from those arrays (no copy of the tokens) and compresses
    it. Row groups are written in order by one thread (pyarrow compresses without the GIL), at most
    ``IN_FLIGHT`` of them waiting. A write error of that thread (a full disk) is raised, as the
    OSError it is, by a later ``write`` or by ``close``; pyarrow has then closed the file, so the
    writer is abandoned, not closed again. As a context manager: the block's end closes the file
    (``close``), an exception out of it abandons it (``abandon``).
    """

    IN_FLIGHT = 2

    def __init__(self, path: Path):
        self._writer = pq.ParquetWriter(path, SCHEMA, **WRITER_OPTIONS)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="row-writer")
        self._flushing: deque = deque()
        self._pending: list[Row] = []
        self._written = 0

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()

    def write(self, row: Row) -> RowGroup | None:
        """Add ``row``; the row group it completes (handed to the writer's thread), if any."""
        self._pending.append(row)
        if len(self._pending) == ROW_GROUP_ROWS:
            return self.hand_over()
        return None

    def hand_over(self) -> RowGroup | None:
        """Hand the rows not yet written to the writer's thread as a row group; return it, if any.

        ``write`` does it for each full group; after the last row, the caller does it to have the
        last group (``close`` does it too).
        """
        if not self._pending:
            return None
        group, self._pending = RowGroup.of(self._pending), []
        while len(self._flushing) >= self.IN_FLIGHT:
            self._flushing.popleft().result()
        self._flushing.append(self._thread.submit(self._write_group, group, self._written))
        self._written += len(group.input_ids)
        return group

    def close(self) -> None:
        """Write the last row group and the footer.

        Raise the first write error, if any.
        """
        try:
            self.hand_over()
            while self._flushing:
                self._flushing.popleft().result()
            self._thread.shutdown(wait=True)
            self._writer.close()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Stop writing, and close the file as it is.

        The rows not yet written are dropped and the thread finishes. The errors of what the thread
        still had to write are those already raised, or their consequences.
        """
        self._pending = []
        self._thread.shutdown(wait=True, cancel_futures=True)
        with suppress(pa.ArrowException, OSError):
            self._writer.close()

    def _write_group(self, group: RowGroup, first_index: int) -> None:
        """Write ``group`` as one row group (in the writer's thread: the table is made there)."""
        self._writer.write_table(_table(group, first_index), row_group_size=len(group.input_ids))


def _table(group: RowGroup, first_index: int) -> pa.Table:
    count = len(group.input_ids)
    metadata = pa.StructArray.from_arrays(
        [
            pa.array(np.arange(first_index, first_index + count, dtype=np.int64)),
            _lists([np.asarray(s, dtype=np.int64) for s in group.source_index], pa.int64()),
            pa.array(group.source_id, type=pa.list_(pa.string())),
            _lists([np.asarray(s, dtype=np.int32) for s in group.segment_start], pa.int32()),
        ],
        fields=list(METADATA_TYPE),
    )
    return pa.Table.from_arrays(
        [_rows(group.input_ids, pa.int32()), _rows(group.loss_mask, pa.uint8()), metadata],
        schema=SCHEMA,
    )


def _rows(matrix: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """The rows of a 2-D array as a list array over its own buffer."""
    count, width = matrix.shape
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(width)
    values = pa.array(matrix.reshape(-1), type=value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _lists(arrays: list[np.ndarray], value_type: pa.DataType) -> pa.ListArray:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.array([], dtype=value_type.to_pandas_dtype())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type))


def check_row_file(path: Path) -> None:
    """Refuse a row file that is missing or is not parquet, as bad input."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(max(0, path.stat().st_size - 4))
        tail = f.read(4)
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC:
        raise UsageError(f"{path}: not a parquet file")


def open_row_file(path: Path) -> pq.ParquetFile:
    """Open a built row file.

    A file that is damaged is a VerificationError, one of another kind bad input.
    """
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise VerificationError(f"{path}: cannot read the parquet file: {err}") from err
    for name in ("input_ids", "loss_mask"):
        if name not in parquet.schema_arrow.names:
            raise UsageError(f"{path}: no column {name!r}; not a fixed-SFT row file")
    return parquet


def read_group(
    path: Path, parquet: pq.ParquetFile, group: int, columns=("input_ids", "loss_mask")
) -> pa.Table:
    try:
        return parquet.read_row_group(group, columns=list(columns))
    except (pa.ArrowException, OSError) as err:
        raise VerificationError(f"{path}: cannot read row group {group}: {err}") from err


def token_matrices(path: Path, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A table's ``input_ids`` and ``loss_mask`` as 2-D arrays.

    Each is rows × row length.
    """
    return (
        _matrix(path, table.column("input_ids").combine_chunks(), np.int32),
        _matrix(path, table.column("loss_mask").combine_chunks(), np.uint8),
    )


def iter_token_batches(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(input_ids, loss_mask)`` per row group, as 2-D arrays.

    Each is rows × row length.
    """
    for ids, mask, _ in iter_row_batches(path, segments=False):
        yield ids, mask


def iter_row_batches(
    path: Path, segments: bool = True
) -> Iterator[tuple[np.ndarray, np.ndarray, list[np.ndarray] | None]]:
    """Yield ``(input_ids, loss_mask, segment starts)`` per row group.

    The starts are each row's ``metadata.segment_start``, None where the file has none (or with
    ``segments=False``); of the metadata only that leaf is read.
    """
    parquet = open_row_file(path)
    segments = segments and "metadata" in parquet.schema_arrow.names
    columns = ("input_ids", "loss_mask", *([SEGMENT_START] if segments else []))
    for group in range(parquet.metadata.num_row_groups):
        table = read_group(path, parquet, group, columns)
        yield (*token_matrices(path, table), segment_starts(path, table) if segments else None)


def segment_starts(path: Path, table: pa.Table) -> list[np.ndarray]:
    """Each row's ``metadata.segment_start`` of a table read with that leaf."""
    metadata = table.column("metadata").combine_chunks()
    if "segment_start" not in [field.name for field in metadata.type]:
        raise VerificationError(f"{path}: its metadata has no segment_start")
    lists = metadata.field("segment_start")
    if lists.null_count:
        raise VerificationError(f"{path}: a row has no metadata.segment_start")
    offsets = lists.offsets.to_numpy()
    values = lists.flatten().to_numpy(zero_copy_only=False)
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(lists))]


def _matrix(path: Path, lists: pa.ListArray, dtype) -> np.ndarray:
    lengths = np.diff(lists.offsets.to_numpy())
    if lists.null_count or (lengths.size and (lengths != lengths[0]).any()):
        raise VerificationError(
            f"{path}: rows of unequal length or null rows in column {lists.type}"
        )
    width = int(lengths[0]) if lengths.size else 0
    return (
        lists.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(-1, width)
    )
