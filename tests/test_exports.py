"""Rows other trainers load: the Hub folder, TRL, Megatron-Bridge.

Each is read by that tool's own code where it is installed: ``datasets`` (in the lock), TRL's
``SFTTrainer`` and its collator (trl, where installed), Megatron-Bridge's packed-parquet reader
(``MBRIDGE_PY``: an interpreter with megatron-bridge, run on tests/megatron_bridge_check.py).
Where a tool is absent, the test holds the export to that tool's rules as written in its source.
"""

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from builders.build import build
from builders.errors import UsageError, VerificationError
from builders.fixture.make import tokenizer_json
from builders.formats.glm5_layout import EOS
from builders.manifest import load_manifest
from builders.rows import RowReader
from builders.training.exports import export
from helpers import EDITED, MANIFESTS, REPO, SELF_CONTAINED, run_cli


@pytest.fixture(scope="module")
def out(tmp_path_factory, hub):
    """Two builds into one folder, the edited one last."""
    folder = tmp_path_factory.mktemp("out")
    for name in (SELF_CONTAINED, EDITED):
        build(load_manifest(MANIFESTS / f"{name}.yaml"), folder, hub)
    return folder


@pytest.fixture(scope="module")
def rows(out):
    """The self-contained build's rows, as the file holds them."""
    table = pq.read_table(out / f"{SELF_CONTAINED}.parquet")
    return {
        "ids": np.array(table.column("input_ids").to_pylist()),
        "mask": np.array(table.column("loss_mask").to_pylist()),
        "starts": [m["segment_start"] for m in table.column("metadata").to_pylist()],
    }


def test_the_out_folder_loads_as_a_dataset(out):
    datasets = pytest.importorskip("datasets")
    assert sorted(p.name for p in out.glob("*.png"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        latest = datasets.load_dataset(str(out), split="train")
        first = datasets.load_dataset(str(out), SELF_CONTAINED, split="train")
    assert latest.num_rows == first.num_rows == 48
    assert (
        latest["input_ids"][0] == pq.read_table(out / f"{EDITED}.parquet")["input_ids"][0].as_py()
    )
    assert (
        first["input_ids"][5]
        == pq.read_table(out / f"{SELF_CONTAINED}.parquet")["input_ids"][5].as_py()
    )
    # the card's features are what datasets itself writes for the file: nothing is cast
    own = datasets.Dataset.from_parquet(str(out / f"{SELF_CONTAINED}.parquet")).features
    card = datasets.load_dataset_builder(str(out), SELF_CONTAINED).info.features
    assert card == own
    expected = datasets.DatasetInfo(features=own)._to_yaml_dict()["features"]
    front = (out / "README.md").read_text(encoding="utf-8").split("---\n")[1]
    import yaml

    meta = yaml.safe_load(front)
    assert [info["features"] for info in meta["dataset_info"]] == [expected, expected]
    assert [(c["config_name"], c.get("default", False)) for c in meta["configs"]] == [
        (EDITED, True),
        (SELF_CONTAINED, False),
    ]
    assert meta["license"] == "cc0-1.0"


def test_the_readme_is_the_latest_card(out):
    hub_card = pytest.importorskip("huggingface_hub").DatasetCard
    readme = (out / "README.md").read_text(encoding="utf-8")
    card = (out / f"{EDITED}.md").read_text(encoding="utf-8")
    assert readme.split("\n---\n", 1)[1] == card.split("\n---\n", 1)[1]
    data = hub_card(readme).data
    assert data.license == "cc0-1.0" and len(data.configs) == 2


def test_the_trl_export_holds_what_trl_reads(out, rows):
    path = export(out / f"{SELF_CONTAINED}.parquet", "trl")
    assert path == out / f"{SELF_CONTAINED}.trl.parquet"
    table = pq.read_table(path)
    assert table.column_names == ["input_ids", "assistant_masks", "seq_lengths", "row_index"]
    assert (np.array(table["input_ids"].to_pylist()) == rows["ids"]).all()
    assert (np.array(table["assistant_masks"].to_pylist()) == rows["mask"]).all()
    width = rows["ids"].shape[1]
    assert table["seq_lengths"].to_pylist() == [
        np.diff([*starts, width]).tolist() for starts in rows["starts"]
    ]
    assert table["row_index"].to_pylist() == list(range(48))
    footer = pq.ParquetFile(path).metadata.metadata
    assert footer[b"fixed_sft.rows"] == f"{SELF_CONTAINED}.parquet".encode()
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    assert footer[b"fixed_sft.rows_sha256"].decode() == manifest.expect.rows_sha256


def trl_batches(path: Path, tmp_path: Path, padding_free: bool) -> list[dict]:
    """Batches of 4 rows as TRL's SFTTrainer gives them to its model."""
    torch = pytest.importorskip("torch")
    trl = pytest.importorskip("trl", reason="trl is absent")
    datasets = pytest.importorskip("datasets")
    from tokenizers import models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    data = datasets.load_dataset("parquet", data_files=str(path), split="train")
    vocab = 1 + max(max(ids) for ids in data["input_ids"])
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab + 1)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token=f"t{vocab}", eos_token="t0"
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab + 1,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    args = trl.SFTConfig(
        output_dir=str(tmp_path / f"trl-{padding_free}"),
        max_length=None,
        padding_free=padding_free,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        shuffle_dataset=False,
    )
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    return list(trainer.get_train_dataloader())


def batch_rows(batch, ids: np.ndarray) -> list[int]:
    width = ids.shape[1]
    flat = batch["input_ids"].reshape(-1, width).numpy()
    return [int(np.flatnonzero((ids == row).all(axis=1))[0]) for row in flat]


@pytest.mark.parametrize("padding_free", [False, True])
def test_trls_labels_are_exactly_the_mask(out, rows, tmp_path, padding_free):
    path = export(out / f"{SELF_CONTAINED}.parquet", "trl", tmp_path)
    ids, mask, width = rows["ids"], rows["mask"], rows["ids"].shape[1]
    for batch in trl_batches(path, tmp_path, padding_free):
        which = batch_rows(batch, ids)
        labels = batch["labels"].reshape(-1, width).numpy()
        for k, i in enumerate(which):
            expected = np.where(mask[i] == 1, ids[i], -100)
            if padding_free:
                # boundaries: a segment's first token is no target (none is supervised here)
                expected[rows["starts"][i]] = -100
                positions = batch["position_ids"].reshape(-1, width)[k].numpy()
                assert np.flatnonzero(positions == 0).tolist() == rows["starts"][i]
            assert (labels[k] == expected).all()
        if padding_free:
            lengths = [n for i in which for n in np.diff([*rows["starts"][i], width])]
            assert batch["cu_seq_lens_q"].tolist() == np.cumsum([0, *lengths]).tolist()


def test_trl_trains_every_token_of_the_row_file_itself(out, rows, tmp_path):
    """The negative control: TRL reads no loss_mask."""
    for batch in trl_batches(out / f"{SELF_CONTAINED}.parquet", tmp_path, False):
        assert (batch["labels"] == batch["input_ids"]).all()


def megatron_semantics(path: Path, rows: dict) -> int:
    """Megatron-Bridge's reading of an export, as its source states it.

    Their ``validate_row`` checks; their collate gives, per segment ``[b, e)``, the inputs
    ``ids[b:e-1]``, the labels ``ids[b+1:e]`` weighted by the stored mask ``[b:e-1]``
    (``packing/gpt_sft.py``); returns how many labels are trained.
    """
    table = pq.read_table(path)
    assert table.column_names == ["input_ids", "seq_start_id", "loss_mask"]
    assert [str(t) for t in table.schema.types] == ["list<element: int32>"] * 2 + [
        "list<element: int8>"
    ]
    trained = 0
    for i, (ids, starts, stored) in enumerate(
        zip(*(table[c].to_pylist() for c in table.column_names), strict=True)
    ):
        assert len(ids) == len(stored) and starts[0] == 0
        assert all(np.diff(starts) > 0) and starts[-1] < len(ids)
        assert ids == rows["ids"][i].tolist() and starts == rows["starts"][i]
        for b, e in zip(starts, [*starts[1:], len(ids)], strict=True):
            weights, labels = stored[b : e - 1], range(b + 1, e)
            assert weights == [int(rows["mask"][i][t]) for t in labels]
            assert stored[e - 1] == 0
            trained += sum(weights)
    return trained


def test_the_megatron_bridge_export_trains_what_whole_rows_train(out, rows):
    path = export(out / f"{SELF_CONTAINED}.parquet", "megatron-bridge")
    assert path.name == f"{SELF_CONTAINED}.idx.parquet"
    assert megatron_semantics(path, rows) == int(rows["mask"][:, 1:].sum()) == 13104


@pytest.mark.skipif(
    not os.environ.get("MBRIDGE_PY"), reason="MBRIDGE_PY names no interpreter with megatron-bridge"
)
def test_megatron_bridges_own_reader_accepts_the_export(out, rows, tmp_path):
    path = export(out / f"{SELF_CONTAINED}.parquet", "megatron-bridge", tmp_path)
    eos = Tokenizer.from_str(tokenizer_json().decode()).token_to_id(EOS)
    done = subprocess.run(
        [
            os.environ["MBRIDGE_PY"],
            str(REPO / "tests" / "megatron_bridge_check.py"),
            str(path),
            str(out / f"{SELF_CONTAINED}.parquet"),
            str(eos),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"rows": 48, "differ": [], "trained": int(rows["mask"][:, 1:].sum())}


def test_the_export_command(out, tmp_path):
    rows_file = tmp_path / "rows.parquet"
    shutil.copy(out / f"{SELF_CONTAINED}.parquet", rows_file)
    before = rows_file.read_bytes()
    done = run_cli("export", str(rows_file), "--to", "trl", "--to", "miles", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rows.miles.parquet",
        "rows.parquet",
        "rows.trl.parquet",
    ]
    assert rows_file.read_bytes() == before
    order = [
        m["row_index"]
        for m in pq.read_table(tmp_path / "rows.miles.parquet")["metadata"].to_pylist()
    ]
    assert order == RowReader(rows_file).order(seed=3).tolist()
    refused = run_cli("export", str(rows_file), "--to", "trl", "--seed", "3")
    assert refused.returncode == UsageError.exit_code
    assert "--seed and --epochs order the miles prompt file: add --to miles" in refused.stderr
    missing = run_cli("export", str(tmp_path / "none.parquet"), "--to", "trl")
    assert missing.returncode == UsageError.exit_code and "no such file" in missing.stderr
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_export_names_what_is_wrong_with_its_input(out, tmp_path):
    table = pq.read_table(out / f"{SELF_CONTAINED}.parquet")
    pq.write_table(table.drop_columns(["metadata"]), tmp_path / "bare.parquet")
    with pytest.raises(UsageError, match=r"bare\.parquet: no metadata\.segment_start"):
        export(tmp_path / "bare.parquet", "trl")
    metadata = table.column("metadata").to_pylist()
    metadata[7]["segment_start"] = [3, 9]
    damaged = table.set_column(2, "metadata", pa.array(metadata, type=table.schema[2].type))
    pq.write_table(damaged, tmp_path / "damaged.parquet")
    with pytest.raises(VerificationError, match=r"row 7: segment_start \[3, 9\] does not begin"):
        export(tmp_path / "damaged.parquet", "megatron-bridge")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.parquet", "damaged.parquet"]
