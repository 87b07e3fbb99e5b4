"""Other datasets and mixtures: layouts and ``take``, built, verified.

docs/datasets.md (layouts and mixtures): layouts and ``take`` built and verified against
tests/reference.py, which reads the files whole with Python's ``json`` and pyarrow.parquet and
applies the layout and ``take`` by its own code; bad input named by file, row, field.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import builders.inputs.files
from builders.build import build
from builders.errors import ManifestError, PinnedInputError, SourceDataError
from builders.fixture.hf_cache import MESSAGE_WITH_REASONING, parquet_shards, put_snapshot
from builders.fixture.make import FIXTURE_TEMPLATE, synthetic_rows, tokenizer_json
from builders.inputs.layout import Layout, conversations
from builders.inputs.pinned import Hub, dataset_repo, matching_files
from builders.manifest import DatasetPin, load_manifest, parse_manifest
from builders.messages import DEFAULT_KEYS
from helpers import file_rows, run_cli
from reference import Reference, mixture, reference_rows, rows_sha256

SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "observation": "tool"}
SHAREGPT = {
    "messages": "conversations",
    "keys": {"role": "from", "content": "value"},
    "roles": SHAREGPT_ROLES,
}
# a manifest's tokenizer sha256 mapping, for manifests that are only parsed
FAKE_SHA256 = f"{{tokenizer.json: {'a' * 64}, chat_template.jinja: {'a' * 64}}}"
TOKENIZER_FILES = {
    "tokenizer.json": tokenizer_json(),
    "chat_template.jinja": FIXTURE_TEMPLATE.read_bytes(),
}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """JSON read in many small blocks.

    A JSON list is scanned in chunks that cut its tokens.
    """
    monkeypatch.setattr(builders.inputs.files, "BLOCK_BYTES", 3000)
    monkeypatch.setattr(builders.inputs.files, "SCAN_BYTES", 777)


def sharegpt(rows: list[dict]) -> list[dict]:
    """Rows in the ShareGPT layout.

    ``conversations`` of ``{from, value}``, integer ids, a null message field the layout does not
    name (absent, as a parquet struct's), a row field nobody reads.
    """
    by_role = {v: k for k, v in SHAREGPT_ROLES.items()}
    out = []
    for k, row in enumerate(rows):
        turns = [
            {
                "from": by_role[m["role"]],
                "value": m["content"],
                "weight": None,
                **(
                    {"reasoning_content": m["reasoning_content"]}
                    if m.get("reasoning_content")
                    else {}
                ),
            }
            for m in row["messages"]
        ]
        out.append(
            {"id": 1000 + k, "conversations": turns, "model": "someone", "source": f"share-{k % 3}"}
        )
    return out


def jsonl(records: list[dict]) -> bytes:
    return "".join(
        json.dumps(r, ensure_ascii=k % 2 == 0) + ("\n\n" if k % 7 == 3 else "\n")
        for k, r in enumerate(records)
    ).encode()


def lay_out(
    hf_home: Path,
    datasets: list[tuple[dict, dict]],
    *,
    rows: int,
    row_tokens: int = 200,
    seed: int = 5,
    expect: dict | None = None,
    name: str = "layout",
) -> Path:
    """Dataset repos and the fixture tokenizer in ``hf_home``.

    The repos are given as (files, pin fields); returns the manifest naming them.
    """
    pins = []
    for j, (files, fields) in enumerate(datasets):
        repo = f"someone/{name}-data-{j}"
        pins.append(
            {"repo": repo, "revision": put_snapshot(hf_home, repo, "dataset", files), **fields}
        )
    tokenizer = put_snapshot(hf_home, "someone/tok", "model", TOKENIZER_FILES)
    doc = {
        "name": name,
        **({"dataset": pins[0]} if len(pins) == 1 else {"datasets": pins}),
        "tokenizer": {
            "repo": "someone/tok",
            "revision": tokenizer,
            "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in TOKENIZER_FILES.items()},
        },
        "loss_mask": "glm5",
        "seed": seed,
        "row_tokens": row_tokens,
        "rows": rows,
        "expect": expect or {},
    }
    path = hf_home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def snapshot(hf_home: Path, repo: str, revision: str) -> Path:
    return hf_home / "hub" / f"datasets--{repo.replace('/', '--')}" / "snapshots" / revision


def reference_of(hf_home: Path, manifest_path: Path):
    """The reference's rows of a laid-out manifest.

    It returns the source rows its stream consumed too.
    """
    doc = yaml.safe_load(manifest_path.read_text())
    pins = doc["datasets"] if "datasets" in doc else [doc["dataset"]]
    source, kept = mixture(
        [(snapshot(hf_home, p["repo"], p["revision"]), p) for p in pins], doc["seed"]
    )
    tok = hf_home / "hub" / "models--someone--tok" / "snapshots" / doc["tokenizer"]["revision"]
    consumed = []
    rows = reference_rows(
        None,
        tok / "tokenizer.json",
        (tok / "chat_template.jinja").read_text(),
        doc["seed"],
        doc["row_tokens"],
        doc["rows"],
        source=source,
        kept=kept,
        consumed=consumed,
    )
    return (
        rows,
        consumed,
        Reference(tok / "tokenizer.json", (tok / "chat_template.jinja").read_text()),
    )


def build_and_verify(hf_home: Path, manifest_path: Path, tmp_path: Path):
    """Pin the reference's rows_sha256 in the manifest and build it.

    Then check the build verifies with those rows.
    """
    expected, consumed, ref = reference_of(hf_home, manifest_path)
    doc = yaml.safe_load(manifest_path.read_text())
    doc["expect"] = {"rows_sha256": rows_sha256(expected)}
    manifest_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = build(
        load_manifest(manifest_path), tmp_path / "out", Hub(hf_home / "hub", offline=True)
    )
    assert result.verified, result.verification.summary()
    assert file_rows(result.parquet) == expected
    metadata = pq.read_table(result.parquet).column("metadata").to_pylist()
    provenance = [
        (i, d) for m in metadata for i, d in zip(m["source_index"], m["source_id"], strict=True)
    ]
    assert list(dict.fromkeys(provenance)) == [(row["index"], row["id"]) for row in consumed]
    return result, consumed, ref


def contributions(
    consumed: list[dict], ref: Reference, bounds: list[int]
) -> list[tuple[int, int, int]]:
    """(conversations, tokens with EOS, supervised tokens) per dataset.

    From the reference's own encoding.
    """
    totals = [[0, 0, 0] for _ in bounds[1:]]
    for row in consumed:
        ids, mask = ref.conversation(row["messages"])
        j = next(j for j in range(len(bounds) - 1) if bounds[j] <= row["index"] < bounds[j + 1])
        totals[j][0] += 1
        totals[j][1] += len(ids)
        totals[j][2] += sum(mask)
    return [tuple(t) for t in totals]


def test_sharegpt_json_lines_builds_and_verifies(tmp_path):
    records = sharegpt(synthetic_rows(seed=11, count=50))
    files = {
        "data/train-0.jsonl": jsonl(records[:30]),
        "data/train-1.jsonl": jsonl(records[30:]),
        "README.md": b"# not data\n",
    }
    manifest = lay_out(tmp_path, [(files, {"files": "data/*.jsonl", **SHAREGPT})], rows=25)
    result, consumed, _ = build_and_verify(tmp_path, manifest, tmp_path)
    # integer ids, read as their text
    assert consumed[0]["id"].isdigit()
    report = json.loads(result.report.read_text())
    assert {s["source"] for s in report["stats"]["by_source"]} <= {"share-0", "share-1", "share-2"}
    assert [f["name"] for f in report["source_files"]] == [
        "data/train-0.jsonl",
        "data/train-1.jsonl",
    ]


def test_single_json_list_builds_and_verifies(tmp_path):
    rows = synthetic_rows(seed=12, count=45)
    # no id, no source
    records = [{"messages": r["messages"], "note": {"nested": [1, "]"]}} for r in rows]
    files = {"train.json": json.dumps(records, indent=1).encode()}
    manifest = lay_out(
        tmp_path, [(files, {"files": "*.json", "id": None, "rows": len(records)})], rows=20
    )
    _, consumed, _ = build_and_verify(tmp_path, manifest, tmp_path)
    # id: null: the source index is the id
    assert all(row["id"] == str(row["index"]) for row in consumed)
    card = (tmp_path / "out" / "layout.md").read_text()
    assert "The data has no `source` field" in card


def test_two_source_mixture_with_take_builds_and_verifies(tmp_path):
    tulu = synthetic_rows(seed=13, count=40)
    chat = sharegpt(synthetic_rows(seed=14, count=60))
    datasets = [
        (
            parquet_shards(tulu, shards=2, row_group_rows=7, message_type=MESSAGE_WITH_REASONING),
            {"split": "train", "take": 25, "rows": len(tulu)},
        ),
        (
            {"chat.jsonl": jsonl(chat)},
            {"files": "chat.jsonl", "take": 30, "rows": len(chat), **SHAREGPT},
        ),
    ]
    manifest = lay_out(tmp_path, datasets, rows=30, seed=9)
    result, consumed, ref = build_and_verify(tmp_path, manifest, tmp_path)
    by_dataset = json.loads(result.report.read_text())["stats"]["by_dataset"]
    expected = contributions(consumed, ref, [0, len(tulu), len(tulu) + len(chat)])
    assert [
        (d["conversations"], d["tokens"], d["supervised_tokens"]) for d in by_dataset
    ] == expected
    assert all(d["conversations"] > 0 for d in by_dataset)
    card = (tmp_path / "out" / "layout.md").read_text()
    assert (
        "### Datasets" in card
        and f"| {expected[1][0]:,} | {expected[1][1]:,} | {expected[1][2]:,} |" in card
    )


def test_take_keeps_the_rows_the_contract_names(tmp_path):
    """kept rows are sorted(default_rng([seed, j]).permutation(N_j)[:K]).

    They are offset by the sources before.
    """
    import numpy as np

    from builders.rows.order import kept_rows

    kept = kept_rows(7, [10, 20], [None, 5])
    assert kept[:10].tolist() == list(range(10))
    assert kept[10:].tolist() == [
        10 + i for i in sorted(np.random.default_rng([7, 1]).permutation(20)[:5].tolist())
    ]


# --- resolution: exactly the files the glob names


def test_the_glob_matches_as_the_hub_download_filter(tmp_path):
    commit = put_snapshot(
        tmp_path,
        "o/d",
        "dataset",
        {"a.json": b"[]", "sub/b.json": b"[]", "c.jsonl": b"", "data/train-0.parquet": b""},
    )
    folder = snapshot(tmp_path, "o/d", commit)
    assert [name for name, _ in matching_files("*.json", folder)] == ["a.json", "sub/b.json"]
    manifest = parse_manifest(f"""
name: m
dataset: {{repo: o/d, revision: {commit}, files: "*.json"}}
tokenizer: {{repo: o/t, revision: {commit}, sha256: {FAKE_SHA256}}}
loss_mask: glm5
seed: 1
row_tokens: 8
rows: 1
""")
    assert dataset_repo(manifest.dataset).patterns == ("*.json",)


# --- bad input: named by file, row and field


def bad_build(tmp_path, files: dict, fields: dict, rows: int = 500):
    manifest = lay_out(tmp_path / "hf", [(files, fields)], rows=rows)
    return build(
        load_manifest(manifest),
        tmp_path / "out",
        Hub(tmp_path / "hf" / "hub", offline=True),
        card=False,
    )


def few(count=6):
    return sharegpt(synthetic_rows(seed=3, count=count))[:count]


def test_a_role_the_layout_does_not_map(tmp_path):
    records = few()
    records[4]["conversations"][0]["from"] = "bot"
    with pytest.raises(SourceDataError) as err:
        bad_build(tmp_path, {"d/x.jsonl": jsonl(records)}, {"files": "d/*.jsonl", **SHAREGPT})
    message = str(err.value)
    assert "d/x.jsonl row 4" in message and "'conversations'" in message and "role 'bot'" in message
    assert not (tmp_path / "out" / "layout.parquet").exists()


def test_a_message_without_the_keys(tmp_path):
    records = few()
    del records[2]["conversations"][1]["value"]
    with pytest.raises(
        SourceDataError,
        match=r"x\.json row 2 \(id '1002'\): field 'conversations': message 1 has no field 'value'",
    ):
        bad_build(
            tmp_path, {"x.json": json.dumps(records).encode()}, {"files": "x.json", **SHAREGPT}
        )


def test_a_row_without_the_conversation_field(tmp_path):
    table = pa.table({"id": ["a", "b"], "messages": [[{"role": "user", "content": "q"}], None]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    with pytest.raises(
        SourceDataError,
        match=r"data/train-0\.parquet row 1 \(id 'b'\): no conversation \(field 'messages'",
    ):
        bad_build(tmp_path, {"data/train-0.parquet": buffer.getvalue()}, {"split": "train"})


GOOD = b'{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}'


@pytest.mark.parametrize(
    "name, content, problem",
    [
        (
            "x.jsonl",
            b'[{"conversations": []}]',
            "x.jsonl: row 0 is not JSON Lines: a JSON list: name the file .json",
        ),
        ("x.jsonl", GOOD + b'\n{"conversations": [}\n', "x.jsonl row 1: not valid JSON"),
        (
            "x.json",
            GOOD + b"\n" + GOOD + b"\n",
            "x.json: not one JSON list of objects",
        ),
        ("x.json", b"[" + GOOD + b", 7]", "x.json row 1: a number, not a JSON object"),
        (
            "x.json",
            b'[{"conversations": "hi"}]',
            "x.json row 0: field 'conversations' is a string, not a list",
        ),
        ("x.json", b"[" + GOOD + b",]", "x.json row 1: not valid JSON"),
        (
            "x.jsonl",
            b'{"conversations": [{"from": "human", "value": 3}]}\n',
            "x.jsonl row 0: field 'conversations': message 0 (user)'s value is a number, "
            "not a string",
        ),
        ("x.parquet", b"PAR1 not really", "x.parquet: not a readable parquet file"),
        (
            "x.txt",
            b"hello",
            "x.txt: matched the dataset's files glob, but is not .parquet, .jsonl or .json",
        ),
    ],
)
def test_a_file_that_is_not_what_its_extension_says(tmp_path, name, content, problem):
    # a damaged parquet file or a glob that matches other files: the inputs (3); JSON that the
    # layout cannot read: the data (4)
    expected = PinnedInputError if name.endswith((".parquet", ".txt")) else SourceDataError
    with pytest.raises(expected) as err:
        bad_build(tmp_path, {name: content}, {"files": "x.*", **SHAREGPT})
    assert problem in str(err.value)


def test_bad_layout_through_the_command_line(tmp_path):
    records = few()
    records[1]["conversations"][1]["from"] = "assistant"
    manifest = lay_out(
        tmp_path, [({"c.jsonl": jsonl(records)}, {"files": "c.jsonl", **SHAREGPT})], rows=500
    )
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path)
    assert done.returncode == 4, done.stderr
    assert (
        "c.jsonl row 1" in done.stderr
        and "role 'assistant'" in done.stderr
        and "Traceback" not in done.stderr
    )


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"take": 7}, "take: 7, but it has 6 rows"),
        ({"rows": 5}, "has 6 rows, the manifest pins rows: 5"),
    ],
)
def test_source_counts_are_checked(tmp_path, fields, problem):
    with pytest.raises(PinnedInputError, match=problem):
        bad_build(tmp_path, {"c.jsonl": jsonl(few())}, {"files": "c.jsonl", **SHAREGPT, **fields})


@pytest.mark.parametrize(
    "section, problem",
    [
        (
            "dataset: {repo: o/d, revision: REV, split: train}\n"
            "datasets: [{repo: o/d, revision: REV, split: train}]",
            "dataset: give either dataset: (one pin) or datasets:",
        ),
        ("datasets: []", "datasets: expected a non-empty list"),
        (
            "datasets: [{repo: o/d, revision: REV, split: train, permutation_sha256: SHA}]",
            "datasets[0].permutation_sha256: unknown field",
        ),
        ("dataset: {repo: o/d, revision: REV}", "dataset.split: missing"),
        ("dataset: {repo: o/d, revision: REV, files: ../x.json}", "dataset.files: expected a glob"),
        (
            "dataset: {repo: o/d, revision: REV, split: train, keys: {role: from}}",
            "dataset.keys.content: missing",
        ),
        (
            "dataset: {repo: o/d, revision: REV, split: train, roles: [human]}",
            "dataset.roles: expected a mapping",
        ),
        (
            "dataset: {repo: o/d, revision: REV, split: train, take: 0}",
            "dataset.take: expected a whole number > 0",
        ),
    ],
)
def test_manifest_dataset_sections_are_checked(section, problem):
    text = f"""name: m
{section.replace("REV", "a" * 40).replace("SHA", "b" * 64)}
tokenizer: {{repo: o/t, revision: {"a" * 40}, sha256: {FAKE_SHA256}}}
loss_mask: glm5
seed: 1
row_tokens: 8
rows: 1
"""
    with pytest.raises(
        ManifestError,
        match=problem.replace("[", r"\[")
        .replace("(", r"\(")
        .replace(")", r"\)")
        .replace(".", r"\."),
    ):
        parse_manifest(text)


def test_defaults_are_the_tulu_layout():
    manifest = load_manifest(
        Path(__file__).resolve().parents[1] / "manifests" / "glm47flash-tulu3-fixed8192-v1.yaml"
    )
    pin = manifest.dataset
    assert (pin.pattern, pin.messages, pin.keys, pin.roles, pin.id, pin.take) == (
        "data/train-*.parquet",
        "messages",
        ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name"),
        None,
        "id",
        None,
    )
    assert manifest.datasets == (pin,) and not manifest.mixture


def test_json_list_scan_minds_strings_escapes_and_chunk_edges(tmp_path, monkeypatch):
    """Brackets, commas, quotes and backslashes, cut anywhere, read right.

    Brackets, commas, quotes and backslash runs inside strings, cut anywhere by the scan's chunks:
    the objects read are those Python's json reads.
    """
    import random

    rng = random.Random(0)
    layout = Layout.of(
        DatasetPin(
            repo="o/d",
            revision="0" * 40,
            files="x.json",
            messages="conversations",
            keys=("from", "value", *DEFAULT_KEYS[2:]),
            roles=tuple(SHAREGPT_ROLES.items()),
        )
    )

    def text():
        return "".join(
            rng.choice(["a", "\\", '"', ",", "[", "]", "{", "}", " ", "\n", "é", "\\\\"])
            for _ in range(rng.randint(0, 12))
        )

    for _ in range(150):
        monkeypatch.setattr(
            builders.inputs.files, "SCAN_BYTES", rng.choice([1, 2, 3, 7, 64, 1 << 20])
        )
        monkeypatch.setattr(builders.inputs.files, "BLOCK_BYTES", rng.choice([1, 50, 1 << 20]))
        records = [
            {
                "id": i,
                "conversations": [
                    {"from": rng.choice(["human", "gpt"]), "value": text()}
                    for _ in range(rng.randint(1, 3))
                ],
                "other": [text(), {"x": "]\\", "y": [1, text()]}],
            }
            for i in range(rng.randint(0, 6))
        ]
        path = tmp_path / "x.json"
        text_of_file = json.dumps(
            records, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5
        )
        # a UTF-8 byte order mark, sometimes
        path.write_bytes(b"\xef\xbb\xbf" * (rng.random() < 0.3) + text_of_file.encode())
        file = builders.inputs.files.JsonListFile(path, "x.json", layout)
        got = [
            row for block in range(len(file.block_rows)) for row in conversations(file.read(block))
        ]
        assert got == [
            {
                "id": str(r["id"]),
                "source": None,
                "messages": [
                    {"role": SHAREGPT_ROLES[m["from"]], "content": m["value"]}
                    for m in r["conversations"]
                ],
                "tools": None,
                "string_arguments": None,
                "problem": None,
            }
            for r in json.loads(text_of_file)
        ], text_of_file
