"""Document boundaries on a real model: conversations as if alone.

A small Llama with random weights (transformers, torch, CPU, eager attention) runs a packed
fixture row with its boundaries and each of the row's segments alone; the logits agree within
1e-5, and without the boundaries they do not (the negative control). ``collate_boundaries``
equals transformers' own ``DataCollatorWithFlattening`` fed the segments. Needs torch: skipped
where it is absent.
"""

import numpy as np
import pytest

from builders.rows import RowReader
from helpers import SELF_CONTAINED

torch = pytest.importorskip("torch", reason="torch is optional and not installed")
transformers = pytest.importorskip("transformers")
from builders.training.collate import block_causal_mask, collate_boundaries  # noqa: E402
from builders.training.dataset import torch_dataset  # noqa: E402


@pytest.fixture(scope="module")
def rows_file(row_file):
    return row_file(SELF_CONTAINED)


@pytest.fixture(scope="module")
def model(rows_file):
    torch.manual_seed(0)
    vocab = int(max(int(row["input_ids"].max()) for row in RowReader(rows_file).rows())) + 1
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).eval()


def segments_alone(model, ids, seq_lengths) -> torch.Tensor:
    ends = np.cumsum(seq_lengths)
    with torch.no_grad():
        return torch.cat(
            [
                model(input_ids=ids[:, end - length : end], use_cache=False).logits[0]
                for length, end in zip(seq_lengths, ends, strict=True)
            ]
        )


def test_a_packed_row_gives_each_conversation_its_own_logits(model, rows_file):
    row = next(r for r in RowReader(rows_file).rows(boundaries=True) if len(r["seq_lengths"]) >= 4)
    ids = torch.from_numpy(row["input_ids"].astype(np.int64))[None]
    positions = torch.from_numpy(row["position_ids"].astype(np.int64))[None]
    lengths = row["seq_lengths"].tolist()
    alone = segments_alone(model, ids, lengths)
    with torch.no_grad():
        packed = model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=block_causal_mask(lengths),
            use_cache=False,
        ).logits[0]
        whole_row = model(input_ids=ids, use_cache=False).logits[0]
    assert (packed - alone).abs().max() < 1e-5
    # the negative control: without boundaries, tokens after the first segment see earlier ones
    first = lengths[0]
    assert (whole_row[:first] - alone[:first]).abs().max() < 1e-5
    assert (whole_row[first:] - alone[first:]).abs().max() > 1e-2


def test_the_collator_is_transformers_flattening_of_the_segments(rows_file):
    rows = list(torch_dataset(rows_file, boundaries=True))[2:5]
    ours = collate_boundaries(rows)
    segments = []
    for row in rows:
        ends = row["seq_lengths"].cumsum(0).tolist()
        for length, end in zip(row["seq_lengths"].tolist(), ends, strict=True):
            ids, mask = row["input_ids"][end - length : end], row["loss_mask"][end - length : end]
            segments.append({"input_ids": ids, "labels": torch.where(mask == 1, ids, -100)})
    theirs = transformers.DataCollatorWithFlattening(
        return_flash_attn_kwargs=True, return_seq_idx=True
    )(segments)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key
    # boundaries train what whole rows train: the supervised tokens after each row's token 0
    whole_rows = sum(int(row["loss_mask"][1:].sum()) for row in rows)
    assert int((ours["labels"] != -100).sum()) == whole_rows


def test_the_collated_batch_runs_as_the_conversations_alone(model, rows_file):
    rows = list(torch_dataset(rows_file, boundaries=True))[2:4]
    batch = collate_boundaries(rows)
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=block_causal_mask(torch.cat([r["seq_lengths"] for r in rows])),
            use_cache=False,
        ).logits[0]
    alone = segments_alone(
        model, batch["input_ids"], torch.cat([r["seq_lengths"] for r in rows]).tolist()
    )
    assert (packed - alone).abs().max() < 1e-5
