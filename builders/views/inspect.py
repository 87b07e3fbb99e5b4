"""Show a row, or one source conversation, decoded.

Supervised spans are highlighted, conversation and EOS boundaries marked, each conversation
labelled with its source index and id.

A special token's text typed inside a message (a user writing ``<|user|>``) becomes the special
token itself, so the ids alone cannot tell it from the template's markup. The view re-encodes
the row's source conversations to know which tokens are a message's own text, and marks special
tokens there as literal.
"""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GREEN, MAGENTA, DIM, RESET = "\033[42;30m", "\033[4;35m", "\033[2m", "\033[0m"
LEGEND = (
    "legend: ⟦…⟧ supervised (loss_mask 1) · ⏎ the EOS after a conversation · "
    "«…» special-token text typed inside a message (encoded as that special token) · "
    "⋯ the conversation goes on in the next row"
)


@dataclass(frozen=True)
class Span:
    """A run of tokens of one conversation with one mask value.

    ``literal``: whether it is literal special-token text.
    """

    conversation: int  # position in the view's segment list
    supervised: bool
    literal: bool
    text: str


@dataclass(frozen=True)
class View:
    title: str
    labels: list[str]  # one per conversation segment
    spans: list[Span]
    # the last conversation goes on past the end of the row
    continues: bool
    # the chat format's EOS, marked where it follows a conversation
    eos: str
    chat_format: str  # the chat format and its inputs, in a line

    def as_dict(self) -> dict:
        """The view for ``--json``.

        It holds its title, conversation labels, spans (decoded text, supervised, literal
        special-token text, which conversation) and whether the row ends inside a conversation.
        """
        return {
            "title": self.title,
            "labels": self.labels,
            "continues": self.continues,
            "spans": [
                {
                    "conversation": s.conversation,
                    "supervised": s.supervised,
                    "literal": s.literal,
                    "text": s.text,
                }
                for s in self.spans
            ],
        }

    def as_terminal(self, color: bool) -> str:
        """The view for a terminal.

        Supervised text on green (or between ⟦ ⟧), literal special-token text underlined (or between
        « »).
        """

        def dim(text: str) -> str:
            return f"{DIM}{text}{RESET}" if color else text

        out = [self.title, "\n", dim(self.chat_format), "\n", dim(LEGEND)]
        current, inside = None, False
        for span in self.spans:
            if span.conversation != current or span.supervised != inside:
                if inside and not color:
                    out.append("⟧")
                if span.conversation != current:
                    current = span.conversation
                    out.append(dim(f"\n── {self.labels[current]} ──") + "\n")
                if span.supervised and not color:
                    out.append("⟦")
                inside = span.supervised
            text = span.text if span.literal else span.text.replace(self.eos, "⏎" + self.eos + "\n")
            if color:
                style = (MAGENTA if span.literal else "") + (GREEN if span.supervised else "")
                out.append(f"{style}{text}{RESET}" if style else text)
            else:
                out.append(f"«{text}»" if span.literal else text)
        if inside and not color:
            out.append("⟧")
        if self.continues:
            out.append(dim(" ⋯ (continues in the next row)"))
        return "".join(out) + "\n"

    def as_html(self) -> str:
        parts = [
            '<!doctype html>\n<html><head><meta charset="utf-8">',
            f"<title>{html.escape(self.title)}</title>",
            "<style>body{font-family:sans-serif;margin:2em;max-width:70em}"
            ".conv{border-left:4px solid #9ab;margin:1em 0;padding:.3em .8em}"
            ".label{color:#555;font-size:.85em;margin-bottom:.4em}"
            "pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:.9em}"
            ".sup{background:#bfe8c6}.eos{color:#c33;font-weight:bold}"
            ".literal{outline:1px dashed #a3a;color:#a3a}.more{color:#777}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
            f'<p class="label">{html.escape(self.chat_format)}</p>',
            '<p><span class="sup">supervised (loss_mask = 1)</span> · plain: not supervised · '
            '<span class="eos">⏎</span> the EOS after a conversation · '
            '<span class="literal">&lt;|user|&gt;</span> special-token text typed inside a message '
            "(encoded as that special token) · "
            '<span class="more">⋯</span> continues in the next row</p>',
        ]
        current = None
        for span in self.spans:
            if span.conversation != current:
                if current is not None:
                    parts.append("</pre></div>")
                current = span.conversation
                label = html.escape(self.labels[current])
                parts.append(f'<div class="conv"><div class="label">{label}</div><pre>')
            text = html.escape(span.text)
            if not span.literal:
                text = text.replace(
                    html.escape(self.eos), f'<span class="eos">⏎{html.escape(self.eos)}</span>'
                )
            else:
                text = f'<span class="literal" title="typed inside a message">{text}</span>'
            parts.append(f'<span class="sup">{text}</span>' if span.supervised else text)
        if self.continues:
            parts.append('<span class="more"> ⋯ (continues in the next row)</span>')
        parts.append("</pre></div></body></html>\n")
        return "".join(parts)


def inspect_row(manifest, hub, file: Path, row_index: int) -> View:
    """Row ``row_index`` of a built file.

    Its conversations are re-encoded from the pinned source.
    """
    from builders.errors import UsageError
    from builders.rows import RowReader

    reader = RowReader(file)
    if not -len(reader) <= row_index < len(reader):
        raise UsageError(f"inspect: {file} has rows 0..{len(reader) - 1}, not {row_index}")
    row = reader[row_index]
    encoder, source = _pinned(manifest, hub)
    ids, mask = np.asarray(row["input_ids"]), np.asarray(row["loss_mask"])
    starts = list(row.get("segment_start") or [0])
    indices = list(row.get("source_index") or [])
    literal = np.zeros(len(ids), dtype=bool)
    continued = continues = False
    # a row without metadata names no source rows: there is nothing to re-encode
    for k, (start, index) in enumerate(zip(starts, indices, strict=False)):
        end = starts[k + 1] if k + 1 < len(starts) else len(ids)
        part, part_literal = _conversation(encoder, source, index)
        offset = _offset(part, ids[start:end], first=k == 0, last=k == len(starts) - 1)
        literal[start:end] = part_literal[offset : offset + end - start]
        continued |= k == 0 and offset > 0
        continues |= k == len(starts) - 1 and offset + end - start < len(part)
    labels = [
        f"source row {index} (id {id_})"
        f"{' (continued from an earlier row)' if k == 0 and continued else ''}"
        for k, (index, id_) in enumerate(
            zip(indices or [None], row.get("source_id") or [None], strict=True)
        )
    ]
    supervised = int(np.count_nonzero(mask))
    title = (
        f"row {row['index']}: {len(ids):,} tokens, {supervised:,} supervised "
        f"({supervised / max(1, len(ids)):.1%})"
    )
    return View(
        title,
        labels,
        _spans(encoder.tokenizer, ids, mask, literal, starts),
        continues,
        encoder.format.eos,
        format_line(encoder.format.describe()),
    )


def inspect_source(manifest, hub, index: int) -> View:
    """Source conversation ``index`` as it enters the stream, with EOS."""
    from builders.errors import UsageError
    from builders.inputs.layout import conversations

    encoder, source = _pinned(manifest, hub)
    if not 0 <= index < source.num_rows:
        raise UsageError(f"inspect: the source has rows 0..{source.num_rows - 1}, not {index}")
    (row,) = conversations(source.take([index]))
    (ids, mask), literal = _conversation(encoder, source, index, with_mask=True)
    supervised = int(np.count_nonzero(mask))
    title = (
        f"source row {index} (id {row['id']}): {len(ids):,} tokens with EOS, "
        f"{supervised:,} supervised"
    )
    return View(
        title,
        [f"source row {index} (id {row['id']})"],
        _spans(encoder.tokenizer, ids, mask, literal, [0]),
        False,
        encoder.format.eos,
        format_line(encoder.format.describe()),
    )


def format_line(described: dict) -> str:
    """The chat format and its main inputs, as a view's second line."""
    keys = ("chat_template", "eos", "stop", "prefills", "render_date")
    return f"loss_mask {described['loss_mask']}: " + "; ".join(
        f"{key} {described[key]!r}"
        if isinstance(described[key], str)
        else f"{key} {described[key]}"
        for key in keys
        if described.get(key) not in (None, [], {})
    )


def _pinned(manifest, hub):
    from builders.encode.encoder import ConversationEncoder
    from builders.inputs.pinned import pinned_inputs

    pinned, source = pinned_inputs(manifest, hub)
    return ConversationEncoder(pinned.tokenizer, pinned.spec, manifest.contract), source


def _conversation(encoder, source, index: int, with_mask: bool = False):
    """A source conversation's part of the stream, and its literal tokens.

    Those are the special tokens inside message text.
    """
    from builders.errors import UsageError
    from builders.inputs.layout import conversations
    from builders.rows.packing import with_eos

    (row,) = conversations(source.take([index]))
    (annotated,) = encoder.annotate([row], (encoder.contract.mask_rule,))
    materialized = encoder.materialize(annotated, encoder.contract)
    if materialized is None:
        raise UsageError(
            f"inspect: source row {index} is left out of the stream by mask_rule "
            f"{encoder.contract.mask_rule} (no answer header found)"
        )
    ids, mask = with_eos(*materialized, encoder.eos_id, encoder.contract)
    special = np.isin(annotated.ids, list(encoder.tokenizer.get_added_tokens_decoder()))
    literal = np.zeros(len(ids), dtype=bool)
    literal[_plain_offset(encoder) :][: len(annotated.ids)] = annotated.message_text & special
    return ((ids, mask) if with_mask else ids), literal


def _plain_offset(encoder) -> int:
    """Where the text's own tokens begin in a conversation's ids.

    They begin after what a post-processor puts first.
    """
    return (
        len(encoder.vocab.post_processor_wrap()[0])
        if encoder.contract.encode == "add-special"
        else 0
    )


def _offset(conversation: np.ndarray, segment: np.ndarray, first: bool, last: bool) -> int:
    """Where a row's segment starts in its conversation's part.

    The part is what the conversation puts in the stream.
    """
    # a conversation that starts in this row
    if not first:
        return 0
    # one that ends in this row
    if not last:
        return len(conversation) - len(segment)
    matches = [
        k
        for k in range(len(conversation) - len(segment) + 1)
        if np.array_equal(conversation[k : k + len(segment)], segment)
    ]
    return matches[0] if matches else 0


def _spans(
    tokenizer, ids: np.ndarray, mask: np.ndarray, literal: np.ndarray, starts: list[int]
) -> list[Span]:
    change = (
        np.flatnonzero(
            (np.diff(mask.astype(np.int8)) != 0) | (np.diff(literal.astype(np.int8)) != 0)
        )
        + 1
    )
    bounds = sorted(set(starts) | {len(ids)} | {int(i) for i in change})
    spans, segment = [], 0
    for begin, end in itertools.pairwise(bounds):
        while segment + 1 < len(starts) and starts[segment + 1] <= begin:
            segment += 1
        text = tokenizer.decode(ids[begin:end].tolist(), skip_special_tokens=False)
        spans.append(Span(segment, bool(mask[begin]), bool(literal[begin]), text))
    return spans
