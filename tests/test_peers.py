"""The peer formats against the peers' own code.

transformers' ``apply_chat_template`` with ``return_assistant_tokens_mask`` for ``hf-generation``,
miles' ``get_loss_mask`` for ``miles-qwen`` / ``miles-qwen3``, on Qwen's real BPE and the chat
templates the trl wheel ships (``peer_inputs``).

The miles readings are compared with ``peer_reference.miles_loss_mask`` (miles transcribed call for
call) always, and with miles' own ``mask_utils.py`` where ``MILES_SRC`` names a miles checkout at
78527b91 (miles is not on PyPI). Importing ``miles.utils.mask_utils`` needs only transformers:
nothing is stubbed. Run it with:

    MILES_SRC=/path/to/miles python -m pytest tests/test_peers.py -s

Run at miles 78527b91 (``git archive 78527b91 | tar -x -C /tmp/miles``), ``-s`` prints the counts:
real miles, 2 rules x 8 templates: 2,016 conversations compared, 1,699 equal, 317 where miles raises
or returns a mask of another length than its ids and the builder refuses, 0 different; transformers'
``{% generation %}`` masks, 34 templates: 1,084 compared, 1,015 equal, 69 refused by both (the
template raises), 0 different.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from tokenizers import AddedToken, Tokenizer

from builders.build import build
from builders.errors import ConversationError, ManifestError, UsageError
from builders.fixture.conversations import hard_cases, synthetic
from builders.fixture.hf_cache import parquet_shards
from builders.fixture.make import shared_dir
from builders.formats import PEER_FORMATS, FormatSpec, make_format
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from helpers import file_rows, lay_out_build, run_cli
from peer_inputs import hf_tokenizer, qwen_tokenizer_json, trl_templates
from peer_reference import hf_generation, miles_loss_mask
from reference import cut_rows, read_source, rows_sha256, stream_order

# where peers break: two answers in a row, role-token text, whitespace at the edges, a system
# message not first; and empty answers, reasoning, a newline merging with the header, step_loss_mask
QWEN_HARD_CASES = [
    [
        {"role": "user", "content": "two answers please"},
        {"role": "assistant", "content": "answer one"},
        {"role": "assistant", "content": "answer two"},
    ],
    [
        {"role": "user", "content": "what is <|im_start|>assistant\n? and <|im_end|>"},
        {"role": "assistant", "content": "a header: <|im_end|>\n<|im_start|>user\nfake turn"},
    ],
    [
        {"role": "user", "content": "  padded  "},
        {"role": "assistant", "content": "\n\n  answer with edges \n\n"},
    ],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "Now be verbose."},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "hello there, friend"},
    ],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": ""},
    ],
    [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "\nr2\n"},
    ],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\ninline\n</think>\n\nanswer"},
    ],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\nstarts with a newline"}],
    [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "not trained", "step_loss_mask": 0},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "trained", "step_loss_mask": 1},
    ],
    [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Looking."},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "21 and sunny."},
    ],
    [{"role": "assistant", "content": "unprompted"}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": "nobody answers"}],
    [
        {"role": "user", "content": "东京の天気は？ 🙂"},
        {"role": "assistant", "content": "晴れです 😀 — naïve café\u0301"},
    ],
]
QWEN_SPECIALS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
DEEPSEEK_DISTILL_TOKENS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
)
# handmade templates for the edges of transformers' span-to-token mapping: a span that starts
# inside a token, an empty span, a span inside a buffered macro (recorded at the wrong offset)
EDGE_TEMPLATES = {
    "straddle": "{% for m in messages %}{{ m.role }}:{% if m.role == 'assistant' %}x"
    "{% generation %}{{ m.content }}.{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n"
    "{% endfor %}",
    "empty-span": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.role == 'assistant' %}{% generation %}{% endgeneration %}{% endif %}<|im_end|>\n"
    "{% endfor %}",
    "macro": "{% macro turn(m) %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
    "{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}"
    "<|im_end|>{% endif %}\n{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}",
}


def peer_reading(name: str, tokenizer: Tokenizer, template: str, special_tokens: dict):
    return make_format(
        FormatSpec(name, template, eos="<|endoftext|>", special_tokens=special_tokens), tokenizer
    )


def conversations(with_tulu: bool) -> list[list[dict]]:
    """The hard cases, and with ``with_tulu`` some Tulu 3 rows.

    The first 100 Tulu 3 rows, where ../shared has them.
    """
    out = QWEN_HARD_CASES + hard_cases()
    folder = shared_dir()
    if (
        with_tulu
        and folder is not None
        and (folder / "data" / "tulu-3-sft-mixture-first100.jsonl").is_file()
    ):
        with open(folder / "data" / "tulu-3-sft-mixture-first100.jsonl", encoding="utf-8") as f:
            out += [json.loads(line)["messages"] for line in f]
    return out


def generation_templates() -> dict[str, str]:
    return {
        **{name: text for name, text in trl_templates().items() if name.endswith("_training")},
        **EDGE_TEMPLATES,
    }


def compare(reference, reading, convs: list[list[dict]]) -> dict:
    """Conversation by conversation: the reading equals the reference.

    Or both refuse it; then the defined ones encoded in one batch equal the same one by one.

    Where the reference raises (a template error), the reading must raise ConversationError;
    where its ids and mask differ in length (miles' cut ate an answer's header), the reading refuses
    too.
    """
    counts = {"compared": 0, "equal": 0, "both refuse": 0}
    defined, singles = [], []
    for position, messages in enumerate(convs):
        counts["compared"] += 1
        try:
            expected = reference(messages)
        except Exception:
            expected = None
        if expected is not None and len(expected[0]) == len(expected[1]):
            ((ids, mask),) = reading.encode_all([messages])
            assert (ids.tolist(), mask.tolist()) == expected, f"conversation {position}: {messages}"
            counts["equal"] += 1
            defined.append(messages)
            singles.append(expected)
        else:
            with pytest.raises(ConversationError):
                reading.encode_all([messages])
            counts["both refuse"] += 1
    batched = [(ids.tolist(), mask.tolist()) for ids, mask in reading.encode_all(defined)]
    assert batched == singles
    return counts


@pytest.fixture(scope="module")
def qwen_json() -> str:
    return qwen_tokenizer_json()


@pytest.fixture(scope="module")
def qwen_hf(qwen_json, tmp_path_factory):
    """One PreTrainedTokenizerFast over the Qwen tokenizer.

    A test sets its chat_template.
    """
    return hf_tokenizer(qwen_json, "", tmp_path_factory.mktemp("qwen"), **QWEN_SPECIALS)


# the slow reference on long rows: a few only
WITH_TULU = ("qwen3_training", "qwen2_5_training", "qwen3", "qwen2_5")


@pytest.mark.parametrize("template_name", sorted(generation_templates()))
def test_hf_generation_equals_transformers(qwen_json, qwen_hf, template_name):
    template = generation_templates()[template_name]
    qwen_hf.chat_template = template
    reading = peer_reading(
        "hf-generation", Tokenizer.from_str(qwen_json), template, qwen_hf.special_tokens_map
    )
    counts = compare(
        lambda m: hf_generation(qwen_hf, m), reading, conversations(template_name in WITH_TULU)
    )
    assert counts["equal"] > 0
    print(f"hf-generation {template_name}: {counts}")


def test_hf_generation_refuses_a_template_without_generation_blocks(qwen_json):
    with pytest.raises(UsageError, match="generation"):
        peer_reading("hf-generation", Tokenizer.from_str(qwen_json), trl_templates()["qwen3"], {})
    assert UsageError.exit_code == 2


MILES_TEMPLATES = (
    "qwen3",
    "qwen3_training",
    "qwen2_5",
    "qwen2_5_training",
    "qwen3_instruct_2507",
    "qwen3_6",
    "qwen3_5_think",
    "deepseek_r1_distill",
)


def miles_case(qwen_json: str, qwen_hf, template_name: str, tmp_path):
    """The Qwen tokenizer, its PreTrainedTokenizerFast, and the template.

    The tokenizer has DeepSeek's role tokens added for the distill template; the
    PreTrainedTokenizerFast has the template.
    """
    tokenizer = Tokenizer.from_str(qwen_json)
    template = trl_templates()[template_name]
    if template_name != "deepseek_r1_distill":
        qwen_hf.chat_template = template
        return tokenizer, qwen_hf, template
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in DEEPSEEK_DISTILL_TOKENS]
    )
    specials = {"bos_token": DEEPSEEK_DISTILL_TOKENS[0], "eos_token": DEEPSEEK_DISTILL_TOKENS[1]}
    return tokenizer, hf_tokenizer(tokenizer.to_str(), template, tmp_path, **specials), template


@pytest.mark.parametrize("kind", ["qwen", "qwen3"])
@pytest.mark.parametrize("template_name", MILES_TEMPLATES)
def test_miles_readings_equal_miles_transcribed(qwen_json, qwen_hf, template_name, kind, tmp_path):
    tokenizer, tok, template = miles_case(qwen_json, qwen_hf, template_name, tmp_path)
    reading = peer_reading(f"miles-{kind}", tokenizer, template, tok.special_tokens_map)
    counts = compare(
        lambda m: miles_loss_mask(tok, kind, m), reading, conversations(template_name in WITH_TULU)
    )
    assert counts["equal"] > 0
    print(f"miles-{kind} (transcribed) {template_name}: {counts}")


def real_miles():
    source = os.environ.get("MILES_SRC")
    if not source:
        pytest.skip("needs MILES_SRC, a miles checkout at 78527b91 (not on PyPI; never in CI)")
    if source not in sys.path:
        sys.path.insert(0, source)
    return importlib.import_module("miles.utils.mask_utils")


@pytest.mark.parametrize("kind", ["qwen", "qwen3"])
@pytest.mark.parametrize("template_name", MILES_TEMPLATES)
def test_miles_readings_equal_real_miles(qwen_json, qwen_hf, template_name, kind, tmp_path):
    mask_utils = real_miles()
    tokenizer, tok, template = miles_case(qwen_json, qwen_hf, template_name, tmp_path)
    reading = peer_reading(f"miles-{kind}", tokenizer, template, tok.special_tokens_map)
    generator = mask_utils.MultiTurnLossMaskGenerator(tok, tokenizer_type=kind)
    assert (reading.system_message_length, reading.gen_token_length) == (
        generator.system_message_length,
        generator.gen_token_length,
    )
    counts = compare(generator.get_loss_mask, reading, conversations(True))
    assert counts["equal"] > 0
    print(f"miles-{kind} (real miles) {template_name}: {counts}")


def test_miles_qwen_turns_distill_on_a_deepseek_vocabulary(qwen_json, qwen_hf, tmp_path):
    tokenizer, tok, template = miles_case(qwen_json, qwen_hf, "deepseek_r1_distill", tmp_path)
    assert (
        peer_reading("miles-qwen", tokenizer, template, tok.special_tokens_map).rule
        == "distill_qwen"
    )
    assert peer_reading("miles-qwen3", tokenizer, template, tok.special_tokens_map).rule == "qwen3"


# builds: a peer format's rows equal the peer's own conversations packed as ROWS.md packs them
MESSAGE_WITH_STEP = pa.struct(
    [
        ("content", pa.string()),
        ("role", pa.string()),
        ("reasoning_content", pa.string()),
        ("step_loss_mask", pa.int64()),
    ]
)
PEER_TEMPLATE = {"miles-qwen": "qwen3", "miles-qwen3": "qwen3", "hf-generation": "qwen3_training"}


def peer_source() -> list[dict]:
    """Hard and synthetic conversations, each message's ``step_loss_mask`` stored.

    A message without one reads back from the struct column as null, which miles does not train:
    the source gives 1 where a conversation leaves it out, as miles' own data would.
    """
    hard = [
        {"id": f"hard_{i}", "source": "hard", "messages": m} for i, m in enumerate(QWEN_HARD_CASES)
    ]
    rows = hard + [
        {"id": f"synthetic_{k}", "source": "synthetic", "messages": m}
        for k, m in enumerate(synthetic(5, 30))
    ]
    return [
        {**row, "messages": [{"step_loss_mask": 1, **m} for m in row["messages"]]} for row in rows
    ]


def lay_out_peer(hf_home: Path, qwen_json: str, template_name: str, loss_mask: str) -> Path:
    """The peer source and the Qwen tokenizer, laid out in ``hf_home``.

    The tokenizer with ``template_name``; returns a manifest under ``loss_mask``.
    """
    files = {
        "tokenizer.json": qwen_json.encode(),
        "chat_template.jinja": trl_templates()[template_name].encode(),
    }
    manifest = lay_out_build(
        hf_home,
        peer_source(),
        name=f"peer-{template_name}",
        seed=5,
        row_tokens=128,
        build_rows=12,
        shards=2,
        row_group_rows=8,
        tokenizer_files=files,
        dataset_files=parquet_shards(
            peer_source(), shards=2, row_group_rows=8, message_type=MESSAGE_WITH_STEP
        ),
    )
    text = manifest.read_text().replace("loss_mask: glm5", f"loss_mask: {loss_mask}")
    text = text.replace("  sha256:", '  eos: "<|endoftext|>"\n  sha256:')
    path = hf_home / f"peer-{template_name}-{loss_mask}.yaml"
    path.write_text(text)
    return path


def peer_reference_rows(hf_home: Path, manifest, loss_mask: str, qwen_hf) -> list:
    """The rows of ``manifest``'s source under peer ``loss_mask``.

    Each conversation from the peer's own calls (``peer_reference``), then the EOS (unsupervised),
    packed by tests/reference.py.
    """
    qwen_hf.chat_template = trl_templates()[PEER_TEMPLATE[loss_mask]]
    eos = qwen_hf.convert_tokens_to_ids("<|endoftext|>")

    def encode(messages):
        # miles keeps a null step_loss_mask (an untrained answer); transformers drops null fields
        messages = [
            {k: v for k, v in m.items() if v is not None or k == "step_loss_mask"} for m in messages
        ]
        ids, mask = (
            hf_generation(qwen_hf, messages)
            if loss_mask == "hf-generation"
            else miles_loss_mask(qwen_hf, loss_mask.removeprefix("miles-"), messages)
        )
        return [*ids, eos], [*mask, 0]

    data = next(
        (hf_home / "hub").glob(f"datasets--*{manifest.dataset.repo.split('/')[1]}/snapshots/*/data")
    )
    source = read_source(sorted(data.glob("train-*.parquet")))
    order = stream_order("numpy-generator", manifest.seed, len(source))
    return cut_rows(
        (encode(source[i]["messages"]) for i in order), manifest.row_tokens, manifest.rows
    )


@pytest.mark.parametrize("loss_mask", PEER_FORMATS)
def test_a_peer_build_is_the_peer_rows(qwen_json, qwen_hf, loss_mask, tmp_path):
    hf_home = tmp_path / "hf"
    manifest = load_manifest(lay_out_peer(hf_home, qwen_json, PEER_TEMPLATE[loss_mask], loss_mask))
    built = build(manifest, tmp_path / "out", Hub(hf_home / "hub", offline=True), card=False)
    assert file_rows(built.parquet) == peer_reference_rows(hf_home, manifest, loss_mask, qwen_hf)


@pytest.mark.slow
def test_explain_names_the_peer_that_made_the_pinned_rows(qwen_json, qwen_hf, tmp_path):
    """Rows made the miles-qwen3 way, in a manifest that says miles-qwen.

    Made by the transcribed miles calls, and pinned in the manifest.
    """
    hf_home = tmp_path / "hf"
    path = lay_out_peer(hf_home, qwen_json, "qwen3", "miles-qwen")
    peer_rows = peer_reference_rows(hf_home, load_manifest(path), "miles-qwen3", qwen_hf)
    assert peer_rows != peer_reference_rows(hf_home, load_manifest(path), "miles-qwen", qwen_hf)
    path.write_text(path.read_text() + f"expect:\n  rows_sha256: {rows_sha256(peer_rows)}\n")
    done = run_cli("explain", "--manifest", str(path), "--json", hf_home=hf_home)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert found["matches"] == [] and found["peer_matches"] == [
        {"loss_mask": "miles-qwen3", "hash": "u4-u1"}
    ]
    text = run_cli("explain", "--manifest", str(path), hf_home=hf_home).stdout
    assert "loss_mask miles-qwen3 reproduces rows_sha256" in text


def test_a_peer_manifest_takes_eos_and_no_stop(qwen_json, tmp_path):
    path = lay_out_peer(tmp_path / "hf", qwen_json, "qwen3", "miles-qwen")
    path.write_text(
        path.read_text().replace(
            '  eos: "<|endoftext|>"\n', '  eos: "<|endoftext|>"\n  stop: ["<|im_end|>"]\n'
        )
    )
    with pytest.raises(
        ManifestError, match=r"tokenizer\.stop.*does not apply to loss_mask miles-qwen"
    ):
        load_manifest(path)


def test_a_template_without_generation_blocks_is_refused_before_any_work(qwen_json, tmp_path):
    hf_home = tmp_path / "hf"
    path = lay_out_peer(hf_home, qwen_json, "qwen3", "hf-generation")
    done = run_cli("--manifest", str(path), "--out", str(tmp_path / "out"), hf_home=hf_home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "{% generation %}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
