"""Exports: the rows as other trainers read them, beside the row file.

The row file's bytes are pinned, so each export is a file of its own (docs/training.md):

- ``trl``: ``NAME.trl.parquet``, the columns TRL's ``SFTTrainer`` reads: ``input_ids``,
  ``assistant_masks`` (the loss mask), ``seq_lengths`` (the segments, for ``padding_free``), and
  ``row_index``;
- ``megatron-bridge``: ``NAME.idx.parquet``, Megatron-Bridge's packed parquet: ``input_ids``,
  ``seq_start_id`` (the segment starts) and ``loss_mask`` shifted as its collate reads it;
- ``miles``: ``NAME.miles.parquet``, a prompt file of what miles needs: each sample's
  ``metadata`` (``row_index``, ``epoch``) in training order, naming the row file in its footer.

Each is written whole or not at all, and records the row file's ``rows_sha256`` in its footer.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from builders.errors import UsageError, VerificationError
from builders.rows.epochs import WINDOW_GROUPS, epoch_order
from builders.rows.figures import RowHash
from builders.rows.rowfile import (
    ROW_GROUP_ROWS,
    WRITER_OPTIONS,
    check_row_file,
    iter_row_batches,
    open_row_file,
)
from builders.rows.segments import check_starts
from builders.runtime.atomic import outputs
from builders.training import EXPORT_SUFFIXES

# the footer keys every export carries
ROWS_KEY, ROWS_SHA256_KEY = b"fixed_sft.rows", b"fixed_sft.rows_sha256"
WINDOW_GROUPS_KEY = b"fixed_sft.window_groups"

TRL_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("assistant_masks", pa.list_(pa.uint8())),
        ("seq_lengths", pa.list_(pa.int32())),
        ("row_index", pa.int64()),
    ]
)
MEGATRON_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("seq_start_id", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
    ]
)
MILES_SCHEMA = pa.schema(
    [("metadata", pa.struct([("row_index", pa.int64()), ("epoch", pa.int32())]))]
)


def export(
    rows: Path,
    to: str,
    out_dir: Path | None = None,
    seed: int | None = None,
    epochs: int = 1,
    window_groups: int = WINDOW_GROUPS,
) -> Path:
    """Write the export ``to`` of the row file ``rows``; return its path.

    It goes in ``out_dir`` (default: beside ``rows``). ``seed``, ``epochs`` and
    ``window_groups`` give the miles prompt file's order (data/ROWS.md, "Reading order").
    """
    if to not in EXPORT_SUFFIXES:
        raise UsageError(f"unknown export {to!r} (known: {', '.join(EXPORT_SUFFIXES)})")
    if to != "miles" and (seed is not None or epochs != 1):
        raise UsageError(f"--seed and --epochs order the miles prompt file; {to} keeps file order")
    if epochs < 1:
        raise UsageError(f"--epochs must be 1 or more, not {epochs}")
    check_row_file(rows)
    out_dir = rows.parent if out_dir is None else out_dir
    name = rows.name.removesuffix(".parquet") + EXPORT_SUFFIXES[to]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{out_dir}: cannot make the output folder ({err.strerror})") from err
    with outputs(out_dir) as files:
        with files.writing(name) as staged:
            if to == "miles":
                _write_miles(rows, out_dir, staged.temporary, seed, epochs, window_groups)
            else:
                _write_rows_export(rows, to, staged.temporary, out_dir)
        files.commit(last=staged)
    return staged.final


def _write_rows_export(rows: Path, to: str, path: Path, out_dir: Path) -> None:
    """The TRL or Megatron-Bridge file: one row per row, in file order."""
    schema = TRL_SCHEMA if to == "trl" else MEGATRON_SCHEMA
    digest, first = RowHash(), 0
    with pq.ParquetWriter(path, schema, **WRITER_OPTIONS) as writer:
        for ids, mask, starts in iter_row_batches(rows):
            if starts is None:
                raise UsageError(f"{rows}: no metadata.segment_start; not a fixed-SFT row file")
            digest.add(ids, mask)
            columns = _trl_columns if to == "trl" else _megatron_columns
            writer.write_table(
                pa.Table.from_arrays(columns(rows, first, ids, mask, starts), schema=schema),
                row_group_size=ROW_GROUP_ROWS,
            )
            first += len(ids)
        writer.add_key_value_metadata(_footer(rows, digest.hexdigest(), out_dir))


def _trl_columns(rows, first, ids, mask, starts) -> list:
    width = ids.shape[1]
    lengths = [
        np.diff(np.append(_starts(rows, first + k, s, width), width)) for k, s in enumerate(starts)
    ]
    return [
        _matrix_lists(ids, pa.int32()),
        _matrix_lists(mask, pa.uint8()),
        _ragged_lists(lengths, pa.int32()),
        pa.array(np.arange(first, first + len(ids), dtype=np.int64)),
    ]


def _megatron_columns(rows, first, ids, mask, starts) -> list:
    """Megatron-Bridge's columns; its loss mask is shifted.

    Stored ``t`` weights the label at ``t + 1``: within each segment ``[b, e)``,
    ``loss_mask[t + 1]`` for ``b <= t < e - 1``, and 0 at ``e - 1``, as its
    ``fill_packing_strategy`` stores it.
    """
    width = ids.shape[1]
    shifted = np.zeros_like(mask, dtype=np.int8)
    shifted[:, :-1] = mask[:, 1:]
    checked = []
    for k, s in enumerate(starts):
        s = _starts(rows, first + k, s, width)
        shifted[k, s[1:] - 1] = 0
        checked.append(s)
    return [
        _matrix_lists(ids, pa.int32()),
        _ragged_lists(checked, pa.int32()),
        _matrix_lists(shifted, pa.int8()),
    ]


def _write_miles(rows, out_dir, path, seed, epochs, window_groups) -> None:
    """The miles prompt file: ``metadata`` per sample, epoch after epoch."""
    parquet = open_row_file(rows)
    sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)]
    digest = RowHash()
    for ids, mask, _ in iter_row_batches(rows, segments=False):
        digest.add(ids, mask)
    with pq.ParquetWriter(path, MILES_SCHEMA, **WRITER_OPTIONS) as writer:
        for epoch in range(epochs):
            order = epoch_order(sizes, seed, epoch, window_groups)
            metadata = pa.StructArray.from_arrays(
                [pa.array(order), pa.array(np.full(len(order), epoch, dtype=np.int32))],
                fields=list(MILES_SCHEMA.field("metadata").type),
            )
            writer.write_table(
                pa.Table.from_arrays([metadata], schema=MILES_SCHEMA), row_group_size=1 << 16
            )
        footer = _footer(rows, digest.hexdigest(), out_dir)
        footer[WINDOW_GROUPS_KEY] = str(window_groups).encode()
        writer.add_key_value_metadata(footer)


def _footer(rows: Path, rows_sha256: str, out_dir: Path) -> dict:
    """The row file and its ``rows_sha256``.

    The file's path is relative to the export's folder.
    """
    name = os.path.relpath(rows.resolve(), out_dir.resolve())
    return {ROWS_KEY: name.encode(), ROWS_SHA256_KEY: rows_sha256.encode()}


def _starts(rows: Path, index: int, starts, width: int) -> np.ndarray:
    try:
        return check_starts(starts, width)
    except ValueError as err:
        raise VerificationError(f"{rows}: row {index}: {err}") from err


def _matrix_lists(matrix: np.ndarray, kind: pa.DataType) -> pa.ListArray:
    rows, width = matrix.shape
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(matrix.reshape(-1), type=kind))


def _ragged_lists(arrays: list[np.ndarray], kind: pa.DataType) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int32)
    values = np.concatenate(arrays) if arrays else np.array([], dtype=np.int64)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=kind))
