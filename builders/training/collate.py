"""Batches that keep a row's conversations apart (its segments).

``collate_boundaries`` flattens rows read with ``boundaries=True`` into one sequence with the
varlen flash-attention inputs, exactly as transformers' ``DataCollatorWithFlattening(
return_flash_attn_kwargs=True, return_seq_idx=True)`` does fed the segments one by one;
``block_causal_mask`` is the same separation as an explicit mask, for eager or sdpa attention.
Pass ``use_cache=False`` to the model: with a cache, transformers does not read packed sequences
from ``position_ids``. torch is not a dependency of this project; this module needs it.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def collate_boundaries(batch: list[dict]) -> dict:
    """The rows' segments as one ``[1, Σ]`` batch, each its own sequence.

    ``labels`` are the supervised tokens (``IGNORE_INDEX`` elsewhere and at every segment's first
    token, which nothing in its segment predicts), ``position_ids`` restart at 0 in each segment,
    ``cu_seq_lens_q``/``_k`` (int32) are the segments' cumulative lengths.
    """
    ids = torch.cat([row["input_ids"] for row in batch])[None]
    labels = torch.cat(
        [torch.where(row["loss_mask"] == 1, row["input_ids"], IGNORE_INDEX) for row in batch]
    )[None]
    positions = torch.cat([row["position_ids"] for row in batch])[None]
    labels[positions == 0] = IGNORE_INDEX
    lengths = torch.cat([row["seq_lengths"] for row in batch])
    cumulative = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    longest = int(lengths.max())
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": positions,
        "cu_seq_lens_q": cumulative,
        "cu_seq_lens_k": cumulative,
        "max_length_q": longest,
        "max_length_k": longest,
        "seq_idx": torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths)[
            None
        ],
    }


def block_causal_mask(seq_lengths, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive ``(1, 1, L, L)`` attention mask of one row's segments.

    A token sees the earlier tokens of its own segment only.
    """
    lengths = torch.as_tensor(seq_lengths)
    segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    size = segment.numel()
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(
        size, size, dtype=torch.bool
    ).tril()
    return torch.zeros(size, size, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[
        None, None
    ]
