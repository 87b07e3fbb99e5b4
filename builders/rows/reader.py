"""Read a built row file back.

It offers random access, disjoint shards, resuming, and bounded memory. Rows come back as dicts of
numpy arrays (``input_ids`` int32, ``loss_mask`` uint8) with their ``index`` and provenance. The
file is read one row group at a time, so memory depends on the row-group size, not on the file's
size. Importing this module does not need torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from builders.errors import VerificationError
from builders.manifest import Manifest
from builders.rows import figures
from builders.rows.rowfile import open_row_file, read_group, token_matrices

COLUMNS = ("input_ids", "loss_mask", "metadata")


def response_start(loss_mask) -> int:
    """Where a row's trained response starts.

    It starts at its first supervised token, and never at token 0.

    Training predicts token ``t`` from the logits at ``t - 1`` of the same row, so token 0 of a
    row can never be a target. As a sample, a row of ``L`` tokens has the prompt ``[0, s)`` and
    the response ``[s, L)`` with ``s = max(first supervised token, 1)``: every supervised token
    at positions ``1 .. L - 1`` is trained exactly once, and a supervised token 0 is not.
    """
    supervised = np.flatnonzero(np.asarray(loss_mask))
    return max(int(supervised[0]) if supervised.size else 1, 1)


class RowReader:
    """The rows of one built parquet file.

    With ``manifest`` and ``verify=True`` the whole file is checked against the manifest's
    pinned figures first, and a file that differs is refused.
    """

    def __init__(self, path: str | Path, manifest: Manifest | None = None, verify: bool = False):
        self.path = Path(path)
        if verify:
            if manifest is None:
                raise ValueError("verify=True needs the manifest to verify against")
            verification = figures.verify(
                figures.file_figures(self.path, manifest.row_tokens, manifest.contract.hash),
                manifest,
            )
            if not verification.verified:
                raise VerificationError(
                    f"{self.path}: does not match {manifest.name}: {verification.summary()}"
                )
        self._parquet = open_row_file(self.path)
        self._columns = [c for c in COLUMNS if c in self._parquet.schema_arrow.names]
        sizes = [
            self._parquet.metadata.row_group(g).num_rows
            for g in range(self._parquet.metadata.num_row_groups)
        ]
        self._group_start = np.cumsum([0, *sizes], dtype=np.int64)
        self._cached: tuple[int, list[dict]] | None = None

    def __len__(self) -> int:
        return int(self._group_start[-1])

    def __getitem__(self, index: int) -> dict:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of a file of {len(self)} rows")
        index %= len(self)
        group = int(np.searchsorted(self._group_start, index, side="right") - 1)
        return self._group(group)[index - int(self._group_start[group])]

    def rows(self, start: int = 0, rank: int = 0, world_size: int = 1) -> Iterator[dict]:
        """Rows ``i >= start`` with ``i % world_size == rank``, in order.

        The shards of ranks ``0 .. world_size - 1`` are disjoint and together hold every row;
        a job that consumed ``k`` rows per rank resumes at ``start = k * world_size``.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        first = start + (rank - start) % world_size
        for index in range(first, len(self), world_size):
            yield self[index]

    def _group(self, group: int) -> list[dict]:
        if self._cached is None or self._cached[0] != group:
            table = read_group(self.path, self._parquet, group, self._columns)
            ids, mask = token_matrices(self.path, table)
            metadata = (
                table.column("metadata").to_pylist()
                if "metadata" in self._columns
                else [{}] * len(ids)
            )
            first = int(self._group_start[group])
            self._cached = (
                group,
                [
                    {"index": first + i, "input_ids": ids[i], "loss_mask": mask[i], **(meta or {})}
                    for i, meta in enumerate(metadata)
                ],
            )
        return self._cached[1]


def worker_shard(rank: int, world_size: int, worker: int, workers: int) -> tuple[int, int]:
    """The (rank, world_size) of one data-loader worker of one training rank.

    The workers of a rank split that rank's rows (``i % world_size == rank``) among themselves.
    """
    return rank + world_size * worker, world_size * workers
