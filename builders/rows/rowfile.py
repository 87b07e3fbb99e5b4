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


class RowWriter:
    """Writes rows to ``path`` in fixed-size row groups.

    It makes each row group's table and compresses it in a thread of its own. Row groups are
    written in order by one thread (pyarrow compresses without the GIL), at most ``IN_FLIGHT`` of
    them waiting. A write error of that thread
    (a full disk) is raised, as the OSError it is, by a later ``write`` or by ``close``; pyarrow has
    then closed the file, so the writer is abandoned, not closed again. As a context manager: the
    block's end closes the file (``close``), an exception out of it abandons it (``abandon``).
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

    def write(self, row: Row) -> None:
        self._pending.append(row)
        if len(self._pending) == ROW_GROUP_ROWS:
            self._flush()

    def close(self) -> None:
        """Write the last row group and the footer.

        Raise the first write error, if any.
        """
        try:
            self._flush()
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

    def _flush(self) -> None:
        if self._pending:
            rows, self._pending = self._pending, []
            while len(self._flushing) >= self.IN_FLIGHT:
                self._flushing.popleft().result()
            self._flushing.append(self._thread.submit(self._write_group, rows, self._written))
            self._written += len(rows)

    def _write_group(self, rows: list[Row], first_index: int) -> None:
        """Write ``rows`` as one row group (in the writer's thread: the table is made there too)."""
        self._writer.write_table(_table(rows, first_index), row_group_size=len(rows))


def _table(rows: list[Row], first_index: int) -> pa.Table:
    metadata = pa.StructArray.from_arrays(
        [
            pa.array(np.arange(first_index, first_index + len(rows), dtype=np.int64)),
            _lists([np.asarray(r.source_index, dtype=np.int64) for r in rows], pa.int64()),
            pa.array([r.source_id for r in rows], type=pa.list_(pa.string())),
            _lists([np.asarray(r.segment_start, dtype=np.int32) for r in rows], pa.int32()),
        ],
        fields=list(METADATA_TYPE),
    )
    return pa.Table.from_arrays(
        [
            _lists([r.input_ids for r in rows], pa.int32()),
            _lists([r.loss_mask for r in rows], pa.uint8()),
            metadata,
        ],
        schema=SCHEMA,
    )


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
