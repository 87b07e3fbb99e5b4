"""Show a row, or one source conversation, decoded: supervised spans highlighted, conversation and
EOS boundaries marked, each conversation labelled with its source index and id."""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from builders.glm5 import EOS

PREFIX_TOKEN = "[gMASK]"

GREEN, DIM, RESET = "\033[42;30m", "\033[2m", "\033[0m"


@dataclass(frozen=True)
class Span:
    """A run of tokens of one conversation with one mask value."""

    conversation: int  # position in the row's segment list
    supervised: bool
    text: str
    tokens: int


@dataclass(frozen=True)
class View:
    title: str
    labels: list[str]  # one per conversation segment
    spans: list[Span]


def row_view(tokenizer: Tokenizer, row: dict) -> View:
    """A built row (a dict from ``builders.rows.RowReader``) split into labelled spans."""
    starts = list(row.get("segment_start") or [0])
    ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
    # every conversation's rendering begins with the prefix token, so a row that does not continues one
    continued = len(ids) > 0 and tokenizer.id_to_token(int(ids[0])) != PREFIX_TOKEN
    labels = [f"source row {index} (id {id_}){' (continued from an earlier row)' if k == 0 and continued else ''}"
              for k, (index, id_) in enumerate(zip(row.get("source_index") or [None], row.get("source_id") or [None]))]
    supervised = int(np.count_nonzero(mask))
    title = f"row {row['index']}: {len(ids):,} tokens, {supervised:,} supervised ({supervised / max(1, len(ids)):.1%})"
    return View(title, labels, _spans(tokenizer, ids, mask, starts))


def conversation_view(tokenizer: Tokenizer, index: int, id_: str, ids: np.ndarray, mask: np.ndarray) -> View:
    supervised = int(np.count_nonzero(mask))
    title = f"source row {index} (id {id_}): {len(ids):,} tokens with EOS, {supervised:,} supervised"
    return View(title, [f"source row {index} (id {id_})"], _spans(tokenizer, ids, mask, [0]))


def _spans(tokenizer: Tokenizer, ids: np.ndarray, mask: np.ndarray, starts: list[int]) -> list[Span]:
    bounds = sorted(set(starts) | {len(ids)} | {int(i) for i in np.flatnonzero(np.diff(mask.astype(np.int8))) + 1})
    spans, segment = [], 0
    for begin, end in zip(bounds, bounds[1:]):
        while segment + 1 < len(starts) and starts[segment + 1] <= begin:
            segment += 1
        text = tokenizer.decode(ids[begin:end].tolist(), skip_special_tokens=False)
        spans.append(Span(segment, bool(mask[begin]), text, end - begin))
    return spans


def as_terminal(view: View, color: bool) -> str:
    """Supervised text on green (or between ⟦ ⟧ without color), a header line per conversation."""
    out, current = [view.title], None
    for span in view.spans:
        if span.conversation != current:
            current = span.conversation
            out.append(f"\n{DIM if color else ''}── {view.labels[current]} ──{RESET if color else ''}\n")
        text = span.text.replace(EOS, "⏎" + EOS + "\n")
        if span.supervised:
            out.append(f"{GREEN}{text}{RESET}" if color else f"⟦{text}⟧")
        else:
            out.append(text)
    return "".join(out) + "\n"


def as_html(view: View) -> str:
    parts = [
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">",
        f"<title>{html.escape(view.title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}"
        ".conv{border-left:4px solid #9ab;margin:1em 0;padding:.3em .8em}"
        ".label{color:#555;font-size:.85em;margin-bottom:.4em}"
        "pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:.9em}"
        ".sup{background:#bfe8c6}.eos{color:#c33;font-weight:bold}</style></head><body>",
        f"<h1>{html.escape(view.title)}</h1>",
        "<p><span class=\"sup\">supervised (loss_mask = 1)</span> · plain: not supervised · "
        "<span class=\"eos\">⏎</span> EOS between conversations</p>",
    ]
    current = None
    for span in view.spans:
        if span.conversation != current:
            if current is not None:
                parts.append("</pre></div>")
            current = span.conversation
            parts.append(f"<div class=\"conv\"><div class=\"label\">{html.escape(view.labels[current])}</div><pre>")
        text = html.escape(span.text).replace(html.escape(EOS), f"<span class=\"eos\">⏎{html.escape(EOS)}</span>")
        parts.append(f"<span class=\"sup\">{text}</span>" if span.supervised else text)
    parts.append("</pre></div></body></html>\n")
    return "".join(parts)
