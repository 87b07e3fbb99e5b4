"""Rendering conversations with a pinned chat template.

Rendering is transformers' own (the steps of ``render_jinja_template``: sandboxed Jinja with
``trim_blocks`` and ``lstrip_blocks``), as ``apply_chat_template(messages, tools=...,
tokenize=False)`` renders; a chat format passes the variables it pins, and each conversation's
tools (None: no tools). The sandbox is bounded by the manifest's ``limits.render_chars``
(``builders.formats.sandbox``).
"""

from __future__ import annotations

import functools
import os
from datetime import datetime

# transformers advises at import that "PyTorch was not found": rendering a template needs no torch
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
import jinja2
from transformers.utils.chat_template_utils import _cached_compile_jinja_template

from builders.errors import PinnedInputError, UsageError
from builders.formats.sandbox import BoundedSandbox, TemplateFailure
from builders.formats.tools import PROBE_NAME, prints_tools
from builders.limits import DEFAULT_LIMITS

try:
    # the message normalization of transformers 5.23 and later (the lock's)
    from transformers.utils.chat_template_utils import _alias_reasoning_fields, _plain_template_data
except ImportError:
    # earlier releases (miles' pinned 5.12.1) render the messages as they are given

    def _alias_reasoning_fields(messages):
        return messages

    def _plain_template_data(data):
        return data


def _plain(value):
    """``_plain_template_data(value)``: its JSON types copied here, anything else by it.

    The template sees data rebuilt out of plain JSON types (transformers' step); dicts, lists
    and exact scalars, all of a source's data, are rebuilt here without its per-value checks (a
    string, the common leaf, is kept without a call).
    """
    kind = type(value)
    if kind is dict:
        return {
            key if type(key) is str else _plain(key): item if type(item) is str else _plain(item)
            for key, item in value.items()
        }
    if kind is list:
        return [item if type(item) is str else _plain(item) for item in value]
    if kind is str or value is None or kind is int or kind is float or kind is bool:
        return value
    return _plain_template_data(value)


class ChatRenderer:
    """Renders conversations with one chat template.

    It renders as ``apply_chat_template`` does, in transformers' sandbox bounded by
    ``render_chars`` (``builders.formats.sandbox``): a render that would print or build more is a
    ``RenderLimitError``, any other exception out of a render a ``TemplateFailure``, both template
    errors. ``strftime_now`` prints ``render_date`` (ISO text) instead of the clock where it is
    given. Variables (special-token strings, a manifest's ``template_vars``) reach the template as
    ``apply_chat_template``'s keyword arguments do.
    """

    def __init__(
        self,
        chat_template: str,
        render_date: str | None = None,
        render_chars: int = DEFAULT_LIMITS.render_chars,
    ):
        self.chat_template = chat_template
        self.render_date = render_date
        self.render_chars = render_chars
        self._compiled = None

    def environment(self):
        return self._template().environment

    def _template(self):
        if self._compiled is None:
            # transformers' environment: its filters, globals and extensions
            base = _cached_compile_jinja_template("").environment
            sandbox = BoundedSandbox(base, self.render_chars)
            if self.render_date is not None:
                sandbox.globals["strftime_now"] = datetime.fromisoformat(self.render_date).strftime
            self._compiled = _failing_as_template_errors(sandbox.from_string, self.chat_template)
        return self._compiled

    def render(self, messages: list[dict], tools: list | None = None) -> str:
        return self.render_all([messages], tools=[tools])[0]

    def render_all(
        self,
        conversations: list[list[dict]],
        variables: dict | None = None,
        add_generation_prompt: bool = False,
        tools: list | None = None,
    ) -> list[str]:
        """Several conversations, each as ``render_jinja_template`` renders it.

        ``tools`` holds each conversation's tool list (None: no tools for any); no documents.
        """
        kwargs = _plain_template_data(variables or {})
        copies = _ToolCopies(self.environment())
        return [
            self._generate([], chat, copies.of(chat_tools), add_generation_prompt, kwargs)
            for chat, chat_tools in zip(conversations, _each(tools, conversations), strict=True)
        ]

    def render_with_spans(
        self,
        conversations: list[list[dict]],
        variables: dict | None = None,
        tools: list | None = None,
    ) -> tuple[list[str], list[list[tuple[int, int]]]]:
        """``render_all``, with each conversation's ``{% generation %}`` spans.

        The spans are (character start, end), as
        ``apply_chat_template(..., return_assistant_tokens_mask=True)`` records them (the steps of
        transformers' ``_render_with_assistant_indices``).
        """
        kwargs = _plain_template_data(variables or {})
        copies = _ToolCopies(self.environment())
        rendered, spans = [], []
        for chat, chat_tools in zip(conversations, _each(tools, conversations), strict=True):
            blocks, indices = [], []
            with self.environment().activate_tracker(blocks, indices):
                rendered.append(self._generate(blocks, chat, copies.of(chat_tools), False, kwargs))
            spans.append(indices)
        return rendered, spans

    def _generate(
        self,
        blocks: list,
        chat: list[dict],
        tools: list | None,
        add_generation_prompt: bool,
        variables: dict,
    ) -> str:
        """One conversation's render, its pieces counted into ``blocks`` as they are printed.

        ``tools`` is already plain data (``_ToolCopies``). The steps of Jinja's
        ``Template.generate``, its render function's pieces taken as they come.
        """
        template = self._template()
        sandbox = template.environment
        sandbox.begin()

        def generate():
            context = template.new_context(
                dict(
                    messages=_alias_reasoning_fields(_plain(chat)),
                    tools=tools,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **variables,
                )
            )
            try:
                # each piece is appended as it is printed: the generation tracker reads blocks
                # meanwhile
                sandbox.print_into(blocks, template.root_render_func(context))
            except Exception:
                sandbox.handle_exception()
            return "".join(blocks)

        return _failing_as_template_errors(generate)


class _ToolCopies:
    """Each distinct tool list of one call, rebuilt once (``_plain``).

    transformers rebuilds the tools once for every conversation of a call too; a list held by
    several conversations (a conversation and its placeholder one) is rebuilt once. Kept by
    ``id`` while the call holds every list, so no id is reused. The sandbox holds each rebuilt
    tool (``BoundedSandbox.hold``): it is measured, and printed by ``tojson``, once.
    """

    def __init__(self, sandbox):
        self._copies: dict[int, list] = {}
        self._sandbox = sandbox
        sandbox.hold((), fresh=True)

    def of(self, tools: list | None) -> list | None:
        if tools is None:
            return None
        copy = self._copies.get(id(tools))
        if copy is None:
            copy = self._copies[id(tools)] = _plain(tools)
            if type(copy) is list:
                self._sandbox.hold(copy)
        return copy


def check_template(spec) -> ChatRenderer:
    """Refuse, before any work, a chat template (of ``FormatSpec`` ``spec``) that cannot compile.

    A syntax error, or one Jinja's parser cannot take (nested too deeply): a PinnedInputError.
    Returns the renderer it compiled.
    """
    try:
        return _compiled(spec.chat_template, spec.render_date, spec.limits.render_chars)
    except jinja2.TemplateError as err:
        raise PinnedInputError(
            f"the pinned chat template ({spec.template_source}) is not valid Jinja: {err}"
        ) from err


@functools.lru_cache(maxsize=8)
def _compiled(chat_template: str, render_date: str | None, render_chars: int) -> ChatRenderer:
    """A renderer of ``chat_template`` compiled for the checks, once per process.

    The command checks its inputs, then makes its chat format, which checks them again.
    """
    renderer = ChatRenderer(chat_template, render_date, render_chars)
    renderer.environment()
    return renderer


def check_prints_tools(spec, renderer: ChatRenderer) -> None:
    """Refuse a dataset with tools and a template that never prints a tool schema (exit 2).

    Every chat format runs it when it is made (``ChatFormat.check_inputs``), with the renderer
    ``check_template`` compiled: where ``spec.tools``, one probe conversation is rendered with the
    probe tool, whose name must occur (data/ROWS.md, "Tool calls").
    """
    if not spec.tools:
        return
    variables = {**spec.special_tokens, **spec.template_vars}
    try:
        printed = prints_tools(
            lambda messages, tools: renderer.render_all([messages], variables, tools=[tools])[0]
        )
    except jinja2.TemplateError as err:
        raise UsageError(
            f"the dataset names tools, and the chat template ({spec.template_source}) fails on "
            f"a conversation with a tool: {err}"
        ) from err
    if not printed:
        raise UsageError(
            f"the dataset names tools, and the chat template ({spec.template_source}) never "
            f"prints them (a probe tool's name {PROBE_NAME!r} does not occur in its render): "
            f"under loss_mask {spec.loss_mask} the schema would never reach the model. Use a "
            "template that renders tools, or set dataset.tools: null (datasets[j].tools: null "
            "in a mixture) to build without them"
        )


def _failing_as_template_errors(work, *args):
    """``work(*args)``, any exception out of it a template error (``TemplateFailure``)."""
    try:
        return work(*args)
    except jinja2.TemplateError:
        raise
    except Exception as err:
        raise TemplateFailure(f"{type(err).__name__}: {err}") from err


def _each(tools: list | None, conversations: list) -> list:
    """Each conversation's tools (None for all where ``tools`` is None)."""
    return [None] * len(conversations) if tools is None else tools
