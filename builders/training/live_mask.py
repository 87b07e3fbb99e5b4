"""The glm5 mask for a job that tokenizes conversations on the fly.

This is what ``patches/patch_glm5_mask.py`` plugs into miles' ``MultiTurnLossMaskGenerator``:
the builder's own encoder (template rendering, layout check, tokens, mask), given the job's
transformers tokenizer instead of pinned files, so the two can never disagree. It serves
``loss_mask: glm5`` only: other chat formats are built ahead of time.

Messages may carry miles' per-message ``step_loss_mask``, as its qwen and qwen3 mask types
honour it: an answer whose ``step_loss_mask`` is not 1 is not supervised, nor is the stop token
after it. The field is taken off before rendering (the chat template does not read it).
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from builders.encode.encoder import ConversationEncoder
from builders.errors import BuildError, SourceDataError
from builders.formats import glm5_spec
from builders.rows.packing import with_eos


def glm5_loss_mask(
    tokenizer, messages: list[dict], tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids and glm5 mask of one conversation.

    They end with the EOS a build puts after the conversation.

    ``tokenizer`` is a transformers fast tokenizer whose ``chat_template`` is the GLM one.
    Tools are not part of the glm5 contract and are refused.
    """
    if tools:
        raise ValueError("the glm5 loss mask is defined for conversations without tools")
    if not isinstance(messages, list):
        raise ValueError(
            f"the glm5 loss mask needs a list of messages, not {type(messages).__name__}"
        )
    encoder = _encoder(tokenizer)
    try:
        (conversation,) = encoder.encode([{"index": 0, "id": None, "messages": messages}])
    except SourceDataError as err:
        raise ValueError(f"glm5 loss mask: {err.__cause__ or err}") from err
    ids, mask = with_eos(
        conversation.ids, conversation.mask, conversation.ends_with_answer, encoder.eos_id
    )
    return ids.tolist(), mask.tolist()


@lru_cache(maxsize=4)
def _encoder(tokenizer) -> ConversationEncoder:
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError(
            f"the tokenizer's chat_template is {type(template).__name__}, not one template string"
        )
    # a copy: the encoder owns its tokenizer
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    try:
        return ConversationEncoder(backend, glm5_spec(template))
    except BuildError as err:
        # the format refuses a template that does not compile when it is made
        raise ValueError(f"glm5 loss mask: {err}") from err
