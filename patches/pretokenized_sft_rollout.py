"""miles rollout function for rows built by fixed-SFT: ``pretokenized_sft_rollout.generate_rollout``.

The recipe trains with::

    --prompt-data out/glm47flash-tulu3-fixed8192-v1.parquet --input-key messages
    --metadata-key metadata --rollout-function-path pretokenized_sft_rollout.generate_rollout
    --loss-type sft_loss --calculate-per-token-loss

miles reads ``--prompt-data`` row by row and keeps each row's ``metadata`` (the builder's
provenance, with ``row_index``) on its sample; this function fetches that row's tokens and
mask from the same file and fills the sample as miles' own ``sft_rollout`` does: ``tokens``,
``response_length`` (from the first supervised token to the end), ``loss_mask`` (the last
``response_length`` mask values) and ``reward = 0``.
"""

from __future__ import annotations

import re

import numpy as np

from builders.rows import RowReader

__all__ = ["generate_rollout"]

_READERS: dict[str, RowReader] = {}


def generate_rollout(args, rollout_id, data_buffer, evaluation=False):
    """Fill ``args.rollout_batch_size`` samples from the data buffer with their built rows."""
    if evaluation:
        raise ValueError("pretokenized_sft_rollout has no evaluation rollouts")
    reader = _reader(args.prompt_data)
    samples = data_buffer.get_samples(args.rollout_batch_size)
    for group in samples:
        for sample in group:
            row = reader[_row_index(sample, reader)]
            mask = row["loss_mask"]
            response_length = len(mask) - int(np.argmax(mask != 0))
            sample.tokens = row["input_ids"].tolist()
            sample.response_length = response_length
            sample.loss_mask = mask[-response_length:].tolist()
            sample.reward = 0
    return samples


def _reader(prompt_data: str) -> RowReader:
    path = re.sub(r"@\[-?\d*:-?\d*\]$", "", prompt_data)  # miles' "path@[start:end]" row slice
    if path not in _READERS:
        _READERS[path] = RowReader(path)
    return _READERS[path]


def _row_index(sample, reader: RowReader) -> int:
    metadata = sample.metadata or {}
    if "row_index" not in metadata:
        raise ValueError(f"a sample from {reader.path} has no metadata.row_index: pass --metadata-key metadata "
                         f"and a file built by fixed-SFT")
    return int(metadata["row_index"])
