"""The template sandbox, bounded by ``limits.render_chars``; no exception escapes a render.

docs/failures.md, "Bounds on one conversation". Memory is measured with tracemalloc: a refused
value must be refused before it is made, so a render's peak stays near the limit, never near
what the template asked for.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
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
from builders.formats.sandbox import RenderLimitError, TemplateFailure, text_size
from builders.messages import normalize_messages
from helpers import CLI, REPO, cli_env, lay_out_build

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
    "{{ ('x' * 1000).translate({120: 'y' * 1000}) }}",
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
        ("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}", "RecursionError"),
    ],
)
def test_every_failure_of_a_render_is_a_template_error(template, failure):
    with pytest.raises(jinja2.TemplateError, match=failure):
        ChatRenderer(template).render(HI)


def test_an_exception_out_of_python_is_carried_with_its_kind():
    with pytest.raises(TemplateFailure, match=r"^RecursionError: "):
        ChatRenderer("{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}").render(HI)


@pytest.mark.parametrize(
    "template, printed",
    [
        ("{{ 'call 180055512345 {}'.format(10**9) }}", "call 180055512345 1000000000"),
        ("{{ 'call 180055512345 %d' % 10**9 }}", "call 180055512345 1000000000"),
        ("{{ '%s'|format(10**9) }}", "1000000000"),
        ("{{ '{:>5}|%-4d'.format(1) % 2 }}", "    1|2   "),
        ("{{ 2 ** 64 }}", str(2**64)),
    ],
)
def test_numbers_that_are_not_widths_print(template, printed):
    assert ChatRenderer(template, render_chars=LIMIT).render(HI) == printed


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


ATTRIBUTES_TEMPLATE = (
    "{% set ns = namespace(a=1) %}{% for m in messages %}"
    "{{ m.content }}|{{ m.items is defined }}|{{ m.clear is defined }}|{{ m.gone is defined }}|"
    "{{ m.__class__ is defined }}|{{ m.content.strip() }}|{{ m.content.format is defined }}|"
    "{{ 'x{}'.format(m.role) }}|{{ m.content.__class__ is defined }}|"
    "{{ messages.append is defined }}|{{ messages.index(m) }}|{{ loop.index0 }}|"
    "{{ loop.__init__ is defined }}|{{ loop.last }}|{{ loop.gone is defined }}|{{ ns.a }}|"
    "{{ ns.__class__ is defined }}|{{ (1).real }}|{{ (1.5).__class__ is defined }}|"
    "{{ (1, 2).count(1) }}|{{ d.items is defined }}|{{ d.clear is defined }}|{{ d.x }}|"
    "{{ d.update is defined }}|{{ d['items'] }}|{{ d.gone is defined }}|{{ (d.items()|list)[0] }}"
    "{% endfor %}"
)


def test_the_bounded_sandbox_reads_attributes_as_jinjas_sandbox_does():
    """Items, methods, unsafe and missing attributes, of dicts, strings, lists, loops, numbers.

    A dict's key named like one of its methods is the method, as Jinja reads it.
    """
    chats = [normalize_messages(m) for m in conversations()[:6]]
    variables = {"d": {"items": 1, "clear": 2, "x": 3}}
    own = _cached_compile_jinja_template(ATTRIBUTES_TEMPLATE)
    expected = [
        _render_with_assistant_indices(own, chat, None, None, False, **variables)[0]
        for chat in chats
    ]
    assert "|False|" in expected[0] and "|True|" in expected[0]
    assert ChatRenderer(ATTRIBUTES_TEMPLATE).render_all(chats, variables) == expected
    # str.format and format_map read through the sandbox stay sandboxed: no __class__ printed
    for call in ("'{0.__class__}'.format(1)", "'{a.__class__}'.format_map({'a': 1})"):
        assert ChatRenderer(f"{{{{ {call} }}}}|").render(HI) == "|"


# the code the sandbox writes in place of the environment's calls (a dict's item read as an
# attribute, a printed string), and string methods called, inside every kind of block: macros,
# call blocks, recursive and filtered loops, filter and set blocks; printed values of every type
INLINE_TEMPLATE = (
    "{% macro show(m, sep='|') %}{{ m.role }}{{ sep }}{{ m.content }}{{ m.gone }}{% endmacro %}"
    "{% macro wrap() %}[{{ caller() }}]{% endmacro %}"
    "{% for m in messages if m.role != 'system' %}{{ show(m) }}"
    "{{ m.content.split(' ')[0]|upper }}{{ m.content.startswith('W') }}{{ m.role.center(12, '*') }}"
    "{{ '{}!'.format(m.role) }}{{ m.role.count('s', 1) }}"
    "{% call wrap() %}{{ m.role|upper }}{{ m.items is defined }}{{ m.keys()|list }}{% endcall %}"
    "{% filter upper %}{{ m.content[:5] }}{% endfilter %}"
    "{% set block %}{{ m.content|length }}{{ m.tool_calls }}{% endset %}{{ block }}"
    "{{ (m.tool_calls or [{}])[0].function.name if m.tool_calls else m.role }}"
    "{{ 1 }}{{ 2.5 }}{{ none }}{{ [m.role, 3] }}{{ {'k': m.role} }}{{ true }}{{ m }}"
    "{% endfor %}"
    "{% for item in tree recursive %}{{ item.name }}({{ loop(item.children) }}){% endfor %}"
    "{% for t in tools or [] %}{{ t.function.name }}{{ t.function.parameters|tojson }}"
    "{{ t|tojson }}{{ t|tojson(indent=2) }}{{ t|tojson }}{% endfor %}"
    "{{ d.items is number }}{{ d.x }}"
)


def test_the_sandboxs_own_code_renders_as_transformers_does():
    """Items read as attributes and printed values, in every kind of block, as Jinja renders them.

    The same tool list given to several conversations is rebuilt once, as transformers does.
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    chats = [normalize_messages(m) for m in conversations()]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"a": [1, None]}}}]
    tree = [{"name": "a", "children": [{"name": "b", "children": []}]}, {"name": "c"}]
    # a dict's key named as one of its methods is the method
    d = {"items": 1, "x": 2}
    expected, _ = render_jinja_template(
        chats, tools=tools, chat_template=INLINE_TEMPLATE, tree=tree, d=d
    )
    assert "|" in expected[0] and "[USER" in expected[0] and expected[0].endswith("False2")
    rendered = ChatRenderer(INLINE_TEMPLATE).render_all(
        chats, {"tree": tree, "d": d}, tools=[tools] * len(chats)
    )
    assert rendered == expected
    # a tool printed by tojson is measured before it is printed, as every value is
    wide = [{"name": "w" * 60}]
    with pytest.raises(RenderLimitError, match="the filter 'tojson' would make"):
        ChatRenderer("{% for t in tools %}{{ t|tojson }}{% endfor %}", render_chars=100).render(
            HI, wide
        )


def test_template_data_is_rebuilt_as_transformers_rebuilds_it():
    """Plain JSON copied, anything else (a str subclass, a numpy scalar, a tuple) as it does."""
    import enum

    import numpy as np
    from transformers.utils.chat_template_utils import _plain_template_data

    from builders.formats.render import _plain

    class Kind(str, enum.Enum):
        A = "a"

    value = [
        {"a": [1, 2.5, True, None, "s"], 3: {"k": (1, Kind.A)}},
        Kind.A,
        np.int64(7),
        np.bool_(False),
        object(),
    ]

    def typed(v):
        if isinstance(v, dict):
            return {typed(k): typed(i) for k, i in v.items()}
        if isinstance(v, (list, tuple)):
            return (type(v), [typed(i) for i in v])
        return (type(v), v)

    assert typed(_plain(value)) == typed(_plain_template_data(value))
    assert _plain(value) is not value and _plain(value)[0] is not value[0]


class _Mapping(dict):
    """A dict ``text_size`` measures item by item, as it measures any mapping."""


def _item_by_item(value):
    """``value`` with its lists as tuples and its dicts as ``_Mapping``: the same size, slowly."""
    if isinstance(value, list):
        return tuple(_item_by_item(v) for v in value)
    if isinstance(value, dict):
        return _Mapping({k: _item_by_item(v) for k, v in value.items()})
    return value


def test_plain_data_is_measured_as_any_other_value():
    """The plain-data count is the item-by-item count; deep, cyclic or large values end too."""
    rng = random.Random(3)

    def made(depth):
        if depth > 4 or rng.random() < 0.3:
            return rng.choice(["ab", "x" * rng.randint(0, 40), 3, 2**70, True, None, 1.5])
        if rng.random() < 0.5:
            return [made(depth + 1) for _ in range(rng.randint(0, 5))]
        return {str(k) * rng.randint(1, 3): made(depth + 1) for k in range(rng.randint(0, 5))}

    for _ in range(500):
        value, limit = made(0), rng.choice([10, 100, 10**6])
        assert text_size(value, limit) == text_size(_item_by_item(value), limit)
    deep, cyclic = [], [1]
    for _ in range(10_000):
        deep = [deep]
    cyclic.append(cyclic)
    assert text_size(deep, 10**6) == 5 * 10_001
    assert 10 < text_size(cyclic, 10**6) < 100
    # the count stops past the limit, far below the 52 M characters of the whole
    assert text_size([["y" * 50] * 1000] * 1000, 1000) < 10**5


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
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        build = subprocess.Popen(
            [sys.executable, str(CLI), "--manifest", str(manifest), "--out", str(tmp_path / "out")],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=cli_env(tmp_path),
            cwd=REPO,
        )
        # the build's own usage (its workers' included), whatever else this process started
        _, status, usage = os.wait4(build.pid, 0)
        build.returncode = os.waitstatus_to_exitcode(status)
    text = stderr.read_text()
    assert build.returncode == 4, text
    assert "Traceback" not in text
    assert "source row" in text and "(id 'c" in text
    assert "chat_template.jinja" in text
    assert "limits.render_chars (8,000,000)" in text
    assert not list((tmp_path / "out").glob("*.parquet"))
    # far from the 12.9 GB it once took (ru_maxrss in KiB)
    assert usage.ru_maxrss < 2 * 1024 * 1024


@pytest.mark.parametrize("loss_mask", ["glm5", "hf-generation", "turns"])
@pytest.mark.parametrize(
    "template", ["{% for %}", "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}"], ids=["syntax", "deep"]
)
def test_a_template_that_cannot_compile_is_refused_before_any_work(loss_mask, template):
    from tokenizers import Tokenizer

    from builders.errors import PinnedInputError
    from builders.formats import FormatSpec, format_class

    spec = FormatSpec(loss_mask, template, "<|endoftext|>", ("<|endoftext|>",))
    with pytest.raises(PinnedInputError, match=r"\(chat_template\.jinja\) is not valid Jinja"):
        format_class(loss_mask).check_inputs(spec, Tokenizer.from_str(tokenizer_json().decode()))
