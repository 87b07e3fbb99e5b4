"""The manifest's ``limits:``: checked, recorded, never part of the recipe."""

import json

import pytest
import yaml

from builders.errors import ManifestError
from builders.limits import Limits
from builders.manifest import load_manifest, parse_manifest
from helpers import MANIFESTS, SELF_CONTAINED, run_cli


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


def test_the_encoder_refuses_a_conversation_beyond_conversation_chars():
    from dataclasses import replace

    from tokenizers import Tokenizer

    from builders.encode.encoder import ConversationEncoder
    from builders.errors import SourceDataError
    from builders.fixture.make import FIXTURE_TEMPLATE, tokenizer_json
    from builders.formats import glm5_spec

    spec = replace(glm5_spec(FIXTURE_TEMPLATE.read_text()), limits=Limits(conversation_chars=23))
    enc = ConversationEncoder(Tokenizer.from_str(tokenizer_json().decode()), spec)
    # every string counts, the roles too: 4 + 4 + 9 + 6 characters, at the limit
    at = [{"role": "user", "content": "four"}, {"role": "assistant", "content": "sixsix"}]
    assert enc.encode([{"index": 0, "id": "a", "messages": at}])[0].ids.size
    over = [*at[:1], {"role": "assistant", "content": "seven!!"}]
    with pytest.raises(
        SourceDataError,
        match=r"source row 3 \(id 'b'\): the conversation holds 24 characters, more than "
        r"limits\.conversation_chars \(23\)",
    ):
        enc.encode([{"index": 3, "id": "b", "messages": over}])


def test_workers_render_within_the_manifest_limit(fixture_cache, tmp_path):
    manifest = tmp_path / "limited.yaml"
    manifest.write_text(with_limits({"render_chars": 100}).replace(SELF_CONTAINED, "limited"))
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path), "--workers", "2", hf_home=fixture_cache
    )
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    assert "source row" in done.stderr and "limits.render_chars (100)" in done.stderr
