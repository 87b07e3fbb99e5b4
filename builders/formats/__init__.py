"""The chat formats a manifest's ``loss_mask`` names.

They are named here, with their inputs and how one is made. ``builders.formats.base`` states what a
format gives the build. A new format is a ``ChatFormat`` subclass named in ``FORMATS`` (imported
when a manifest asks for it); nothing else changes. This module stays light (no tokenizer stack):
the manifest reads the names from it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from builders.contract import READINGS, Contract
from builders.limits import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from builders.formats.base import ChatFormat

# loss_mask: "module:class"
FORMATS: dict[str, str] = {
    "glm5": "builders.formats.glm5:Glm5Format",
    "turns": "builders.formats.turns:TurnsFormat",
    "miles-qwen": "builders.formats.peers:MilesQwenFormat",
    "miles-qwen3": "builders.formats.peers:MilesQwen3Format",
    "hf-generation": "builders.formats.peers:HFGenerationFormat",
}
# what the builder passes a chat template itself, as apply_chat_template does: no variable of a
# manifest may set them
RENDER_ARGUMENTS = ("messages", "tools", "documents", "add_generation_prompt")
# formats that reproduce another tool's rows
PEER_FORMATS = ("miles-qwen", "miles-qwen3", "hf-generation")
# a peer's mask is its own: the readings that refine the structure rule or re-encode do not apply
PEER_FIXED = ("encode", "mask_rule", "final", "prefill", "stop")
# loss_mask: for each contract key, the readings that mean something for it (a key absent applies
# with all its values); here, not on the classes, so that a manifest is checked without them
FORMAT_READINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "glm5": {},
    "turns": {"mask_rule": ("structure",), "final": ("eos",), "prefill": ("after-prefill",)},
    **{name: {key: (READINGS[key][0],) for key in PEER_FIXED} for name in PEER_FORMATS},
}


@dataclass(frozen=True)
class FormatSpec:
    """A chat format's inputs.

    They are the manifest's ``loss_mask`` and ``tokenizer`` fields and the pinned template.
    ``special_tokens`` are the strings ``apply_chat_template`` gives a template (``bos_token``,
    ``eos_token``, ...), from the pinned ``tokenizer_config.json``.
    """

    loss_mask: str
    chat_template: str
    eos: str | None = None
    stop: tuple[str, ...] = ()
    prefills: tuple[dict, ...] = ({},)
    template_vars: dict = field(default_factory=dict)
    render_date: str | None = None
    special_tokens: dict = field(default_factory=dict)
    # the pinned file (and name) the template came from
    template_source: str = "chat_template.jinja"
    # the manifest's bounds on one conversation and its render
    limits: Limits = DEFAULT_LIMITS
    # the dataset names a tools field (``dataset.tools``): the template must print tools
    tools: bool = False


def refusal(loss_mask: str, contract: Contract) -> tuple[str, str] | None:
    """The field of ``contract`` that does not apply to ``loss_mask``.

    With why; None: all of its readings apply.
    """
    for key, values in FORMAT_READINGS[loss_mask].items():
        if getattr(contract, key) not in values:
            return f"contract.{key}", (
                f"{getattr(contract, key)} does not apply to loss_mask {loss_mask} "
                f"(it takes {', '.join(values)})"
            )
    return None


def format_class(loss_mask: str) -> type[ChatFormat]:
    module, name = FORMATS[loss_mask].split(":")
    return getattr(importlib.import_module(module), name)


def make_format(spec: FormatSpec, tokenizer, vocab=None) -> ChatFormat:
    """The chat format ``spec.loss_mask`` names.

    It is made over the pinned ``tokenizers.Tokenizer`` (and its ``Vocab``).
    """
    from builders.formats.vocab import Vocab

    return format_class(spec.loss_mask)(spec, tokenizer, vocab or Vocab(tokenizer))


def glm5_spec(chat_template: str) -> FormatSpec:
    """The spec of ``loss_mask: glm5`` with ``chat_template``.

    Its tokens are fixed by the format.
    """
    return FormatSpec("glm5", chat_template)
