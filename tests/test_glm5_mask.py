"""The glm5 mask on its hard cases, against supervised text written out by hand, and the
rendering and tokens against transformers' apply_chat_template, with both templates."""

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from builders.chat import normalize_messages
from builders.errors import SourceDataError
from builders.fixture.conversations import hard_cases
from builders.fixture.make import FIXTURE_TEMPLATE, shared_dir, synthetic_rows, tokenizer_json, tulu_fixture_rows
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
    ["Let me look that up.<|observation|>", "And the forecast.<|observation|>", "21 degrees, sunny and windy." + E],
    ["unprompted<|user|>"],
    ["晴れです 😀 — naïve café\u0301" + E],
]

def supervised_spans(tokenizer: Tokenizer, ids, mask) -> list[str]:
    spans, current = [], []
    for token, supervised in zip(ids, mask):
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
    for row, conversation, expected in zip(rows, enc.encode(rows), EXPECTED_SUPERVISED):
        assert supervised_spans(enc.tokenizer, *with_its_eos(enc, conversation)) == expected, row["id"]


def all_fixture_rows():
    rows = synthetic_rows()
    if shared_dir() is not None:
        rows += tulu_fixture_rows(shared_dir())
    return rows


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendering_and_tokens_match_apply_chat_template(template, tmp_path):
    """Both ways: our text is transformers' text, and our ids are apply_chat_template(tokenize=True)'s."""
    template = template()
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_json())
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    enc = encoder(template)
    rows = [{"index": i, "id": r["id"], "messages": r["messages"]} for i, r in enumerate(all_fixture_rows())]
    encoded = enc.encode(rows)
    for row, conversation in zip(rows, encoded):
        messages = normalize_messages(row["messages"])
        text = hf.apply_chat_template(messages, chat_template=template, tokenize=False)
        ids = hf.apply_chat_template(messages, chat_template=template, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert enc.renderer.render(messages) == text, row["id"]
        assert conversation.ids.tolist() == list(ids), row["id"]


@pytest.mark.parametrize("messages, problem", [
    ([{"role": "function", "content": "x"}], "role 'function'"),
    ([{"role": "user"}], "no content"),
    ([{"role": "user", "content": ["a", "b"]}], "content of type list"),
    ([{"role": "user", "content": "x", "tool_calls": [{"name": "f"}]}], "unsupported field 'tool_calls'"),
    ([{"role": "user", "content": "x", "reasoning_content": "y"}], "only an assistant message"),
    ("not a list", "not a list"),
    ([], "no messages"),
])
def test_conversations_the_contract_cannot_render_are_refused(messages, problem):
    enc = encoder(FIXTURE_TEMPLATE.read_text(encoding="utf-8"))
    with pytest.raises(SourceDataError) as err:
        enc.encode([{"index": 17, "id": "conv-17", "messages": messages}])
    assert "source row 17 (id 'conv-17')" in str(err.value) and problem in str(err.value)
    with pytest.raises(ValueError):  # the reference implementation refuses the same cases
        refuse_undefined(messages)


def test_a_template_that_renders_otherwise_is_refused():
    enc = encoder("[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}")
    with pytest.raises(SourceDataError, match="renders this conversation differently"):
        enc.encode([{"index": 0, "id": "a", "messages": [{"role": "user", "content": "hi"}]}])
