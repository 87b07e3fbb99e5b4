"""Rows: the stream cut into rows, the parquet, its figures and card.

The parquet is written and read back. ``order`` (the seeded permutation), ``packing`` (conversations
joined by EOS, cut into rows), ``rowfile`` (the byte-deterministic parquet), ``segments`` (a row's
conversations), ``figures`` (hashes, verification), ``stats`` and ``card`` (what a build consumed,
the data card), ``epochs`` (the reading order of an epoch, ranks' shares) and ``reader``
(``RowReader``: the file read back).
"""

from builders.rows.reader import RowReader, response_start

__all__ = ["RowReader", "response_start", "torch_dataset"]


def __getattr__(name: str):
    """``torch_dataset``, imported on first use.

    It lives in builders.training.
    """
    # documented here before builders.training held it
    if name == "torch_dataset":
        from builders.training.dataset import torch_dataset

        return torch_dataset
    raise AttributeError(f"module 'builders.rows' has no attribute {name!r}")
