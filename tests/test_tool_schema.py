"""A dataset with tools needs a template that prints them, under every chat format.

Each format that renders a template with a conversation's tools (``turns``, ``glm5`` given
another template than GLM's, ``hf-generation``, ``miles-qwen``, ``miles-qwen3``) refuses, when it
is made and before any work (exit 2), a dataset that names a tools field with a template that
never prints a tool schema (data/ROWS.md, "Tool calls", step 6); the real templates that print
tools are accepted, and their rows hold the schema; ``dataset.tools: null`` still builds.
"""

from __future__ import annotations

import json

import pytest
import yaml
from test_tools import SAMPLE, WEATHER, lay_out_tool_build, rows
from tokenizers import Tokenizer
from tool_conversations import tool_conversations

import real_models
from builders.encode.encoder import ConversationEncoder
from builders.errors import UsageError
from builders.fixture.make import PINNED_TEMPLATE, shared_dir, tokenizer_json
from builders.formats import FormatSpec
from builders.inputs.pinned import special_tokens
from helpers import run_cli
from peer_inputs import qwen_tokenizer_json, trl_templates

# every format that renders a template with the conversation's tools
RENDERING = ("turns", "glm5", "hf-generation", "miles-qwen", "miles-qwen3")
PEERS = ("hf-generation", "miles-qwen", "miles-qwen3")
# the schema of WEATHER's tool, as each template that prints tools prints it
SCHEMA_TEXT = "Get the weather for a city"


def ignoring_model(loss_mask: str) -> real_models.Model:
    """A real tokenizer repo whose template never prints ``tools``, usable under ``loss_mask``.

    TRL's DeepSeek-V3 training template (with ``{% generation %}`` blocks) for hf-generation and
    glm5 (over the GLM-shaped tokenizer), DeepSeek-V3.1's for the others, with DeepSeek's tokenizer.
    """
    deepseek = real_models.deepseek()
    if loss_mask == "turns":
        return deepseek
    eos = {"eos": deepseek.fields["eos"]}
    if loss_mask in ("miles-qwen", "miles-qwen3"):
        return real_models.Model(deepseek.name, deepseek.files, eos)
    template = trl_templates()["deepseekv3_training"]
    if loss_mask == "glm5":
        files = {"tokenizer.json": tokenizer_json(), "chat_template.jinja": template.encode()}
        return real_models.Model("glm-shaped-deepseekv3", files, {})
    config = json.loads(deepseek.files["tokenizer_config.json"])
    files = {
        **deepseek.files,
        "tokenizer_config.json": json.dumps({**config, "chat_template": template}).encode(),
    }
    return real_models.Model("deepseekv3-training", files, eos)


def printing_model(loss_mask: str) -> real_models.Model:
    """A real tokenizer repo whose template prints ``tools``, usable under ``loss_mask``.

    Qwen3's (TRL's) for turns and the miles rules, TRL's Qwen3 training template for
    hf-generation, the pinned GLM-4.7-Flash template for glm5.
    """
    if loss_mask == "glm5":
        template = (shared_dir() / PINNED_TEMPLATE).read_bytes()
        files = {"tokenizer.json": tokenizer_json(), "chat_template.jinja": template}
        return real_models.Model("glm-4.7-flash", files, {})
    qwen3 = real_models.qwen3()
    if loss_mask == "turns":
        return qwen3
    template = trl_templates()["qwen3_training" if loss_mask == "hf-generation" else "qwen3"]
    files = {
        "tokenizer.json": qwen_tokenizer_json().encode(),
        "chat_template.jinja": template.encode(),
    }
    return real_models.Model(f"{qwen3.name}-{loss_mask}", files, {"eos": qwen3.fields["eos"]})


def encoder(model: real_models.Model, loss_mask: str, tools: bool) -> ConversationEncoder:
    """An encoder under ``loss_mask`` over ``model``'s files, as a manifest would pin them."""
    files = model.files
    config = (
        json.loads(files["tokenizer_config.json"]) if "tokenizer_config.json" in files else None
    )
    if "chat_template.jinja" in files:
        template, source = files["chat_template.jinja"].decode(), "chat_template.jinja"
    else:
        template, source = config["chat_template"], "tokenizer_config.json"
    fields = model.fields
    spec = FormatSpec(
        loss_mask,
        template,
        fields.get("eos"),
        tuple(fields.get("stop", ())),
        tuple(fields.get("prefills", [{}])),
        special_tokens=special_tokens(config) if config else {},
        template_source=source,
        tools=tools,
    )
    return ConversationEncoder(Tokenizer.from_str(files["tokenizer.json"].decode()), spec)


@pytest.mark.parametrize("loss_mask", RENDERING)
def test_a_template_that_never_prints_tools_is_refused_when_the_format_is_made(loss_mask):
    model = ignoring_model(loss_mask)
    source = "chat_template.jinja" if "chat_template.jinja" in model.files else "tokenizer_config"
    with pytest.raises(UsageError) as refused:
        encoder(model, loss_mask, tools=True)
    message = str(refused.value)
    assert f"chat template ({source}" in message and "never prints them" in message
    assert "'probe_fn'" in message and f"loss_mask {loss_mask} " in message
    assert "dataset.tools: null" in message


def test_a_template_that_fails_on_tools_is_refused_naming_its_error():
    # Qwen3's template, made to raise where it is given tools
    model = printing_model("miles-qwen3")
    template = "{%- if tools %}{{ raise_exception('no tools here') }}{%- endif %}"
    files = {
        **model.files,
        "chat_template.jinja": template.encode() + model.files["chat_template.jinja"],
    }
    failing = real_models.Model("raising", files, model.fields)
    with pytest.raises(UsageError) as refused:
        encoder(failing, "miles-qwen3", tools=True)
    message = str(refused.value)
    assert "(chat_template.jinja) fails on a conversation with a tool" in message
    assert "no tools here" in message
    assert encoder(failing, "miles-qwen3", tools=False).encode(rows([(SAMPLE, None)]))


@pytest.mark.parametrize("loss_mask", [m for m in RENDERING if m != "glm5"])
def test_without_the_tools_field_the_same_template_is_made_and_encodes(loss_mask):
    # the refusal is the tools': without them (dataset.tools: null) the format is made and encodes
    made = encoder(ignoring_model(loss_mask), loss_mask, tools=False)
    (conversation,) = made.encode(rows([(SAMPLE, None)]))
    text = made.tokenizer.decode(conversation.ids.tolist(), skip_special_tokens=False)
    assert "Paris: 18°C, Tokyo: 25°C." in text and conversation.mask.any()


@pytest.mark.parametrize("loss_mask", RENDERING)
def test_a_real_template_that_prints_tools_is_accepted_and_its_rows_hold_the_schema(loss_mask):
    if loss_mask == "glm5" and shared_dir() is None:
        pytest.skip("needs ../shared (the pinned GLM-4.7-Flash template)")
    made = encoder(printing_model(loss_mask), loss_mask, tools=True)
    (conversation,) = made.encode(rows([(SAMPLE, WEATHER)]))
    text = made.tokenizer.decode(conversation.ids.tolist(), skip_special_tokens=False)
    assert SCHEMA_TEXT in text and "get_weather" in text, text


def lay_out(hf_home, model: real_models.Model, loss_mask: str, tools_field: str | None):
    """A tool dataset and `model`'s repo; a manifest under `loss_mask` naming `tools_field`."""
    cases = [(SAMPLE, WEATHER), *tool_conversations(3, 12)]
    name = f"schema-{loss_mask}-{tools_field or 'null'}"
    path = lay_out_tool_build(hf_home, model, name, cases)
    manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
    manifest["loss_mask"] = loss_mask
    manifest["dataset"]["tools"] = tools_field
    # miles-qwen on DeepSeek's vocabulary is miles' distill_qwen: short rows
    manifest["row_tokens"], manifest["rows"] = 64, 2
    path.write_text(yaml.safe_dump(manifest, allow_unicode=True, sort_keys=False))
    return path


@pytest.mark.parametrize("loss_mask", RENDERING)
def test_a_build_naming_tools_with_such_a_template_is_exit_2_before_any_work(loss_mask, tmp_path):
    hf_home = tmp_path / "hf"
    manifest = lay_out(hf_home, ignoring_model(loss_mask), loss_mask, "tools")
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=hf_home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "never prints them" in done.stderr and f"loss_mask {loss_mask} " in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("loss_mask", PEERS)
def test_with_dataset_tools_null_the_same_build_completes(loss_mask, tmp_path):
    hf_home = tmp_path / "hf"
    manifest = lay_out(hf_home, ignoring_model(loss_mask), loss_mask, None)
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=hf_home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "out" / f"schema-{loss_mask}-null.parquet").exists()
