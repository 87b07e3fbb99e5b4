"""Recipe cards: ``manifest --from-recipe`` and ``check-recipe``.

On the seed's card, on a card made for the fixture build (so a fresh clone tests them too), and on
edited copies of both.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders.cli import main
from builders.fixture.make import shared_dir
from builders.manifest import load_manifest
from builders.yamlfile import MAX_BYTES, MAX_DEPTH
from helpers import MANIFESTS, REPO, SELF_CONTAINED, run_cli

SEED_NAME = "glm47flash-tulu3-fixed8192-v1"
FIXTURE_CARD = REPO / "tests" / "cards" / f"{SELF_CONTAINED}.yaml"
SEED_CARD_PAGE = "spec/recipe-glm47flash-h200-attune.txt"
CARD_YAML_STARTS = "# recipes/glm-4.7-flash/h200/attune-tp1-pp1-ep8.yaml"


def seed_card(tmp_path):
    """The seed's card as a CARD.yaml.

    The YAML part of the page in ../shared/spec.
    """
    shared = shared_dir()
    if shared is None or not (shared / SEED_CARD_PAGE).is_file():
        pytest.skip(
            f"needs ../shared/{SEED_CARD_PAGE} (the seed's recipe card), which this checkout lacks"
        )
    page = (shared / SEED_CARD_PAGE).read_text(encoding="utf-8")
    path = tmp_path / "attune-tp1-pp1-ep8.yaml"
    path.write_text(page[page.index(CARD_YAML_STARTS) :], encoding="utf-8")
    return path


CARDS = {SEED_NAME: seed_card, SELF_CONTAINED: lambda tmp_path: FIXTURE_CARD}


def edited(card, tmp_path, *replacements):
    """A copy of ``card`` with each (old, new) text replaced.

    Each old text must be on the card once.
    """
    text = card.read_text(encoding="utf-8")
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "edited.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def cli(capsys, *args):
    """The command line run in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_same_manifest(implied, shipped):
    """Field by field: every field the card carries equal.

    Those it does not carry are left out.
    """
    assert implied.path != shipped.path
    for field in dataclasses.fields(shipped):
        name = field.name
        # where it was read from, and its text as written
        if name in ("path", "text"):
            continue
        got, expected = getattr(implied, name), getattr(shipped, name)
        # one; the card gives no source row count or permutation hash
        if name == "datasets":
            (got,), (expected,) = got, expected
            assert (got.rows, got.permutation_sha256) == (None, None)
            expected = dataclasses.replace(expected, rows=None, permutation_sha256=None)
        # nor the writer of its file, nor the rows' segments
        if name == "expect":
            assert got.writer is None and got.segments_sha256 is None
            expected = dataclasses.replace(expected, writer=None, segments_sha256=None)
        assert got == expected, name


@pytest.mark.parametrize("name", [SEED_NAME, SELF_CONTAINED])
def test_the_card_implies_its_shipped_manifest(name, tmp_path):
    card = CARDS[name](tmp_path)
    out = tmp_path / "implied.yaml"
    done = run_cli("manifest", "--from-recipe", str(card), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert_same_manifest(load_manifest(out), load_manifest(MANIFESTS / f"{name}.yaml"))
    text = out.read_text(encoding="utf-8")
    assert "dataset.split: train, assumed" in text and "expect.writer: left out" in text
    assert "expect.segments_sha256: left out" in text
    assert (
        "dataset.rows, dataset.permutation_sha256: left out" in text
        and "contract: left out" in text
    )


@pytest.mark.parametrize("name", [SEED_NAME, SELF_CONTAINED])
def test_the_card_checks_against_its_shipped_manifest(name, tmp_path, capsys):
    code, out, err = cli(capsys, "check-recipe", str(CARDS[name](tmp_path)), "--json")
    assert code == 0, out + err
    result = json.loads(out)
    assert result["matches"] and result["manifest"] == str(MANIFESTS / f"{name}.yaml")
    assert {f["status"] for f in result["fields"]} == {"ok"}
    assert {f["field"] for f in result["fields"]} >= {
        "expect.rows_sha256",
        "expect.parquet_sha256",
        "tokenizer.sha256.chat_template.jinja",
        "tokenizer.repo",
    }
    # nothing unknown on the card
    assert err == ""


def test_a_changed_hash_is_named_with_both_values(tmp_path, capsys):
    old = "d4dd773eabe1d2ae7cb47d221c1aff3b146c97b46eecec30caca6c7fbb4116a5"
    # a string in YAML (64 zeros would be a number)
    new = "f" * 64
    card = edited(FIXTURE_CARD, tmp_path, (old, new))
    code, out, _ = cli(capsys, "check-recipe", str(card))
    assert code == 5
    assert (
        f"DIFFERS         expect.parquet_sha256: card {new} "
        f"(workload.dataset.build.parquet_sha256), "
        f"manifest {old}" in out
    )
    assert "card DIFFERS in expect.parquet_sha256:" in out


def test_every_differing_field_is_named(tmp_path, capsys):
    card = edited(
        FIXTURE_CARD,
        tmp_path,
        ("seed: 42", "seed: 43"),
        ("supervised_token_ratio: 0.5342", "supervised_token_ratio: 0.534"),
        ("(revision d4e7779b0ae58830e80a2a8d3e6f7983a0de2504;", f"(revision {'a' * 40};"),
    )
    code, out, _ = cli(capsys, "check-recipe", str(card), "-q")
    assert code == 5
    assert "card DIFFERS in tokenizer.revision, seed, expect.supervised_token_ratio:" in out


def test_a_ratio_written_with_trailing_zeros_is_the_same_figure(tmp_path, capsys):
    card = edited(
        FIXTURE_CARD,
        tmp_path,
        ("supervised_token_ratio: 0.5342", "supervised_token_ratio: 0.53420"),
    )
    assert cli(capsys, "check-recipe", str(card))[0] == 0


def test_a_missing_figure_is_reported_not_guessed(tmp_path, capsys):
    card = edited(FIXTURE_CARD, tmp_path, ("      parquet_bytes: 35434\n", ""))
    code, out, _ = cli(capsys, "check-recipe", str(card))
    assert code == 0
    assert (
        "not on card     expect.parquet_bytes (workload.dataset.build.parquet_bytes): "
        "manifest 35434" in out
    )
    assert "; not on the card: expect.parquet_bytes" in out
    implied = tmp_path / "implied.yaml"
    code, _, err = cli(capsys, "manifest", "--from-recipe", str(card), "-o", str(implied))
    assert code == 0
    assert load_manifest(implied).expect.parquet_bytes is None
    assert "expect.parquet_bytes: left out, not verified" in implied.read_text(encoding="utf-8")
    assert "workload.dataset.build.parquet_bytes is not on the card" in err


def test_a_card_lacking_what_a_manifest_needs_makes_none(tmp_path, capsys):
    card = edited(FIXTURE_CARD, tmp_path, ("      seed: 42\n", ""))
    output = tmp_path / "implied.yaml"
    code, out, err = cli(capsys, "manifest", "--from-recipe", str(card), "-o", str(output))
    assert code == 2 and not output.exists()
    assert (
        "the card does not give what a manifest needs: seed (card: workload.dataset.build.seed)"
        in err
    )
    code, out, _ = cli(capsys, "check-recipe", str(card))
    assert code == 0 and "not on card     seed (workload.dataset.build.seed): manifest 42" in out


@pytest.mark.parametrize(
    "line, named",
    [
        (
            "glm-shaped-tiny revision d4e7779b0ae58830e80a2a8d3e6f7983a0de2504",
            "workload.dataset.build.tokenizer: expected",
        ),
        (
            "glm-shaped-tiny (revision d4e7779b; tokenizer.json sha256 4cf5)",
            "workload.dataset.build.tokenizer (revision): expected a 40-hex commit, got 'd4e7779b'",
        ),
        (
            "glm-shaped-tiny "
            "(revision d4e7779b0ae58830e80a2a8d3e6f7983a0de2504; tokenizer.json 4cf5)",
            "workload.dataset.build.tokenizer: cannot read 'tokenizer.json 4cf5'",
        ),
    ],
)
def test_a_malformed_tokenizer_line_is_refused_by_name(line, named, tmp_path, capsys):
    text = FIXTURE_CARD.read_text(encoding="utf-8")
    start, end = text.index("      tokenizer: "), text.index("      loss_mask: ")
    card = tmp_path / "edited.yaml"
    card.write_text(f"{text[:start]}      tokenizer: {line}\n{text[end:]}", encoding="utf-8")
    for command in (["check-recipe", str(card)], ["manifest", "--from-recipe", str(card)]):
        code, _, err = cli(capsys, *command)
        assert code == 2, err
        assert named in err and "Traceback" not in err


def test_a_tokenizer_line_naming_another_repo_leaves_the_repo_unknown(tmp_path, capsys):
    card = edited(
        FIXTURE_CARD,
        tmp_path,
        (
            "source: https://huggingface.co/fixed-sft-fixtures/glm-shaped-tiny",
            "source: https://huggingface.co/someone/other-model",
        ),
    )
    code, out, err = cli(capsys, "check-recipe", str(card))
    assert code == 0 and "not on card     tokenizer.repo" in out
    assert (
        "names 'glm-shaped-tiny', not a Hub repo, "
        "and result.active_params.source is someone/other-model" in err
    )
    code, _, err = cli(capsys, "manifest", "--from-recipe", str(card))
    assert code == 2 and "tokenizer.repo (card: workload.dataset.build.tokenizer" in err


def test_unknown_fields_are_one_note_never_fatal(tmp_path, capsys):
    card = edited(
        FIXTURE_CARD,
        tmp_path,
        ("      builder:", "      shuffle_buffer: 4096\n      builder:"),
        ("patches: []", "patches: []\nsignature: abc"),
    )
    code, _, err = cli(capsys, "check-recipe", str(card))
    assert code == 0
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: fields this parser does not know, not read: signature, "
        "workload.dataset.build.shuffle_buffer"
    ]
    code, _, err = cli(capsys, "manifest", "--from-recipe", str(card))
    assert code == 0 and err.count("note: fields this parser does not know") == 1


@pytest.mark.parametrize(
    "text, named",
    [
        ("- schema_version: 1\n", "top level: expected a mapping, got list"),
        ("just words\n", "top level: expected a mapping, got str"),
        (
            "schema_version: 2\nworkload: {}\n",
            "schema_version: this parser reads schema_version 1, got 2",
        ),
        ("schema_version: '1'\n", "schema_version: this parser reads schema_version 1, got '1'"),
        ("model: x\n", "schema_version: missing"),
        ("schema_version: 1\nworkload: [1, 2]\n", "workload: expected a mapping, got list"),
        (
            "schema_version: 1\nworkload:\n  dataset:\n    build:\n      seed: forty-two\n",
            "workload.dataset.build.seed: expected a whole number >= 0, got 'forty-two'",
        ),
        (
            "schema_version: 1\nworkload:\n  dataset:\n    rows_sha256: 1234\n",
            "workload.dataset.rows_sha256: expected a string, got int",
        ),
        ("schema_version: 1\nschema_version: 1\n", "duplicate key 'schema_version'"),
        ("schema_version: 1\na: &a {x: 1}\nb: {<<: *a}\n", "merge keys (<<) are not read"),
        (
            "schema_version: 1\nnotes: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n",
            "nested deeper than",
        ),
        ("schema_version: 1\nnotes: [" + "1, " * 60_000 + "]\n", "YAML nodes, too many"),
        (
            "schema_version: 1\nnotes: '" + "x" * MAX_BYTES + "'\n",
            "too large for a recipe card",
        ),
        ("schema_version: 1\nnotes: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_card_is_refused_by_name(text, named, tmp_path, capsys):
    card = tmp_path / "card.yaml"
    card.write_text(text, encoding="utf-8")
    for command in (
        ["check-recipe", str(card), "--build", SELF_CONTAINED],
        ["manifest", "--from-recipe", str(card)],
    ):
        code, out, err = cli(capsys, *command)
        assert code == 2, out + err
        assert f"error: {card}: " in err and named in err, err


def test_a_card_that_is_not_text_or_not_there(tmp_path, capsys):
    binary = tmp_path / "card.yaml"
    binary.write_bytes(b"schema_version: 1\nnotes: \xff\n")
    assert "not UTF-8 text" in cli(capsys, "check-recipe", str(binary))[2]
    code, _, err = cli(capsys, "check-recipe", str(tmp_path / "absent.yaml"))
    assert code == 2 and "absent.yaml: no such file" in err


def test_a_card_without_a_build_name_needs_one_given(tmp_path, capsys):
    card = edited(FIXTURE_CARD, tmp_path, ("      name: fixture-synthetic-v1\n", ""))
    code, _, err = cli(capsys, "check-recipe", str(card))
    assert code == 2 and "the card names no build (workload.dataset.build.name)" in err
    code, out, _ = cli(
        capsys, "check-recipe", str(card), "--manifest", str(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    )
    assert code == 0 and "not on card     name" in out


def test_check_against_another_manifest(tmp_path, capsys):
    code, out, _ = cli(
        capsys, "check-recipe", str(FIXTURE_CARD), "--build", "fixture-synthetic-edited-v1", "-q"
    )
    assert code == 5 and "card DIFFERS in name," in out and "expect.rows_sha256" in out


def test_rows_verified_against_the_card_and_manifest(row_file, tmp_path):
    built = row_file(SELF_CONTAINED)
    done = run_cli("check-recipe", str(FIXTURE_CARD), "--rows", str(built))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rows verified" in done.stdout

    table = pq.read_table(built)
    ids = table.column("input_ids").to_pylist()
    ids[3][7] += 1
    tampered = tmp_path / f"{SELF_CONTAINED}.parquet"
    pq.write_table(table.set_column(0, "input_ids", pa.array(ids, pa.list_(pa.int32()))), tampered)
    done = run_cli("check-recipe", str(FIXTURE_CARD), "--rows", str(tampered))
    assert done.returncode == 5
    assert "DIFFERS     rows_sha256" in done.stdout and "card matches" in done.stdout
    assert "rows NOT verified" in done.stdout


def test_the_manifest_printed_is_the_manifest_written(tmp_path, capsys):
    written = tmp_path / "implied.yaml"
    assert cli(capsys, "manifest", "--from-recipe", str(FIXTURE_CARD), "-o", str(written))[0] == 0
    code, out, _ = cli(capsys, "manifest", "--from-recipe", str(FIXTURE_CARD))
    assert code == 0 and out == written.read_text(encoding="utf-8")
    code, _, err = cli(
        capsys,
        "manifest",
        "--from-recipe",
        str(FIXTURE_CARD),
        "-o",
        str(tmp_path / "no" / "x.yaml"),
    )
    assert code == 6 and "cannot write " in err and "x.yaml: No such file or directory" in err


def test_a_card_without_rows_has_nothing_to_check(tmp_path, capsys):
    card = tmp_path / "card.yaml"
    card.write_text("schema_version: 1\nmodel: some-model\n", encoding="utf-8")
    code, _, err = cli(capsys, "check-recipe", str(card), "--build", SELF_CONTAINED)
    assert code == 2 and "the card publishes no rows (workload.dataset): nothing to check" in err
    code, _, err = cli(capsys, "manifest", "--from-recipe", str(card))
    assert (
        code == 2
        and "the card does not give what a manifest needs: name (card: workload.dataset.build.name)"
        in err
    )


def test_a_tokenizer_file_a_manifest_does_not_pin_is_a_note(tmp_path, capsys):
    card = edited(
        FIXTURE_CARD,
        tmp_path,
        (
            "77ac268bf198fd3c0ce678f6e97f9c746e5be5f96706aaf80edf6e5eaf24a83b)",
            f"77ac268bf198fd3c0ce678f6e97f9c746e5be5f96706aaf80edf6e5eaf24a83b; "
            f"tokenizer_config.json sha256 {'e' * 64})",
        ),
    )
    code, _, err = cli(capsys, "check-recipe", str(card))
    assert code == 0
    assert "pins tokenizer_config.json, which a manifest does not carry: not compared" in err


def test_a_build_name_not_shipped_needs_its_manifest_given(tmp_path, capsys):
    card = edited(
        FIXTURE_CARD,
        tmp_path,
        ("      name: fixture-synthetic-v1\n", "      name: someone-elses-v2\n"),
    )
    code, _, err = cli(capsys, "check-recipe", str(card))
    assert code == 2 and "no manifest" in err and "someone-elses-v2.yaml" in err
    code, out, _ = cli(capsys, "check-recipe", str(card), "--build", SELF_CONTAINED, "-q")
    assert code == 5 and "card DIFFERS in name:" in out
