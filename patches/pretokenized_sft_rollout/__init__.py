"""miles rollout function for rows built by fixed-SFT.

The function is ``pretokenized_sft_rollout.generate_rollout``; the recipe trains with::

    --prompt-data out/glm47flash-tulu3-fixed8192-v1.miles.parquet --input-key messages
    --metadata-key metadata --rollout-function-path pretokenized_sft_rollout.generate_rollout
    --loss-type sft_loss --calculate-per-token-loss

``--prompt-data`` is the prompt file ``fixed-sft export --to miles`` writes: each sample's
``metadata`` (``row_index``, ``epoch``) in training order, the row file named in its footer; or
the row file itself, whose rows carry ``metadata`` with ``row_index`` (miles then turns every
token into a Python object just to keep that metadata). Neither has a ``messages`` column, so the
sample's ``prompt`` is ``None``, which nothing in the SFT path reads. This function fetches the
row's tokens and mask from the row file and fills the sample as miles' own ``sft_rollout`` does:
``tokens``, ``response_length``, ``loss_mask`` (the last ``response_length`` mask values) and
``reward = 0``.

The response starts at ``s = max(first supervised token, 1)`` (``builders.rows.response_start``):
miles predicts response token ``t`` from the logit at ``t - 1`` of the packed sequence, so a
response that began at token 0 would take its first logit from the previous sample of the
micro-batch, or from nowhere for the first one (a crash in the loss). Token 0 of a row has no
token before it and is never a target; every supervised token at positions ``1 .. L - 1`` is
trained exactly once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq

from builders.rows import RowReader, response_start
from builders.rows.figures import RowHash
from builders.rows.rowfile import iter_token_batches
from builders.training.exports import ROWS_KEY, ROWS_SHA256_KEY, WINDOW_GROUPS_KEY

__all__ = ["generate_rollout"]

_READERS: dict[str, RowReader] = {}


def generate_rollout(args, rollout_id, data_buffer, evaluation=False):
    """Fill samples from the data buffer with their built rows.

    It takes ``args.rollout_batch_size`` samples from the buffer.
    """
    if evaluation:
        raise ValueError("pretokenized_sft_rollout has no evaluation rollouts")
    reader = _reader(args.prompt_data)
    samples = data_buffer.get_samples(args.rollout_batch_size)
    for group in samples:
        for sample in group:
            row = reader[_row_index(sample, reader)]
            start = response_start(row["loss_mask"])
            sample.tokens = row["input_ids"].tolist()
            sample.response_length = len(sample.tokens) - start
            sample.loss_mask = row["loss_mask"][start:].tolist()
            sample.reward = 0
    return samples


def _reader(prompt_data: str) -> RowReader:
    # miles' "path@[start:end]" row slice
    path = re.sub(r"@\[-?\d*:-?\d*\]$", "", prompt_data)
    if path not in _READERS:
        _READERS[path] = _rows_of(Path(path))
    return _READERS[path]


def _rows_of(prompt_file: Path) -> RowReader:
    """The row file: ``prompt_file`` itself, or the one it names.

    A prompt file names its row file and that file's ``rows_sha256``, checked here once.
    """
    parquet = pq.ParquetFile(prompt_file)
    if "input_ids" in parquet.schema_arrow.names:
        return RowReader(prompt_file)
    footer = parquet.metadata.metadata or {}
    if ROWS_KEY not in footer:
        raise ValueError(
            f"{prompt_file}: neither a row file (no input_ids column) nor a prompt file written "
            "by `fixed-sft export --to miles` (its footer names no row file)"
        )
    rows = prompt_file.parent / footer[ROWS_KEY].decode()
    digest = RowHash()
    for ids, mask in iter_token_batches(rows):
        digest.add(ids, mask)
    if digest.hexdigest() != footer[ROWS_SHA256_KEY].decode():
        raise ValueError(
            f"{prompt_file} was written for rows with rows_sha256 "
            f"{footer[ROWS_SHA256_KEY].decode()}, and {rows} holds others ({digest.hexdigest()}): "
            "export the prompt file again from this row file"
        )
    # one window of the reading order at a time: each group is decoded once an epoch
    return RowReader(rows, cache_groups=int(footer.get(WINDOW_GROUPS_KEY, b"1")))


def _row_index(sample, reader: RowReader) -> int:
    metadata = sample.metadata or {}
    if "row_index" not in metadata:
        raise ValueError(
            f"a sample from {reader.path} has no metadata.row_index: pass --metadata-key metadata "
            f"and a file built by fixed-SFT"
        )
    return int(metadata["row_index"])
