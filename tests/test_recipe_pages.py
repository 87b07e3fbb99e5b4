"""Recipe cards as published (text and Markdown pages), mixtures on a card, and ``-q``.

A mixture's card is written here from the manifest's own values, in the seed card's style; its
rows_sha256 is tests/reference.py's (an independent implementation of the row contract).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import yaml
from test_layouts import FAKE_SHA256, lay_out, reference_of
from test_recipe import (
    FIXTURE_CARD,
    SEED_CARD_PAGE,
    SEED_NAME,
    assert_same_manifest,
    cli,
    edited,
    shared_dir,
)

from builders.fixture.hf_cache import parquet_shards
from builders.fixture.make import synthetic_rows
from builders.inputs.recipe import manifest_fields
from builders.manifest import load_manifest, parse_manifest
from helpers import MANIFESTS, SELF_CONTAINED, run_cli
from reference import rows_sha256

PROSE = "Training a tiny model\n\nRows\n\nfixture-synthetic-v1 (rows_sha256 380bf27f...)\n\n"


def page(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_seed_card_as_published_checks_and_implies_its_manifest(tmp_path, capsys):
    shared = shared_dir()
    if shared is None or not (shared / SEED_CARD_PAGE).is_file():
        pytest.skip(f"needs ../shared/{SEED_CARD_PAGE} (the seed's recipe card page)")
    published = shared / SEED_CARD_PAGE
    code, out, err = cli(capsys, "check-recipe", str(published), "--json")
    assert code == 0, out + err
    result = json.loads(out)
    assert result["manifest"] == str(MANIFESTS / f"{SEED_NAME}.yaml")
    assert {f["status"] for f in result["fields"]} == {"ok"} and len(result["fields"]) > 15
    implied = tmp_path / "implied.yaml"
    assert cli(capsys, "manifest", "--from-recipe", str(published), "-o", str(implied))[0] == 0
    assert_same_manifest(load_manifest(implied), load_manifest(MANIFESTS / f"{SEED_NAME}.yaml"))


def test_a_markdown_page_with_the_card_in_a_fenced_block(tmp_path, capsys):
    card = FIXTURE_CARD.read_text(encoding="utf-8")
    text = (
        f"# {PROSE}```bash\nschema_version: not this one, a shell line\n```\n\n"
        f"```yaml\n{card}```\n\nMore prose: key: value\n"
    )
    code, out, err = cli(capsys, "check-recipe", str(page(tmp_path, "card.md", text)))
    assert code == 0, out + err
    assert "card matches:" in out and "DIFFERS" not in out


def test_a_text_page_with_the_yaml_document_inside(tmp_path, capsys):
    card = FIXTURE_CARD.read_text(encoding="utf-8")
    text = f"{PROSE}export X=1\n{card}---\nWhat follows the card is not read: [unclosed\n"
    code, out, err = cli(capsys, "check-recipe", str(page(tmp_path, "card.txt", text)))
    assert code == 0, out + err


@pytest.mark.parametrize(
    "text, problem",
    [
        (PROSE, "no recipe card in this page"),
        (
            f"{PROSE}```yaml\nschema_version: 1\n```\n```\nschema_version: 1\n```\n",
            "2 recipe cards in this page (from lines 8, 11)",
        ),
        # the error's line is the page's: line 8
        (f"{PROSE}schema_version: 1\nnotes: [unclosed\n", "line 8"),
    ],
)
def test_a_page_without_one_readable_card_is_refused(text, problem, tmp_path, capsys):
    code, _, err = cli(capsys, "check-recipe", str(page(tmp_path, "card.txt", text)))
    assert code == 2 and problem in err, err


def test_quiet_still_shows_both_values_of_a_differing_field(tmp_path, capsys):
    card = edited(FIXTURE_CARD, tmp_path, ("seed: 42", "seed: 43"))
    code, out, _ = cli(capsys, "check-recipe", str(card), "-q")
    assert code == 5
    assert "DIFFERS         seed: card 43 (workload.dataset.build.seed), manifest 42" in out
    assert " ok " not in out and "card DIFFERS in seed:" in out


def mixture_card(manifest, rows_sha256: str) -> str:
    """A card for ``manifest`` (a mixture) in the seed card's style, from its own values."""
    doc = yaml.safe_load(manifest.read_text())
    tok = doc["tokenizer"]
    line = (
        f"{tok['repo']} (revision {tok['revision']}; tokenizer.json sha256 "
        f"{tok['sha256']['tokenizer.json']}; chat_template.jinja sha256 "
        f"{tok['sha256']['chat_template.jinja']})"
    )
    sources = "".join(
        f"    - name: part {j}\n      source: https://huggingface.co/datasets/{pin['repo']}\n"
        f"      revision: {pin['revision']}\n      license: CC0-1.0\n      take: {pin['take']}\n"
        for j, pin in enumerate(doc["datasets"])
    )
    return (
        "schema_version: 1\nmodel: tiny\nworkload:\n"
        f"  row_tokens: {doc['row_tokens']}\n"
        f"  dataset:\n    name: a mixture\n    sources:\n{sources}"
        f"    rows_sha256: {rows_sha256}\n"
        f"    build:\n      name: {doc['name']}\n      tokenizer: {line}\n"
        f"      loss_mask: {doc['loss_mask']}\n      rows: {doc['rows']}\n"
        f"      row_tokens: {doc['row_tokens']}\n      padding_tokens: 0\n"
        f"      seed: {doc['seed']}\n"
    )


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    """A two-source mixture laid out, its card, and the rows tests/reference.py gives."""
    home = tmp_path_factory.mktemp("mixture")
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    datasets = [
        (
            parquet_shards(synthetic_rows(seed=s, count=30), 2, 7, message),
            {"split": "train", "take": take},
        )
        for s, take in ((21, 20), (22, 25))
    ]
    manifest = lay_out(home, datasets, rows=12, seed=9, name="mix")
    expected, _, _ = reference_of(home, manifest)
    card = home / "mix-card.yaml"
    card.write_text(mixture_card(manifest, rows_sha256(expected)), encoding="utf-8")
    return home, manifest, card


def test_a_mixture_card_implies_the_mixture_and_its_rows_verify(mixture, tmp_path):
    home, manifest, card = mixture
    implied = tmp_path / "implied.yaml"
    done = run_cli("manifest", "--from-recipe", str(card), "-o", str(implied))
    assert done.returncode == 0, done.stderr
    got, pinned = load_manifest(implied), load_manifest(manifest)
    assert [(d.repo, d.revision, d.split, d.take) for d in got.datasets] == [
        (d.repo, d.revision, d.split, d.take) for d in pinned.datasets
    ]
    assert "datasets[*].split: train, assumed" in implied.read_text()
    built = run_cli("--manifest", str(implied), "--out", str(tmp_path / "out"), hf_home=home)
    assert built.returncode == 0 and "verified:" in built.stdout, built.stdout + built.stderr
    done = run_cli(
        "check-recipe",
        str(card),
        "--manifest",
        str(manifest),
        "--rows",
        str(tmp_path / "out" / "mix.parquet"),
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fields = {f["field"]: f for f in json.loads(done.stdout)["fields"]}
    assert fields["datasets"]["status"] == "ok" and fields["datasets[1].take"]["card"] == 25
    assert fields["datasets[0].repo"]["card_field"] == "workload.dataset.sources[0].source"


def test_a_mixture_card_that_differs_names_the_source(mixture, tmp_path, capsys):
    _, manifest, card = mixture
    changed = edited(card, tmp_path, ("take: 25", "take: 24"))
    code, out, _ = cli(capsys, "check-recipe", str(changed), "--manifest", str(manifest), "-q")
    assert code == 5
    assert (
        "DIFFERS         datasets[1].take: card 24 (workload.dataset.sources[1].take), manifest 25"
        in out
    )
    code, out, _ = cli(capsys, "check-recipe", str(card), "--build", SELF_CONTAINED, "-q")
    assert code == 5 and "DIFFERS         datasets: card 2 (workload.dataset (how many)), " in out


def test_a_card_gives_one_source_or_a_list(tmp_path, capsys):
    both = edited(
        FIXTURE_CARD,
        tmp_path,
        (
            "    rows_sha256:",
            "    sources: [{source: o/d, revision: " + "a" * 40 + "}]\n    rows_sha256:",
        ),
    )
    code, _, err = cli(capsys, "check-recipe", str(both))
    assert code == 2 and "workload.dataset.sources: give either source:" in err


def test_a_mixture_manifest_has_the_fields_a_card_names():
    pins = "".join(f"\n  - {{repo: o/d{j}, revision: {'a' * 40}, split: train}}" for j in range(2))
    manifest = parse_manifest(f"""name: m
datasets:{pins}
tokenizer: {{repo: o/t, revision: {"a" * 40}, sha256: {FAKE_SHA256}}}
loss_mask: glm5
seed: 1
row_tokens: 8
rows: 1
""")
    assert manifest.mixture and [pin.repo for pin in manifest.datasets] == ["o/d0", "o/d1"]
    assert set(manifest.recipe()) >= {"datasets[0].repo", "datasets[1].revision"}
    fields = manifest_fields(manifest)
    assert fields["datasets[0].repo"] == "o/d0" and fields["datasets[1].revision"] == "a" * 40
    assert "dataset.repo" not in fields


def test_unknown_fields_of_a_mixture_source_join_the_one_note(mixture, tmp_path, capsys):
    _, manifest, card = mixture
    changed = edited(
        card,
        tmp_path,
        ("      take: 25\n", "      take: 25\n      weight: 2\n"),
        ("model:", "x: 1\nmodel:"),
    )
    code, _, err = cli(capsys, "check-recipe", str(changed), "--manifest", str(manifest))
    assert code == 0
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: fields this parser does not know, not read: x, workload.dataset.sources[1].weight"
    ]
