"""``loss_mask: turns``: any chat template's answers.

They run from where generation starts through the stop token that ends them (data/ROWS.md,
"`turns`: any chat template").

A conversation is rendered twice: as it is (``R``), and with every text replaced by its
placeholder (runs of text between the template's markup literals become markers; blank runs
stay). Aligning the two tells markup from text: each marker is printed as its run, the run
less some leading or trailing whitespace, or nothing (earliest and longest first). Headers are
the template's own generation prompts found before each answer; supervision runs from a header
through the answer's texts and the markup after them up to the first stop token. Characters
are marked, then tokens: a token is supervised when any character it covers is.

With tools (data/ROWS.md, "Tool calls"), the render gets ``tools=``; tool fields are markup,
refused where they hold a token, stop or header of the template's own (``builders.formats.tools``);
the placeholder render also replaces each call's name, argument keys and string leaves by markers,
which must all be printed inside their answer's supervised span; an answer after a tool result
starts after the tool probe's closing markup and generation prompt.

Token classes: ``OTHER``, ``ANSWER`` (supervised), ``STOP`` (the stop token that ends an
answer: supervised unless the reading ``stop: unsupervised``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from typing import NamedTuple

import jinja2
import numpy as np
from jinja2 import nodes

from builders.contract import Contract
from builders.errors import ConversationError, ManifestError, PinnedInputError
from builders.formats import tools as tool_calls
from builders.formats.base import Annotated, ChatFormat, located
from builders.formats.render import ChatRenderer, check_prints_tools, check_template
from builders.formats.vocab import char_spans
from builders.messages import TEXT_FIELDS, normalize_messages, split_step_loss_mask

OTHER, ANSWER, STOP = 0, 1, 2
# what a character of a render is: markup, a message's printed text, an answer's calls (the markup
# between its last printed text and its stop, in an answer that calls tools)
MARKUP, TEXT, CALLS = 0, 1, 2
CUTTING_METHODS = frozenset({"split", "rsplit", "startswith", "endswith", "replace", "find"})
PROBE = [{"role": "user", "content": "probe"}]
# markers are made of private-use characters: ``MARK_OPEN``, the run's number in hex digits,
# ``MARK_CLOSE``
MARK_OPEN, MARK_CLOSE, MARK_DIGITS = "\ue000", "\ue001", "\ue010"
_MARKER = re.compile(f"{MARK_OPEN}[{MARK_DIGITS}-{chr(ord(MARK_DIGITS) + 15)}]+{MARK_CLOSE}")
# the placeholder renders a format keeps, keys and renders together, in characters
SHAPES_KEPT_CHARS = 1 << 22


class Run(NamedTuple):
    """What a marker stands for: a run of a message's text, or a call field (markup)."""

    message: int
    text: str
    # the call's name, argument key or string leaf; None: a text run
    field: tool_calls.CallField | None = None


class TurnsFormat(ChatFormat):
    name = "turns"
    classes = 3

    def __init__(self, spec, tokenizer, vocab):
        super().__init__(spec, tokenizer, vocab)
        self.variables = {**spec.special_tokens, **spec.template_vars}
        self.renderer = ChatRenderer(spec.chat_template, spec.render_date, spec.limits.render_chars)
        self.literals = markup_literals(spec.chat_template)
        self._literal = (
            re.compile("|".join(map(re.escape, sorted(self.literals, key=len, reverse=True))))
            if self.literals
            else None
        )
        self.prompts = self._generation_prompts()
        self.stops = tuple(spec.stop)
        self.eos_is_stop = spec.eos in spec.stop
        self._byte_level = vocab.byte_level()
        self.tool_prompts = self._tool_prompts()
        added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
        self.injection = tool_calls.Injection([*added, *self.stops, *self.prompts])
        # placeholder renders by their conversation and tools (``_renders``), and their size
        self._kept: dict[str, str] = {}
        self._kept_chars = 0

    @classmethod
    def check_inputs(cls, spec, tokenizer) -> None:
        check_spec(spec, tokenizer)

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        return self.stops

    def class_mask(self, contract: Contract) -> np.ndarray:
        return np.array([0, 1, contract.stop == "supervised"], dtype=np.uint8)

    def describe(self) -> dict:
        spec = self.spec
        return {
            "loss_mask": self.name,
            "chat_template": spec.template_source,
            "eos": spec.eos,
            "stop": list(spec.stop),
            "prefills": [dict(v) for v in spec.prefills],
            "template_vars": dict(spec.template_vars),
            "render_date": spec.render_date,
            "generation_prompts": list(self.prompts),
            "after_tool_prompts": None if self.tool_prompts is None else list(self.tool_prompts),
            "markup_literals": list(self.literals),
        }

    def _generation_prompts(self) -> tuple[str, ...]:
        """``G(v)`` for each prefill ``v``, longest first.

        ``G(v)`` is the generation prompt the template renders after the probe.
        """
        prompts = []
        for prefill in self.spec.prefills:
            variables = {**self.variables, **prefill}
            try:
                plain, prompted = (
                    self.renderer.render_all([PROBE], variables, generation)[0]
                    for generation in (False, True)
                )
            except jinja2.TemplateError as err:
                raise PinnedInputError(
                    f"the chat template fails on the probe conversation with prefill "
                    f"{prefill}: {err}"
                ) from err
            if not prompted.startswith(plain) or len(prompted) == len(plain):
                raise PinnedInputError(
                    f"the chat template's generation prompt with prefill {prefill} does not extend "
                    f"its render of the probe conversation; the turns mask needs one"
                )
            prompts.append(prompted[len(plain) :])
        return _longest_first(prompts)

    def _tool_prompts(self) -> tuple[str, ...] | None:
        """``C_t + G_t(v)`` for each prefill ``v``, longest first.

        ``G_t(v)`` is the generation prompt after the tool probe (a call, then its result), ``C_t``
        the markup of its render after its last printed text. None where the template fails on
        the probe, prints none of its texts, or its prompted render does not extend it (it takes
        no tool calls): an answer after a tool result then starts as any other does.
        """
        probe = normalize_messages(tool_calls.TOOL_PROBE)
        held, runs = self._placeholders(probe)
        candidates = []
        for prefill in self.spec.prefills:
            variables = {**self.variables, **prefill}
            try:
                plain, prompted, shape = (
                    self.renderer.render_all([c], variables, g, [[tool_calls.PROBE_TOOL]])[0]
                    for c, g in ((probe, False), (probe, True), (held, False))
                )
                found = align(plain, shape, runs, probe)
            except (jinja2.TemplateError, ConversationError):
                return None
            printed = [p for p in found if runs[p[2]].field is None]
            if not printed or not prompted.startswith(plain):
                return None
            candidates.append(plain[printed[-1][1] :] + prompted[len(plain) :])
        if not all(candidates):
            return None
        return _longest_first(candidates)

    def annotate(self, rows: list[dict], engine, rules: tuple[str, ...] = ()) -> list[Annotated]:
        conversations, tools, placeheld, untrained = [], [], [], []
        for row in rows:
            with located(row):
                messages, skipped = split_step_loss_mask(row["messages"])
                messages = normalize_messages(messages)
                row_tools = tool_calls.row_tools(row)
                if row_tools or any("tool_calls" in m or m["role"] == "tool" for m in messages):
                    self.injection.check(messages, row_tools)
                conversations.append(messages)
                tools.append(row_tools)
                placeheld.append(self._placeholders(messages))
                untrained.append(skipped)
        rendered, shapes = self._renders(rows, conversations, [p[0] for p in placeheld], tools)
        marks = []
        for row, messages, text, shape, (_, runs), skipped in zip(
            rows, conversations, rendered, shapes, placeheld, untrained, strict=True
        ):
            with located(row):
                marks.append(self._characters(messages, text, shape, runs, skipped))
        # a byte-level BPE tokenizer's tokens are placed by their byte lengths (any engine encodes
        # them), where its normalizer leaves the text as it is; any other text is placed by the
        # encoding's character offsets
        by_bytes = [self._byte_level and self.vocab.keeps(text) for text in rendered]
        tokens, spans, checked = [None] * len(rows), [None] * len(rows), [False] * len(rows)
        chosen = [k for k, b in enumerate(by_bytes) if b]
        if chosen:
            texts = [rendered[k] for k in chosen]
            encoded = engine.encode(texts)
            agreed = engine.cross_check(texts, encoded, [rows[k]["index"] for k in chosen])
            for k, ids, check in zip(chosen, encoded, agreed, strict=True):
                tokens[k], checked[k] = ids, check
        others = [k for k, b in enumerate(by_bytes) if not b]
        if others:
            encodings = self.tokenizer.encode_batch(
                [rendered[k] for k in others], add_special_tokens=False
            )
            for k, e in zip(others, encodings, strict=True):
                tokens[k] = np.array(e.ids, dtype=np.int32)
                spans[k] = np.array(e.offsets, dtype=np.int64).reshape(-1, 2)
        out = []
        for k, (row, text, ids, (classes, kinds, ends)) in enumerate(
            zip(rows, rendered, tokens, marks, strict=True)
        ):
            with located(row):
                char_span = (
                    self._byte_spans(text, ids) if spans[k] is None else _tiled(spans[k], len(text))
                )
                token_classes, token_kinds = _token_classes(classes, kinds, char_span)
            out.append(
                Annotated(
                    np.asarray(ids, dtype=np.int32),
                    token_classes,
                    token_kinds == TEXT,
                    ends,
                    checked[k],
                    in_calls=token_kinds == CALLS,
                )
            )
        return out

    def _render(self, rows: list[dict], conversations: list[list[dict]], tools) -> list[str]:
        try:
            return self.renderer.render_all(conversations, self.variables, tools=tools)
        except jinja2.TemplateError:
            for row, messages, row_tools in zip(rows, conversations, tools, strict=True):
                with located(row):
                    try:
                        self.renderer.render_all([messages], self.variables, tools=[row_tools])
                    except jinja2.TemplateError as err:
                        raise ConversationError(
                            f"the chat template failed ({self.spec.template_source}): {err}"
                        ) from err
            raise

    def _renders(
        self, rows: list[dict], conversations: list[list[dict]], held: list[list[dict]], tools
    ) -> tuple[list[str], list[str]]:
        """Each conversation's render, and the placeholder render of ``held``, in one call.

        One call rebuilds each tool list once for both renders (``render._ToolCopies``); the
        placeholder renders come after every real one, so a failing render is found in the order
        it was before. Each distinct placeholder render is rendered once while it is kept.

        A placeholder conversation holds markers where the texts were, so conversations of one
        structure share it. Its render is a function of it and its tools (the variables are the
        format's, the clock pinned), so a kept render is the render; ``repr`` tells apart what a
        template can (``1`` and ``True``, ``1`` and ``"1"``). Only renders that succeeded are
        kept: a conversation whose render fails is rendered, and fails, as before. At most
        ``SHAPES_KEPT_CHARS`` characters are kept. A conversation whose calls have ids is rendered
        and not kept (its key is its position): call ids are unique, so its shape never repeats.
        """
        keys = [
            k if _calls_have_ids(h) else repr((h, t))
            for k, (h, t) in enumerate(zip(held, tools, strict=True))
        ]
        shapes = {key: self._kept[key] for key in keys if key in self._kept}
        # each shape not kept, at its first conversation
        fresh: dict[str | int, int] = {}
        for k, key in enumerate(keys):
            if key not in shapes:
                fresh.setdefault(key, k)
        made = self._render(
            [*rows, *(rows[k] for k in fresh.values())],
            [*conversations, *(held[k] for k in fresh.values())],
            [*tools, *(tools[k] for k in fresh.values())],
        )
        rendered = made[: len(rows)]
        for key, text in zip(fresh, made[len(rows) :], strict=True):
            shapes[key] = text
            if type(key) is not str:
                continue
            size = len(key) + len(text)
            if self._kept_chars + size > SHAPES_KEPT_CHARS:
                self._kept.clear()
                self._kept_chars = 0
            if size <= SHAPES_KEPT_CHARS:
                self._kept[key] = text
                self._kept_chars += size
        return rendered, [shapes[key] for key in keys]

    def _placeholders(self, messages: list[dict]) -> tuple[list[dict], list[Run]]:
        """``messages`` with every text replaced by its placeholder.

        Each call's name, argument keys and string leaves are replaced by markers too. The second
        value is what each marker stands for, by number.
        """
        runs: list[Run] = []
        out = []
        for position, message in enumerate(messages):
            held = dict(message)
            for key in TEXT_FIELDS:
                if key in message:
                    held[key] = self._placeholder(message[key], position, runs)
            out.append(held)
        if any("tool_calls" in m for m in messages):

            def marker(field: tool_calls.CallField) -> str:
                runs.append(Run(field.message, field.text, field))
                return _marker(len(runs) - 1)

            out = tool_calls.marked_calls(out, marker)
        return out, runs

    def _placeholder(self, text: str, position: int, runs: list) -> str:
        cuts = [(m.start(), m.end()) for m in self._literal.finditer(text)] if self._literal else []
        # a blank run (whitespace only, or nothing) stays
        if not cuts:
            if not text or text.isspace():
                return text
            runs.append(Run(position, text))
            return _marker(len(runs) - 1)
        pieces, at = [], 0
        for start, end in [*cuts, (len(text), len(text))]:
            run = text[at:start]
            if run and not run.isspace():
                pieces.append(_marker(len(runs)))
                runs.append(Run(position, run))
            else:
                pieces.append(run)
            pieces.append(text[start:end])
            at = end
        return "".join(pieces)

    def _characters(
        self, messages, text: str, shape: str, runs: list[Run], untrained
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Each character's class, and its kind (``MARKUP``, ``TEXT``, ``CALLS``).

        The third value says whether the EOS after ``text`` is a stop.
        """
        # (start, end, marker), in order
        found = align(text, shape, runs, messages)
        printed = [(s, e, runs[n].message) for s, e, n in found if runs[n].field is None]
        classes = np.zeros(len(text), dtype=np.uint8)
        kinds = np.zeros(len(text), dtype=np.uint8)
        for start, end, _ in printed:
            kinds[start:end] = TEXT
        # where answers start, a call's printed fields stand as its message's as texts do
        anchors = sorted(printed + [(s, e, runs[n].message) for s, e, n in found if runs[n].field])
        headers = self._headers(messages, text, anchors)
        # the prints are disjoint and in order: the first of them from a character on is found by
        # bisection
        starts = [p[0] for p in printed]
        last_print = {p[2]: p[1] for p in printed}
        ends_with_answer = False
        spans = {}
        for j, header in headers.items():
            last = last_print.get(j, header[1])
            answer_end, stop = last, None
            # after j's last print (or its header, when it prints none) every print is another's
            at = bisect.bisect_left(starts, last)
            following = printed[at] if at < len(printed) else None
            stop_end = len(text) if following is None else following[0]
            markup = text[last:stop_end]
            stops = [(at, -len(s)) for s in self.stops if (at := markup.find(s)) >= 0]
            if stops:
                # the first stop token (the longest, where two start at one character)
                at, length = min(stops)
                answer_end, stop = last + at, (last + at, last + at - length)
            elif following is None:
                answer_end = len(text)
                ends_with_answer = self.eos_is_stop and j not in untrained
            elif messages[following[2]]["role"] == "assistant" and following[2] in headers:
                answer_end = headers[following[2]][0]
            spans[j] = (header[1], answer_end)
            if messages[j].get("tool_calls"):
                kinds[last:answer_end] = CALLS
            if j not in untrained:
                classes[header[1] : answer_end] = ANSWER
                if stop:
                    classes[stop[0] : stop[1]] = STOP
        _check_calls(shape, found, runs, spans)
        return classes, kinds, ends_with_answer

    def _headers(self, messages, text: str, printed) -> dict[int, tuple[int, int]]:
        """Each assistant message's header.

        That is the ``[start, end)`` of the generation prompt found before it. ``printed``: the
        printed texts and call fields, ``(start, end, message)`` in order.
        """
        # the prints are disjoint and in order (so are their ends): each bound below is found by
        # bisection, and the prints ending before a message's first print are all another's
        starts = [p[0] for p in printed]
        ends = [p[1] for p in printed]
        first = {}
        # the furthest end of the prints of the messages before each one
        before = [0] * (len(messages) + 1)
        for start, end, message in printed:
            first.setdefault(message, start)
            before[message + 1] = max(before[message + 1], end)
        before = list(itertools.accumulate(before, max))
        headers, previous = {}, 0
        for j, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            after_tool = j > 0 and messages[j - 1]["role"] == "tool" and self.tool_prompts
            prompts = self.tool_prompts if after_tool else self.prompts
            if j in first:
                end = first[j]
            else:
                # printing nothing, j ends at the next printed text: the first of a later message
                # after what came before j (a template may move a later text to the front, as
                # DeepSeek's does a system message); from there on, every print is a later one's
                at = bisect.bisect_left(starts, max(previous, before[j]))
                end = starts[at] if at < len(starts) else len(text)
            at = bisect.bisect_right(ends, end)
            start = max(previous, ends[at - 1]) if at else previous
            region = text[start:end]
            found = _first_longest(region, prompts)
            if found is None:
                what = "closing markup and generation prompts after a tool result"
                raise ConversationError(
                    f"message {j} (assistant): none of the template's "
                    f"{what if after_tool else 'generation prompts'} "
                    f"({', '.join(map(repr, prompts))}) occurs before it "
                    f"(characters {start}..{end} of the render: {region[-60:]!r}); "
                    f"the turns mask is undefined for this conversation"
                )
            at = start + found[0]
            headers[j] = (at, at + len(found[1]))
            previous = at + len(found[1])
        return headers

    def _byte_spans(self, text: str, ids: np.ndarray) -> np.ndarray:
        """Each token's character span, from its length in bytes.

        The tokenizer is a byte-level BPE tokenizer.
        """
        lengths = self.vocab.token_bytes[ids]
        data_length = len(text) if text.isascii() else len(text.encode("utf-8"))
        if int(lengths.sum()) != data_length:
            raise ConversationError(
                f"the tokens cover {int(lengths.sum())} bytes of a {data_length}-byte render; "
                f"the tokenizer does not encode the text losslessly, so the mask cannot be placed"
            )
        if text.isascii():
            ends = np.cumsum(lengths)
            return np.stack([ends - lengths, ends], axis=1)
        return char_spans(text, lengths)


def _first_longest(region: str, prompts: tuple[str, ...]) -> tuple[int, str] | None:
    """The longest of ``prompts`` that occurs in ``region``, and where it first does.

    Among prompts as long, the earliest (then the least). ``prompts`` are longest first.
    """
    found = None
    for prompt in prompts:
        if found is not None and len(prompt) < len(found[1]):
            break
        at = region.find(prompt)
        if at >= 0 and (found is None or (at, prompt) < found):
            found = (at, prompt)
    return found


def _calls_have_ids(messages: list[dict]) -> bool:
    return any(call.get("id") is not None for m in messages for call in m.get("tool_calls") or ())


def align(text: str, shape: str, runs: list[Run], messages) -> list[tuple[int, int, int]]:
    """Where each marker of ``shape`` is printed in ``text``.

    ``shape`` is the placeholder render, ``text`` the real render. Each marker stands for its run,
    printed as the run itself, less some leading and/or trailing whitespace, or not at all (a call
    field: as it is, or as ``tojson`` escapes it); the first assignment that reproduces ``text`` is
    taken, trying each marker's prints earliest and longest first. Returns the non-empty prints as
    ``(start, end, marker)``; when no assignment reproduces ``text``, raises ConversationError at
    the furthest character any assignment reached.
    """
    pieces, markers = _marked(shape)
    if not text.startswith(pieces[0]):
        at = next(
            (k for k, (a, b) in enumerate(zip(text, pieces[0], strict=False)) if a != b),
            min(len(text), len(pieces[0])),
        )
        _refuse(text, at, markers[0] if markers else None, messages, runs)
    found = _first_path(text, pieces, markers, runs)
    if found is not None:
        return found
    n = len(markers)

    def state(i: int, position: int):
        return i, position, iter(_prints(runs[markers[i]])) if i < n else iter(())

    stack, spans, failed = [state(0, len(pieces[0]))], [], set()
    furthest = (len(pieces[0]), 0)
    while stack:
        i, position, candidates = stack[-1]
        if i == n and position == len(text):
            return [
                (start, end, m)
                for m, (start, end) in zip(markers, spans, strict=True)
                if end > start
            ]
        for printed in candidates:
            after = position + len(printed)
            following = after + len(pieces[i + 1])
            if (
                text.startswith(printed, position)
                and text.startswith(pieces[i + 1], after)
                and (i + 1, following) not in failed
            ):
                spans.append((position, after))
                stack.append(state(i + 1, following))
                furthest = max(furthest, (following, i + 1))
                break
        else:
            failed.add((i, position))
            stack.pop()
            if stack:
                spans.pop()
    at, i = furthest
    _refuse(text, at, markers[min(i, n - 1)] if n else None, messages, runs)


def _first_path(text: str, pieces: list[str], markers: list[int], runs: list[Run]):
    """The search's first path through ``text``, or None where it does not reproduce it.

    Each marker's first print (``_prints``, most often the run whole) that ``text`` and the
    markup after it follow: the assignment ``align``'s search tries first, without its stack.
    """
    position, found = len(pieces[0]), []
    for i, m in enumerate(markers):
        following = pieces[i + 1]
        printed = runs[m].text
        if not (
            text.startswith(printed, position)
            and text.startswith(following, position + len(printed))
        ):
            printed = next(
                (
                    p
                    for p in itertools.islice(_prints(runs[m]), 1, None)
                    if text.startswith(p, position)
                    and text.startswith(following, position + len(p))
                ),
                None,
            )
            if printed is None:
                return None
        if printed:
            found.append((position, position + len(printed), m))
        position += len(printed) + len(following)
    return found if position == len(text) else None


def _prints(marked: Run):
    """The ways a template may print a marker's run.

    A text run: earliest and longest first, then as ``tojson`` escapes it (without its quotes),
    then not at all. A call field: as it is, or as ``tojson`` escapes it.
    """
    run = marked.text
    if marked.field is not None:
        yield from tool_calls.escaped_prints(run)
        return
    # the whole run first, the common case: its whitespace is measured only if it is not printed
    yield run
    lead = len(run) - len(run.lstrip())
    trail = len(run) - len(run.rstrip())
    for a in range(lead + 1):
        for b in range(len(run), len(run) - trail - 1, -1):
            if a or b < len(run):
                yield run[a:b]
    yield from itertools.islice(tool_calls.escaped_prints(run), 1, None)
    yield ""


def _check_calls(shape: str, found, runs: list[Run], spans: dict) -> None:
    """Refuse a conversation whose calls are not all printed inside their answers.

    Each call field's marker must occur in the placeholder render, each print inside its answer's
    supervised span (``spans``: each answer's ``[start, end)`` before its stop token).
    """
    fields = {n: r for n, r in enumerate(runs) if r.field is not None}
    if not fields:
        return
    shown = set(_marked(shape)[1])
    for n, run in fields.items():
        if n not in shown:
            raise ConversationError(
                f"message {run.message} (assistant): the chat template does not print "
                f"{run.field.describe()}, so the call would be trained incomplete; "
                f'this template cannot train these calls (data/ROWS.md, "Tool calls")'
            )
    for start, end, n in found:
        run = fields.get(n)
        span = spans.get(run.message) if run else None
        if run and not (span and span[0] <= start and end <= span[1]):
            raise ConversationError(
                f"message {run.message} (assistant): the chat template prints "
                f"{run.field.describe()} at characters {start}..{end}, outside the answer's "
                f"supervised span; the call would not be trained whole"
            )


def _refuse(text: str, at: int, marker, messages, runs: list[Run]):
    where = (
        f"message {runs[marker].message} ({messages[runs[marker].message]['role']})"
        if marker is not None
        else "the markup"
    )
    raise ConversationError(
        f"the turns mask is undefined for this conversation: "
        f"the template's markup depends on the text of {where} "
        f"(the real render and the placeholder render differ from character {at}: "
        f"real {text[at : at + 40]!r})"
    )


def _longest_first(prompts: list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(prompts), key=lambda p: (-len(p), prompts.index(p))))


@functools.lru_cache(maxsize=2)
def _marked(shape: str) -> tuple[list[str], list[int]]:
    """A placeholder render's markup between its markers, and its markers' numbers, in order.

    Kept for the last renders: ``align`` and the completeness check both read them.
    """
    return _MARKER.split(shape), [_marker_number(m) for m in _MARKER.findall(shape)]


@functools.lru_cache(maxsize=4096)
def _marker(number: int) -> str:
    digits = "".join(chr(ord(MARK_DIGITS) + int(d, 16)) for d in f"{number:x}")
    return f"{MARK_OPEN}{digits}{MARK_CLOSE}"


@functools.lru_cache(maxsize=4096)
def _marker_number(marker: str) -> int:
    return int("".join("0123456789abcdef"[ord(c) - ord(MARK_DIGITS)] for c in marker[1:-1]), 16)


def _tiled(spans: np.ndarray, length: int) -> np.ndarray:
    """Offsets made a tiling of the text.

    A character no token's offsets cover goes to the next token (the last one for trailing
    characters). Offsets that go backwards are refused.
    """
    if not len(spans):
        return spans
    starts, ends = spans[:, 0].copy(), spans[:, 1].copy()
    if np.any(np.diff(starts) < 0) or np.any(np.diff(ends) < 0) or np.any(ends < starts):
        raise ConversationError(
            "the tokenizer's character offsets are not in order; the mask cannot be placed"
        )
    previous_end = np.concatenate([[0], np.maximum.accumulate(ends)[:-1]])
    starts = np.minimum(starts, previous_end)
    ends[-1] = max(int(ends[-1]), length)
    return np.stack([starts, ends], axis=1)


def _token_classes(
    classes: np.ndarray, kinds: np.ndarray, spans: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A token's class, and its kind.

    The class is ANSWER if any character it covers is, else STOP if any is, else OTHER; the kind
    is its first character's (``MARKUP`` for a token that covers none).
    """
    if not len(spans):
        return np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    answer = np.concatenate([[0], np.cumsum(classes == ANSWER, dtype=np.int64)])
    stop = np.concatenate([[0], np.cumsum(classes == STOP, dtype=np.int64)])
    start, end = spans[:, 0], np.maximum(spans[:, 1], spans[:, 0])
    # in uint8 arithmetic on the flags (OTHER and MARKUP are 0): no int64 temporaries
    has_answer = answer[end] > answer[start]
    only_stop = (stop[end] > stop[start]) & ~has_answer
    out = has_answer.view(np.uint8) * np.uint8(ANSWER) + only_stop.view(np.uint8) * np.uint8(STOP)
    if not len(kinds):
        return out, np.full(len(spans), MARKUP, np.uint8)
    first = np.minimum(start, len(kinds) - 1)
    return out, kinds[first] * (end > start).view(np.uint8)


def markup_literals(template: str) -> tuple[str, ...]:
    """The string constants a template tests a value against or cuts it by.

    They are the left side of ``in`` / ``not in``, the first argument of ``split``, ``rsplit``,
    ``startswith``, ``endswith`` (a string or a tuple of them), ``replace`` (the method or the
    filter), ``find``.
    """
    found = set()
    for node in _parse(template).find_all((nodes.Compare, nodes.Call, nodes.Filter)):
        if isinstance(node, nodes.Compare):
            if any(op.op in ("in", "notin") for op in node.ops[:1]):
                found.update(_strings(node.expr))
        elif isinstance(node, nodes.Filter):
            # the filter cuts text as the method does
            if node.name == "replace" and node.args:
                found.update(_strings(node.args[0]))
        elif (
            isinstance(node.node, nodes.Getattr) and node.node.attr in CUTTING_METHODS and node.args
        ):
            # the separator, prefix, suffix or needle: what the text is cut by
            found.update(_strings(node.args[0]))
    return tuple(sorted(s for s in found if s))


def calls_strftime_now(template: str) -> bool:
    return any(n.name == "strftime_now" for n in _parse(template).find_all(nodes.Name))


def _strings(node) -> list[str]:
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (nodes.Tuple, nodes.List)):
        return [s for item in node.items for s in _strings(item)]
    return []


@functools.lru_cache(maxsize=8)
def _parse(template: str) -> nodes.Template:
    return ChatRenderer(template).environment().parse(template)


def check_spec(spec, tokenizer) -> None:
    """Refuse, before any work, inputs the turns mask cannot use.

    They are ``eos``/``stop`` that are not single special tokens, a template that reads the clock
    with no ``render_date``, markers the template could see; and, as under every format, a
    template that does not compile or never prints a dataset's tools.
    """
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    for name, tokens in (("tokenizer.eos", [spec.eos]), ("tokenizer.stop", list(spec.stop))):
        for token in tokens:
            if token not in special:
                raise ManifestError(
                    f"{name}: {token!r} is not a special token of the pinned tokenizer.json "
                    f"(the turns mask needs each to be one special token)"
                )
    renderer = check_template(spec)
    if calls_strftime_now(spec.chat_template) and spec.render_date is None:
        raise ManifestError(
            "tokenizer.render_date: the chat template calls strftime_now (it prints a date); "
            "pin the date it sees with render_date: YYYY-MM-DD, "
            "so the build never depends on the clock"
        )
    for literal in markup_literals(spec.chat_template):
        if all(MARK_OPEN <= c <= chr(ord(MARK_DIGITS) + 15) for c in literal):
            raise PinnedInputError(
                f"the chat template tests text against {literal!r}, which the turns mask's "
                f"placeholder markers use"
            )
    check_prints_tools(spec, renderer)
