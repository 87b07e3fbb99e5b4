"""The manifest's ``limits:``: checked, recorded, never part of the recipe."""

import json

import pytest
import yaml

from builders.errors import ManifestError
from builders.limits import Limits
from builders.manifest import load_manifest, parse_manifest
from helpers import MANIFESTS, SELF_CONTAINED


def fixture_doc() -> dict:
    return yaml.safe_load((MANIFESTS / f"{SELF_CONTAINED}.yaml").read_text())


def with_limits(limits) -> str:
    return yaml.safe_dump({**fixture_doc(), "limits": limits})


def test_the_defaults_are_beyond_any_real_conversation():
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    assert manifest.limits.conversation_chars == 4_000_000
    assert manifest.limits.render_chars == 8_000_000


def test_limits_are_read_and_not_part_of_the_recipe():
    plain = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    limited = parse_manifest(with_limits({"render_chars": 1000}))
    assert limited.limits == Limits(conversation_chars=4_000_000, render_chars=1000)
    assert limited.recipe() == plain.recipe()
    assert not any("limits" in key for key in limited.recipe())


@pytest.mark.parametrize(
    "limits, named, problem",
    [
        ({"render_chars": 0}, "limits.render_chars", "> 0"),
        ({"conversation_chars": -5}, "limits.conversation_chars", "> 0"),
        ({"render_chars": "8M"}, "limits.render_chars", "whole number"),
        ({"render_chars": 1.5}, "limits.render_chars", "whole number"),
        ({"render_chars": True}, "limits.render_chars", "whole number"),
        ({"tokens": 5}, "limits.tokens", "unknown field"),
        ([1, 2], "limits", "expected a mapping"),
    ],
)
def test_a_bad_limit_names_its_field(limits, named, problem):
    with pytest.raises(ManifestError, match=rf": {named}: .*{problem}"):
        parse_manifest(with_limits(limits))


def test_the_report_and_card_record_the_limits(built):
    result = built(SELF_CONTAINED)
    report = json.loads(result.report.read_text())
    assert report["limits"] == {"conversation_chars": 4_000_000, "render_chars": 8_000_000}
    card = result.parquet.with_suffix(".md").read_text()
    assert "a conversation up to 4,000,000 characters, its render up to 8,000,000" in card
