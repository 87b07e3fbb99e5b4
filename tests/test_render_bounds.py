"""The template sandbox, bounded by ``limits.render_chars``; no exception escapes a render.

docs/failures.md, "Bounds on one conversation". Memory is measured with tracemalloc: a refused
value must be refused before it is made, so a render's peak stays near the limit, never near
what the template asked for.
"""

from __future__ import annotations

import resource
import tracemalloc

import jinja2
import pytest
from transformers.utils.chat_template_utils import (
    _cached_compile_jinja_template,
    _render_with_assistant_indices,
)

from builders.fixture.conversations import hard_cases, synthetic
from builders.fixture.make import FIXTURE_TEMPLATE, tokenizer_json
from builders.formats.render import ChatRenderer
from builders.formats.sandbox import RenderLimitError, TemplateFailure
from builders.messages import normalize_messages
from helpers import lay_out_build, run_cli

HI = [{"role": "user", "content": "hi"}]
LIMIT = 100_000

# each asks for far more than LIMIT characters (most for gigabytes), at once or step by step
RUNAWAYS = [
    "{{ 'x' * 10**9 }}",
    "{{ 'x' * 10**12 }}",
    "{{ 10**9 * 'x' }}",
    "{{ ['x'] * 10**9 }}",
    "{{ 'x'|center(10**9) }}",
    "{{ 'x'.ljust(10**9) }}",
    "{{ 'x'.zfill(10**9) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ 'x'|indent(10**9) }}",
    "{{ '\\t'.expandtabs(10**9) }}",
    "{{ lipsum(10**7) }}",
    "{{ [1]|batch(10**9, 0)|list }}",
    "{{ 'a'|replace('a', 'b' * 99999)|replace('b', 'cccccccccc') }}",
    "{{ (['y' * 50000] * 100)|join }}",
    "{{ (['y' * 50000] * 100)|tojson }}",
    "{{ '%s' % (['y' * 50000] * 100,) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
    "{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}abcdefgh{% endfor %}{% endfor %}",
    "{% macro m() %}{% for i in range(100000) %}{% for j in range(100000) %}abcdefgh"
    "{% endfor %}{% endfor %}{% endmacro %}{{ m()|length }}",
    "{% set x %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}{{ x|length }}",
    "{{ (range(100000)|map('center', 90000)|list)|length }}",
]


@pytest.mark.parametrize("template", RUNAWAYS)
def test_a_runaway_template_is_refused_before_it_takes_the_memory(template):
    renderer = ChatRenderer(template, render_chars=LIMIT)
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitError, match=r"limits\.render_chars \(100,000\)"):
            renderer.render(HI)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # far below what any of them asks for: the limit's worth of values, a few times over
    assert peak < 40 * LIMIT * 4, peak


@pytest.mark.parametrize(
    "template, failure",
    [
        ("{{ range(10**9)|length }}", "OverflowError: Range too big"),
        ("{% include '/etc/passwd' %}", "cannot include, import or extend another template"),
        ("{% extends 'base.html' %}", "cannot include, import or extend another template"),
        ("{% from 'x' import y %}{{ y }}", "cannot include, import or extend another template"),
        ("{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}", "RecursionError"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ 10 ** 5000 }}", "ValueError: Exceeds the limit"),
        ("{{ 'x' * 'y' }}", "TypeError: can't multiply"),
        ("{{ messages|dictsort }}", "AttributeError"),
        ("{{ (1, 2)|sum(start='a') }}", "TypeError"),
        ("{{ raise_exception('no such role') }}", "no such role"),
        ("{% for %}", "Expected an expression"),
    ],
)
def test_every_failure_of_a_render_is_a_template_error(template, failure):
    with pytest.raises(jinja2.TemplateError, match=failure):
        ChatRenderer(template).render(HI)


def test_an_exception_out_of_python_is_carried_with_its_kind():
    with pytest.raises(TemplateFailure, match=r"^RecursionError: "):
        ChatRenderer("{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}").render(HI)


def test_at_the_limit_a_render_prints_in_full():
    text = ChatRenderer("{{ 'x' * 1000 }}{{ messages|length }}", render_chars=1001).render(HI)
    assert text == "x" * 1000 + "1"
    with pytest.raises(RenderLimitError, match="prints more than"):
        ChatRenderer("{{ 'x' * 1000 }}{{ messages|length }}x", render_chars=1001).render(HI)


def conversations() -> list[list[dict]]:
    return [*hard_cases(), *synthetic(5, 30)]


GENERATION_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content|trim }}{% endgeneration %}{% else %}{{ m.content|tojson }}{% endif %}"
    "{% endfor %}{{ (messages|map(attribute='role')|join(', '))|center(40) }}{{ bos }}"
)


@pytest.mark.parametrize(
    "template",
    [FIXTURE_TEMPLATE.read_text(encoding="utf-8"), GENERATION_TEMPLATE],
    ids=["fixture-template", "generation-template"],
)
def test_the_bounded_sandbox_renders_as_transformers_does(template):
    chats = [normalize_messages(m) for m in conversations()]
    own = _cached_compile_jinja_template(template)
    expected = [
        _render_with_assistant_indices(own, chat, None, None, False, bos="<s>") for chat in chats
    ]
    renderer = ChatRenderer(template)
    assert renderer.render_all(chats, {"bos": "<s>"}) == [text for text, _ in expected]
    assert renderer.render_with_spans(chats, {"bos": "<s>"}) == (
        [text for text, _ in expected],
        [spans for _, spans in expected],
    )


def test_a_runaway_template_ends_the_build_with_exit_4_naming_the_row(tmp_path):
    rows = [{"id": f"c{k}", "source": "s", "messages": m} for k, m in enumerate(synthetic(3, 8))]
    manifest = lay_out_build(
        tmp_path,
        rows,
        name="runaway",
        tokenizer_files={
            "tokenizer.json": tokenizer_json(),
            "chat_template.jinja": b"{{ 'x' * 10**12 }}",
        },
    )
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    assert "source row" in done.stderr and "(id 'c" in done.stderr
    assert "chat_template.jinja" in done.stderr
    assert "limits.render_chars (8,000,000)" in done.stderr
    assert not list((tmp_path / "out").glob("*.parquet"))
    # every process this test started, the build's included: far from the 12.9 GB it once took
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 2 * 1024 * 1024
