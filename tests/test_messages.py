"""Messages that say where to look: a mistyped pin, a dataset's roles left unmapped.

The pinned hashes come from tests/reference.py (an independent implementation of the row
contract); the ShareGPT rows from tests/test_layouts.py's own layout.
"""

from __future__ import annotations

import json

import pytest
import yaml
from test_layouts import SHAREGPT, few, jsonl, lay_out

from builders.inputs.pinned import Hub
from builders.runtime.progress import Reporter
from builders.views.explain import describe, explain
from helpers import (
    MANIFESTS,
    SELF_CONTAINED,
    lay_out_readings,
    manifest_under,
    reference_under,
    run_cli,
)
from reference import rows_sha256


@pytest.fixture(scope="module")
def readings_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("messages")
    lay_out_readings(home)
    return home


@pytest.fixture(scope="module")
def true_hash(readings_home, tmp_path_factory):
    """The rows_sha256 of the readings dataset's default reading, by tests/reference.py."""
    folder = tmp_path_factory.mktemp("made")
    made = manifest_under(readings_home, "readings", {}, folder)
    return rows_sha256(reference_under(readings_home, made, {}))


def explained(home, folder, expect: str) -> str:
    pinned = manifest_under(home, "readings", {}, folder, expect=expect)
    found = explain(pinned, Hub(home / "hub", offline=True), Reporter.silent())
    return "\n".join(describe(found, pinned))


def test_a_mistyped_pin_is_called_mistyped(readings_home, true_hash, tmp_path):
    # two characters swapped, as a hand copies them
    k = next(i for i in range(63) if true_hash[i] != true_hash[i + 1])
    typo = true_hash[:k] + true_hash[k + 1] + true_hash[k] + true_hash[k + 2 :]
    text = explained(readings_home, tmp_path, f"expect:\n  rows_sha256: {typo}\n")
    assert f"no reading reproduces rows_sha256 {typo}" in text
    assert (
        f"the default reading gives rows_sha256 {true_hash}, which differs from the pin in only 2"
        in text
    )
    assert "the pin is likely mistyped" in text


def test_when_no_reading_comes_near_the_pin_is_to_be_checked(readings_home, tmp_path):
    # the ratio no reading gives, nor a hash near
    expect = f"expect:\n  rows_sha256: {'0f' * 32}\n  supervised_token_ratio: 0.0123\n"
    text = explained(readings_home, tmp_path, expect)
    assert "no reading comes near" in text and "check the pin itself" in text
    assert "supervised_token_ratio 0.0123" in text and "mistyped" not in text


def test_the_nearest_reading_is_in_the_json(readings_home, true_hash, tmp_path):
    typo = true_hash[:-1] + ("a" if true_hash[-1] != "a" else "b")
    pinned = manifest_under(
        readings_home, "readings", {}, tmp_path, expect=f"expect:\n  rows_sha256: {typo}\n"
    )
    # the default reading reproduces nothing, so every reading is tried: the CLI's --json
    done = run_cli("explain", "--manifest", str(pinned.path), "--json", hf_home=readings_home)
    assert done.returncode == 5, done.stderr
    nearest = json.loads(done.stdout)["nearest"]
    assert nearest == {
        "reading": "the default reading",
        "rows_sha256": true_hash,
        "differing_characters": 1,
    }


def test_sharegpt_roles_without_a_roles_mapping_name_roles(tmp_path):
    layout = {key: value for key, value in SHAREGPT.items() if key != "roles"}
    manifest = lay_out(
        tmp_path, [({"chat.jsonl": jsonl(few())}, {"files": "chat.jsonl", **layout})], rows=3
    )
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path)
    assert done.returncode == 4 and "Traceback" not in done.stderr
    assert "chat.jsonl row " in done.stderr and "role 'human'" in done.stderr
    assert "roles:" in done.stderr and "human: user" in done.stderr
    assert not (tmp_path / "out" / "layout.parquet").exists()


def test_a_build_against_a_mistyped_pin_says_so_not_the_contract(fixture_cache, tmp_path):
    doc = yaml.safe_load((MANIFESTS / f"{SELF_CONTAINED}.yaml").read_text())
    pinned = doc["expect"]["rows_sha256"]
    doc["expect"] = {"rows_sha256": pinned[:5] + ("0" if pinned[5] != "0" else "1") + pinned[6:]}
    manifest = tmp_path / f"{SELF_CONTAINED}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=fixture_cache
    )
    assert done.returncode == 5
    assert f"these rows have rows_sha256 {pinned}, which differs from the pin in only 1" in (
        done.stderr
    )
    assert "the pin is likely mistyped" in done.stderr
    assert "a reading of the row contract" not in done.stderr
