"""Refused conversations left out (``leave_out_refused: N``), and ``rows: all``.

The rows are held to tests/reference.py, which leaves a refused conversation out of the stream
at its place in the order (data/ROWS.md, "Rows").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.build import build
from builders.errors import ManifestError, SourceDataError
from builders.fixture.make import synthetic_rows
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from helpers import file_rows, lay_out_build, reference_under, run_cli

BAD = (4, 13, 21)


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Forty conversations, three of them with a role no template knows."""
    hf_home = tmp_path_factory.mktemp("hf")
    rows = synthetic_rows(seed=2, count=30)
    for index in BAD:
        rows[index]["messages"].append({"role": "function", "content": "x"})
    lay_out_build(hf_home, rows, name="refusing", build_rows=30, row_tokens=120)
    return hf_home, rows


def manifest_with(hf_home: Path, folder: Path, **fields):
    text = (hf_home / "refusing.yaml").read_text()
    for key, value in fields.items():
        text = text.replace(f"\n{key}: ", f"\n{key}_was: ") + f"{key}: {value}\n"
        text = "\n".join(line for line in text.splitlines() if "_was: " not in line) + "\n"
    path = folder / "refusing.yaml"
    path.write_text(text)
    return load_manifest(path)


def test_refused_conversations_are_left_out_as_the_reference_leaves_them(laid_out, tmp_path):
    hf_home, rows = laid_out
    manifest = manifest_with(hf_home, tmp_path, leave_out_refused=3, rows="all")
    result = build(manifest, tmp_path / "out", Hub(hf_home / "hub", offline=True), workers=1)
    left_out = []
    expected = reference_under(hf_home, manifest, {}, left_out=left_out)
    assert sorted(left_out) == sorted(BAD)
    assert file_rows(result.parquet) == expected
    report = json.loads(result.report.read_text())
    assert [r["source_index"] for r in report["refused_left_out"]] == left_out
    assert [r["id"] for r in report["refused_left_out"]] == [rows[i]["id"] for i in left_out]
    assert all("role 'function'" in r["reason"] for r in report["refused_left_out"])
    assert report["recipe"]["leave_out_refused"] == 3 and report["recipe"]["rows"] == "all"
    card = result.report.with_name("refusing.md").read_text()
    assert "### Conversations left out" in card
    assert all(f"| {i} | {rows[i]['id']} |" in card for i in BAD)


def test_rows_all_drops_and_counts_the_remainder(laid_out, tmp_path):
    hf_home, _ = laid_out
    manifest = manifest_with(hf_home, tmp_path, leave_out_refused=3, rows="all")
    result = build(manifest, tmp_path / "out", Hub(hf_home / "hub", offline=True), workers=2)
    left_out, consumed = [], []
    expected = reference_under(hf_home, manifest, {}, left_out=left_out, consumed=consumed)
    assert file_rows(result.parquet) == expected
    stats = json.loads(result.report.read_text())["stats"]
    # every token of the stream is in a row, a skipped window, or the remainder
    stream_tokens = stats["stream_tokens_consumed"]
    windows = len(expected) + stats["windows_skipped"]
    assert stats["remainder_tokens_dropped"] == stream_tokens - windows * manifest.row_tokens
    assert 0 <= stats["remainder_tokens_dropped"] < manifest.row_tokens
    assert stats["conversations_consumed"] == len(consumed) - len(left_out)


def test_one_more_refusal_than_allowed_stops_the_build(laid_out, tmp_path):
    hf_home, rows = laid_out
    manifest = manifest_with(hf_home, tmp_path, leave_out_refused=2, rows="all")
    left_out = []
    reference_under(hf_home, manifest, {}, left_out=left_out)
    with pytest.raises(SourceDataError) as err:
        build(manifest, tmp_path / "out", Hub(hf_home / "hub", offline=True), workers=1)
    third = left_out[2]
    assert f"source row {third} (id '{rows[third]['id']}')" in str(err.value)
    assert "leave_out_refused: 2" in str(err.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_the_default_still_stops_at_the_first(laid_out, tmp_path):
    hf_home, _ = laid_out
    manifest = manifest_with(hf_home, tmp_path, rows="all")
    done = run_cli("--manifest", str(manifest.path), "--out", str(tmp_path / "o"), hf_home=hf_home)
    assert done.returncode == 4, done.stderr
    assert "role 'function'" in done.stderr and "leave_out_refused" not in done.stderr


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("rows", "some", "rows: expected a whole number > 0, or all"),
        ("leave_out_refused", -1, "leave_out_refused: expected a whole number >= 0"),
    ],
)
def test_bad_values_name_the_field(laid_out, tmp_path, field, value, message):
    hf_home, _ = laid_out
    with pytest.raises(ManifestError, match=message):
        manifest_with(hf_home, tmp_path, **{field: value})


def test_explain_needs_a_fixed_number_of_rows(laid_out, tmp_path):
    from builders.errors import UsageError
    from builders.runtime.progress import Reporter
    from builders.views.explain import explain

    hf_home, _ = laid_out
    manifest = manifest_with(hf_home, tmp_path, rows="all")
    with pytest.raises(UsageError, match="explain compares readings over a fixed number of rows"):
        explain(manifest, Hub(hf_home / "hub", offline=True), Reporter.silent())
