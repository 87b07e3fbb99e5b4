"""loss_mask: turns, on the GLM format and on other tokenizers.

data/ROWS.md, "`turns`: any chat template": the glm5 rows on the GLM format, the manifest
fields, refusals, the clock, and the token-to-character mapping of a tokenizer that is not
byte-level BPE. The real-model comparisons with tests/reference.py live beside the real-model
fixtures.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from builders.build import build
from builders.encode.encoder import ConversationEncoder
from builders.errors import ManifestError, SourceDataError
from builders.fixture.conversations import corpus, hard_cases
from builders.fixture.make import (
    GENERATION_PROMPT_TOKENIZER_REPO,
    PINNED_TEMPLATE,
    TOKENIZER_REPO,
    fixture_template_with_generation_prompt,
    synthetic_rows,
    tokenizer_json,
)
from builders.fixture.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, with_nfc_normalizer
from builders.formats import FormatSpec, glm5_spec
from builders.formats.vocab import char_spans
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest, parse_manifest
from helpers import MANIFESTS, NEEDS_SHARED, TEMPLATES, lay_out_build, manifest_names, run_cli

GLM_STOPS = ("<|endoftext|>", "<|user|>", "<|observation|>")
GLM_PREFILLS = ({}, {"enable_thinking": False})


def turns_spec(template: str, **more) -> FormatSpec:
    return FormatSpec(
        "turns",
        template,
        **{"eos": "<|endoftext|>", "stop": GLM_STOPS, "prefills": GLM_PREFILLS, **more},
    )


def glm_template(which) -> str:
    """A GLM-format template with its generation prompt.

    The fixture's gets one added.
    """
    text = which()
    return (
        text
        if "add_generation_prompt" in text
        else fixture_template_with_generation_prompt().decode()
    )


def rows_of(conversations, first_index: int = 0) -> list[dict]:
    return [
        {"index": first_index + k, "id": f"c{k}", "messages": m}
        for k, m in enumerate(conversations)
    ]


def fixture_tokenizer() -> Tokenizer:
    return Tokenizer.from_str(tokenizer_json().decode())


@pytest.mark.parametrize("normalizer", [False, True], ids=["plain", "nfc"])
@pytest.mark.parametrize("template", TEMPLATES)
def test_turns_gives_the_glm5_mask_on_the_hard_cases(template, normalizer):
    """Every hard case and seeded conversation is as glm5 encodes it.

    The same ids, mask and final EOS as glm5. With an NFC normalizer (as Qwen's tokenizer.json has),
    a text it changes is placed by the encoding's offsets.
    """
    text = glm_template(template)
    source = tokenizer_json().decode()
    source = with_nfc_normalizer(source) if normalizer else source
    glm5 = ConversationEncoder(Tokenizer.from_str(source), glm5_spec(text))
    turns = ConversationEncoder(Tokenizer.from_str(source), turns_spec(text))
    nfd = [
        {"role": "user", "content": "cafe\u0301?"},
        {"role": "assistant", "content": "re\u0301sume\u0301 done"},
    ]
    rows = rows_of([*hard_cases(), nfd]) + [
        dict(r, index=1000 + k) for k, r in enumerate(synthetic_rows())
    ]
    for row, a, b in zip(rows, glm5.encode(rows), turns.encode(rows), strict=True):
        assert a.ids.tolist() == b.ids.tolist() and a.mask.tolist() == b.mask.tolist(), row["id"]
        assert a.ends_with_answer == b.ends_with_answer, row["id"]


def turns_manifest(name: str, fixture_cache: Path, folder: Path) -> Path:
    """Fixture manifest ``name`` under loss_mask: turns.

    With GLM's stop tokens and both prefills, and its figures pinned as they are; the fixture
    template gets the generation prompt turns needs.
    """
    doc = yaml.safe_load((MANIFESTS / f"{name}.yaml").read_text())
    tok = doc["tokenizer"]
    if tok["repo"] == TOKENIZER_REPO:
        tok["repo"] = GENERATION_PROMPT_TOKENIZER_REPO
        refs = (
            fixture_cache
            / "hub"
            / f"models--{GENERATION_PROMPT_TOKENIZER_REPO.replace('/', '--')}"
            / "refs"
        )
        tok["revision"] = (refs / "main").read_text().strip()
        tok["sha256"]["chat_template.jinja"] = hashlib.sha256(
            fixture_template_with_generation_prompt()
        ).hexdigest()
    tok |= {
        "eos": "<|endoftext|>",
        "stop": list(GLM_STOPS),
        "prefills": [dict(p) for p in GLM_PREFILLS],
    }
    doc["loss_mask"] = "turns"
    doc["expect"] = {
        k: v for k, v in doc["expect"].items() if k in ("rows_sha256", "supervised_token_ratio")
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("name", manifest_names())
def test_turns_builds_the_glm5_rows_of_every_fixture_manifest(name, fixture_cache, hub, tmp_path):
    """The pinned rows_sha256 is what turns builds too.

    The pinned hash is checked against tests/reference.py's glm5 rows.
    """
    manifest = load_manifest(turns_manifest(name, fixture_cache, tmp_path))
    assert manifest.loss_mask == "turns"
    result = build(manifest, tmp_path / "out", hub, card=True)
    assert result.verified, [c for c in result.verification.checks if c.status != "ok"]
    report = json.loads(result.report.read_text())
    assert report["chat_format"]["loss_mask"] == "turns" and report["chat_format"]["stop"] == list(
        GLM_STOPS
    )
    card = (tmp_path / "out" / f"{name}.md").read_text()
    assert "`loss_mask: turns`" in card and "generation_prompts" in card


def test_rollout_and_row_iterator_work_on_turns_rows(fixture_cache, hub, tmp_path):
    from test_training import assert_trains_exactly_the_supervised_tokens, built_rows, fill

    from builders.rows import RowReader

    name = manifest_names(with_shared=False)[0]
    result = build(
        load_manifest(turns_manifest(name, fixture_cache, tmp_path)),
        tmp_path / "out",
        hub,
        card=False,
    )
    ids, masks = built_rows(result.parquet)
    assert [list(r["input_ids"]) for r in RowReader(result.parquet)] == ids
    filled = fill(result.parquet)
    assert [s.tokens for s in filled] == ids
    assert_trains_exactly_the_supervised_tokens(filled, masks, 2)


# a ChatML-shaped template on the fixture tokenizer's special tokens: the stop token is followed by
# markup
CHATML = (
    "{%- for m in messages -%}<|user|>{{ m.role }}\n{{ m.content }}<|endoftext|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|user|>assistant\n{% endif %}"
)


def supervised_text(encoder, conversation) -> str:
    ids, mask = conversation.ids, conversation.mask
    return "|".join(
        encoder.tokenizer.decode([int(i) for i in ids[a:b]], skip_special_tokens=False)
        for a, b in _runs(mask)
    )


def _runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


def test_the_stop_token_ends_an_answer_and_the_markup_after_it_is_not_supervised():
    enc = ConversationEncoder(
        fixture_tokenizer(), FormatSpec("turns", CHATML, "<|endoftext|>", ("<|endoftext|>",))
    )
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "see you"},
    ]
    (encoded,) = enc.encode(rows_of([conversation]))
    # the header is the generation prompt "<|user|>assistant\n"; "\n" after each <|endoftext|> is
    # markup
    assert supervised_text(enc, encoded) == "hello<|endoftext|>|see you<|endoftext|>"
    # its stop token is its own: the EOS after it is not
    assert not encoded.ends_with_answer
    unsupervised_stop = replace(enc.contract, stop="unsupervised")
    enc_u = ConversationEncoder(fixture_tokenizer(), enc.spec, unsupervised_stop)
    (encoded,) = enc_u.encode(rows_of([conversation]))
    assert supervised_text(enc_u, encoded) == "hello|see you"


def test_an_untrained_answer_is_rendered_but_not_supervised():
    enc = ConversationEncoder(
        fixture_tokenizer(), FormatSpec("turns", CHATML, "<|endoftext|>", ("<|endoftext|>",))
    )
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "step_loss_mask": 0},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "see you"},
    ]
    (encoded,) = enc.encode(rows_of([conversation]))
    assert "hello" in enc.tokenizer.decode(encoded.ids.tolist())
    assert supervised_text(enc, encoded) == "see you<|endoftext|>"


@pytest.mark.parametrize(
    "messages, named",
    [
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y", "tool_calls": [{"name": "f"}]},
            ],
            "has no arguments",
        ),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
            "has tool_calls, which only an assistant message may have",
        ),
        ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "content is a list"),
        ([{"role": "user", "content": "x", "name": "bob"}], "has name, which only a tool"),
    ],
)
def test_messages_with_tools_lists_or_other_fields_are_refused_by_name(messages, named):
    enc = ConversationEncoder(
        fixture_tokenizer(), turns_spec(fixture_template_with_generation_prompt().decode())
    )
    with pytest.raises(SourceDataError, match=f"source row 7 \\(id 'c0'\\).*{named}"):
        enc.encode(rows_of([messages], first_index=7))


def test_a_conversation_whose_markup_depends_on_its_text_is_refused_at_the_character():
    template = (
        "{%- for m in messages -%}<|user|>{{ m.role }}\n"
        "{% if m.content | length > 5 %}[long]{% endif %}"
        "{{ m.content }}<|endoftext|>{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|user|>assistant\n{% endif %}"
    )
    enc = ConversationEncoder(
        fixture_tokenizer(), FormatSpec("turns", template, "<|endoftext|>", ("<|endoftext|>",))
    )
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    enc.encode(rows_of([short]))
    long = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a long answer"}]
    with pytest.raises(SourceDataError) as err:
        enc.encode(rows_of([short, long], first_index=40))
    text = str(err.value)
    # "<|user|>user\nhi<|endoftext|>" is 28 characters, "<|user|>assistant\n" 18: then the template
    # prints [long]
    assert (
        "source row 41 (id 'c1')" in text
        and "message 1 (assistant)" in text
        and "character 46" in text
    ), text
    assert err.value.exit_code == 4


def test_kept_placeholder_renders_give_the_rows_fresh_ones_do(monkeypatch):
    """Conversations of one shape share its placeholder render; the rows are as if each were alone.

    A render that fails is not kept: the shape fails again. The kept renders stay within their
    bound (here a few shapes' worth).
    """
    from builders.formats import turns

    template = (
        "{%- for m in messages -%}<|user|>{{ m.role }}\n"
        "{% if m.content == 'boom' %}{{ raise_exception('no') }}{% endif %}"
        "{{ m.content }}<|endoftext|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|user|>assistant\n{% endif %}"
    )
    spec = FormatSpec("turns", template, "<|endoftext|>", ("<|endoftext|>",))
    conversations = [
        [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "a " * k}]
        for k in range(1, 4)
    ] + [[{"role": "system", "content": f"s{k}"}, *c] for k, c in enumerate(hard_cases())]
    rows = rows_of(conversations)
    monkeypatch.setattr(turns, "SHAPES_KEPT_CHARS", 1000)
    shared = ConversationEncoder(fixture_tokenizer(), spec)
    together = shared.encode(rows) + shared.encode(rows)
    alone = [ConversationEncoder(fixture_tokenizer(), spec).encode([r])[0] for r in rows]
    for a, b in zip(together, alone + alone, strict=True):
        assert (a.ids.tolist(), a.mask.tolist(), a.ends_with_answer) == (
            b.ids.tolist(),
            b.mask.tolist(),
            b.ends_with_answer,
        )
    assert 0 < shared.format._kept_chars <= 1000
    # the placeholder of "boom" is a marker: only the real render fails, in every batch
    boom = rows_of([[{"role": "user", "content": "boom"}, {"role": "assistant", "content": "x"}]])
    for _ in range(2):
        with pytest.raises(SourceDataError, match=r"source row 0 .*the chat template failed"):
            shared.encode(boom)


def test_an_answer_with_no_generation_prompt_before_it_is_refused():
    template = (
        "{%- for m in messages -%}"
        "{% if m.role == 'assistant' %}<|observation|>{% else %}<|user|>{% endif %}"
        "{{ m.content }}{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
    )
    enc = ConversationEncoder(
        fixture_tokenizer(), FormatSpec("turns", template, "<|endoftext|>", ("<|endoftext|>",))
    )
    with pytest.raises(
        SourceDataError,
        match=r"source row 0 .*message 1 \(assistant\): none of the template's generation prompts",
    ):
        enc.encode(
            rows_of([[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]])
        )


# a Llama-3.2-style system block: the date comes from the clock unless pinned
DATED = (
    "{%- set date_string = strftime_now('%d %b %Y') -%}"
    "<|user|>system\nToday Date: {{ date_string }}<|endoftext|>"
    "{%- for m in messages -%}<|user|>{{ m.role }}\n{{ m.content }}<|endoftext|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|user|>assistant\n{% endif %}"
)


def test_a_template_that_reads_the_clock_needs_render_date_before_any_work():
    with pytest.raises(ManifestError, match="render_date") as err:
        ConversationEncoder(
            fixture_tokenizer(), FormatSpec("turns", DATED, "<|endoftext|>", ("<|endoftext|>",))
        )
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    "render_date, shown", [("2024-07-26", "26 Jul 2024"), ("2031-01-02", "02 Jan 2031")]
)
def test_render_date_is_what_strftime_now_returns(render_date, shown):
    enc = ConversationEncoder(
        fixture_tokenizer(),
        FormatSpec("turns", DATED, "<|endoftext|>", ("<|endoftext|>",), render_date=render_date),
    )
    (encoded,) = enc.encode(
        rows_of([[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]])
    )
    text = enc.tokenizer.decode(encoded.ids.tolist(), skip_special_tokens=False)
    assert f"Today Date: {shown}<|endoftext|>" in text
    assert supervised_text(enc, encoded) == "a<|endoftext|>"


def manifest_text(sha: dict, tokenizer_lines: str, loss_mask: str = "turns") -> str:
    return (
        f"name: t\ndataset: {{repo: a/b, revision: '{'1' * 40}', split: train}}\n"
        f"tokenizer:\n  repo: a/c\n  revision: '{'2' * 40}'\n  sha256: {json.dumps(sha)}\n"
        f"{tokenizer_lines}"
        f"loss_mask: {loss_mask}\nseed: 1\nrow_tokens: 8\nrows: 1\n"
    )


SHA = {"tokenizer.json": "a" * 64, "tokenizer_config.json": "b" * 64}


def test_manifest_fields_of_turns():
    manifest = parse_manifest(
        manifest_text(
            SHA,
            "  eos: '<|endoftext|>'\n  stop: ['<|user|>']\n"
            "  prefills: [{}, {enable_thinking: false}]\n"
            "  template_vars: {date_string: 26 Jul 2024, day: 2024-07-26}\n"
            "  render_date: 2024-07-26\n  chat_template_name: tool_use\n",
        )
    )
    tok = manifest.tokenizer
    assert (tok.eos, tok.stop, tok.prefills) == (
        "<|endoftext|>",
        ("<|user|>",),
        ({}, {"enable_thinking": False}),
    )
    assert (
        tok.template_vars == {"date_string": "26 Jul 2024", "day": "2024-07-26"}
        and tok.render_date == "2024-07-26"
    )
    assert tok.chat_template_name == "tool_use" and tok.files == (
        "tokenizer.json",
        "tokenizer_config.json",
    )


@pytest.mark.parametrize(
    "lines, loss_mask, named",
    [
        ("  stop: ['<|user|>']\n", "turns", "tokenizer.eos"),
        ("  eos: x\n", "turns", "tokenizer.stop"),
        ("  eos: x\n  stop: []\n", "turns", "tokenizer.stop"),
        ("  eos: x\n  stop: [x]\n  prefills: {a: 1}\n", "turns", "tokenizer.prefills"),
        ("  eos: x\n  stop: [x]\n  render_date: soon\n", "turns", "tokenizer.render_date"),
        ("  eos: x\n", "glm5", "tokenizer.eos"),
    ],
)
def test_bad_turns_fields_are_named(lines, loss_mask, named):
    with pytest.raises(ManifestError, match=named.replace(".", "\\.")):
        parse_manifest(manifest_text(SHA, lines, loss_mask))


def test_turns_refuses_glm_only_readings():
    with pytest.raises(ManifestError, match=r"contract\.mask_rule.*turns"):
        parse_manifest(
            manifest_text(SHA, "  eos: x\n  stop: [x]\n") + "contract: {mask_rule: slime-pr1844}\n"
        )


def test_eos_and_stop_must_be_special_tokens():
    with pytest.raises(ManifestError, match=r"tokenizer\.stop: '<think>' is not a special token"):
        ConversationEncoder(
            fixture_tokenizer(),
            turns_spec(
                fixture_template_with_generation_prompt().decode(), stop=("<|user|>", "<think>")
            ),
        )


NAMED_CONFIG_TEMPLATE = (
    "{{ bos_token }}{%- for m in messages -%}<|user|>{{ m.role }}\n{{ m.content }}{{ eos_token }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|user|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("name", [None, "other"])
def test_the_template_from_tokenizer_config_gets_its_special_tokens(tmp_path, name):
    """tokenizer_config.json's chat_template and special tokens.

    The chat_template is a list of named ones; its special tokens are the template's variables (a
    string, or an AddedToken mapping's content).
    """
    config = {
        "bos_token": {"__type": "AddedToken", "content": "[gMASK]"},
        "eos_token": "<|endoftext|>",
        "chat_template": [
            {"name": "default", "template": NAMED_CONFIG_TEMPLATE},
            {"name": "other", "template": "<sop>" + NAMED_CONFIG_TEMPLATE},
        ],
    }
    files = {
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": json.dumps(config).encode(),
    }
    path = lay_out_build(
        tmp_path,
        synthetic_rows(count=40),
        name="cfg",
        row_tokens=128,
        build_rows=4,
        tokenizer_files=files,
    )
    text = path.read_text().replace(
        "loss_mask: glm5",
        (
            "  eos: '<|endoftext|>'\n  stop: ['<|endoftext|>']\n"
            + (f"  chat_template_name: {name}\n" if name else "")
            + "loss_mask: turns"
        ),
    )
    path.write_text(text)
    result = build(
        load_manifest(path), tmp_path / "out", Hub(tmp_path / "hub", offline=True), card=False
    )
    report = json.loads(result.report.read_text())
    assert report["chat_format"]["chat_template"] == f"tokenizer_config.json ({name or 'default'})"
    from builders.rows import RowReader

    first = RowReader(result.parquet)[0]["input_ids"]
    start = Tokenizer.from_str(tokenizer_json().decode()).decode(
        list(first)[:3], skip_special_tokens=False
    )
    assert start.startswith("<sop>[gMASK]<|user|>" if name else "[gMASK]<|user|>"), start


def sentencepiece_style() -> Tokenizer:
    """A SentencePiece-style tokenizer.json.

    Metaspace pre-tokenizer, BPE with byte fallback, GLM's tokens added.
    """
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()])
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=[f"<0x{b:02X}>" for b in range(256)],
        special_tokens=[f"<0x{b:02X}>" for b in range(256)],
    )
    tokenizer.train_from_iterator(corpus(lines=1500), trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tokenizer


def test_char_spans_are_each_tokens_characters_counted_byte_by_byte():
    """``char_spans`` against a per-byte owner table, on texts of 1- to 4-byte characters.

    Token lengths split characters, some are 0 and some run past the text (both: ``(0, 0)``),
    so the common case (every token inside) and the masked one are both compared.
    """
    rng = random.Random(29)
    for _ in range(400):
        text = "".join(rng.choice("aé東😀 \n") for _ in range(rng.randint(0, 30)))
        # the character each byte belongs to
        owner = [k for k, c in enumerate(text) for _ in c.encode("utf-8")]
        lengths, left = [], len(owner)
        while left > 0 or rng.random() < 0.1:
            lengths.append(rng.choice([0, 1, 1, 2, 3, 4, 5]) if rng.random() < 0.9 else left + 2)
            left -= lengths[-1]
        expected, at = [], 0
        for length in lengths:
            inside = length > 0 and at + length <= len(owner)
            expected.append([owner[at], owner[at + length - 1] + 1] if inside else [0, 0])
            at += length
        got = char_spans(text, np.array(lengths, dtype=np.int64))
        assert got.tolist() == expected and got.shape == (len(lengths), 2), (text, lengths)


def test_token_classes_follow_their_characters_token_by_token():
    """``_token_classes`` against the rule applied to each token's characters in turn.

    ANSWER if any character is, else STOP if any is, else OTHER; the kind of its first
    character, MARKUP for a token that covers none (empty or backwards spans included).
    """
    from builders.formats.turns import ANSWER, MARKUP, OTHER, STOP, _token_classes

    rng = random.Random(29)
    for _ in range(300):
        length = rng.randint(0, 40)
        classes = np.array([rng.choice([0, 0, 1, 2]) for _ in range(length)], dtype=np.uint8)
        kinds = np.array([rng.choice([0, 1, 2]) for _ in range(length)], dtype=np.uint8)
        spans = [
            sorted(rng.randint(0, length) for _ in range(2))[:: rng.choice([1, 1, -1])]
            for _ in range(rng.randint(0, 12))
        ]
        expected_classes, expected_kinds = [], []
        for start, end in spans:
            covered = classes[start : max(start, end)].tolist()
            expected_classes.append(
                ANSWER if ANSWER in covered else STOP if STOP in covered else OTHER
            )
            expected_kinds.append(int(kinds[start]) if covered else MARKUP)
        got = _token_classes(classes, kinds, np.array(spans, dtype=np.int64).reshape(-1, 2))
        assert [g.dtype for g in got] == [np.uint8, np.uint8]
        assert (got[0].tolist(), got[1].tolist()) == (expected_classes, expected_kinds), spans


def test_align_takes_the_first_assignment_in_the_order_of_each_markers_prints():
    """``align`` against every combination of the markers' prints, tried in order.

    Renders where each run is printed whole, trimmed or dropped (a call field whole or escaped),
    between markup that makes several assignments fit, so the first path fails part-way and the
    search backtracks.
    """
    from builders.errors import ConversationError
    from builders.formats.tools import CallField
    from builders.formats.turns import Run, _marker, _prints, align

    # the order data/ROWS.md gives (turns step 2, tool calls step 3: the whole run, then
    # trimmed earliest and longest first, then as tojson escapes it, then nothing), written out
    assert list(_prints(Run(0, " ab "))) == [" ab ", " ab", "ab ", "ab", ""]
    assert list(_prints(Run(0, "b\n"))) == ["b\n", "b", "b\\n", ""]
    assert list(_prints(Run(0, "ab"))) == ["ab", ""]
    rng = random.Random(29)
    found = 0
    for _ in range(400):
        runs = [Run(k, rng.choice(["a", " a", "a ", " ab ", "b\n", "ab"])) for k in range(3)]
        # a call field: printed as it is, or as tojson escapes it
        field = rng.choice(["a", "b\t", 'q"'])
        runs.append(Run(3, field, CallField(3, 0, "argument value", field)))
        order = [rng.randrange(len(runs)) for _ in range(rng.randint(1, 4))]
        pieces = [rng.choice(["", " ", "a", "<m>", "b"]) for _ in range(len(order) + 1)]
        shape = pieces[0] + "".join(_marker(m) + p for m, p in zip(order, pieces[1:], strict=True))
        printed = [rng.choice(list(_prints(runs[m]))) for m in order]
        text = pieces[0] + "".join(p + q for p, q in zip(printed, pieces[1:], strict=True))
        messages = [{"role": "user"}] * len(runs)
        expected = None
        for choice in itertools.product(*(list(_prints(runs[m])) for m in order)):
            if pieces[0] + "".join(p + q for p, q in zip(choice, pieces[1:], strict=True)) == text:
                at, expected = len(pieces[0]), []
                for m, p, q in zip(order, choice, pieces[1:], strict=True):
                    if p:
                        expected.append((at, at + len(p), m))
                    at += len(p) + len(q)
                break
        assert expected is not None
        found += len(expected) < len(order) or any(
            e - s < len(runs[m].text) for s, e, m in expected
        )
        assert align(text, shape, runs, messages) == expected, (text, shape)
        with pytest.raises(ConversationError):
            align(text + "\ue002", shape, runs, messages)
    # renders where a run is not printed whole
    assert found > 100


@NEEDS_SHARED
def test_a_sentencepiece_style_tokenizer_supervises_the_characters_glm5_does(shared):
    """A Metaspace tokenizer under turns supervises glm5's characters.

    Characters supervised under turns with a Metaspace/byte-fallback tokenizer (mapped by its
    offsets) are those glm5 supervises with the byte-level fixture tokenizer (mapped by byte
    lengths).
    """
    template = (shared / PINNED_TEMPLATE).read_text()
    glm5 = ConversationEncoder(fixture_tokenizer(), glm5_spec(template))
    sp = sentencepiece_style()
    assert not ConversationEncoder(sp, turns_spec(template)).vocab.byte_level()
    turns = ConversationEncoder(sp, turns_spec(template))
    rows = rows_of(hard_cases())
    texts = turns.format.renderer.render_all([r["messages"] for r in rows], turns.format.variables)
    for row, text, a, b in zip(rows, texts, glm5.encode(rows), turns.encode(rows), strict=True):
        expected = _character_mask(text, char_spans(text, glm5.vocab.token_bytes[a.ids]), a.mask)
        offsets = np.array(sp.encode(text, add_special_tokens=False).offsets).reshape(-1, 2)
        assert _character_mask(text, offsets, b.mask) == expected, row["id"]
        assert a.ends_with_answer == b.ends_with_answer
        assert any(sp.id_to_token(int(i)).startswith("<0x") for i in b.ids) or text.isascii()


def _character_mask(text: str, spans: np.ndarray, mask: np.ndarray) -> str:
    chars = np.zeros(len(text), dtype=bool)
    for (start, end), value in zip(spans.tolist(), mask.tolist(), strict=True):
        if value:
            chars[start:end] = True
    return "".join("1" if c else "0" for c in chars)


def test_a_turns_manifest_refused_for_the_clock_exits_2_before_any_work(tmp_path):
    files = {"tokenizer.json": tokenizer_json(), "chat_template.jinja": DATED.encode()}
    path = lay_out_build(tmp_path, synthetic_rows(count=20), name="dated", tokenizer_files=files)
    path.write_text(
        path.read_text().replace(
            "loss_mask: glm5", "  eos: '<|endoftext|>'\n  stop: ['<|endoftext|>']\nloss_mask: turns"
        )
    )
    done = run_cli("--manifest", str(path), "--out", str(tmp_path / "out"), hf_home=tmp_path)
    assert done.returncode == 2 and "render_date" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_explain_on_a_turns_manifest_searches_the_readings_that_apply(fixture_cache, tmp_path):
    """The turns build of a fixture manifest reproduces its pinned rows.

    Under the default reading; the GLM-only readings are named as not applying, and no contract
    tried holds one.
    """
    from builders.contract import DEFAULT
    from builders.runtime.progress import Reporter
    from builders.views.explain import explain

    manifest = load_manifest(
        turns_manifest(manifest_names(with_shared=False)[0], fixture_cache, tmp_path)
    )
    found = explain(
        manifest, Hub(fixture_cache / "hub", offline=True), Reporter.silent(), everything=True
    )
    assert found.matches[0] == DEFAULT
    assert any("mask_rule, final, prefill do not apply" in note for note in found.notes), (
        found.notes
    )
    assert all(
        c.mask_rule == "structure" and c.final == "eos" and c.prefill == "after-prefill"
        for c in found.matches + [c for c, _ in found.ratio_matches]
    )


def test_a_header_is_the_longest_prompt_that_occurs_at_its_first_occurrence():
    """``_first_longest`` against a search of every prompt's every occurrence."""
    from builders.formats.turns import _first_longest, _longest_first

    rng = random.Random(17)
    for _ in range(2000):
        prompts = _longest_first(
            ["".join(rng.choice("ab<") for _ in range(rng.randint(1, 4))) for _ in range(4)]
        )
        region = "".join(rng.choice("ab<x") for _ in range(rng.randint(0, 12)))
        occurrences = [
            (-len(g), at, g)
            for g in prompts
            for at in range(len(region))
            if region.startswith(g, at)
        ]
        expected = min(occurrences, default=None)
        assert _first_longest(region, prompts) == (
            None if expected is None else (expected[1], expected[2])
        )


def _byte_level_by_whole_json(tokenizer: Tokenizer) -> bool:
    """The byte-level test on the whole tokenizer's JSON, as Vocab made it before."""
    config = json.loads(tokenizer.to_str())
    if any(
        "ByteLevel" not in json.dumps(config.get(part)) for part in ("pre_tokenizer", "decoder")
    ):
        return False
    regular = set(tokenizer.get_vocab(with_added_tokens=False).values())
    from builders.formats.vocab import token_byte_lengths

    return bool(regular) and bool(np.all(token_byte_lengths(tokenizer)[list(regular)] > 0))


def _without_decoder() -> Tokenizer:
    tokenizer = fixture_tokenizer()
    tokenizer.decoder = None
    return tokenizer


def _byte_level_in_a_sequence() -> Tokenizer:
    tokenizer = fixture_tokenizer()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return tokenizer


def _byte_level_split_metaspace_decoder() -> Tokenizer:
    tokenizer = fixture_tokenizer()
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer


@pytest.mark.parametrize(
    "make",
    [
        fixture_tokenizer,
        sentencepiece_style,
        _without_decoder,
        _byte_level_in_a_sequence,
        _byte_level_split_metaspace_decoder,
    ],
)
def test_byte_level_reads_the_parts_as_the_whole_json_does(make):
    from builders.formats.vocab import Vocab

    tokenizer = make()
    assert Vocab(tokenizer).byte_level() == _byte_level_by_whole_json(tokenizer)
