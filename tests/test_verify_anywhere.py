"""Files that verify anywhere: a build's own report names its manifest; a lone file, its hash.

A user's manifest (not shipped) is built, its files moved together to another folder and the
manifest deleted: ``--verify`` and ``inspect`` read the manifest from the build's report. A
parquet that travels alone verifies against ``--rows-sha256``. The expected figures are those
the shipped fixture manifest pins (checked there against tests/reference.py): renaming a build
changes none of them.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from builders.fixture.make import tokenizer_json
from helpers import MANIFESTS, SELF_CONTAINED, run_cli

NAME = "mine-v1"


def shipped_expect() -> dict:
    return yaml.safe_load((MANIFESTS / f"{SELF_CONTAINED}.yaml").read_text())["expect"]


def user_manifest(folder, name=NAME, expect=True):
    """The shipped fixture manifest under another name, in a folder of the user's."""
    doc = yaml.safe_load((MANIFESTS / f"{SELF_CONTAINED}.yaml").read_text())
    doc["name"] = name
    if not expect:
        del doc["expect"]
    path = folder / f"{name}.yaml"
    path.write_text("# my own manifest\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def moved(fixture_cache, tmp_path_factory):
    """A user's build, its files moved together to another folder, its manifest deleted."""
    work = tmp_path_factory.mktemp("verify-anywhere")
    manifest = user_manifest(work)
    done = run_cli(
        "--manifest", str(manifest), "--out", str(work / "out"), "-q", hf_home=fixture_cache
    )
    assert done.returncode == 0, done.stderr
    text = manifest.read_text()
    manifest.unlink()
    shutil.move(work / "out", work / "elsewhere")
    return work / "elsewhere", text


def test_the_report_records_the_manifest_whole(moved):
    folder, text = moved
    report = json.loads((folder / f"{NAME}.report.json").read_text())
    assert report["manifest_text"] == text


def test_the_parquet_is_the_pinned_file(moved):
    """Recording the manifest in the report leaves the parquet's bytes as the recipe pins them."""
    folder, _ = moved
    data = (folder / f"{NAME}.parquet").read_bytes()
    expect = shipped_expect()
    assert hashlib.sha256(data).hexdigest() == expect["parquet_sha256"]
    assert len(data) == expect["parquet_bytes"]


def test_verify_reads_the_manifest_from_the_report_beside_the_file(moved, tmp_path):
    folder, _ = moved
    done = run_cli("--verify", str(folder / f"{NAME}.parquet"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok          rows_sha256: {shipped_expect()['rows_sha256']}" in done.stdout
    assert (
        f"verified: {folder / f'{NAME}.parquet'} against the manifest recorded in "
        f"{folder / f'{NAME}.report.json'}" in done.stdout
    )
    result = json.loads(run_cli("--verify", str(folder / f"{NAME}.parquet"), "--json").stdout)
    # its file is gone
    assert result["verified"] and result["manifest"] is None
    assert result["against"] == f"the manifest recorded in {folder / f'{NAME}.report.json'}"


def test_the_recorded_manifest_is_what_is_checked(moved, tmp_path):
    """A report whose manifest pins other rows: the file is checked against that, and differs."""
    folder, text = moved
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    report = json.loads((copy / f"{NAME}.report.json").read_text())
    wrong = "ab" * 32
    report["manifest_text"] = text.replace(shipped_expect()["rows_sha256"], wrong)
    (copy / f"{NAME}.report.json").write_text(json.dumps(report))
    done = run_cli("--verify", str(copy / f"{NAME}.parquet"))
    assert done.returncode == 5, done.stdout + done.stderr
    assert f"DIFFERS     rows_sha256: expected {wrong}" in done.stdout


def test_inspect_reads_the_manifest_from_the_report(moved, fixture_cache):
    folder, _ = moved
    done = run_cli(
        "inspect", str(folder / f"{NAME}.parquet"), "--row", "2", "--json", hf_home=fixture_cache
    )
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    ids = pq.read_table(folder / f"{NAME}.parquet").column("input_ids")[2].as_py()
    decoded = Tokenizer.from_str(tokenizer_json().decode()).decode(ids, skip_special_tokens=False)
    assert "".join(span["text"] for span in view["spans"]) == decoded


def test_a_file_alone_asks_for_a_manifest_or_its_rows_sha256(moved, tmp_path):
    folder, _ = moved
    alone = tmp_path / f"{NAME}.parquet"
    shutil.copy(folder / f"{NAME}.parquet", alone)
    done = run_cli("--verify", str(alone))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--manifest FILE" in done.stderr and "--rows-sha256 HEX" in done.stderr
    done = run_cli("inspect", str(alone))
    assert done.returncode == 2 and "--manifest FILE" in done.stderr


def test_a_file_alone_verifies_against_its_rows_sha256(moved, tmp_path):
    folder, _ = moved
    alone = tmp_path / f"{NAME}.parquet"
    shutil.copy(folder / f"{NAME}.parquet", alone)
    pinned = shipped_expect()["rows_sha256"]
    done = run_cli("--verify", str(alone), "--rows-sha256", pinned)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"verified: {alone} against rows_sha256 {pinned}" in done.stdout
    # one character mistyped
    other = pinned[:-1] + ("0" if pinned[-1] != "0" else "1")
    done = run_cli("--verify", str(alone), "--rows-sha256", other, "--json")
    assert done.returncode == 5
    result = json.loads(done.stdout)
    assert result["verified"] is False and result["figures"]["rows_sha256"] == pinned


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--rows-sha256", "abc"], "64 lowercase hex digits"),
        (["--rows-sha256", "a" * 64, "--build", SELF_CONTAINED], "without a manifest"),
    ],
)
def test_rows_sha256_is_checked(moved, argv, problem):
    folder, _ = moved
    done = run_cli("--verify", str(folder / f"{NAME}.parquet"), *argv)
    assert done.returncode == 2 and problem in done.stderr, done.stderr


def test_a_report_without_the_manifest_text_is_not_read(moved, tmp_path):
    """A report of an older build records no manifest text: the file is then unknown."""
    folder, _ = moved
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    report = json.loads((copy / f"{NAME}.report.json").read_text())
    del report["manifest_text"]
    (copy / f"{NAME}.report.json").write_text(json.dumps(report))
    done = run_cli("--verify", str(copy / f"{NAME}.parquet"))
    assert done.returncode == 2 and "--rows-sha256 HEX" in done.stderr


def test_an_unpinned_build_says_the_same_on_its_card_and_command_line(fixture_cache, tmp_path):
    manifest = user_manifest(tmp_path, expect=False)
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=fixture_cache
    )
    assert done.returncode == 0, done.stderr
    assert "built, nothing pinned to verify:" in done.stdout
    card = (tmp_path / "out" / f"{NAME}.md").read_text()
    assert "**Built, nothing pinned to verify**" in card and "Verified" not in card
