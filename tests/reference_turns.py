"""A slow, plain implementation of ROWS.md's ``turns`` loss mask.

It is for checking the builder.

It shares no code with ``builders`` and works by another method: the rule is evaluated on the
characters of the render. Renders come from transformers' own ``apply_chat_template`` of a
``PreTrainedTokenizerFast`` over the pinned ``tokenizer.json``; markup literals are read from the
template's syntax tree as transformers' Jinja environment parses it; the placeholder render is
aligned with the real one by a depth-first search over what each marker may have printed;
generation prompts come from ``apply_chat_template(add_generation_prompt=True)``; and the
supervised characters are mapped to tokens by the tokenizer's character offsets.

``TurnsReference(...).conversation(messages, tools=...)`` returns a conversation's ids and mask
followed by its EOS, or raises ``Undefined`` for exactly the conversations ROWS.md leaves
undefined. With tools ("Tool calls"): the render gets ``tools=``; tool fields holding an added
token, a stop or a generation prompt are refused; a second render with each call field replaced by
a marker must print every marker inside its answer's supervised characters (found by running the
rule on that render); an answer right after a tool message starts after the tool probe's markup.
"""

from __future__ import annotations

import datetime
import json
import re
from contextlib import contextmanager
from pathlib import Path

import yaml
from jinja2 import TemplateError, nodes
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import _compile_jinja_template

TEXT_FIELDS = ("content", "reasoning_content")
CUTTING_METHODS = ("split", "rsplit", "startswith", "endswith", "replace", "find")
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
PROBE = [{"role": "user", "content": "probe"}]
MARKER = re.compile("\ue000(\\d+)\ue001")
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_fn",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}
TOOL_PROBE = [
    {"role": "user", "content": "probe"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "probe_fn", "arguments": {}}}],
    },
    {"role": "tool", "content": "probe"},
]


class Undefined(ValueError):
    """A conversation that ROWS.md's ``turns`` rule does not define.

    ``message``/``character`` say where.
    """

    def __init__(self, why: str, message: int | None = None, character: int | None = None):
        super().__init__(why)
        self.message, self.character = message, character


def markup_literals(template: str) -> list[str]:
    """The string constants the template tests or cuts a value by.

    Those it tests a value against (left of ``in``) or cuts it by (argument of split, rsplit,
    startswith, endswith, replace, find), longest first.
    """
    tree = _compile_jinja_template(template).environment.parse(template)
    found = set()

    def constants(node):
        if isinstance(node, nodes.Const) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (nodes.Tuple, nodes.List)):
            for item in node.items:
                yield from constants(item)

    for node in tree.find_all((nodes.Compare, nodes.Call, nodes.Filter)):
        if isinstance(node, nodes.Compare):
            left = node.expr
            for operand in node.ops:
                if operand.op in ("in", "notin"):
                    found.update(constants(left))
                left = operand.expr
        elif (
            isinstance(node, nodes.Call)
            and isinstance(node.node, nodes.Getattr)
            and node.node.attr in CUTTING_METHODS
            and node.args
        ):
            arguments = node.args[:1] if node.node.attr == "replace" else node.args
            for argument in arguments:
                found.update(constants(argument))
        elif isinstance(node, nodes.Filter) and node.name == "replace" and node.args:
            found.update(constants(node.args[0]))
    return sorted((s for s in found if s), key=lambda s: (-len(s), s))


def calls_strftime_now(template: str) -> bool:
    tree = _compile_jinja_template(template).environment.parse(template)
    return any(node.name == "strftime_now" for node in tree.find_all(nodes.Name))


def split_runs(text: str, literals: list[str]) -> list[tuple[bool, str]]:
    """``text`` as (is_literal, piece) pieces.

    Markup-literal occurrences (the longest at each position, scanning left to right) and the
    maximal runs between them.
    """
    pieces, run, at = [], "", 0
    while at < len(text):
        literal = next((s for s in literals if text.startswith(s, at)), None)
        if literal is None:
            run += text[at]
            at += 1
            continue
        if run:
            pieces.append((False, run))
            run = ""
        pieces.append((True, literal))
        at += len(literal)
    if run:
        pieces.append((False, run))
    return pieces


def printings(run: str) -> list[str | None]:
    """What a template may print of ``run``.

    The run less some leading and/or trailing whitespace, earliest start first, then longest;
    then the run as ``tojson`` escapes it, without its quotes; ``None`` (printed nothing) last.
    """
    core_start = len(run) - len(run.lstrip())
    core_end = len(run.rstrip())
    trimmed = [run[i:j] for i in range(core_start + 1) for j in range(len(run), core_end - 1, -1)]
    escaped = [json.dumps(run, ensure_ascii=False)[1:-1], json.dumps(run)[1:-1]]
    return (
        trimmed + [e for k, e in enumerate(escaped) if e != run and e not in escaped[:k]] + [None]
    )


class TurnsReference:
    """The ``turns`` rule for one tokenizer repo snapshot.

    It is made of the snapshot and the manifest's tokenizer fields.
    """

    def __init__(self, snapshot: Path, fields: dict):
        snapshot = Path(snapshot)
        config = {}
        if (snapshot / "tokenizer_config.json").exists() and "tokenizer_config.json" in fields.get(
            "sha256", {}
        ):
            config = json.loads((snapshot / "tokenizer_config.json").read_text(encoding="utf-8"))
        pinned = fields.get("sha256", {})
        if "chat_template.jinja" in pinned:
            self.template = (snapshot / "chat_template.jinja").read_text(encoding="utf-8")
        elif isinstance(config.get("chat_template"), str):
            self.template = config["chat_template"]
        else:
            name = fields.get("chat_template_name", "default")
            self.template = next(
                t["template"] for t in config["chat_template"] if t["name"] == name
            )
        specials = {}
        for key in SPECIAL_TOKEN_NAMES:
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
        self.tok = PreTrainedTokenizerFast(tokenizer_file=str(snapshot / "tokenizer.json"))
        self.variables = {**specials, **(fields.get("template_vars") or {})}
        date = fields.get("render_date")
        self.date = datetime.date.fromisoformat(date) if isinstance(date, str) else date
        if self.date is None and calls_strftime_now(self.template):
            raise ValueError("the template calls strftime_now and the manifest has no render_date")
        self.eos = fields["eos"]
        self.eos_id = self.tok.convert_tokens_to_ids(self.eos)
        self.stops = list(fields["stop"])
        self.literals = markup_literals(self.template)
        prefills = fields.get("prefills") or [{}]
        self.prompts = [self._generation_prompt(v) for v in prefills]
        self.tool_prompts = self._tool_prompts(prefills)
        self.forbidden = [*self.tok.get_added_vocab(), *self.stops, *self.prompts]

    def render(self, messages, **variables) -> str:
        """transformers' render.

        Its ``strftime_now`` reads ``render_date`` (or fails without one).
        """
        with clock_at(self.date):
            return self.tok.apply_chat_template(
                messages,
                chat_template=self.template,
                tokenize=False,
                **{**self.variables, **variables},
            )

    def _generation_prompt(self, prefill: dict) -> str:
        with_prompt = self.render(PROBE, add_generation_prompt=True, **prefill)
        without = self.render(PROBE, **prefill)
        assert with_prompt.startswith(without), (
            "the generation prompt is not an extension of the render"
        )
        return with_prompt[len(without) :]

    def _tool_prompts(self, prefills) -> list[str] | None:
        """``C_t + G_t(v)`` per prefill: the markup after the tool probe's last printed text,
        then its generation prompt; None where the template cannot render the probe."""
        out = []
        for prefill in prefills:
            try:
                plain = self.render(TOOL_PROBE, tools=[PROBE_TOOL], **prefill)
                prompted = self.render(
                    TOOL_PROBE, tools=[PROBE_TOOL], add_generation_prompt=True, **prefill
                )
                prints = self._printed_texts(TOOL_PROBE, plain, [PROBE_TOOL], **prefill)
            except (TemplateError, Undefined):
                return None
            if not prints or not prompted.startswith(plain):
                return None
            out.append(plain[prints[-1][1] :] + prompted[len(plain) :])
        return out if all(out) else None

    def conversation(
        self, messages, untrained=frozenset(), tools=None
    ) -> tuple[list[int], list[int]]:
        """Token ids and mask of one conversation followed by its EOS.

        Raises ``Undefined``.
        """
        messages = checked(messages)
        tools = tools or None
        self._refuse_injection(messages, tools)
        try:
            text = self.render(messages, tools=tools)
        except TemplateError as error:
            raise Undefined(f"the template refuses the conversation: {error}") from None
        prints = self._printed_texts(messages, text, tools)
        supervised = self._supervised_characters(messages, text, prints, untrained)
        self._check_complete(messages, tools)
        encoding = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [1 if any(supervised[start:end]) else 0 for start, end in encoding["offset_mapping"]]
        ids = list(encoding["input_ids"])
        return [*ids, self.eos_id], [*mask, int(supervised.eos)]

    def _refuse_injection(self, messages, tools) -> None:
        """Refuse a tool field that holds an added token, a stop or a generation prompt."""
        fields = list(strings_in(tools))
        for m in messages:
            for call in m.get("tool_calls", []):
                fields += [call.get("id"), call["function"]["name"]]
                fields += list(strings_in(call["function"].get("arguments")))
            fields += [m.get("tool_call_id"), m.get("name")]
        for field in fields:
            if isinstance(field, str) and any(f and f in field for f in self.forbidden):
                raise Undefined(f"the tool field {field!r} holds the template's own markup")

    def _check_complete(self, messages, tools) -> None:
        """Each call's name, argument keys and string leaves, replaced by markers.

        Every marker must be printed inside its answer's supervised characters.
        """
        fields = []

        def mark(j, value):
            if isinstance(value, str):
                if not value:
                    return value
                fields.append(j)
                return f"\ue002{len(fields) - 1}\ue003"
            if isinstance(value, dict):
                return {mark(j, k): mark(j, v) for k, v in value.items()}
            if isinstance(value, list):
                return [mark(j, v) for v in value]
            return value

        marked = []
        for j, m in enumerate(messages):
            if m.get("tool_calls"):
                m = {
                    **m,
                    "tool_calls": [
                        {
                            **call,
                            "function": {
                                **call["function"],
                                "name": mark(j, call["function"]["name"]),
                                "arguments": mark(j, call["function"].get("arguments")),
                            },
                        }
                        for call in m["tool_calls"]
                    ],
                }
            marked.append(m)
        if not fields:
            return
        text = self.render(marked, tools=tools)
        spans = self._supervised_characters(
            marked, text, self._printed_texts(marked, text, tools), frozenset()
        ).spans
        for n, j in enumerate(fields):
            forms = {f"\ue002{n}\ue003", json.dumps(f"\ue002{n}\ue003")[1:-1]}
            places = [(a.start(), a.end()) for f in forms for a in re.finditer(re.escape(f), text)]
            if not places:
                raise Undefined(f"a call field of message {j} is not printed", message=j)
            if any(not (spans[j][0] <= a and b <= spans[j][1]) for a, b in places):
                raise Undefined(f"a call field of message {j} is not supervised", message=j)

    def _printed_texts(self, messages, text: str, tools=None, **variables) -> list:
        """(start, end, message) of each printed text in ``text``.

        Found by aligning the placeholder render.
        """
        runs, placeholders = [], []
        for m in messages:
            placeholder = dict(m)
            for key in TEXT_FIELDS:
                if key in m:
                    parts = []
                    for is_literal, piece in split_runs(m[key], self.literals):
                        if is_literal or piece.isspace():
                            parts.append(piece)
                        else:
                            parts.append(f"\ue000{len(runs)}\ue001")
                            runs.append((piece, len(placeholders)))
                    placeholder[key] = "".join(parts)
            placeholders.append(placeholder)
        try:
            rendered = self.render(placeholders, tools=tools, **variables)
        except TemplateError as error:
            raise Undefined(f"the template refuses the placeholder conversation: {error}") from None
        # literal, marker, literal, marker, ..., literal
        literal_parts = MARKER.split(rendered)
        fixed = literal_parts[0::2]
        markers = [int(k) for k in literal_parts[1::2]]
        failed = set()

        def align(k: int, at: int) -> list | None:
            if k == len(markers):
                return [] if at == len(text) else None
            if (k, at) in failed:
                return None
            run, owner = runs[markers[k]]
            for printed in printings(run):
                end = at + len(printed or "")
                if printed and not text.startswith(printed, at):
                    continue
                if not text.startswith(fixed[k + 1], end):
                    continue
                rest = align(k + 1, end + len(fixed[k + 1]))
                if rest is not None:
                    return ([(at, end, owner)] if printed else []) + rest
            failed.add((k, at))
            return None

        found = align(0, len(fixed[0])) if text.startswith(fixed[0]) else None
        if found is None:
            as_written = MARKER.sub(lambda match: runs[int(match.group(1))][0], rendered)
            character = next(
                (i for i, (a, b) in enumerate(zip(text, as_written, strict=False)) if a != b),
                min(len(text), len(as_written)),
            )
            raise Undefined(
                f"the placeholder render differs from the render at character {character}",
                message=message_at(character, runs, rendered),
                character=character,
            )
        return found

    def _supervised_characters(self, messages, text, prints, untrained):
        supervised = Characters(len(text))
        answers = [j for j, m in enumerate(messages) if m["role"] == "assistant"]
        headers = {}
        previous_header_end = 0
        for j in answers:
            after_tool = j > 0 and messages[j - 1]["role"] == "tool" and self.tool_prompts
            prompts = self.tool_prompts if after_tool else self.prompts
            own = [p for p in prints if p[2] == j]
            # j printing nothing: the next printed text is the first of a later message after what
            # came before j (a template may move a later text in front, as DeepSeek does with system
            # messages)
            floor = max([p[1] for p in prints if p[2] < j] + [previous_header_end])
            later = [p[0] for p in prints if p[2] > j and p[0] >= floor]
            end = own[0][0] if own else min(later, default=len(text))
            start = max([p[1] for p in prints if p[1] <= end] + [previous_header_end])
            header = None
            for length in sorted({len(p) for p in prompts}, reverse=True):
                found = [
                    at
                    for p in prompts
                    if len(p) == length
                    for at in [text.find(p, start, end)]
                    if at >= 0
                ]
                if found:
                    header = (min(found), min(found) + length)
                    break
            if header is None:
                raise Undefined(
                    f"assistant message {j} has no generation prompt in its search region "
                    f"(characters {start}..{end})",
                    message=j,
                )
            headers[j] = header
            previous_header_end = header[1]
        for j in answers:
            # marked, or only measured (an untrained answer's span, for the completeness check)
            target = Characters(len(text)) if j in untrained else supervised
            own = [p for p in prints if p[2] == j]
            answer_end = own[-1][1] if own else headers[j][1]
            target.mark(headers[j][1], answer_end)
            following = [p for p in prints if p[0] >= answer_end and p[2] != j]
            next_print = min(following) if following else None
            markup_end = next_print[0] if next_print else len(text)
            # the first stop token; of two starting at one character the longer (the one the
            # tokenizer matches)
            stops = [
                (at, -len(s))
                for s in self.stops
                if (at := text.find(s, answer_end, markup_end)) >= 0
            ]
            end = answer_end
            if stops:
                at, negative_length = min(stops)
                target.mark(answer_end, at - negative_length)
                end = at
            elif next_print is None:
                target.mark(answer_end, len(text))
                target.eos = target.eos or self.eos in self.stops
                end = len(text)
            elif messages[next_print[2]]["role"] == "assistant":
                end = max(answer_end, headers[next_print[2]][0])
                target.mark(answer_end, end)
            supervised.spans[j] = (headers[j][1], end)
        return supervised


@contextmanager
def clock_at(date: datetime.date | None):
    """transformers' ``strftime_now`` sees midnight of ``date``.

    Without a date, calling it fails. (Template variables cannot carry a function: transformers
    turns them into plain data.)
    """

    class Clock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            if date is None:
                raise Undefined(
                    "the template calls strftime_now and the manifest has no render_date"
                )
            return cls(date.year, date.month, date.day)

    saved = chat_template_utils.datetime
    chat_template_utils.datetime = Clock
    try:
        yield
    finally:
        chat_template_utils.datetime = saved


def message_at(character: int, runs, rendered: str) -> int | None:
    """The message of the last run at or before ``character``.

    The last run that starts at or before it once the markers of ``rendered`` are written out as
    their runs (where a refusal is reported).
    """
    owner, shift = None, 0
    for match in MARKER.finditer(rendered):
        if match.start() + shift > character:
            break
        run, owner = runs[int(match.group(1))]
        shift += len(run) - (match.end() - match.start())
    return owner


class Characters(list):
    """One flag per character of the render.

    It also holds whether the EOS after it is supervised.
    """

    def __init__(self, n: int):
        super().__init__([0] * n)
        self.eos = False
        # each answer's characters before its stop token: (start, end)
        self.spans = {}

    def mark(self, start: int, end: int) -> None:
        for i in range(start, end):
            self[i] = 1


def checked(messages) -> list[dict]:
    """The messages with null fields dropped.

    Raises ``Undefined`` for shapes ROWS.md refuses.
    """
    if not isinstance(messages, list) or not messages:
        raise Undefined("not a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise Undefined(f"message {i} is not a mapping", message=i)
        m = {k: v for k, v in m.items() if v is not None and (k, v) != ("tool_calls", [])}
        if m.get("tool_calls") and m.get("role") == "assistant":
            m.setdefault("content", "")
            if not all(isinstance(c["function"]["name"], str) for c in m["tool_calls"]):
                raise Undefined(f"message {i} has a call without a name", message=i)
        allowed = {"role", "content"} | {
            "assistant": {"reasoning_content", "tool_calls"},
            "tool": {"tool_call_id", "name"},
        }.get(m.get("role"), set())
        if set(m) - allowed:
            raise Undefined(f"message {i} has fields {sorted(set(m) - allowed)}", message=i)
        if not isinstance(m.get("role"), str) or not all(
            isinstance(m.get(k, ""), str) for k in (*TEXT_FIELDS, "tool_call_id", "name")
        ):
            raise Undefined(f"message {i} has a role or text that is not a string", message=i)
        out.append(m)
    return out


def strings_in(value):
    """Every string in a JSON value, its keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def turns_fields(manifest: Path) -> dict:
    """The ``tokenizer:`` mapping of a ``turns`` manifest.

    Read with ``yaml.safe_load``.
    """
    return yaml.safe_load(Path(manifest).read_text(encoding="utf-8"))["tokenizer"]
