"""Rendering conversations with a pinned chat template.

Rendering is transformers' own (the steps of ``render_jinja_template``: sandboxed Jinja with
``trim_blocks`` and ``lstrip_blocks``), as ``apply_chat_template(messages, tools=...,
tokenize=False)`` renders; a chat format passes the variables it pins, and each conversation's
tools (None: no tools).
"""

from __future__ import annotations

import os
from datetime import datetime

# transformers advises at import that "PyTorch was not found": rendering a template needs no torch
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
from transformers.utils.chat_template_utils import (
    _cached_compile_jinja_template,
    _render_with_assistant_indices,
)

try:
    # the message normalization of transformers 5.23 and later (the lock's)
    from transformers.utils.chat_template_utils import _alias_reasoning_fields, _plain_template_data
except ImportError:
    # earlier releases (miles' pinned 5.12.1) render the messages as they are given

    def _alias_reasoning_fields(messages):
        return messages

    def _plain_template_data(data):
        return data


class ChatRenderer:
    """Renders conversations with one chat template.

    It renders as ``apply_chat_template`` does. The template is compiled by transformers into an
    environment of its own, so that ``strftime_now`` can print ``render_date`` (ISO text) instead of
    the clock; without one it is transformers' own. Variables (special-token strings, a manifest's
    ``template_vars``) reach the template as ``apply_chat_template``'s keyword arguments do.
    """

    def __init__(self, chat_template: str, render_date: str | None = None):
        self.chat_template = chat_template
        self.render_date = render_date
        self._compiled = None

    def environment(self):
        return self._template().environment

    def _template(self):
        if self._compiled is None:
            # uncached: a fresh environment
            compiled = _cached_compile_jinja_template(self.chat_template)
            if self.render_date is not None:
                compiled.globals["strftime_now"] = datetime.fromisoformat(self.render_date).strftime
            self._compiled = compiled
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
        template = self._template()
        kwargs = _plain_template_data(variables or {})
        return [
            template.render(
                messages=_alias_reasoning_fields(_plain_template_data(chat)),
                tools=_plain_template_data(chat_tools),
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
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
        ``apply_chat_template(..., return_assistant_tokens_mask=True)`` records them.
        """
        template = self._template()
        kwargs = _plain_template_data(variables or {})
        rendered = [
            _render_with_assistant_indices(
                template,
                _alias_reasoning_fields(_plain_template_data(chat)),
                _plain_template_data(chat_tools),
                None,
                False,
                **kwargs,
            )
            for chat, chat_tools in zip(conversations, _each(tools, conversations), strict=True)
        ]
        return [text for text, _ in rendered], [spans for _, spans in rendered]


def _each(tools: list | None, conversations: list) -> list:
    """Each conversation's tools (None for all where ``tools`` is None)."""
    return [None] * len(conversations) if tools is None else tools
