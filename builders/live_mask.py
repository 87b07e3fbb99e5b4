"""The glm5 mask for a training job that tokenizes conversations on the fly.

This is what ``patches/patch_glm5_mask.py`` plugs into miles' ``MultiTurnLossMaskGenerator``:
the builder's own encoder (template rendering, layout check, tokens, mask), given the job's
transformers tokenizer instead of pinned files, so the two can never disagree.

Messages may carry miles' per-message ``step_loss_mask``, as its qwen and qwen3 mask types
honour it: an answer whose ``step_loss_mask`` is not 1 is not supervised, nor is the stop token
after it. The field is taken off before rendering (the chat template does not read it).
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from builders.encode import ConversationEncoder
from builders.errors import ConversationError
from builders.packing import with_eos

STEP_LOSS_MASK = "step_loss_mask"


def glm5_loss_mask(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """Token ids and glm5 mask of one conversation, ending with the EOS a build puts after it.

    ``tokenizer`` is a transformers fast tokenizer whose ``chat_template`` is the GLM one.
    Tools are not part of the glm5 contract and are refused.
    """
    if tools:
        raise ValueError("the glm5 loss mask is defined for conversations without tools")
    if not isinstance(messages, list):
        raise ValueError(f"the glm5 loss mask needs a list of messages, not {type(messages).__name__}")
    untrained = frozenset(i for i, m in enumerate(messages) if isinstance(m, dict) and m.get(STEP_LOSS_MASK, 1) != 1)
    plain = [{k: v for k, v in m.items() if k != STEP_LOSS_MASK} if isinstance(m, dict) else m for m in messages]
    encoder = _encoder(tokenizer)
    try:
        ids, mask, ends_with_answer = encoder.encode_messages(plain, untrained)
    except ConversationError as err:
        raise ValueError(f"glm5 loss mask: {err}") from err
    ids, mask = with_eos(ids, mask, ends_with_answer, encoder.eos_id)
    return ids.tolist(), mask.tolist()


@lru_cache(maxsize=4)
def _encoder(tokenizer) -> ConversationEncoder:
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError(f"the tokenizer's chat_template is {type(template).__name__}, not one template string")
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a copy: the encoder owns its tokenizer
    return ConversationEncoder(backend, template)
