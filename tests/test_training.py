"""The training side, against stand-ins that follow miles' source.

The row iterator, the miles rollout function and the miles glm5 patch (miles itself is not
installable from PyPI).
"""

import argparse
import importlib
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
from transformers import PreTrainedTokenizerFast

import pretokenized_sft_rollout
from builders.errors import VerificationError
from builders.fixture.conversations import hard_cases
from builders.fixture.make import FIXTURE_TEMPLATE, shared_dir, synthetic_rows, tokenizer_json
from builders.formats.glm5_layout import EOS
from builders.manifest import load_manifest
from builders.rows import RowReader
from builders.rows.figures import RowFigures
from helpers import (
    EDITED,
    MANIFESTS,
    NEEDS_SHARED,
    REPO,
    SELF_CONTAINED,
    encoder,
    manifest_names,
    with_its_eos,
)
from miles_emulation import MilesWouldCrash, Target, trained_targets
from reference import Reference


@pytest.fixture(scope="module")
def rows_file(row_file):
    return row_file(SELF_CONTAINED)


def built_rows(path):
    table = pq.read_table(path)
    return table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()


def test_iterating_gives_back_exactly_the_built_rows(rows_file):
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    reader = RowReader(rows_file, manifest, verify=True)
    figures = RowFigures(manifest.row_tokens)
    ids, masks = built_rows(rows_file)
    rows = list(reader.rows())
    for i, row in enumerate(rows):
        assert row["index"] == i and row["row_index"] == i
        assert row["input_ids"].dtype == np.int32 and row["loss_mask"].dtype == np.uint8
        assert row["input_ids"].tolist() == ids[i] and row["loss_mask"].tolist() == masks[i]
        figures.add(row["input_ids"], row["loss_mask"])
    assert len(rows) == len(reader) == manifest.rows
    assert figures.as_dict()["rows_sha256"] == manifest.expect.rows_sha256
    assert reader[-1]["index"] == len(reader) - 1 and reader[5]["input_ids"].tolist() == ids[5]
    with pytest.raises(IndexError):
        reader[len(reader)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("remainder", ["drop", "wrap"])
def test_shards_are_disjoint_equal_and_cover_the_kept_rows(rows_file, world_size, remainder):
    reader = RowReader(rows_file)
    shards = [
        [row["index"] for row in reader.rows(rank=r, world_size=world_size, remainder=remainder)]
        for r in range(world_size)
    ]
    assert len({len(shard) for shard in shards}) == 1
    flat = sorted(i for shard in shards for i in shard)
    whole = len(reader) - len(reader) % world_size
    if remainder == "drop":
        assert flat == list(range(whole))
    else:
        # the first rows again, to fill the last step
        assert flat == sorted([*range(len(reader)), *range((-len(reader)) % world_size)])
    again = [
        [
            row["index"]
            for row in RowReader(rows_file).rows(rank=r, world_size=world_size, remainder=remainder)
        ]
        for r in range(world_size)
    ]
    assert again == shards


@pytest.mark.parametrize("world_size, consumed", [(1, 0), (1, 17), (2, 5), (4, 3), (3, 16)])
def test_resuming_continues_where_it_stopped(rows_file, world_size, consumed):
    reader = RowReader(rows_file)
    for rank in range(world_size):
        whole = [row["index"] for row in reader.rows(rank=rank, world_size=world_size)]
        resumed = [
            row["index"]
            for row in reader.rows(start=consumed * world_size, rank=rank, world_size=world_size)
        ]
        assert resumed == whole[consumed:]


def test_reads_one_row_group_at_a_time(rows_file, monkeypatch):
    reader = RowReader(rows_file)
    reads = []
    original = reader._parquet.read_row_group
    monkeypatch.setattr(
        reader._parquet, "read_row_group", lambda g, **kw: reads.append(g) or original(g, **kw)
    )
    for _ in reader.rows():
        pass
    assert reads == list(range(reader._parquet.metadata.num_row_groups))


def test_verify_refuses_a_file_that_differs(rows_file, tmp_path):
    table = pq.read_table(rows_file)
    pq.write_table(table.slice(1), tmp_path / "short.parquet")
    with pytest.raises(VerificationError, match="rows expected 48, got 47"):
        RowReader(
            tmp_path / "short.parquet",
            load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml"),
            verify=True,
        )


def test_the_docs_reader_snippet_runs_from_any_folder(rows_file, tmp_path):
    """docs/training.md's snippet names its manifest, not a path.

    Not a path into a checkout: it runs from any folder (and from an installed package: .ci/run runs
    this file in a virtualenv with fixed-sft installed).
    """
    readme = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    snippet = readme.split("```python\n", 1)[1].split("row = reader[17]")[0]
    snippet = snippet.replace('"out/glm47flash-tulu3-fixed8192-v1.parquet"', repr(str(rows_file)))
    snippet = snippet.replace('"glm47flash-tulu3-fixed8192-v1"', repr(SELF_CONTAINED))
    done = subprocess.run(
        [sys.executable, "-c", snippet + "print(len(reader), reader[3]['index'])"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["48", "3"]


def docs_miles_command() -> list[str]:
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    (block,) = [b.split("```")[0] for b in text.split("```bash\n")[1:] if "generate_rollout" in b][
        :1
    ]
    return block.replace("\\\n", " ").split()


def test_the_docs_miles_command_has_what_miles_requires():
    words = docs_miles_command()
    for flag in ("--debug-train-only", "--disable-compute-advantages-and-returns"):
        assert flag in words
    assert "--num-rollout" in words or "--num-epoch" in words
    assert "--rollout-shuffle" not in words
    assert words[words.index("--prompt-data") + 1].endswith(".miles.parquet")


@NEEDS_SHARED
def test_the_docs_miles_command_passes_the_recipes_training_flags():
    """Each flag of the recipe's SFT and data lines, with its value, is in the docs' command."""
    recipe = (shared_dir() / "spec" / "recipe-glm47flash-h200-attune.txt").read_text()
    lines = recipe.split("--loss-type", 1)[1].split("--tensor-model-parallel-size", 1)[0]
    flags = ("--loss-type" + lines).replace("\\\n", " ").split()
    words = docs_miles_command()
    for k, word in enumerate(flags):
        if word.startswith("--"):
            assert word in words, word
            value = flags[k + 1] if k + 1 < len(flags) else "--"
            if not value.startswith(("--", '"')):
                assert words[words.index(word) + 1] == value, word


def test_torch_dataset(rows_file):
    torch = pytest.importorskip("torch", reason="torch is optional and not installed")
    from builders.rows import torch_dataset

    loader = torch.utils.data.DataLoader(
        torch_dataset(rows_file, rank=1, world_size=2), batch_size=None, num_workers=2
    )
    assert sorted(int(row["index"]) for row in loader) == list(range(1, 48, 2))


# --- miles stand-ins, following miles/utils/types.py, miles/utils/data.py and
# --- miles/rollout/data_source.py (RolloutDataSource.get_samples) at the recipe's commit


@dataclass
class Sample:
    prompt: object = ""
    tokens: list = field(default_factory=list)
    response_length: int = 0
    reward: object = None
    loss_mask: list | None = None
    metadata: dict = field(default_factory=dict)


class DataBuffer:
    """miles' reading path for --prompt-data.

    iter_batches → to_pylist → row.get(key).
    """

    def __init__(self, path, input_key, metadata_key):
        self.samples = []
        for batch in pq.ParquetFile(path).iter_batches():
            for data in batch.to_pylist():
                self.samples.append(
                    Sample(prompt=data.get(input_key), metadata=data.get(metadata_key) or {})
                )
        self.offset = 0

    def get_samples(self, n):
        picked = self.samples[self.offset : self.offset + n]
        self.offset += n
        return [[sample] for sample in picked]


def fill(path, batch_size=16):
    """Every row of ``path`` through miles' reading path, in order.

    Through the reading path and the rollout function.
    """
    args = SimpleNamespace(
        prompt_data=str(path),
        input_key="messages",
        metadata_key="metadata",
        rollout_batch_size=batch_size,
        rollout_global_dataset=True,
    )
    buffer = DataBuffer(path, args.input_key, args.metadata_key)
    filled = []
    while buffer.offset < len(buffer.samples):
        filled += [
            sample
            for (sample,) in pretokenized_sft_rollout.generate_rollout(args, len(filled), buffer)
        ]
    return filled


def assert_trains_exactly_the_supervised_tokens(filled, masks, per_micro_batch):
    """Each micro-batch trains exactly its rows' supervised tokens.

    Through miles' packing and slicing, each micro-batch trains exactly its rows' supervised tokens
    at positions >= 1, each from the logit just before it in the same row.
    """
    for first in range(0, len(filled), per_micro_batch):
        batch = filled[first : first + per_micro_batch]
        targets, normalizer = trained_targets(batch)
        rows = [sample.metadata["row_index"] for sample in batch]
        expected = {(row, int(t)) for row in rows for t in np.flatnonzero(masks[row]) if t >= 1}
        assert len(targets) == len(expected) and {(t.row, t.position) for t in targets} == expected
        assert all((t.logit_row, t.logit_position) == (t.row, t.position - 1) for t in targets)
        # miles counts a sample with nothing to train as one token (max(mask.sum(), 1))
        assert normalizer == len(expected) + sum(
            1 for row in rows if not np.asarray(masks[row])[1:].any()
        )


@pytest.mark.parametrize("name", manifest_names())
@pytest.mark.parametrize("per_micro_batch", [1, 2, 3])
def test_rollout_samples_train_exactly_the_supervised_tokens(row_file, name, per_micro_batch):
    path = row_file(name)
    filled = fill(path)
    ids, masks = built_rows(path)
    assert len(filled) == len(ids)
    for i, sample in enumerate(filled):
        assert sample.metadata["row_index"] == i and sample.tokens == ids[i] and sample.reward == 0
        # the file has no messages column: miles' prompt is None
        assert sample.prompt is None
    assert_trains_exactly_the_supervised_tokens(filled, masks, per_micro_batch)


EDGE_MASKS = {
    "starts supervised": [1, 1, 0, 0, 1, 1, 0, 1],
    "starts unsupervised": [0, 0, 1, 1, 0, 1, 1, 0],
    "all supervised": [1] * 8,
    "only token 0 supervised": [1, 0, 0, 0, 0, 0, 0, 0],
    "only the last token supervised": [0] * 7 + [1],
}


@pytest.fixture(scope="module")
def edge_rows_file(tmp_path_factory):
    from builders.rows.packing import Row
    from builders.rows.rowfile import RowWriter

    path = tmp_path_factory.mktemp("edge") / "edge.parquet"
    writer = RowWriter(path)
    for k, mask in enumerate(EDGE_MASKS.values()):
        writer.write(
            Row(
                np.arange(8, dtype=np.int32) + 10 * k,
                np.array(mask, dtype=np.uint8),
                [k],
                [f"c{k}"],
                [0],
            )
        )
    writer.close()
    return path


@pytest.mark.parametrize("per_micro_batch", [1, 2, 5])
def test_rollout_edge_rows_train_exactly_the_supervised_tokens(edge_rows_file, per_micro_batch):
    filled = fill(edge_rows_file, batch_size=2)
    masks = list(EDGE_MASKS.values())
    assert [s.response_length for s in filled] == [7, 6, 7, 7, 1]
    assert_trains_exactly_the_supervised_tokens(filled, masks, per_micro_batch)
    assert_trains_exactly_the_supervised_tokens(filled[::-1], masks, per_micro_batch)


def test_a_response_from_token_0_breaks_miles(edge_rows_file):
    """The emulation catches the old rollout's fault.

    A response that starts at token 0 gets no logit when first in its micro-batch, and the previous
    row's last logit otherwise.
    """
    filled = fill(edge_rows_file, batch_size=2)
    # both start supervised
    first, second = filled[0], filled[2]
    for sample, mask in (
        (first, EDGE_MASKS["starts supervised"]),
        (second, EDGE_MASKS["all supervised"]),
    ):
        sample.response_length, sample.loss_mask = len(mask), list(mask)
    with pytest.raises(MilesWouldCrash):
        trained_targets([first, second])
    targets, _ = trained_targets([filled[1], first])
    assert Target(row=0, position=0, logit_row=1, logit_position=7) in targets


@pytest.mark.parametrize("seed, epochs", [(None, 1), (42, 2)])
def test_a_prompt_file_gives_the_rows_in_its_training_order(rows_file, tmp_path, seed, epochs):
    """``fixed-sft export --to miles``: miles reads only each sample's metadata."""
    from builders.training.exports import export

    prompt = export(rows_file, "miles", tmp_path, seed, epochs)
    assert pq.ParquetFile(prompt).schema_arrow.names == ["metadata"]
    filled = fill(prompt)
    reader = RowReader(rows_file)
    order = [(int(i), e) for e in range(epochs) for i in reader.order(seed, e)]
    assert [(s.metadata["row_index"], s.metadata["epoch"]) for s in filled] == order
    ids, masks = built_rows(rows_file)
    assert all(sample.tokens == ids[row] for sample, (row, _) in zip(filled, order, strict=True))
    assert_trains_exactly_the_supervised_tokens(filled, masks, 2)


def test_a_prompt_file_refuses_other_rows(row_file, tmp_path):
    from builders.training.exports import export

    rows = tmp_path / "rows.parquet"
    rows.write_bytes(row_file(SELF_CONTAINED).read_bytes())
    prompt = export(rows, "miles")
    rows.write_bytes(row_file(EDITED).read_bytes())
    with pytest.raises(ValueError, match="export the prompt file again from this row file"):
        fill(prompt)


def test_rollout_reads_a_sliced_prompt_path(rows_file):
    args = SimpleNamespace(prompt_data=f"{rows_file}@[10:20]", rollout_batch_size=2)
    buffer = SimpleNamespace(get_samples=lambda n: [[Sample(metadata={"row_index": 12})]])
    ((sample,),) = pretokenized_sft_rollout.generate_rollout(args, 0, buffer)
    assert sample.tokens == built_rows(rows_file)[0][12]


STAND_IN_MASK_UTILS = '''
class MultiTurnLossMaskGenerator:
    """Stand-in with the interface of miles.utils.mask_utils.MultiTurnLossMaskGenerator."""

    def __init__(self, tokenizer, tokenizer_type="qwen"):
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type

    def get_loss_mask(self, messages, tools=None):
        if self.tokenizer_type == "qwen":
            return [], []
        elif self.tokenizer_type == "distill_qwen":
            return [], []
        else:
            raise ValueError(f"Unsupported tokenizer type: {self.tokenizer_type}")
'''
STAND_IN_ARGUMENTS = """
def add_args(parser):
    parser.add_argument(
                "--loss-mask-type",
                type=str,
                default="qwen",
                choices=["qwen", "qwen3", "distill_qwen"],
                help="Loss mask type",
            )
"""


@pytest.fixture
def patched_miles(tmp_path, monkeypatch):
    utils = tmp_path / "miles" / "utils"
    utils.mkdir(parents=True)
    (tmp_path / "miles" / "__init__.py").write_text("")
    (utils / "__init__.py").write_text("")
    (utils / "mask_utils.py").write_text(STAND_IN_MASK_UTILS)
    (utils / "arguments.py").write_text(STAND_IN_ARGUMENTS)
    script = [sys.executable, str(REPO / "patches" / "patch_glm5_mask.py")]
    assert subprocess.run([*script, "--check", str(tmp_path)], capture_output=True).returncode == 1
    done = subprocess.run([*script, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([*script, "--check", str(tmp_path)], capture_output=True).returncode == 0
    assert (
        subprocess.run([*script, str(tmp_path)], capture_output=True, text=True).stdout.strip()
        == "already applied"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "miles" or m.startswith("miles.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("miles.utils.mask_utils"), importlib.import_module(
        "miles.utils.arguments"
    )


def test_patched_generator_returns_the_builders_tokens_and_mask(patched_miles, tmp_path):
    mask_utils, arguments = patched_miles
    parser = argparse.ArgumentParser()
    arguments.add_args(parser)
    assert parser.parse_args(["--loss-mask-type", "glm5"]).loss_mask_type == "glm5"
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_json())
    template = FIXTURE_TEMPLATE.read_text(encoding="utf-8")
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"), chat_template=template
    )
    generator = mask_utils.MultiTurnLossMaskGenerator(hf, tokenizer_type="glm5")
    builder = encoder(template)
    rows = [
        {"index": i, "id": r["id"], "messages": r["messages"]}
        for i, r in enumerate(synthetic_rows())
    ]
    for row, expected in zip(rows, builder.encode(rows), strict=True):
        token_ids, loss_mask = generator.get_loss_mask(row["messages"])
        assert (token_ids, loss_mask) == with_its_eos(builder, expected), row["id"]
        assert token_ids[-1] == hf.convert_tokens_to_ids(EOS)
    with pytest.raises(ValueError, match="without tools"):
        generator.get_loss_mask(rows[0]["messages"], tools=[{"name": "f"}])


@pytest.fixture(scope="module")
def glm_hf_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf-tokenizer") / "tokenizer.json"
    path.write_bytes(tokenizer_json())
    template = FIXTURE_TEMPLATE.read_text(encoding="utf-8")
    return PreTrainedTokenizerFast(tokenizer_file=str(path), chat_template=template), path, template


def test_a_template_that_does_not_compile_is_a_value_error(glm_hf_tokenizer):
    from builders.training.live_mask import glm5_loss_mask

    _, path, template = glm_hf_tokenizer
    broken = PreTrainedTokenizerFast(tokenizer_file=str(path), chat_template=template + "{% if %}")
    with pytest.raises(ValueError, match=r"glm5 loss mask: the pinned chat template .* not valid"):
        glm5_loss_mask(broken, [{"role": "user", "content": "hi"}])


def test_step_loss_mask_unsupervises_an_answer_and_its_stop_token(glm_hf_tokenizer):
    """miles' per-message step_loss_mask, against the reference.

    The reference implementation of the same rule.
    """
    from builders.training.live_mask import glm5_loss_mask

    hf, path, template = glm_hf_tokenizer
    reference = Reference(path, template)
    checked = 0
    for messages in [*hard_cases(), *(r["messages"] for r in synthetic_rows()[:60])]:
        answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for untrained in [set(), *({i} for i in answers), set(answers)]:
            marked = [
                {**m, "step_loss_mask": 0} if i in untrained else m for i, m in enumerate(messages)
            ]
            assert glm5_loss_mask(hf, marked) == reference.conversation(
                messages, frozenset(untrained)
            )
            checked += bool(untrained)
    assert checked > 100
    # the field present and 1 is the field absent, and the builder's rows have it absent
    messages = hard_cases()[1]
    assert glm5_loss_mask(hf, [{**m, "step_loss_mask": 1} for m in messages]) == glm5_loss_mask(
        hf, messages
    )


@pytest.mark.parametrize("module", ["builders.rows", "pretokenized_sft_rollout"])
def test_the_training_side_loads_no_tokenizer_stack(module):
    """What miles imports from this project pulls in no tokenizer stack.

    No transformers, tokenizers, jinja2 or huggingface_hub.
    """
    code = (
        f"import sys, {module}; print(sorted({{n.split('.')[0] for n in sys.modules}} & "
        "{'transformers', 'tokenizers', 'jinja2', 'huggingface_hub', 'torch', 'matplotlib', "
        "'tqdm'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]" and done.stderr == "", (
        done.stdout + done.stderr
    )
