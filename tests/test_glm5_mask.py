"""The glm5 mask on its hard cases, and the rendering and tokens.

The mask against supervised text written out by hand, and the rendering and tokens against
transformers' apply_chat_template, with both templates.
"""

import json

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from builders.encode.encoder import ConversationEncoder
from builders.errors import SourceDataError
from builders.fixture.conversations import hard_cases
from builders.fixture.make import (
    FIXTURE_TEMPLATE,
    shared_dir,
    synthetic_rows,
    tokenizer_json,
    tulu_fixture_rows,
)
from builders.formats import glm5_spec
from builders.messages import normalize_messages
from helpers import TEMPLATES, encoder, with_its_eos
from reference import refuse_undefined

E = "<|endoftext|>"
EXPECTED_SUPERVISED = [
    ["They are GLM's role tokens: <|user|> starts a user turn, <|observation|> a tool result." + E],
    ["first answer<|user|>", "shown, stripped</think>second answer" + E],
    ["step one, step two</think>the answer is 4" + E],
    ["tail<|user|>", "history hides it<|user|>"],
    [E],
    [E],
    ["answer one", "answer two" + E],
    ["hi<|user|>"],
    [],
    ["hello", "hello there, friend" + E],
    [
        "Let me look that up.<|observation|>",
        "And the forecast.<|observation|>",
        "21 degrees, sunny and windy." + E,
    ],
    ["unprompted<|user|>"],
    ["晴れです 😀 — naïve café\u0301" + E],
]


def supervised_spans(tokenizer: Tokenizer, ids, mask) -> list[str]:
    spans, current = [], []
    for token, supervised in zip(ids, mask, strict=True):
        if supervised:
            current.append(int(token))
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return [tokenizer.decode(span, skip_special_tokens=False) for span in spans]


@pytest.mark.parametrize("template", TEMPLATES)
def test_hard_cases_supervise_exactly_the_answers(template):
    enc = encoder(template())
    cases = hard_cases()
    assert len(cases) == len(EXPECTED_SUPERVISED)
    rows = [{"index": i, "id": f"hard_case_{i}", "messages": m} for i, m in enumerate(cases)]
    for row, conversation, expected in zip(
        rows, enc.encode(rows), EXPECTED_SUPERVISED, strict=True
    ):
        assert supervised_spans(enc.tokenizer, *with_its_eos(enc, conversation)) == expected, row[
            "id"
        ]


def all_fixture_rows():
    rows = synthetic_rows()
    if shared_dir() is not None:
        rows += tulu_fixture_rows(shared_dir())
    return rows


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendering_and_tokens_match_apply_chat_template(template, tmp_path):
    """Both ways: our text is transformers' text.

    Our ids are apply_chat_template(tokenize=True)'s.
    """
    template = template()
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_json())
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    enc = encoder(template)
    rows = [
        {"index": i, "id": r["id"], "messages": r["messages"]}
        for i, r in enumerate(all_fixture_rows())
    ]
    encoded = enc.encode(rows)
    for row, conversation in zip(rows, encoded, strict=True):
        messages = normalize_messages(row["messages"])
        text = hf.apply_chat_template(messages, chat_template=template, tokenize=False)
        ids = hf.apply_chat_template(messages, chat_template=template, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert enc.format.renderer.render(messages) == text, row["id"]
        assert conversation.ids.tolist() == list(ids), row["id"]


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([{"role": "function", "content": "x"}], "role 'function'"),
        ([{"role": "user"}], "no content"),
        ([{"role": "user", "content": ["a", "b"]}], "content is a list"),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"name": "f"}]}],
            "has tool_calls, which only an assistant message may have",
        ),
        ([{"role": "user", "content": "x", "reasoning_content": "y"}], "only an assistant message"),
        ("not a list", "not a list"),
        ([], "no messages"),
    ],
)
def test_conversations_the_contract_cannot_render_are_refused(messages, problem):
    enc = encoder(FIXTURE_TEMPLATE.read_text(encoding="utf-8"))
    with pytest.raises(SourceDataError) as err:
        enc.encode([{"index": 17, "id": "conv-17", "messages": messages}])
    assert "source row 17 (id 'conv-17')" in str(err.value) and problem in str(err.value)
    # the reference implementation refuses the same cases
    with pytest.raises(ValueError):
        refuse_undefined(messages)


def test_a_template_that_renders_otherwise_is_refused():
    enc = encoder(
        "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}"
    )
    with pytest.raises(SourceDataError, match="renders this conversation differently"):
        enc.encode([{"index": 0, "id": "a", "messages": [{"role": "user", "content": "hi"}]}])


def test_a_token_across_the_prefill_boundary_is_refused():
    """A token across the prefill's </think> makes the mask undefined.

    An added token "</think>x" would take the prefill's </think> and the answer's first letter
    together: the mask is undefined for that tokenizer, and the build says so.
    """
    spec = json.loads(tokenizer_json())
    for added in spec["added_tokens"]:
        if added["content"] == "</think>":
            # in place of </think>
            added["content"] = "</think>x"
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    enc = ConversationEncoder(tokenizer, glm5_spec(FIXTURE_TEMPLATE.read_text(encoding="utf-8")))
    rows = [
        {
            "index": 5,
            "id": "ok",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "fine"},
            ],
        },
        {
            "index": 9,
            "id": "across",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "xylophone"},
            ],
        },
    ]
    with pytest.raises(
        SourceDataError,
        match=r"source row 9 \(id 'across'\): token \d+ \(bytes \d+\.\.\d+\) "
        r"straddles the end of message piece 2 or of its prefill",
    ):
        enc.encode(rows)
    assert len(enc.encode(rows[:1])) == 1


def test_a_tokenizer_that_is_not_byte_level_is_refused():
    from tokenizers import models, pre_tokenizers

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.add_special_tokens(
        ["<|endoftext|>", "<|user|>", "<|observation|>", "<|assistant|>", "[gMASK]", "<sop>"]
    )
    words.add_tokens(["<think>", "</think>"])
    enc = ConversationEncoder(words, glm5_spec(FIXTURE_TEMPLATE.read_text(encoding="utf-8")))
    with pytest.raises(
        SourceDataError,
        match=r"source row 0 \(id 'a'\): the tokens cover \d+ bytes of a \d+-byte "
        r"rendering; the tokenizer does not encode the text losslessly",
    ):
        enc.encode([{"index": 0, "id": "a", "messages": [{"role": "user", "content": "hi there"}]}])
