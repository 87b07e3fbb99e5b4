"""The rows as a torch ``IterableDataset`` that resumes exactly.

Each rank reads its share of an epoch's reading order (``RowReader.rows``); the data-loader
workers of a rank take blocks of ``batch_size`` rows in turn, so the loader yields the rank's
share in order for any number of workers. ``state_dict()`` and ``load_state_dict()`` follow
torchdata's ``Stateful`` protocol, which its ``StatefulDataLoader`` uses (one state per worker).
torch is not a dependency of this project; this module needs it installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builders.rows.epochs import WINDOW_GROUPS, check_order_options, worker_blocks
from builders.rows.reader import RowReader

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as err:
    raise ImportError("torch_dataset needs torch, which fixed-SFT does not install") from err

STATE_FORMAT = "fixed-sft-rows/1"
# a state's fields that name the stream it belongs to: another value is another stream
STREAM_FIELDS = ("rows", "seed", "window_groups", "remainder", "rank", "world_size", "batch_size")


def torch_dataset(
    path: str | Path,
    rank: int = 0,
    world_size: int = 1,
    start: int = 0,
    *,
    seed: int | None = None,
    epoch: int = 0,
    batch_size: int = 1,
    window_groups: int = WINDOW_GROUPS,
    remainder: str = "drop",
    boundaries: bool = False,
) -> RowDataset:
    """A torch ``IterableDataset`` of this rank's rows.

    The arguments are ``RowReader.rows``'s; ``batch_size`` is the data loader's (1 with
    ``batch_size=None``). Rows are dicts of int64 tensors (``input_ids``, ``loss_mask``, and
    with ``boundaries`` ``position_ids`` and ``seq_lengths``) with their ``index``.
    """
    return RowDataset(
        path,
        rank,
        world_size,
        start,
        seed=seed,
        epoch=epoch,
        batch_size=batch_size,
        window_groups=window_groups,
        remainder=remainder,
        boundaries=boundaries,
    )


class RowDataset(IterableDataset):
    """One rank's rows of a built file, epoch by epoch, resumable.

    ``set_epoch(e)`` picks the epoch of the next ``iter()`` (persistent workers see it too).
    """

    def __init__(
        self,
        path,
        rank,
        world_size,
        start,
        *,
        seed,
        epoch,
        batch_size,
        window_groups,
        remainder,
        boundaries,
    ):
        check_order_options(seed, epoch, window_groups)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, not {batch_size!r}")
        self.path, self.boundaries = Path(path), boundaries
        reader = RowReader(self.path)
        # checks rank, start and remainder
        reader.shard(start, rank, world_size, remainder=remainder)
        self._stream = {
            "rows": len(reader),
            "seed": seed,
            "window_groups": window_groups,
            "remainder": remainder,
            "rank": rank,
            "world_size": world_size,
            "batch_size": batch_size,
        }
        self.start = start
        # shared memory: a worker's copy sees set_epoch
        self._epoch = torch.tensor([epoch], dtype=torch.int64).share_memory_()
        # the running iterator's progress; None before it yields
        self._progress: dict | None = None
        # a loaded state, for the next iter() of its epoch
        self._resume: dict | None = None

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        check_order_options(self._stream["seed"], epoch, self._stream["window_groups"])
        self._epoch[0] = epoch
        if self._progress is not None and self._progress["epoch"] != epoch:
            self._progress = None

    def __len__(self) -> int:
        """This rank's rows an epoch."""
        return len(self._share(RowReader(self.path)))

    def state_dict(self) -> dict:
        """Where this copy stands in its share of an epoch.

        The rows it has yielded, and what names its stream; JSON-able. ``worker`` and
        ``workers`` are None before the first row.
        """
        progress = self._progress or {
            "epoch": self.epoch,
            "worker": None,
            "workers": None,
            "yielded": 0,
        }
        return {"format": STATE_FORMAT, **self._stream, "start": self.start, **progress}

    def load_state_dict(self, state: dict) -> None:
        """Resume from a ``state_dict()``.

        The next ``iter()`` continues after it. A state of another stream (file length, seed,
        ranks, batch size, ...) is refused.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a state of a fixed-SFT row dataset: {state!r:.200}")
        for key in STREAM_FIELDS:
            if state.get(key) != self._stream[key]:
                raise ValueError(
                    f"the state is of another stream: its {key} is {state.get(key)!r}, this "
                    f"dataset's {self._stream[key]!r} (another number of ranks or workers resumes "
                    "with start=k * batch_size * world_size after k batches)"
                )
        self.start = int(state["start"])
        self.set_epoch(int(state["epoch"]))
        self._resume = dict(state)
        self._progress = None

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        epoch, skip = self.epoch, 0
        resume, self._resume = self._resume, None
        if resume is not None and resume["epoch"] == epoch and resume["workers"] is not None:
            if (resume["worker"], resume["workers"]) != (worker, workers):
                raise ValueError(
                    f"the state is of loader worker {resume['worker']} of {resume['workers']}, "
                    f"this is worker {worker} of {workers}: resume with start= instead"
                )
            skip = int(resume["yielded"])
        reader = RowReader(self.path)
        mine = worker_blocks(
            self._share(reader, epoch), self._stream["batch_size"], worker, workers
        )
        progress = {"epoch": epoch, "worker": worker, "workers": workers, "yielded": skip}
        rows = reader.rows_at(mine[skip:], self.boundaries, self._cache_groups())
        for row in rows:
            progress["yielded"] += 1
            self._progress = progress
            yield self._tensors(row)

    def _share(self, reader: RowReader, epoch: int | None = None) -> np.ndarray:
        stream = self._stream
        return reader.shard(
            self.start,
            stream["rank"],
            stream["world_size"],
            seed=stream["seed"],
            epoch=self.epoch if epoch is None else epoch,
            window_groups=stream["window_groups"],
            remainder=stream["remainder"],
        )

    def _cache_groups(self) -> int:
        return 1 if self._stream["seed"] is None else self._stream["window_groups"]

    def _tensors(self, row: dict) -> dict:
        out = {"index": row["index"]}
        keys = (
            "input_ids",
            "loss_mask",
            *(("position_ids", "seq_lengths") if self.boundaries else ()),
        )
        for key in keys:
            out[key] = torch.from_numpy(row[key].astype(np.int64))
        return out
