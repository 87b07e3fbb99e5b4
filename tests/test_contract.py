"""The builder's rows against tests/reference.py.

tests/reference.py is an independent implementation of ROWS.md.
"""

import json

import pyarrow.parquet as pq
import pytest

from builders.build import build
from builders.fixture.make import synthetic_rows
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from helpers import MANIFESTS, SELF_CONTAINED, lay_out_build, manifest_names, reference_for
from reference import rows_sha256


def file_rows(path):
    table = pq.read_table(path)
    return list(
        zip(
            table.column("input_ids").to_pylist(),
            table.column("loss_mask").to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("name", manifest_names())
def test_fixture_build_matches_reference_and_manifest(name, built, hub):
    manifest = load_manifest(MANIFESTS / f"{name}.yaml")
    expected = reference_for(manifest, hub)
    result = built(name)
    assert result.verified, result.verification.summary()
    assert file_rows(result.parquet) == expected
    # the pinned hash is the one the independent reference computes, not just what the builder wrote
    assert rows_sha256(expected) == manifest.expect.rows_sha256


@pytest.mark.parametrize("name", manifest_names())
def test_provenance_points_at_the_source(name, built):
    table = pq.read_table(built(name).parquet)
    for row in table.column("metadata").to_pylist()[:8]:
        starts = row["segment_start"]
        assert starts[0] == 0 and starts == sorted(starts)
        assert len(row["source_index"]) == len(row["source_id"]) == len(starts)


def test_another_cache_laid_out_the_same_way(tmp_path):
    """A manifest naming any offline cache of the same layout builds.

    Its rows obey the contract.
    """
    manifest = load_manifest(lay_out_build(tmp_path / "hf", synthetic_rows(seed=7, count=90)))
    hub = Hub(cache_dir=tmp_path / "hf" / "hub", offline=True)
    result = build(manifest, tmp_path / "out", hub)
    assert result.verified
    assert file_rows(result.parquet) == reference_for(manifest, hub)


def test_self_contained_fixture_exercises_skipping_and_early_stop(built):
    """The fixture is only a good check of the rules if it hits them.

    Skipped windows, and a build that stops long before the source runs out.
    """
    result = built(SELF_CONTAINED)
    stats = json.loads(result.report.read_text())["stats"]
    assert stats["windows_skipped"] > 0
    assert (
        stats["conversations_consumed"]
        < load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml").dataset.rows / 2
    )
