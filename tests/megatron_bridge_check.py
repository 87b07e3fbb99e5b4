"""Megatron-Bridge's own packed-parquet reader on an export.

``MBRIDGE_PY=/path/to/python`` (Python >= 3.12 with megatron-bridge and megatron-core installed,
``--no-deps``, beside torch, numpy and pyarrow) runs it from tests/test_exports.py:
``python tests/megatron_bridge_check.py NAME.idx.parquet ROWS.parquet EOS``. It prints one JSON
line: what their ``GPTSFTPackedParquetDataset`` and ``collate_fn`` made of each row, against a
per-segment reference computed here from the row file. The only stand-in: megatron.bridge's
package ``__init__`` files (which import every model bridge and transformers) are skipped, the
modules below them load for real, and the tokenizer is a mock, as their own tests use.
"""

import importlib.util
import json
import sys
import types
from pathlib import Path
from unittest.mock import MagicMock

import numpy as np
import pyarrow.parquet as pq

SITE = Path(importlib.util.find_spec("megatron.core").submodule_search_locations[0]).parent
for name in [
    "megatron.bridge",
    "megatron.bridge.data",
    "megatron.bridge.data.packing",
    "megatron.bridge.data.datasets",
    "megatron.bridge.training",
    "megatron.bridge.training.tokenizers",
    "megatron.bridge.utils",
]:
    package = types.ModuleType(name)
    package.__path__ = [str(SITE / Path(*name.split(".")[1:]))]
    sys.modules[name] = package

from megatron.bridge.data.packing.parquet import GPTSFTPackedParquetDataset  # noqa: E402


def main(export: str, rows: str, eos: int) -> dict:
    table = pq.read_table(rows)
    ids, mask = table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()
    starts = [m["segment_start"] for m in table.column("metadata").to_pylist()]
    length = len(ids[0])
    tokenizer = MagicMock()
    tokenizer.eos_id = tokenizer.eod = tokenizer.pad_id = eos
    dataset = GPTSFTPackedParquetDataset(
        file_path=export,
        tokenizer=tokenizer,
        max_seq_length=length,
        pad_to_max_length=False,
        add_bos=False,
        add_eos=False,
        add_sep=False,
        seed=42,
        answer_only_loss=True,
        truncation_field="input",
        prompt_template="{input} {answer}",
        return_cu_seqlen=True,
    )
    for i in range(len(dataset)):
        item = dataset[i]
        GPTSFTPackedParquetDataset.validate_row(i, item["input_ids"], item["loss_mask"], starts[i])
    differ, trained = [], 0
    for first in range(0, len(dataset), 4):
        batch_rows = list(range(first, min(first + 4, len(dataset))))
        batch = dataset.collate_fn([dataset[i] for i in batch_rows])
        for k, i in enumerate(batch_rows):
            bounds = list(zip(starts[i], [*starts[i][1:], length], strict=True))
            n = length - len(starts[i])
            reference = {
                "tokens": np.concatenate([ids[i][b : e - 1] for b, e in bounds]),
                "labels": np.concatenate([ids[i][b + 1 : e] for b, e in bounds]),
                "loss_mask": np.concatenate([mask[i][b + 1 : e] for b, e in bounds]),
                "position_ids": np.concatenate([np.arange(e - b - 1) for b, e in bounds]),
            }
            for key, expected in reference.items():
                if not (batch[key][k, :n].numpy() == expected).all():
                    differ.append([i, key])
            cu = np.cumsum([0] + [e - b - 1 for b, e in bounds])
            if not (batch["cu_seqlens_q"][k, : len(cu)].numpy() == cu).all():
                differ.append([i, "cu_seqlens_q"])
            trained += int(batch["loss_mask"][k, :n].sum())
    return {"rows": len(dataset), "differ": differ, "trained": trained}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
