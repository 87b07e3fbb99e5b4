"""explain: the reading that made a manifest's pinned rows.

The reading of the row contract, found by search.

The pinned figures come from tests/reference.py (an independent implementation of every reading)
under a reading that is not the default; a manifest pins them without saying the reading, and
``explain`` must name exactly that reading. The dataset is the readings dataset of
tests/helpers.py (two answers in a row, role-token text in user and assistant messages, a
tokenizer whose post-processor adds ``[gMASK]<sop>``), where the readings make different rows.
"""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import builders.encode.engines
from builders.build import build
from builders.contract import DEFAULT, KEYS, Contract
from builders.inputs.pinned import Hub
from builders.runtime.progress import Reporter
from builders.views.explain import describe_writers, explain, writers
from builders.views.writers import VARIANTS as WRITER_VARIANTS
from builders.views.writers import WriterVariant
from helpers import (
    SELF_CONTAINED,
    file_rows,
    lay_out_readings,
    manifest_under,
    readings_rows,
    reference_under,
    run_cli,
)
from reference import rows_sha256

PINNED_READINGS = [
    {"prefill": "after-role"},
    {"eos": "none", "hash": "i8-i8"},
    {"order": "python-random", "stop": "unsupervised"},
    {"encode": "add-special", "final": "append-stop", "hash": "u4-all-u1-all"},
    {"order": "numpy-legacy", "eos": "unsupervised", "skip": "keep-all"},
    {"mask_rule": "slime-pr1844"},
    {"mask_rule": "slime-pr1824", "hash": "ids-u4"},
]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("explain")
    lay_out_readings(home)
    return home


def hub(home):
    return Hub(home / "hub", offline=True)


def pinned_expect(rows, layout: str = "u4-u1") -> str:
    """``expect:`` lines pinning ``rows``.

    Their hash in ``layout`` and their ratio at four decimals.
    """
    supervised = sum(sum(mask) for _, mask in rows)
    ratio = supervised / sum(len(mask) for _, mask in rows)
    return (
        f"expect:\n  rows_sha256: {rows_sha256(rows, layout)}\n"
        f"  supervised_token_ratio: {ratio:.4f}\n"
    )


@pytest.mark.parametrize(
    "readings", PINNED_READINGS, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items())
)
def test_explain_names_the_reading_that_made_the_pinned_rows(hf_home, readings, tmp_path):
    made_under = manifest_under(hf_home, "readings", readings, tmp_path)
    expect = pinned_expect(
        reference_under(hf_home, made_under, readings), readings.get("hash", "u4-u1")
    )
    (tmp_path / "pinned").mkdir()
    pinned = manifest_under(hf_home, "readings", {}, tmp_path / "pinned", expect=expect)

    found = explain(pinned, hub(hf_home), Reporter.silent())
    assert found.matches == [Contract(**readings)]
    assert Contract(**{**readings, "hash": "u4-u1"}) in [
        contract for contract, _ in found.ratio_matches
    ]

    # and the manifest that says the reading builds the pinned rows
    (tmp_path / "fixed").mkdir()
    fixed = manifest_under(hf_home, "readings", readings, tmp_path / "fixed", expect=expect)
    assert build(fixed, tmp_path / "out", hub(hf_home), card=False).verified


def test_explain_encodes_each_conversation_once_for_the_whole_search(
    hf_home, tmp_path, monkeypatch
):
    encoded = []
    original = builders.encode.engines.TokenizersEngine.encode

    def counting(self, texts):
        encoded.extend(texts)
        return original(self, texts)

    monkeypatch.setattr(builders.encode.engines.TokenizersEngine, "encode", counting)
    pinned = manifest_under(
        hf_home, "readings", {}, tmp_path, expect=f"expect:\n  rows_sha256: {'0f' * 32}\n"
    )
    found = explain(pinned, hub(hf_home), Reporter.silent(), everything=True, engine="tokenizers")
    # four orders, two encodes: every reading was tried
    assert found.tried == found.readings > 500
    assert len(encoded) <= len(readings_rows())


@pytest.mark.slow
def test_no_reading_reproduces_the_hash_then_the_ratio_matches_are_named_closest_first(
    hf_home, tmp_path
):
    made_under = manifest_under(hf_home, "readings", {}, tmp_path)
    rows = reference_under(hf_home, made_under, {})
    ratio = sum(sum(mask) for _, mask in rows) / sum(len(mask) for _, mask in rows)
    (tmp_path / "pinned").mkdir()
    pinned = manifest_under(
        hf_home,
        "readings",
        {},
        tmp_path / "pinned",
        expect=f"expect:\n  rows_sha256: {'ab' * 32}\n  supervised_token_ratio: {ratio:.2f}\n",
    )
    done = run_cli("explain", "--manifest", str(pinned.path), "--json", hf_home=hf_home)
    assert done.returncode == 5, done.stderr
    out = json.loads(done.stdout)
    assert out["matches"] == [] and out["tried"] == out["readings"]
    distances = [abs(m["supervised_token_ratio"] - round(ratio, 2)) for m in out["ratio_matches"]]
    assert distances == sorted(distances) and all(d <= 0.005 for d in distances)
    assert {
        "contract": DEFAULT.as_dict(),
        "deviations": {},
        "supervised_token_ratio": ratio,
    } in out["ratio_matches"]
    assert all(set(m["contract"]) == set(KEYS) for m in out["ratio_matches"])

    text = run_cli("explain", "--manifest", str(pinned.path), hf_home=hf_home)
    assert text.returncode == 5
    assert "no reading reproduces rows_sha256" in text.stdout and "closest first" in text.stdout


@pytest.mark.slow
def test_explain_on_a_shipped_manifest_finds_the_default_reading(tmp_path):
    done = run_cli(
        "explain", "--build", SELF_CONTAINED, "--fixture-cache", str(tmp_path / "cache"), "--json"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [m["contract"] for m in out["matches"]] == [DEFAULT.as_dict()]
    assert set(out) >= {"matches", "ratio_matches", "tried", "readings", "notes"}

    text = run_cli(
        "-q", "explain", "--build", SELF_CONTAINED, "--fixture-cache", str(tmp_path / "cache")
    )
    assert text.returncode == 0 and "the default reading" in text.stdout


def test_explain_refuses_a_manifest_that_pins_nothing_to_explain(hf_home, tmp_path):
    done = run_cli("explain", "--manifest", str(hf_home / "readings.yaml"), hf_home=hf_home)
    assert done.returncode == 2
    assert "pins neither rows_sha256 nor supervised_token_ratio" in done.stderr


def test_a_build_that_differs_says_how_to_explain_it(hf_home, tmp_path):
    pinned = manifest_under(
        hf_home, "readings", {}, tmp_path, expect=f"expect:\n  rows_sha256: {'ab' * 32}\n"
    )
    result = build(pinned, tmp_path / "out", hub(hf_home), card=False)
    assert not result.verified
    assert any(f"explain --manifest {pinned.path}" in note for note in result.verification.notes)

    done = run_cli("--manifest", str(pinned.path), "--out", str(tmp_path / "cli"), hf_home=hf_home)
    assert done.returncode == 5 and f"explain --manifest {pinned.path}" in done.stderr


def test_rows_that_match_in_a_file_that_does_not_name_the_figure_and_the_writer(hf_home, tmp_path):
    built = build(
        manifest_under(hf_home, "readings", {}, tmp_path),
        tmp_path / "first",
        hub(hf_home),
        card=False,
    )
    figures = json.loads(built.report.read_text())["figures"]
    (tmp_path / "pinned").mkdir()
    pinned = manifest_under(
        hf_home,
        "readings",
        {},
        tmp_path / "pinned",
        expect=(
            f"expect:\n  rows_sha256: {figures['rows_sha256']}\n"
            f"  parquet_bytes: {figures['parquet_bytes'] + 1}\n"
        ),
    )
    result = build(pinned, tmp_path / "second", hub(hf_home), card=False)
    (note,) = [n for n in result.verification.notes if "only the file differs" in n]
    assert "(parquet_bytes)" in note and "fixed-sft's writer" in note and "--writer" in note


def test_explain_writer_names_the_writer_of_a_file_written_otherwise(hf_home, tmp_path):
    """A file written by pyarrow's defaults is named by its size.

    Its ids are int64, its mask bool, with no metadata.
    """
    built = build(
        manifest_under(hf_home, "readings", {}, tmp_path),
        tmp_path / "ours",
        hub(hf_home),
        card=False,
    )
    rows = file_rows(built.parquet)
    theirs = tmp_path / "theirs.parquet"
    pq.write_table(
        pa.table(
            {
                "input_ids": pa.array([ids for ids, _ in rows], pa.list_(pa.int64())),
                "loss_mask": pa.array(
                    [[bool(v) for v in mask] for _, mask in rows], pa.list_(pa.bool_())
                ),
            }
        ),
        theirs,
    )
    size, digest = theirs.stat().st_size, hashlib.sha256(theirs.read_bytes()).hexdigest()
    (tmp_path / "pinned").mkdir()
    pinned = manifest_under(
        hf_home,
        "readings",
        {},
        tmp_path / "pinned",
        expect=(
            f"expect:\n  rows_sha256: {rows_sha256(rows)}\n  parquet_sha256: {digest}\n"
            f"  parquet_bytes: {size}\n"
        ),
    )
    (tmp_path / "work").mkdir()
    written = writers(pinned, DEFAULT, hub(hf_home), tmp_path / "work", Reporter.silent())
    assert [w.variant for w in written] == WRITER_VARIANTS
    same_size = [w for w in written if w.bytes == size]
    assert [w.variant for w in same_size] == [WriterVariant("pyarrow", "int64", "bool", False)]
    assert same_size[0].sha256 == digest
    # fixed-sft's own writer: the file the build wrote
    assert written[0].bytes == built.parquet.stat().st_size
    lines = list(describe_writers(written, pinned))
    assert lines == [
        f"writers: pyarrow, input_ids int64, loss_mask bool, no metadata "
        f"gives parquet_bytes {size:,}; "
        f"parquet_sha256 matches too with pyarrow {pa.__version__}: pin expect.writer: "
        f"pyarrow {pa.__version__}"
    ]


def test_explain_writer_on_the_command_line(tmp_path):
    done = run_cli(
        "explain",
        "--build",
        SELF_CONTAINED,
        "--fixture-cache",
        str(tmp_path / "cache"),
        "--writer",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)["writers"]
    assert len(written) == len(WRITER_VARIANTS)
    assert written[0]["writer"] == "fixed-sft" and written[0]["bytes_match"] is True
    assert all(
        set(w)
        == {
            "writer",
            "input_ids",
            "loss_mask",
            "metadata",
            "parquet_bytes",
            "parquet_sha256",
            "bytes_match",
            "sha256_match",
        }
        for w in written
    )
