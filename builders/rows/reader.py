"""Read a built row file back.

It offers random access, rank shards, epochs in a seeded order, resuming, document boundaries, and
bounded memory. Rows come back as dicts of numpy arrays (``input_ids`` int32, ``loss_mask``
uint8) with their ``index`` and provenance. The file is read a row group at a time and at most
one window of groups is held, so memory depends on the row-group size, not on the file's size.
Importing this module does not need torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from builders.errors import VerificationError
from builders.manifest import Manifest
from builders.rows import figures, segments
from builders.rows.epochs import WINDOW_GROUPS, epoch_order, rank_share
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
    pinned figures first, and a file that differs is refused. ``reader[i]`` holds up to
    ``cache_groups`` decoded row groups (a window's, to read an epoch order at random).
    """

    def __init__(
        self,
        path: str | Path,
        manifest: Manifest | None = None,
        verify: bool = False,
        cache_groups: int = 1,
    ):
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
                    + "".join(f"; {note}" for note in verification.notes)
                )
        self._parquet = open_row_file(self.path)
        self._columns = [c for c in COLUMNS if c in self._parquet.schema_arrow.names]
        self.group_sizes = [
            self._parquet.metadata.row_group(g).num_rows
            for g in range(self._parquet.metadata.num_row_groups)
        ]
        self._group_start = np.cumsum([0, *self.group_sizes], dtype=np.int64)
        # random access holds this many decoded groups
        self._groups = GroupCache(self, cache_groups)

    def __len__(self) -> int:
        return int(self._group_start[-1])

    def __getitem__(self, index: int) -> dict:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of a file of {len(self)} rows")
        return self._groups.row(index % len(self))

    def order(
        self, seed: int | None = None, epoch: int = 0, window_groups: int = WINDOW_GROUPS
    ) -> np.ndarray:
        """The row indices in epoch ``epoch``'s reading order (data/ROWS.md).

        Without a seed, the file order.
        """
        return epoch_order(self.group_sizes, seed, epoch, window_groups)

    def shard(
        self,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
        *,
        seed: int | None = None,
        epoch: int = 0,
        window_groups: int = WINDOW_GROUPS,
        remainder: str = "drop",
    ) -> np.ndarray:
        """The row indices ``rows`` yields with the same arguments, in order."""
        return rank_share(
            self.order(seed, epoch, window_groups), rank, world_size, start, remainder
        )

    def rows(
        self,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
        *,
        seed: int | None = None,
        epoch: int = 0,
        window_groups: int = WINDOW_GROUPS,
        remainder: str = "drop",
        boundaries: bool = False,
    ) -> Iterator[dict]:
        """This rank's rows of one epoch, in the reading order.

        Rank ``rank`` takes the positions ``p >= start`` of the order with
        ``p ≡ rank (mod world_size)``; the ranks' shares are disjoint and equal, ``remainder``
        saying what happens to the last ``N mod world_size`` positions (``drop``: left out;
        ``wrap``: the first positions again). A job that consumed ``k`` rows per rank resumes at
        ``start = k * world_size``. ``seed`` shuffles (a new order each ``epoch``); without it the
        order is the file's. ``boundaries=True`` adds each row's ``position_ids`` and
        ``seq_lengths`` (its segments, data/ROWS.md).
        """
        indices = self.shard(
            start,
            rank,
            world_size,
            seed=seed,
            epoch=epoch,
            window_groups=window_groups,
            remainder=remainder,
        )
        return self.rows_at(indices, boundaries, cache_groups=1 if seed is None else window_groups)

    def rows_at(
        self, indices, boundaries: bool = False, cache_groups: int = WINDOW_GROUPS
    ) -> Iterator[dict]:
        """The rows at ``indices``, in that order.

        Up to ``cache_groups`` decoded groups are held.
        """
        groups = GroupCache(self, cache_groups)
        for index in indices:
            row = groups.row(int(index))
            yield with_boundaries(self.path, row) if boundaries else row


class GroupCache:
    """A reader's decoded row groups, the least recently used dropped."""

    def __init__(self, reader: RowReader, capacity: int):
        self.reader, self.capacity = reader, max(1, capacity)
        self._groups: OrderedDict[int, list[dict]] = OrderedDict()
        self.decoded = 0

    def row(self, index: int) -> dict:
        starts = self.reader._group_start
        group = int(np.searchsorted(starts, index, side="right") - 1)
        if group not in self._groups:
            self._groups[group] = self._decode(group)
            self.decoded += 1
            while len(self._groups) > self.capacity:
                self._groups.popitem(last=False)
        self._groups.move_to_end(group)
        return self._groups[group][index - int(starts[group])]

    def _decode(self, group: int) -> list[dict]:
        reader = self.reader
        table = read_group(reader.path, reader._parquet, group, reader._columns)
        ids, mask = token_matrices(reader.path, table)
        metadata = (
            table.column("metadata").to_pylist()
            if "metadata" in reader._columns
            else [{}] * len(ids)
        )
        first = int(reader._group_start[group])
        return [
            {"index": first + i, "input_ids": ids[i], "loss_mask": mask[i], **(meta or {})}
            for i, meta in enumerate(metadata)
        ]


def with_boundaries(path: Path, row: dict) -> dict:
    """``row`` with its ``position_ids`` and ``seq_lengths``.

    They come from its ``segment_start``; a damaged one is a VerificationError.
    """
    length = len(row["input_ids"])
    if row.get("segment_start") is None:
        raise VerificationError(
            f"{path}: row {row['index']} has no metadata.segment_start: its boundaries are unknown"
        )
    try:
        return {
            **row,
            "position_ids": segments.position_ids(row["segment_start"], length),
            "seq_lengths": segments.seq_lengths(row["segment_start"], length),
        }
    except ValueError as err:
        raise VerificationError(f"{path}: row {row['index']}: {err}") from err
