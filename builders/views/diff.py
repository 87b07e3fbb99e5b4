"""Compare two built row files.

Find where they first differ, in what, and from which conversation.

This is what to run when ``rows_sha256`` does not match a published value: it names the first
row and token that differ, whether the tokens or the mask differ there, the source
conversation that token came from in each file, and, given a tokenizer, the text around it
decoded. Files whose rows have different lengths are builds of different manifests: that is
said first, and no token is compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import zip_longest
from pathlib import Path

from builders.rows import RowReader
from builders.text import shown

CONTEXT_TOKENS = 12  # decoded on each side of the first differing token
Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class FirstDifference:
    row: int
    token: int  # position in the row, or -1 when one file has no such row
    kind: str  # "tokens", "mask", "tokens and mask", or "row missing"
    a: dict  # token id, mask value, source conversation in file A
    b: dict


@dataclass(frozen=True)
class Diff:
    rows_a: int
    rows_b: int
    row_tokens_a: int
    row_tokens_b: int
    differing_rows: int  # rows that differ, or are in one file only
    first: FirstDifference | None

    @property
    def identical(self) -> bool:
        return self.first is None and self.row_tokens_a == self.row_tokens_b

    def as_dict(self) -> dict:
        return asdict(self)


def diff_files(a: Path, b: Path, decode: Decode | None = None) -> Diff:
    """Compare two row files.

    ``decode`` (token ids → text) adds the text around the first difference.
    """
    reader_a, reader_b = RowReader(a), RowReader(b)
    width_a, width_b = (len(r[0]["input_ids"]) if len(r) else 0 for r in (reader_a, reader_b))
    if width_a != width_b:
        return Diff(
            len(reader_a), len(reader_b), width_a, width_b, max(len(reader_a), len(reader_b)), None
        )
    first, differing = None, 0
    for row_a, row_b in zip_longest(reader_a.rows(), reader_b.rows()):
        if row_a is None or row_b is None:
            differing += 1
            if first is None:
                first = FirstDifference(
                    (row_a or row_b)["index"],
                    -1,
                    "row missing",
                    _side(row_a, 0, None),
                    _side(row_b, 0, None),
                )
            continue
        ids = row_a["input_ids"] != row_b["input_ids"]
        masks = row_a["loss_mask"] != row_b["loss_mask"]
        if not (ids.any() or masks.any()):
            continue
        differing += 1
        if first is None:
            token = int((ids | masks).nonzero()[0][0])
            kind = " and ".join(k for k, d in (("tokens", ids[token]), ("mask", masks[token])) if d)
            first = FirstDifference(
                row_a["index"],
                token,
                kind,
                _side(row_a, token, decode),
                _side(row_b, token, decode),
            )
    return Diff(len(reader_a), len(reader_b), width_a, width_b, differing, first)


def _side(row: dict | None, token: int, decode: Decode | None) -> dict:
    if row is None:
        return {}
    starts = row.get("segment_start") or [0]
    k = max(i for i, s in enumerate(starts) if s <= token)
    side = {
        "token_id": int(row["input_ids"][token]),
        "mask": int(row["loss_mask"][token]),
        "source_index": (row.get("source_index") or [None])[k],
        "source_id": (row.get("source_id") or [None])[k],
        "token_in_segment": token - starts[k],
    }
    if decode is not None:
        ids = row["input_ids"].tolist()
        side["text"] = {
            "before": decode(ids[max(0, token - CONTEXT_TOKENS) : token]),
            "token": decode([ids[token]]),
            "after": decode(ids[token + 1 : token + 1 + CONTEXT_TOKENS]),
        }
    return side


def describe(diff: Diff, a: Path, b: Path) -> str:
    if diff.identical:
        return f"identical: {diff.rows_a} rows in both"
    files = f"(A: {a}, {diff.rows_a} rows; B: {b}, {diff.rows_b} rows)"
    if diff.row_tokens_a != diff.row_tokens_b:
        return (
            f"the rows differ in length: "
            f"{diff.row_tokens_a} tokens in A, {diff.row_tokens_b} in B; "
            f"these are builds of different manifests, so no token is compared {files}"
        )
    lines = [f"{diff.differing_rows} of {max(diff.rows_a, diff.rows_b)} rows differ {files}"]
    if diff.rows_a != diff.rows_b:
        lines.append(f"the files have different row counts: {diff.rows_a} in A, {diff.rows_b} in B")
    f = diff.first
    lines.append(
        f"first difference: row {f.row}, "
        + (
            f"token {f.token}, in the {f.kind}"
            if f.token >= 0
            else f"{f.kind} in {'B' if not f.b else 'A'}"
        )
    )
    for name, side in (("A", f.a), ("B", f.b)):
        if side:
            lines.append(
                f"  {name}: token id {side['token_id']}, mask {side['mask']}, from source row "
                f"{side['source_index']} (id {side['source_id']}), "
                f"{side['token_in_segment']} tokens into its part of the row"
            )
            if "text" in side:
                text = side["text"]
                lines.append(
                    f"     text: {_shown(text['before'])}"
                    f"⟨{_shown(text['token'])}⟩{_shown(text['after'])}"
                )
    if any("text" in side for side in (f.a, f.b)):
        lines.append(
            f"  (⟨…⟩ is the first differing token, with {CONTEXT_TOKENS} tokens decoded "
            f"on each side; \\n is a line break)"
        )
    return "\n".join(lines)


def _shown(text: str) -> str:
    """Decoded text on one line: backslashes doubled, control characters written as escapes."""
    return shown(text.replace("\\", "\\\\"))
