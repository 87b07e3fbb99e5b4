"""Every contract reading builds exactly tests/reference.py's rows.

The readings are the contract's open choices, ROWS.md's "Readings the recipe card leaves open". The
dataset is the synthetic fixture (two answers in a row, role-token text in user and assistant
messages, reasoning, tools); the tokenizer is the fixture tokenizer with a GLM-4-style
post-processor that puts ``[gMASK]<sop>`` before a text encoded with special tokens, so that
``encode: add-special`` adds something. The pinned template and the real Tulu rows are tried for the
slime rules.
"""

from __future__ import annotations

import json

import pytest

from builders.contract import READINGS, Contract
from builders.fixture.make import PINNED_TEMPLATE, shared_dir, tulu_fixture_rows
from builders.rows.order import torch_available
from helpers import (
    NEEDS_SHARED,
    build_under,
    file_rows,
    glm4_tokenizer_files,
    lay_out_build,
    lay_out_readings,
    reference_under,
)
from reference import rows_sha256

SINGLE = [
    {key: alternative}
    for key, (_, alternatives) in READINGS.items()
    for alternative in alternatives
    if alternative != "torch" or torch_available()
]
COMBINED = [
    {"order": "python-random", "eos": "none", "hash": "i8-i8"},
    {"mask_rule": "slime-pr1844", "encode": "add-special", "skip": "keep-all"},
    {"prefill": "whole-piece", "stop": "unsupervised", "final": "append-stop", "eos": "supervised"},
    {
        "mask_rule": "slime-pr1824",
        "order": "source",
        "hash": "u4-all-u1-all",
        "eos": "unsupervised",
    },
    {"encode": "add-special", "prefill": "after-role", "final": "append-stop"},
]


@pytest.fixture(scope="module")
def synthetic_source(tmp_path_factory):
    hf_home = tmp_path_factory.mktemp("readings")
    lay_out_readings(hf_home)
    return hf_home


@pytest.fixture(scope="module")
def default_sha(synthetic_source, tmp_path_factory):
    result, _ = build_under(synthetic_source, "readings", {}, tmp_path_factory.mktemp("default"))
    return json.loads(result.report.read_text())["figures"]["rows_sha256"]


@pytest.mark.parametrize(
    "readings", SINGLE + COMBINED, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items())
)
def test_a_reading_builds_the_references_rows(synthetic_source, default_sha, readings, tmp_path):
    result, manifest = build_under(synthetic_source, "readings", readings, tmp_path)
    expected = reference_under(synthetic_source, manifest, readings)
    assert file_rows(result.parquet) == expected
    report = json.loads(result.report.read_text())
    assert report["figures"]["rows_sha256"] == rows_sha256(expected, readings.get("hash", "u4-u1"))
    assert report["contract"] == Contract(**readings).as_dict()
    # the fixture exercises the reading: its rows (or their hash) are not the default's
    assert report["figures"]["rows_sha256"] != default_sha


def test_slime_pr1844_leaves_out_two_answers_in_a_row(synthetic_source, tmp_path):
    """#1844's spans run to a stop token, past a second <|assistant|>.

    The second header is not found.
    """
    result, _ = build_under(
        synthetic_source, "readings", {"mask_rule": "slime-pr1844", "order": "source"}, tmp_path
    )
    assert json.loads(result.report.read_text())["stats"]["conversations_left_out"] >= 1


@NEEDS_SHARED
@pytest.mark.parametrize(
    "readings",
    [
        {"mask_rule": "slime-pr1844"},
        {"mask_rule": "slime-pr1824"},
        {"encode": "add-special", "final": "append-stop"},
    ],
)
def test_readings_with_the_pinned_template_and_real_rows(readings, tmp_path_factory, tmp_path):
    hf_home = tmp_path_factory.mktemp("tulu-readings")
    template = (shared_dir() / PINNED_TEMPLATE).read_bytes()
    lay_out_build(
        hf_home,
        tulu_fixture_rows(shared_dir()),
        name="tulu",
        seed=42,
        row_tokens=1024,
        build_rows=48,
        shards=2,
        row_group_rows=16,
        tokenizer_files=glm4_tokenizer_files(template),
    )
    result, manifest = build_under(hf_home, "tulu", readings, tmp_path)
    assert file_rows(result.parquet) == reference_under(hf_home, manifest, readings)
