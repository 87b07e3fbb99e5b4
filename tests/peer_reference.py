"""The peer formats computed the peers' way.

One transformers call per message, Python lists.

``miles_loss_mask`` is miles 78527b91 ``MultiTurnLossMaskGenerator.get_loss_mask``
(``miles/utils/mask_utils.py``) transcribed call for call onto a ``PreTrainedTokenizerFast``, for
the tests that run where no miles checkout is at hand; ``tests/test_peers.py`` also compares the
builder with the real file where ``MILES_SRC`` names a checkout. ``hf_generation`` is transformers'
own call. Neither shares code with ``builders``.
"""

from __future__ import annotations

TEST = "FOR TESTING ONLY"
DUMMY = {"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}


def miles_lengths(tok) -> tuple[int, int]:
    raw = tok(TEST, add_special_tokens=False)["input_ids"]
    two = [{"role": "user", "content": TEST}] * 2
    ids = tok(
        tok.apply_chat_template(two, add_special_tokens=False, tokenize=False),
        add_special_tokens=False,
    )["input_ids"]
    first, second = [i for i in range(len(ids) - len(raw) + 1) if ids[i : i + len(raw)] == raw]
    end_interval = len(ids) - len(raw) - second
    prompted = tok.apply_chat_template(
        two, add_special_tokens=False, tokenize=True, return_dict=False, add_generation_prompt=True
    )
    return first - ((second - first) - end_interval - len(raw)), len(prompted) - len(ids)


def miles_loss_mask(
    tok, kind: str, messages: list[dict], tools: list | None = None
) -> tuple[list[int], list[int]]:
    if kind == "qwen" and "<｜Assistant｜>" in tok.get_added_vocab():
        kind = "distill_qwen"
    if kind == "distill_qwen":
        prompt = tok(
            tok.apply_chat_template(
                messages[:1], tokenize=False, add_generation_prompt=True, tools=tools
            ),
            add_special_tokens=False,
        )["input_ids"]
        response = tok(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        mask = [0] * len(prompt) + [1] * len(response)
        if messages[-1].get("step_loss_mask", 1) != 1:
            mask = [0] * len(mask)
        return prompt + response, mask
    system_length, header_length = miles_lengths(tok)
    dummy = tok.apply_chat_template([DUMMY], tokenize=True, return_dict=False)
    ids, mask = [], []
    for i, message in enumerate(messages):
        first_tools = tools if i == 0 else None
        if kind == "qwen":
            piece = tok.apply_chat_template(
                [message], tokenize=True, return_dict=False, tools=first_tools
            )
        elif i == 0:
            piece = tok.apply_chat_template(
                [message, DUMMY], tokenize=True, return_dict=False, tools=tools
            )[: -len(dummy)]
        else:
            piece = tok.apply_chat_template([DUMMY, message], tokenize=True, return_dict=False)[
                len(dummy) :
            ]
        if message["role"] != "system" and i > 0:
            piece = piece[system_length:]
        if message["role"] == "assistant":
            piece_mask = [0] * header_length + [1] * (len(piece) - header_length)
        else:
            piece_mask = [0] * len(piece)
        if message.get("step_loss_mask", 1) != 1:
            piece_mask = [0] * len(piece)
        ids += piece
        mask += piece_mask
    return ids, mask


def hf_generation(tok, messages: list[dict], tools=None) -> tuple[list[int], list[int]]:
    out = tok.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])
