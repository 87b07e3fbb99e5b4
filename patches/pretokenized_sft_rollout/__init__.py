"""miles rollout function for rows built by fixed-SFT.

The function is ``pretokenized_sft_rollout.generate_rollout``; the recipe trains with::

    --prompt-data out/glm47flash-tulu3-fixed8192-v1.parquet --input-key messages
    --metadata-key metadata --rollout-function-path pretokenized_sft_rollout.generate_rollout
    --loss-type sft_loss --calculate-per-token-loss

miles reads ``--prompt-data`` row by row and keeps each row's ``metadata`` (the builder's
provenance, with ``row_index``) on its sample; the file has no ``messages`` column, so the
sample's ``prompt`` is ``None``, which nothing in the SFT path reads. This function fetches the
row's tokens and mask from the same file and fills the sample as miles' own ``sft_rollout``
does: ``tokens``, ``response_length``, ``loss_mask`` (the last ``response_length`` mask values)
and ``reward = 0``.

The response starts at ``s = max(first supervised token, 1)`` (``builders.rows.response_start``):
miles predicts response token ``t`` from the logit at ``t - 1`` of the packed sequence, so a
response that began at token 0 would take its first logit from the previous sample of the
micro-batch, or from nowhere for the first one (a crash in the loss). Token 0 of a row has no
token before it and is never a target; every supervised token at positions ``1 .. L - 1`` is
trained exactly once.
"""

from __future__ import annotations

import re

from builders.rows import RowReader, response_start

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
        _READERS[path] = RowReader(path)
    return _READERS[path]


def _row_index(sample, reader: RowReader) -> int:
    metadata = sample.metadata or {}
    if "row_index" not in metadata:
        raise ValueError(
            f"a sample from {reader.path} has no metadata.row_index: pass --metadata-key metadata "
            f"and a file built by fixed-SFT"
        )
    return int(metadata["row_index"])
