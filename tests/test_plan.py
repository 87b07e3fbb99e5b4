"""``plan``: the build's stream, counted instead of written.

Its figures are held to the pinned ones (the self-contained fixture, checked against
tests/reference.py) and to tests/reference.py on a dataset with refused conversations.
"""

from __future__ import annotations

import json

import test_leave_out
from test_leave_out import BAD, manifest_with

from builders.manifest import load_manifest
from builders.runtime.progress import Reporter
from builders.views.plan import plan
from helpers import MANIFESTS, SELF_CONTAINED, reference_under, run_cli

# the dataset with refused conversations, a fixture
laid_out = test_leave_out.laid_out


def test_a_plan_gives_the_pinned_rows_without_writing(hub, tmp_path):
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    result = plan(manifest, hub, Reporter.silent(), workers=1)
    assert result.ok and result.rows == manifest.rows
    assert result.rows_sha256 == manifest.expect.rows_sha256
    assert manifest.expect.supervised_token_ratio.matches(result.supervised_token_ratio)
    assert result.source_conversations == manifest.dataset.rows
    assert 0 < result.conversations < manifest.dataset.rows
    # an estimate, from the rate so far: at least the rows read
    assert result.source_rows >= result.rows and not result.read_all


def test_plan_all_lists_every_refusal_and_counts_every_row(laid_out, tmp_path):
    hf_home, rows = laid_out
    left_out = []
    every_row = reference_under(
        hf_home, manifest_with(hf_home, tmp_path, rows="all"), {}, left_out=left_out
    )
    # rows the build reaches only past every refused conversation
    manifest = manifest_with(hf_home, tmp_path, rows=len(every_row))
    done = run_cli("plan", "--manifest", str(manifest.path), "--all", "--json", hf_home=hf_home)
    # the build would stop at the first refused conversation: exit 4, as the build's
    assert done.returncode == 4, done.stderr
    found = json.loads(done.stdout)
    assert [r["source_index"] for r in found["refused"]] == left_out
    assert sorted(left_out) == sorted(BAD)
    assert [r["id"] for r in found["refused"]] == [rows[i]["id"] for i in left_out]
    assert found["source_rows"] == len(every_row) and found["read_all"]
    assert found["rows"] == len(every_row) and not found["ok"]
    assert found["refused_by_the_build"] == len(BAD)
    assert "leave_out_refused: 0" in found["stops"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refusing.yaml"]


def test_a_plan_that_the_build_would_pass(laid_out, tmp_path):
    hf_home, _ = laid_out
    manifest = manifest_with(hf_home, tmp_path, rows="all", leave_out_refused=3)
    expected = reference_under(hf_home, manifest, {}, left_out=[])
    done = run_cli("plan", "--manifest", str(manifest.path), hf_home=hf_home)
    assert done.returncode == 0, done.stderr
    assert f"rows: {len(expected)} of 120 tokens (the manifest asks for all)" in done.stdout
    assert "refused conversations: 3" in done.stdout
    assert "the build will make its rows" in done.stdout
    # it says what it is doing while it reads
    assert "reading the pinned inputs of refusing" in done.stderr
    assert "encoding all " in done.stderr
    quiet = run_cli("plan", "-q", "--manifest", str(manifest.path), hf_home=hf_home)
    assert quiet.returncode == 0 and quiet.stderr == ""
