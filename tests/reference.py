"""A slow, deliberately plain implementation of the row contract (ROWS.md), for checking the builder.

It shares no code with ``builders``: it reads the parquet files whole, orders them with
``datasets.Dataset.shuffle``, renders and tokenizes through transformers'
``apply_chat_template(tokenize=True)``, finds message pieces by walking the tokens' bytes,
packs Python lists, and hashes with ``struct``.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import datasets
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerFast

STOP = ("<|endoftext|>", "<|user|>", "<|observation|>")


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: character → byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def pieces(messages: list[dict]) -> list[tuple[str, str, str]]:
    """(role, prefill, rest) per rendered piece, following the contract's description."""
    out = [("prefix", "[gMASK]<sop>", "")]
    last_user = -1
    for i, m in enumerate(messages):
        if m["role"] == "user":
            last_user = i
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role == "system":
            out.append((role, "<|system|>" + content, ""))
        elif role == "user":
            out.append((role, "<|user|>" + content, ""))
        elif role == "tool":
            opener = "<|observation|>" if i == 0 or messages[i - 1]["role"] != "tool" else ""
            out.append((role, opener + "<tool_response>" + content + "</tool_response>", ""))
        elif role == "assistant":
            reasoning = m.get("reasoning_content")
            if reasoning is None:
                reasoning = ""
                if "</think>" in content:
                    before, after = content.split("</think>")[0], content.split("</think>")[-1]
                    reasoning = before.rstrip("\n").split("<think>")[-1].lstrip("\n")
                    content = after.lstrip("\n")
            if i > last_user and reasoning != "":
                out.append((role, "<|assistant|><think>", reasoning.strip() + "</think>" + content.strip()))
            else:
                out.append((role, "<|assistant|></think>", content.strip()))
        else:
            raise ValueError(f"role {role}")
    return out


def refuse_undefined(messages) -> None:
    """The conversations data/README.md documents as errors: raise ValueError for each."""
    if not isinstance(messages, list) or len(messages) == 0:
        raise ValueError("not a non-empty list of messages")
    for m in messages:
        present = {k for k, v in m.items() if v is not None} if isinstance(m, dict) else None
        if present is None or not present <= {"role", "content", "reasoning_content"}:
            raise ValueError(f"unsupported message {m!r}")
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"unsupported role in {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"content is not a string in {m!r}")
        if m.get("reasoning_content") is not None and (m["role"] != "assistant"
                                                       or not isinstance(m["reasoning_content"], str)):
            raise ValueError(f"reasoning_content where it cannot be in {m!r}")


class Reference:
    def __init__(self, tokenizer_json: Path, chat_template: str):
        self.tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json))
        self.template = chat_template
        self.decoder = byte_decoder()
        self.added = {t.content for t in self.tok.added_tokens_decoder.values()}
        self.eos = self.tok.convert_tokens_to_ids("<|endoftext|>")

    def token_bytes(self, token_id: int) -> bytes:
        token = self.tok.convert_ids_to_tokens(token_id)
        if token in self.added:
            return token.encode("utf-8")
        return bytes(self.decoder[c] for c in token)

    def conversation(self, messages: list[dict], untrained=frozenset()) -> tuple[list[int], list[int]]:
        """Token ids and mask of one conversation, followed by EOS and its mask value.

        The answers at the message positions in ``untrained`` (miles' ``step_loss_mask: 0``)
        supervise nothing, not even the stop token after them.
        """
        refuse_undefined(messages)
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        text = self.tok.apply_chat_template(messages, chat_template=self.template, tokenize=False)
        ids = self.tok.apply_chat_template(messages, chat_template=self.template, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ps = pieces(messages)
        assert "".join(a + b for _, a, b in ps) == text, "reference pieces differ from the template's rendering"
        mask = []
        position = 0  # token index
        after_answer = False
        trained = False
        for k, (role, prefill, rest) in enumerate(ps):
            trained = role == "assistant" and k - 1 not in untrained
            for part, supervised in ((prefill, False), (rest, trained)):
                want, got = part.encode("utf-8"), b""
                while len(got) < len(want):
                    got += self.token_bytes(ids[position])
                    stop = after_answer and self.tok.convert_ids_to_tokens(ids[position]) in STOP
                    mask.append(1 if supervised or stop else 0)
                    after_answer = False
                    position += 1
                assert got == want, f"tokens straddle a piece boundary: {got!r} vs {want!r}"
            after_answer = trained
        assert position == len(ids)
        return list(ids) + [self.eos], mask + [1 if trained else 0]


def read_source(files: list[Path]) -> list[dict]:
    rows = []
    for path in sorted(files, key=lambda p: p.name):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


def reference_rows(files, tokenizer_json, chat_template, seed, row_tokens, rows):
    """The contract's rows: list of (ids, mask) lists."""
    source = read_source(files)
    order = datasets.Dataset.from_dict({"i": list(range(len(source)))}).shuffle(seed=seed)["i"]
    ref = Reference(tokenizer_json, chat_template)
    stream_ids, stream_mask, out = [], [], []
    for i in order:
        ids, mask = ref.conversation(source[i]["messages"])
        stream_ids += ids
        stream_mask += mask
        while len(stream_ids) >= row_tokens and len(out) < rows:
            window_ids, window_mask = stream_ids[:row_tokens], stream_mask[:row_tokens]
            del stream_ids[:row_tokens], stream_mask[:row_tokens]
            if any(window_mask):
                out.append((window_ids, window_mask))
        if len(out) == rows:
            return out
    raise RuntimeError(f"source ran out at {len(out)} rows")


def rows_sha256(rows) -> str:
    h = hashlib.sha256()
    for ids, mask in rows:
        h.update(struct.pack(f"<{len(ids)}I", *ids))
        h.update(struct.pack(f"<{len(mask)}B", *mask))
    return h.hexdigest()
