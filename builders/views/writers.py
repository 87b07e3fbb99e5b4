"""Writer variants: how a published row file might have been written.

``explain --writer`` tries them. A parquet file's size is a fingerprint of how it was written: the
writer, its column types, compression, encodings and row groups. It hardly depends on the pyarrow
version (the version appears in the footer as ``parquet-cpp-arrow version X.Y.Z``, the same length
for every release with two-digit major and one-digit minor and patch numbers), while the file's
sha256 does. So a writer variant that gives the pinned ``parquet_bytes`` names the writer; one that
also gives the pinned ``parquet_sha256`` names the pyarrow version too, and ``expect.writer`` can be
pinned.

The set tried: this project's writer (``builders.rows.rowfile``: zstd level 3, no dictionary, no
statistics, 64 rows per row group, ``input_ids`` list<int32>, ``loss_mask`` list<uint8>, a
``metadata`` column), and ``pyarrow.parquet.write_table`` with pyarrow's defaults and
``datasets.Dataset.to_parquet``, each with ``input_ids`` int32 or int64, ``loss_mask`` uint8,
int8, int64 or bool, with and without the ``metadata`` column: 33 files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from builders.inputs.digest import file_digest

ID_TYPES = {"int32": pa.int32(), "int64": pa.int64()}
MASK_TYPES = {"uint8": pa.uint8(), "int8": pa.int8(), "int64": pa.int64(), "bool": pa.bool_()}


@dataclass(frozen=True)
class WriterVariant:
    # "fixed-sft", "pyarrow" (write_table's defaults) or "datasets" (Dataset.to_parquet)
    writer: str
    ids: str
    mask: str
    metadata: bool

    @property
    def name(self) -> str:
        if self.writer == "fixed-sft":
            return "fixed-sft"
        metadata = "with" if self.metadata else "no"
        return f"{self.writer}, input_ids {self.ids}, loss_mask {self.mask}, {metadata} metadata"


VARIANTS = [WriterVariant("fixed-sft", "int32", "uint8", True)] + [
    WriterVariant(writer, ids, mask, metadata)
    for writer in ("pyarrow", "datasets")
    for ids in ID_TYPES
    for mask in MASK_TYPES
    for metadata in (True, False)
]


@dataclass(frozen=True)
class Written:
    variant: WriterVariant
    bytes: int
    sha256: str

    def as_dict(self, expect) -> dict:
        """For --json: the variant, the file's figures, and whether they match.

        A match is with ``expect``'s figures (None: not pinned).
        """
        pinned_bytes, pinned_sha = expect.parquet_bytes, expect.parquet_sha256
        return {
            "writer": self.variant.writer,
            "input_ids": self.variant.ids,
            "loss_mask": self.variant.mask,
            "metadata": self.variant.metadata,
            "parquet_bytes": self.bytes,
            "parquet_sha256": self.sha256,
            "bytes_match": None if pinned_bytes is None else self.bytes == pinned_bytes,
            "sha256_match": None if pinned_sha is None else self.sha256 == pinned_sha,
        }


def try_writers(built: Path, folder: Path) -> Iterator[Written]:
    """Write the rows of ``built`` as each writer variant does.

    ``built`` is a file this project wrote; the variants write one at a time.
    """
    table = pq.read_table(built)
    sha256, size = file_digest(built)
    yield Written(VARIANTS[0], size, sha256)
    for number, variant in enumerate(VARIANTS[1:], 1):
        path = folder / f"writer-{number}.parquet"
        written = _written_table(table, variant)
        if variant.writer == "pyarrow":
            pq.write_table(written, path)
        else:
            _datasets_to_parquet(written, path)
        sha256, size = file_digest(path)
        path.unlink()
        yield Written(variant, size, sha256)


def _written_table(table: pa.Table, variant: WriterVariant) -> pa.Table:
    columns = {
        "input_ids": table.column("input_ids").cast(pa.list_(ID_TYPES[variant.ids])),
        "loss_mask": table.column("loss_mask").cast(pa.list_(MASK_TYPES[variant.mask])),
    }
    if variant.metadata:
        columns["metadata"] = table.column("metadata")
    return pa.table(columns)


def _datasets_to_parquet(table: pa.Table, path: Path) -> None:
    """``datasets.Dataset.to_parquet`` with its defaults.

    Its progress bars are off.
    """
    import datasets

    was_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        datasets.Dataset(table).to_parquet(str(path))
    finally:
        if not was_off:
            datasets.enable_progress_bars()
