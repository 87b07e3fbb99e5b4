"""Tool calls under ``turns`` and ``glm5`` (data/ROWS.md, "Tool calls").

On the pinned GLM-4.7-Flash template the two rules give the same rows for generated tool
conversations (tests/tool_conversations.py); on real templates (tests/real_models.py) the calls are
supervised through their stop token and the results are not, and each refusal names what it
refuses: a tool field holding a token of the template's, a template that prints only the first
call or raises, a dataset with tools and a template that never prints them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer
from tool_conversations import TOOLS, tool_conversations

import real_models
from builders.encode.encoder import ConversationEncoder
from builders.errors import ConversationError, SourceDataError, UsageError
from builders.fixture.hf_cache import put_snapshot
from builders.fixture.make import PINNED_TEMPLATE, shared_dir, tokenizer_json
from builders.formats import FormatSpec, glm5_spec
from builders.formats.tools import Injection, tool_fields
from builders.inputs.pinned import special_tokens
from builders.rows.packing import with_eos
from helpers import NEEDS_SHARED, run_cli
from reference_turns import TurnsReference, Undefined

WEATHER = [TOOLS[0]]
# two calls, two results, reasoning, unicode and a number in the arguments
SAMPLE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I need both cities.",
        "tool_calls": [
            {
                "id": "a1b2c3d4e",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            },
            {
                "id": "f5g6h7i8j",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "東京", "days": 2}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": '{"t": 18}'},
    {"role": "tool", "tool_call_id": "f5g6h7i8j", "content": '{"t": 25}'},
    {"role": "assistant", "content": "Paris: 18°C, Tokyo: 25°C."},
]
# an answer that prints only its call, an empty result, then an answer: the call's printed fields
# end the first answer's search region, so the later answer's longer header is not taken for its own
EMPTY_RESULT = [
    SAMPLE[1],
    {"role": "assistant", "content": "", "tool_calls": SAMPLE[2]["tool_calls"][:1]},
    {"role": "tool", "content": ""},
    {"role": "assistant", "content": "ok"},
]
ONE_CALL = [
    *SAMPLE[:2],
    {**SAMPLE[2], "tool_calls": SAMPLE[2]["tool_calls"][:1]},
    SAMPLE[3],
    SAMPLE[5],
]


def rows(conversations) -> list[dict]:
    return [
        {"index": k, "id": f"t{k}", "messages": messages, "tools": tools}
        for k, (messages, tools) in enumerate(conversations)
    ]


ENCODERS: dict = {}


def model_encoder(model: real_models.Model, tools: bool = True, template=None):
    """A ``turns`` encoder over a real model's files (``template``: another one).

    Made once per model, tools flag and template (an encoder keeps no state between encodes).
    """
    key = (model.name, tools, template)
    if key not in ENCODERS:
        ENCODERS[key] = _model_encoder(model, tools, template)
    return ENCODERS[key]


def _model_encoder(model: real_models.Model, tools: bool, template):
    files = model.files
    config = (
        json.loads(files["tokenizer_config.json"]) if "tokenizer_config.json" in files else None
    )
    if template is None and "chat_template.jinja" in files:
        template = files["chat_template.jinja"].decode()
    elif template is None:
        named = config["chat_template"]
        name = model.fields.get("chat_template_name", "default")
        template = (
            named
            if isinstance(named, str)
            else next(t["template"] for t in named if t["name"] == name)
        )
    fields = model.fields
    date = fields.get("render_date")
    spec = FormatSpec(
        "turns",
        template,
        fields["eos"],
        tuple(fields["stop"]),
        tuple(fields.get("prefills", [{}])),
        fields.get("template_vars", {}),
        None if date is None else str(date),
        special_tokens(config) if config else {},
        tools=tools,
    )
    return ConversationEncoder(Tokenizer.from_str(files["tokenizer.json"].decode()), spec)


def marked(encoder, conversation) -> str:
    """The conversation's tokens decoded, supervised runs in «»."""
    out, ids, mask = [], conversation.ids.tolist(), conversation.mask.tolist()
    for supervised, run in itertools.groupby(range(len(ids)), key=lambda t: mask[t]):
        text = encoder.tokenizer.decode([ids[t] for t in run], skip_special_tokens=False)
        out.append(f"«{text}»" if supervised else text)
    return "".join(out)


def glm_encoders():
    template = (shared_dir() / PINNED_TEMPLATE).read_text(encoding="utf-8")
    tokenizer = tokenizer_json().decode()
    glm5 = ConversationEncoder(Tokenizer.from_str(tokenizer), glm5_spec(template))
    turns = ConversationEncoder(
        Tokenizer.from_str(tokenizer),
        FormatSpec(
            "turns",
            template,
            "<|endoftext|>",
            ("<|endoftext|>", "<|user|>", "<|observation|>"),
            ({}, {"enable_thinking": False}),
            tools=True,
        ),
    )
    return glm5, turns


@NEEDS_SHARED
def test_turns_and_glm5_give_the_same_rows_for_tool_conversations_on_glm():
    glm5, turns = glm_encoders()
    source = rows([(SAMPLE, WEATHER), (EMPTY_RESULT, WEATHER), *tool_conversations(11, 60)])
    by_glm5, by_turns = glm5.encode(source), turns.encode(source)
    for row, a, b in zip(source, by_glm5, by_turns, strict=True):
        assert a.ids.tolist() == b.ids.tolist(), row["id"]
        assert a.mask.tolist() == b.mask.tolist(), row["id"]
        assert a.ends_with_answer == b.ends_with_answer, row["id"]
    sample = marked(glm5, by_glm5[0])
    assert (
        "<|assistant|><think>«I need both cities.</think><tool_call>get_weather<arg_key>city"
        "</arg_key><arg_value>Paris</arg_value></tool_call><tool_call>get_weather<arg_key>city"
        "</arg_key><arg_value>東京</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>"
        "</tool_call><|observation|>»<tool_response>" in sample
    ), sample
    assert sample.endswith("</tool_response><|assistant|></think>«Paris: 18°C, Tokyo: 25°C.»")
    assert '<tool_response>{"t": 18}</tool_response>' in sample


@NEEDS_SHARED
def test_glm5_refuses_string_arguments_naming_the_call():
    glm5, _ = glm_encoders()
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "x"}'}}
    messages = [SAMPLE[1], {"role": "assistant", "content": "", "tool_calls": [call]}]
    with pytest.raises(SourceDataError, match=r"source row 0 .*message 1 .*call 0: arguments"):
        glm5.encode(rows([(messages, WEATHER)]))


def test_qwen3_supervises_the_calls_through_im_end_and_not_the_results():
    encoder = model_encoder(real_models.qwen3())
    (conversation,) = encoder.encode(rows([(SAMPLE, WEATHER)]))
    text = marked(encoder, conversation)
    assert (
        "<|im_start|>assistant\n«<think>\nI need both cities.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "東京", "days": 2}}\n</tool_call>'
        "<|im_end|>»\n<|im_start|>user\n<tool_response>\n" in text
    ), text
    assert text.endswith(
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "«Paris: 18°C, Tokyo: 25°C.<|im_end|>»\n"
    ), text
    # the schema is context
    assert '«{"type": "function"' not in text and "get_weather" in text.split("«")[0]
    # the supervised tokens inside calls: those that start between the answer's last text and its
    # stop token, counted on the render's own offsets
    render = encoder.tokenizer.decode(conversation.ids.tolist(), skip_special_tokens=False)
    start = render.index("I need both cities.") + len("I need both cities.")
    end = render.index("<|im_end|>", start)
    offsets = encoder.tokenizer.encode(render, add_special_tokens=False).offsets
    assert conversation.tool_counts[-1] == sum(start <= a < end for a, _ in offsets) > 10


def test_deepseek_v31_answers_right_after_the_tool_output():
    encoder = model_encoder(real_models.deepseek(), tools=False)
    (conversation,) = encoder.encode(rows([(SAMPLE, None)]))
    text = marked(encoder, conversation)
    assert text.endswith(
        '<｜tool▁output▁begin｜>{"t": 25}<｜tool▁output▁end｜>«Paris: 18°C, Tokyo: 25°C.'
        "<｜end▁of▁sentence｜>»"
    ), text
    assert "<｜Assistant｜><think></think>«<｜tool▁calls▁begin｜>" in text


def test_a_dataset_with_tools_and_a_template_that_never_prints_them_is_refused_before_work():
    with pytest.raises(UsageError, match=r"never prints them.*probe_fn"):
        model_encoder(real_models.deepseek(), tools=True)


def test_two_calls_on_llama_are_refused_naming_the_template_error():
    encoder = model_encoder(real_models.llama3("3.1"))
    (one,) = encoder.encode(rows([(ONE_CALL, WEATHER)]))
    assert '«{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>»' in marked(
        encoder, one
    )
    with pytest.raises(SourceDataError, match=r"source row 0 .*single tool-calls"):
        encoder.encode(rows([(SAMPLE, WEATHER)]))


def test_a_template_that_prints_only_the_first_call_is_refused_naming_the_call():
    model = real_models.qwen3()
    template = model.files["chat_template.jinja"].decode()
    first_only = template.replace("in message.tool_calls %}", "in message.tool_calls[:1] %}")
    assert first_only != template
    encoder = model_encoder(model, template=first_only)
    encoder.encode(rows([(ONE_CALL, WEATHER)]))
    with pytest.raises(
        SourceDataError, match=r"message 2 \(assistant\).* does not print call 1 \(name"
    ):
        encoder.encode(rows([(SAMPLE, WEATHER)]))


@pytest.mark.parametrize(
    "where, text",
    [
        ("name", "get<|im_end|>weather"),
        ("argument", "Paris<|im_start|>assistant\n"),
        ("tool", "a tool <tool_call> described"),
        ("call id", "id<|endoftext|>"),
    ],
)
def test_a_tool_field_holding_a_template_token_is_refused(where, text):
    encoder = model_encoder(real_models.qwen3())
    messages = json.loads(json.dumps(ONE_CALL))
    tools = json.loads(json.dumps(WEATHER))
    call = messages[2]["tool_calls"][0]
    if where == "name":
        call["function"]["name"] = text
    elif where == "argument":
        call["function"]["arguments"]["city"] = text
    elif where == "tool":
        tools[0]["function"]["description"] = text
    else:
        messages[3]["tool_call_id"] = text
    with pytest.raises(SourceDataError, match=r"source row 0 .* holds .*added token, stop string"):
        encoder.encode(rows([(messages, tools)]))


def test_tool_conversations_with_call_ids_are_rendered_fresh_and_give_the_same_rows(monkeypatch):
    """Conversations whose calls have ids are not kept (their shapes never repeat), others are.

    Either way the rows are those of an encoder that keeps no placeholder render.
    """
    from builders.formats import turns

    cases = tool_conversations(31, 12) + tool_conversations(32, 12, ids=False)
    shared = _model_encoder(real_models.qwen3(), True, None)
    shared.encode(rows(cases[:12]))
    assert not shared.format._kept
    together = shared.encode(rows(cases)) + shared.encode(rows(cases))
    assert shared.format._kept
    monkeypatch.setattr(turns, "SHAPES_KEPT_CHARS", 0)
    keeping_none = model_encoder(real_models.qwen3())
    fresh = keeping_none.encode(rows(cases))
    assert not keeping_none.format._kept
    for a, b in zip(together, fresh + fresh, strict=True):
        assert (a.ids.tolist(), a.mask.tolist(), a.ends_with_answer) == (
            b.ids.tolist(),
            b.mask.tolist(),
            b.ends_with_answer,
        )


def _strings_of(value, path=(), keys=False):
    """Each (path, string) of a value, and its keys where ``keys`` or under ``arguments``."""
    if isinstance(value, dict):
        for key in list(value):
            if keys or "arguments" in path:
                yield (*path, ("key", key)), key
            yield from _strings_of(value[key], (*path, key), keys)
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from _strings_of(item, (*path, k), keys)
    elif isinstance(value, str):
        yield path, value


def _planted(value, path, text):
    """``value`` with the string at ``path`` (from ``_strings_of``) replaced by ``text``."""
    *inside, last = path
    for step in inside:
        value = value[step]
    if isinstance(last, tuple):
        value[text] = value.pop(last[1])
    else:
        value[last] = text


def test_the_injection_check_refuses_exactly_the_fields_that_hold_a_forbidden_string():
    """Its one search over the tools' and calls' strings refuses as a search of each field would.

    Forbidden strings, and halves of one at the ends of two neighbouring fields, are planted in
    any string of generated conversations and their tools (contents, argument keys, the tools'
    keys too); the expected outcome is each field's own search, in ``tool_fields``' order.
    """
    forbidden = ["<|im_end|>", "<tool_call>", "<|im_start|>assistant\n"]
    injection = Injection(forbidden)
    rng = random.Random(29)
    refused = 0
    # arguments as objects (their keys and nested values planted too), and as JSON text
    conversations = tool_conversations(29, 150, strings=False)
    for messages, tools in conversations + tool_conversations(30, 150, strings=True):
        tools = json.loads(json.dumps(tools))
        for _ in range(rng.randint(0, 2)):
            # (not a role: the refusal names it)
            places = [(messages, p, t) for p, t in _strings_of(messages) if p[-1] != "role"]
            places += [(tools, p, t) for p, t in _strings_of(tools, keys=True)]
            value, path, text = rng.choice(places)
            piece = rng.choice([*forbidden, "<|im_", "end|>"])
            _planted(value, path, rng.choice([piece, text + piece, piece + text]))
        first = next(
            (
                (where, f)
                for where, text in tool_fields(messages, tools)
                for f in forbidden
                if f in text
            ),
            None,
        )
        if first is None:
            injection.check(messages, tools)
            continue
        refused += 1
        with pytest.raises(ConversationError) as raised:
            injection.check(messages, tools)
        assert str(raised.value).startswith(f"{first[0]} holds")
    assert 50 < refused < 250


REAL = {
    "qwen3": (real_models.qwen3, {"max_calls": 3}),
    "qwen2.5": (real_models.qwen25, {"max_calls": 3}),
    "deepseek-v3.1": (real_models.deepseek, {"max_calls": 3}),
    "llama3.1": (lambda: real_models.llama3("3.1"), {"max_calls": 1}),
    "llama3.2": (lambda: real_models.llama3("3.2"), {"max_calls": 1}),
}


@pytest.mark.parametrize("name", list(REAL))
def test_turns_with_tools_equals_the_reference_on_real_templates(name, tmp_path):
    """tests/reference_turns.py (written from data/ROWS.md) gives the same rows, or refuses too.

    Qwen3 also with arguments as JSON strings (it prints a string as it is); DeepSeek-V3.1 never
    prints tools, so its conversations go without them.
    """
    make, options = REAL[name]
    model = make()
    for file, data in model.files.items():
        (tmp_path / file).write_bytes(data)
    reference = TurnsReference(tmp_path, {"sha256": dict.fromkeys(model.files), **model.fields})
    takes_tools = name != "deepseek-v3.1"
    encoder = model_encoder(model, tools=takes_tools)
    cases = [(SAMPLE, WEATHER), (ONE_CALL, WEATHER), (EMPTY_RESULT, WEATHER)]
    cases += tool_conversations(5, 8, **options)
    if name == "qwen3":
        cases += tool_conversations(6, 4, strings=True)
    if not takes_tools:
        cases = [(messages, None) for messages, _ in cases]
    defined = 0
    for k, (messages, tools) in enumerate(cases):
        try:
            expected = reference.conversation(messages, tools=tools)
        except Undefined as undefined:
            expected = undefined
        row = {"index": k, "id": f"t{k}", "messages": messages, "tools": tools}
        try:
            (encoded,) = encoder.encode([row])
        except SourceDataError as refusal:
            assert isinstance(expected, Undefined), f"{k}: builder refuses: {refusal}"
            continue
        assert not isinstance(expected, Undefined), f"{k}: builder takes, reference: {expected}"
        ids, mask = with_eos(encoded.ids, encoded.mask, encoded.ends_with_answer, encoder.eos_id)
        assert (ids.tolist(), mask.tolist()) == expected, k
        defined += 1
    # Llama 3 takes one call per answer: the two-call sample is refused
    assert defined >= len(cases) - (1 if name.startswith("llama") else 0)


def lay_out_tool_build(hf_home, model: real_models.Model, name: str, conversations) -> Path:
    """A JSON Lines dataset of tool conversations (arguments as JSON strings, as the OpenAI
    wire format stores them) and ``model``'s tokenizer repo; returns a ``turns`` manifest with
    ``dataset.tools``."""
    lines = []
    for k, (messages, tools) in enumerate(conversations):
        stored = json.loads(json.dumps(messages))
        for message in stored:
            for call in message.get("tool_calls", []):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        lines.append(json.dumps({"id": f"t{k}", "messages": stored, "tools": tools}))
    files = {"data/train.jsonl": ("\n".join(lines) + "\n").encode()}
    dataset = put_snapshot(hf_home, f"someone/{name}-chat", "dataset", files)
    tokenizer = put_snapshot(hf_home, f"someone/{name}-tokenizer", "model", model.files)
    spec = {
        "name": name,
        "dataset": {
            "repo": f"someone/{name}-chat",
            "revision": dataset,
            "files": "data/*.jsonl",
            "tools": "tools",
        },
        "tokenizer": {
            "repo": f"someone/{name}-tokenizer",
            "revision": tokenizer,
            "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(model.files.items())},
            **model.fields,
        },
        "loss_mask": "turns",
        "seed": 3,
        "row_tokens": 256,
        "rows": 4,
    }
    manifest = hf_home / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))
    return manifest


def test_a_tool_dataset_builds_and_inspect_shows_the_call_supervised(tmp_path):
    hf_home = tmp_path / "hf"
    cases = [(SAMPLE, WEATHER), *tool_conversations(3, 12)]
    manifest = lay_out_tool_build(hf_home, real_models.qwen3(), "tools-qwen3", cases)
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=hf_home)
    assert done.returncode == 0, done.stderr
    calls = json.loads((tmp_path / "out" / "tools-qwen3.report.json").read_text())["stats"][
        "tool_calls"
    ]
    assert 0 < calls["supervised_share_in_calls"] < 1 and calls["supervised_in_calls"] > 0
    card = (tmp_path / "out" / "tools-qwen3.md").read_text()
    assert "supervised tokens inside calls" in card
    shown = run_cli(
        "inspect",
        "--manifest",
        str(manifest),
        "--source-index",
        "0",
        "--color",
        "never",
        hf_home=hf_home,
    )
    assert shown.returncode == 0, shown.stderr
    # supervised: ⟦…⟧; the call and the stop after it are, the tool result is not
    assert '"arguments": {"city": "Paris"}}\n</tool_call>' in shown.stdout
    supervised = re.findall(r"⟦(.*?)⟧", shown.stdout, flags=re.S)
    assert any(
        '{"name": "get_weather", "arguments": {"city": "東京", "days": 2}}' in s
        and s.endswith("<|im_end|>")
        for s in supervised
    ), supervised
    assert not any('{"t": 18}' in s for s in supervised)
    assert '{"t": 18}' in shown.stdout
    # a built row: its calls supervised, its tool results not
    row = run_cli(
        "inspect",
        str(tmp_path / "out" / "tools-qwen3.parquet"),
        "--manifest",
        str(manifest),
        "--row",
        "0",
        "--color",
        "never",
        hf_home=hf_home,
    )
    assert row.returncode == 0, row.stderr
    supervised = re.findall(r"⟦(.*?)⟧", row.stdout, flags=re.S)
    assert any("</tool_call><|im_end|>" in s for s in supervised), row.stdout
    assert not any("<tool_response>" in s for s in supervised)
    assert "<tool_response>" in row.stdout


def test_tools_with_a_template_that_never_prints_them_is_exit_2_before_any_work(tmp_path):
    hf_home = tmp_path / "hf"
    manifest = lay_out_tool_build(hf_home, real_models.deepseek(), "tools-ds", [(SAMPLE, WEATHER)])
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=hf_home)
    assert done.returncode == 2, done.stderr
    assert "never prints them" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
