"""The glm5 mask for a training job that tokenizes conversations on the fly.

This is what ``patches/patch_glm5_mask.py`` plugs into miles' ``MultiTurnLossMaskGenerator``:
the builder's own encoder (template rendering, layout check, tokens, mask), given the job's
transformers tokenizer instead of pinned files, so the two can never disagree.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from builders.encode import ConversationEncoder
from builders.errors import SourceDataError
from builders.pinned import PinnedTokenizer


def glm5_loss_mask(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """Token ids and glm5 mask of one conversation, ending with the EOS a build puts after it.

    ``tokenizer`` is a transformers fast tokenizer whose ``chat_template`` is the GLM one.
    Tools are not part of the glm5 contract and are refused.
    """
    if tools:
        raise ValueError("the glm5 loss mask is defined for conversations without tools")
    try:
        (conversation,) = _encoder(tokenizer).encode([{"index": 0, "id": "conversation", "messages": messages}])
    except SourceDataError as err:
        raise ValueError(str(err)) from None
    return conversation.ids.tolist(), conversation.mask.tolist()


@lru_cache(maxsize=4)
def _encoder(tokenizer) -> ConversationEncoder:
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError(f"the tokenizer's chat_template is {type(template).__name__}, not one template string")
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a copy: the encoder owns its tokenizer
    return ConversationEncoder(PinnedTokenizer(tokenizer=backend, chat_template=template, snapshot=None))
