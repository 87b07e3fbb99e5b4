"""A slow, deliberately plain implementation of the row contract.

The contract is ROWS.md's; the implementation is for checking the builder.

It shares no code with ``builders``: it reads the dataset files whole (parquet with pyarrow.parquet,
JSON Lines and JSON lists with Python's ``json``), applies a layout and a mixture's ``take`` by
its own code (docs/datasets.md: layouts and mixtures), orders them with
``datasets.Dataset.shuffle`` (and the other orders by their own library calls), renders and
tokenizes through transformers (``apply_chat_template``, the tokenizer's call with offsets),
places tokens in message pieces by their character offsets, marks the slime rules' characters
one by one as the pull requests do, packs Python lists, and hashes with ``struct``.

Every reading of ROWS.md's "Readings the recipe card leaves open" is implemented here from the
text of ROWS.md, independently of ``builders.contract``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerFast

STOP = ("<|endoftext|>", "<|user|>", "<|observation|>")
DEFAULTS = {
    "order": "numpy-generator",
    "encode": "plain",
    "mask_rule": "structure",
    "eos": "after-answer",
    "final": "eos",
    "prefill": "after-prefill",
    "stop": "supervised",
    "skip": "skip-unsupervised",
    "hash": "u4-u1",
}


def pieces(
    messages: list[dict], prefill_reading: str = "after-prefill"
) -> list[tuple[str, str, str]]:
    """(role, prefill, rest) per rendered piece.

    It follows the contract's description; the prefill of an answer is what ``prefill_reading``
    leaves unsupervised.
    """
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
                tag, rest = "<think>", reasoning.strip() + "</think>" + content.strip()
            else:
                tag, rest = "</think>", content.strip()
            if prefill_reading == "after-prefill":
                out.append((role, "<|assistant|>" + tag, rest))
            elif prefill_reading == "after-role":
                out.append((role, "<|assistant|>", tag + rest))
            else:
                # whole-piece
                out.append((role, "", "<|assistant|>" + tag + rest))
        else:
            raise ValueError(f"role {role}")
    return out


def refuse_undefined(messages) -> None:
    """The conversations data/README.md documents as errors.

    Raise ValueError for each.
    """
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
        if m.get("reasoning_content") is not None and (
            m["role"] != "assistant" or not isinstance(m["reasoning_content"], str)
        ):
            raise ValueError(f"reasoning_content where it cannot be in {m!r}")


class Reference:
    def __init__(self, tokenizer_json: Path, chat_template: str):
        self.tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json))
        self.template = chat_template
        self.eos = self.tok.convert_tokens_to_ids("<|endoftext|>")

    def conversation(
        self, messages: list[dict], untrained=frozenset(), readings: dict | None = None
    ):
        """Token ids and mask of one conversation followed by its EOS.

        The EOS is as ``eos`` says. Returns None where a slime rule finds no answer header.

        The answers at the message positions in ``untrained`` (miles' ``step_loss_mask: 0``)
        supervise nothing, not even the stop token after them.
        """
        r = {**DEFAULTS, **(readings or {})}
        refuse_undefined(messages)
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        text = self.tok.apply_chat_template(messages, chat_template=self.template, tokenize=False)
        template_ids = self.tok.apply_chat_template(
            messages, chat_template=self.template, tokenize=True
        )
        if hasattr(template_ids, "keys"):
            template_ids = template_ids["input_ids"]
        last = len(messages) - 1
        ends_with_answer = messages[-1]["role"] == "assistant" and last not in untrained
        if r["mask_rule"] == "structure":
            appended = (
                "<|user|>"
                if r["final"] == "append-stop" and messages[-1]["role"] == "assistant"
                else ""
            )
            ids, mask = self._structure(messages, text, untrained, r)
            assert ids == list(template_ids)
            if appended:
                ids, mask = [*ids, self.tok.convert_tokens_to_ids(appended)], [*mask, 1]
        else:
            slimed = self._slime(messages, text, r["mask_rule"])
            if slimed is None:
                return None
            ids, mask, appended = slimed
        if r["encode"] == "add-special":
            ids, mask = self._post_processed(text + appended, ids, mask)
        eos = {
            "after-answer": int(ends_with_answer),
            "supervised": 1,
            "unsupervised": 0,
            "none": None,
        }[r["eos"]]
        return (ids, mask) if eos is None else ([*ids, self.eos], [*mask, eos])

    def _structure(self, messages, text, untrained, r):
        """The glm5 rule from the message structure.

        Tokens are placed by their character offsets.
        """
        encoding = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        # (start, end, supervised, piece) of each piece's prefill and rest, in characters
        regions, at = [], 0
        ps = pieces(messages, r["prefill"])
        assert "".join(a + b for _, a, b in ps) == text, (
            "reference pieces differ from the template's rendering"
        )
        answer_pieces = [
            role == "assistant" and k - 1 not in untrained for k, (role, _, _) in enumerate(ps)
        ]
        for k, (_, prefill, rest) in enumerate(ps):
            regions.append((at, at + len(prefill), False, k))
            at += len(prefill)
            regions.append((at, at + len(rest), answer_pieces[k], k))
            at += len(rest)
        mask, previous = [], None
        for token_id, (start, end) in zip(ids, offsets, strict=True):
            region = next(i for i, (a, b, _, _) in enumerate(regions) if a <= start < b)
            _, region_end, supervised, piece = regions[region]
            assert end <= region_end, "a token straddles a region"
            follows_answer = previous is not None and piece != previous and answer_pieces[previous]
            is_stop = follows_answer and self.tok.convert_ids_to_tokens(token_id) in STOP
            mask.append(1 if supervised or (is_stop and r["stop"] == "supervised") else 0)
            previous = piece
        return list(ids), mask

    def _slime(self, messages, text, rule):
        """The slime PRs' glm5 masks, character by character.

        As the PRs compute them.
        """
        appended = ""
        if (
            rule == "slime-pr1844"
            and messages[-1]["role"] == "assistant"
            and not text.endswith(STOP)
        ):
            appended = "<|user|>"
        full = text + appended
        char_mask = [0] * len(full)
        cursor = 0
        for m in messages:
            if m["role"] != "assistant":
                continue
            header = full.find("<|assistant|>", cursor)
            if header < 0:
                return None
            content_start = header + len("<|assistant|>")
            if rule == "slime-pr1844":
                found = [
                    (full.find(s, content_start), s)
                    for s in STOP
                    if full.find(s, content_start) >= 0
                ]
                stop = min(found) if found else None
                span_end = stop[0] if stop else len(full)
                cursor = span_end
                start = content_start
                while start < span_end and full[start].isspace():
                    start += 1
                if full.startswith("<think>", start):
                    start += len("<think>")
                elif full.startswith("</think>", start):
                    start += len("</think>")
                for pos in range(start, span_end):
                    char_mask[pos] = 1
                if stop:
                    for pos in range(stop[0], stop[0] + len(stop[1])):
                        char_mask[pos] = 1
            else:
                end = len(full)
                for marker in ("<|user|>", "<|assistant|>", "<|system|>", "<|observation|>"):
                    at = full.find(marker, content_start)
                    if 0 <= at < end:
                        end = at
                cursor = end
                start = content_start
                if full[start : start + len("</think>")] == "</think>":
                    start += len("</think>")
                elif full[start : start + len("<think>")] == "<think>":
                    close = full.find("</think>", start)
                    if 0 <= close < end:
                        start = close + len("</think>")
                for pos in range(start, end):
                    char_mask[pos] = 1
        encoding = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        mask = [
            1 if end > start and any(char_mask[start:end]) else 0
            for start, end in encoding["offset_mapping"]
        ]
        return list(encoding["input_ids"]), mask, appended

    def _post_processed(self, text, ids, mask):
        """The post-processor's tokens around the text's own, unsupervised.

        For ``encode: add-special``.
        """
        encoding = self.tok(text, add_special_tokens=True)
        sequence = encoding.sequence_ids()
        full_ids, full_mask, own = [], [], iter(zip(ids, mask, strict=True))
        for token_id, seq in zip(encoding["input_ids"], sequence, strict=True):
            if seq is None:
                full_ids.append(token_id)
                full_mask.append(0)
            else:
                own_id, own_mask = next(own)
                assert own_id == token_id
                full_ids.append(own_id)
                full_mask.append(own_mask)
        assert next(own, None) is None
        return full_ids, full_mask


def read_source(files: list[Path]) -> list[dict]:
    rows = []
    for path in sorted(files, key=lambda p: p.name):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


def read_dataset(snapshot: Path, pin: dict) -> list[dict]:
    """A dataset pin's rows as {id, messages}, read whole.

    Laid out as ROWS.md says: the files the ``files`` glob names (``*`` crossing ``/``, as the Hub's
    filter matches) in sorted path order, the conversation from ``messages``, each message's role
    and content from ``keys`` with its role mapped by ``roles``, and the id from ``id`` (``None``:
    the row's place in the whole source, added later).
    """
    pattern = pin.get("files") or f"data/{pin.get('split', 'train')}-*.parquet"
    names = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    keys, roles = pin.get("keys", {"role": "role", "content": "content"}), pin.get("roles")
    rows = []
    for name in (n for n in names if fnmatch.fnmatchcase(n, pattern)):
        path = snapshot / name
        if name.endswith(".parquet"):
            records = pq.read_table(path).to_pylist()
        elif name.endswith(".jsonl"):
            records = [
                json.loads(line)
                for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()
            ]
        else:
            records = json.loads(path.read_text(encoding="utf-8"))
        for record in records:
            messages = []
            for m in record[pin.get("messages", "messages")]:
                role = m[keys["role"]]
                message = {"role": roles[role] if roles else role, "content": m[keys["content"]]}
                if m.get("reasoning_content") is not None:
                    message["reasoning_content"] = m["reasoning_content"]
                messages.append(message)
            id_field = pin.get("id", "id")
            rows.append(
                {"id": None if id_field is None else str(record[id_field]), "messages": messages}
            )
    return rows


def mixture(datasets: list[tuple[Path, dict]], seed: int) -> tuple[list[dict], list[int]]:
    """Every source row of the datasets, and the indices each keeps.

    The rows of the datasets (snapshot, pin) in manifest order, with their source index, and the
    source indices each keeps (with ``take: K``, ``sorted(default_rng([seed,
    j]).permutation(N_j)[:K])``).
    """
    rows, kept = [], []
    for j, (snapshot, pin) in enumerate(datasets):
        own = read_dataset(snapshot, pin)
        if "take" in pin:
            chosen = sorted(
                np.random.default_rng([seed, j]).permutation(len(own))[: pin["take"]].tolist()
            )
        else:
            chosen = range(len(own))
        kept += [len(rows) + k for k in chosen]
        rows += own
    for index, row in enumerate(rows):
        row["index"] = index
        row["id"] = str(index) if row["id"] is None else row["id"]
    return rows, kept


def stream_order(reading: str, seed: int, n: int) -> list[int]:
    """The source indices in stream order.

    By each reading's own library call.
    """
    if reading == "numpy-generator":
        import datasets

        return list(datasets.Dataset.from_dict({"i": list(range(n))}).shuffle(seed=seed)["i"])
    if reading == "numpy-legacy":
        return np.random.RandomState(seed).permutation(n).tolist()
    if reading == "python-random":
        order = list(range(n))
        random.Random(seed).shuffle(order)
        return order
    if reading == "torch":
        import torch

        return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    assert reading == "source"
    return list(range(n))


def reference_rows(
    files,
    tokenizer_json,
    chat_template,
    seed,
    row_tokens,
    rows,
    readings: dict | None = None,
    source: list[dict] | None = None,
    kept: list[int] | None = None,
    consumed: list | None = None,
    segments: list | None = None,
    left_out: list | None = None,
):
    """The contract's rows under ``readings``.

    A list of (ids, mask) lists. The source is ``files`` (Tulu-shaped parquet), or ``source`` rows
    of which ``kept`` enter the permutation (``mixture``); the source rows the stream consumes, in
    order, are appended to ``consumed``, and each row's segment starts to ``segments``. With
    ``left_out``, a conversation the contract refuses is left out of the stream (its place in the
    order skipped, the order otherwise unchanged) and its source index appended there.
    """
    r = {**DEFAULTS, **(readings or {})}
    source = read_source(files) if source is None else source
    kept = list(range(len(source))) if kept is None else kept
    ref = Reference(tokenizer_json, chat_template)

    def conversations():
        for k in stream_order(r["order"], seed, len(kept)):
            i = kept[k]
            if consumed is not None:
                consumed.append(source[i])
            try:
                conversation = ref.conversation(source[i]["messages"], readings=r)
            except ValueError:
                if left_out is None:
                    raise
                left_out.append(i)
                continue
            if conversation is not None:
                yield conversation

    return cut_rows(conversations(), row_tokens, rows, r["skip"] == "keep-all", segments)


def cut_rows(
    conversations,
    row_tokens: int,
    rows: int | None,
    keep_all: bool = False,
    segments: list | None = None,
):
    """The first ``rows`` windows of ``row_tokens`` of the stream.

    The stream is of (ids, mask) ``conversations``; all-zero windows are skipped unless
    ``keep_all``; ``rows=None``: every window the stream fills. Each row's segment starts (where
    its tokens pass from one conversation to the next, and 0) are appended to ``segments``.
    """
    stream_ids, stream_mask, stream_owner, out = [], [], [], []
    for k, (ids, mask) in enumerate(conversations):
        stream_ids += ids
        stream_mask += mask
        stream_owner += [k] * len(ids)
        while len(stream_ids) >= row_tokens and (rows is None or len(out) < rows):
            window_ids, window_mask = stream_ids[:row_tokens], stream_mask[:row_tokens]
            owner = stream_owner[:row_tokens]
            del stream_ids[:row_tokens], stream_mask[:row_tokens], stream_owner[:row_tokens]
            if any(window_mask) or keep_all:
                out.append((window_ids, window_mask))
                if segments is not None:
                    segments.append(
                        [t for t in range(row_tokens) if t == 0 or owner[t] != owner[t - 1]]
                    )
        if len(out) == rows:
            return out
    if rows is None:
        return out
    raise RuntimeError(f"source ran out at {len(out)} rows")


def segments_sha256(segments) -> str:
    """Per row: its segment count, then its starts, little-endian uint32."""
    h = hashlib.sha256()
    for starts in segments:
        h.update(struct.pack(f"<I{len(starts)}I", len(starts), *starts))
    return h.hexdigest()


def rows_sha256(rows, layout: str = "u4-u1") -> str:
    h = hashlib.sha256()
    if layout == "u4-all-u1-all":
        for ids, _ in rows:
            h.update(struct.pack(f"<{len(ids)}I", *ids))
        for _, mask in rows:
            h.update(struct.pack(f"<{len(mask)}B", *mask))
        return h.hexdigest()
    for ids, mask in rows:
        if layout == "i8-i8":
            h.update(struct.pack(f"<{len(ids)}q", *ids))
            h.update(struct.pack(f"<{len(mask)}q", *mask))
        else:
            h.update(struct.pack(f"<{len(ids)}I", *ids))
            if layout == "u4-u1":
                h.update(struct.pack(f"<{len(mask)}B", *mask))
    return h.hexdigest()
