"""The rows as a torch ``IterableDataset``.

They are split among ranks and data-loader workers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builders.rows.reader import RowReader, worker_shard


def torch_dataset(path: str | Path, rank: int = 0, world_size: int = 1, start: int = 0):
    """A torch ``IterableDataset`` of this rank's rows.

    A ``torch.utils.data.IterableDataset`` of this rank's rows, split among loader workers.

    Rows are dicts of tensors (``input_ids`` int64, ``loss_mask`` int64) with their ``index``.
    torch is not a dependency of this project; this needs it installed.
    """
    try:
        import torch
        from torch.utils.data import IterableDataset, get_worker_info
    except ImportError as err:
        raise ImportError("torch_dataset needs torch, which fixed-SFT does not install") from err

    class RowDataset(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            shard = (
                worker_shard(rank, world_size, info.id, info.num_workers)
                if info
                else (rank, world_size)
            )
            for row in RowReader(path).rows(start, *shard):
                yield {
                    "index": row["index"],
                    "input_ids": torch.from_numpy(row["input_ids"].astype(np.int64)),
                    "loss_mask": torch.from_numpy(row["loss_mask"].astype(np.int64)),
                }

    return RowDataset()
