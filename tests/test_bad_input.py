"""Bad manifests, cards and templates: one named error each, never a traceback.

docs/failures.md. The property tests search for the class of bug: random templates, manifests and
recipe cards may only fail with the project's own errors (a template's with Jinja's
``TemplateError``, which the chat formats turn into exit 4 naming the row).
"""

from __future__ import annotations

from contextlib import suppress

import jinja2
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders.encode.encoder import ConversationEncoder
from builders.errors import BuildError, ManifestError
from builders.formats import RENDER_ARGUMENTS, FormatSpec
from builders.formats.render import ChatRenderer
from builders.inputs.recipe import compare, implied_manifest, read_card
from builders.limits import Limits
from builders.manifest import load_manifest, parse_manifest
from helpers import MANIFESTS, REPO, SELF_CONTAINED, run_cli

CARD = REPO / "tests" / "cards" / f"{SELF_CONTAINED}.yaml"
HUGE = "9" * 100_001
# written as an integer too long to read (safe_dump cannot write one)
LONG_INTEGER = "LONG_INTEGER"
SMALL = Limits(conversation_chars=1000, render_chars=20_000)


def fixture_doc() -> dict:
    return yaml.safe_load((MANIFESTS / f"{SELF_CONTAINED}.yaml").read_text())


def turns_doc() -> dict:
    doc = fixture_doc()
    doc["loss_mask"] = "turns"
    doc["tokenizer"].update(eos="<|endoftext|>", stop=["<|user|>"])
    return doc


# --- integers too long to read


@pytest.mark.parametrize("field", ["seed", "rows", "row_tokens"])
def test_a_manifest_integer_of_100001_digits_is_named(field):
    text = yaml.safe_dump(fixture_doc()).replace(
        f"\n{field}: {fixture_doc()[field]}\n", f"\n{field}: {HUGE}\n"
    )
    with pytest.raises(ManifestError, match=rf": {field}: .*an integer of 100,001 digits"):
        parse_manifest(text)


@pytest.mark.parametrize("command", [["check-recipe"], ["manifest", "--from-recipe"]])
def test_a_card_integer_of_100001_digits_is_exit_2_naming_the_field(tmp_path, command):
    card = tmp_path / "card.yaml"
    card.write_text(CARD.read_text().replace("seed: 42", f"seed: {HUGE}"))
    done = run_cli(*command, str(card))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "workload.dataset.build.seed" in done.stderr and "100,001 digits" in done.stderr


# --- template variables the builder passes itself


@pytest.mark.parametrize("name", RENDER_ARGUMENTS)
@pytest.mark.parametrize("where", ["template_vars", "prefills"])
def test_a_variable_may_not_set_what_the_builder_passes(name, where):
    doc = turns_doc()
    doc["tokenizer"][where] = {name: "x"} if where == "template_vars" else [{}, {name: "x"}]
    named = f"tokenizer.template_vars.{name}" if where == "template_vars" else "prefills"
    with pytest.raises(ManifestError, match=rf"{named}.*passes {name} to the chat template"):
        parse_manifest(yaml.safe_dump(doc))


def test_other_template_variables_are_still_read():
    doc = turns_doc()
    doc["tokenizer"]["template_vars"] = {"enable_thinking": False, "messages_note": "x"}
    manifest = parse_manifest(yaml.safe_dump(doc))
    assert manifest.tokenizer.template_vars == {"enable_thinking": False, "messages_note": "x"}


# --- take


@pytest.mark.parametrize("take", [-5, 0])
def test_take_says_it_must_be_more_than_0(take):
    doc = fixture_doc()
    doc["dataset"]["take"] = take
    with pytest.raises(ManifestError, match=r"dataset\.take: expected a whole number > 0, got"):
        parse_manifest(yaml.safe_dump(doc))


def test_take_beyond_the_pinned_rows_is_a_manifest_error():
    doc = fixture_doc()
    doc["dataset"].update(rows=10, take=11)
    with pytest.raises(ManifestError, match=r"dataset\.take: 11 is more than the dataset's rows"):
        parse_manifest(yaml.safe_dump(doc))


# --- the class of bug: random input


# random templates from a small grammar of Jinja, so that most of them parse; ranges stay
# small, so that no random template loops for long without printing
ATOMS = [
    "messages",
    "m",
    "m.content",
    "m['role']",
    "messages[0]",
    "ns.a",
    "x",
    "loop.index",
    "'x'",
    "'%s'",
    "'{}'",
    "1",
    "-1",
    "0",
    "10**9",
    "None",
    "[]",
    "{}",
    "range(3)",
    "range(10**9)",
    "lipsum(2)",
    "dict(a=1)",
    "cycler(1, 2)",
    "raise_exception('no')",
    "strftime_now('%Y')",
    "f(1)",
    "''.__class__",
]
OPERATORS = [" * ", " + ", " ~ ", " % ", " / ", " // ", " ** ", " and ", " in ", " == "]
FILTERS = [
    "length",
    "join",
    "center(10**9)",
    "tojson",
    "int",
    "first",
    "map('upper')",
    "batch(2)",
    "indent(8)",
    "replace('x', 'y')",
    "dictsort",
    "sum",
    "list",
    "string",
    "trim",
    "items",
]
METHODS = ["split()", "ljust(10**9)", "format(1)", "strip()", "startswith('x')", "get('a')"]

expressions = st.recursive(
    st.sampled_from(ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map("".join),
        st.tuples(inner, st.sampled_from(FILTERS)).map(lambda t: f"{t[0]}|{t[1]}"),
        st.tuples(inner, st.sampled_from(METHODS)).map(lambda t: f"({t[0]}).{t[1]}"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
        inner.map(lambda e: f"({e})"),
    ),
    max_leaves=6,
)
statements = st.recursive(
    st.one_of(
        expressions.map(lambda e: f"{{{{ {e} }}}}"),
        expressions.map(lambda e: f"{{% set x = {e} %}}"),
        expressions.map(lambda e: f"{{% set ns.a = {e} %}}"),
        st.sampled_from(["text\n", "{% include 'x' %}", "{% import 'x' as y %}", "{# c #}"]),
    ),
    lambda body: st.one_of(
        st.tuples(expressions, body).map(lambda t: f"{{% for m in {t[0]} %}}{t[1]}{{% endfor %}}"),
        st.tuples(expressions, body, body).map(
            lambda t: f"{{% if {t[0]} %}}{t[1]}{{% else %}}{t[2]}{{% endif %}}"
        ),
        body.map(lambda b: f"{{% macro f(a) %}}{b}{{% endmacro %}}"),
        st.lists(body, min_size=2, max_size=3).map("".join),
    ),
    max_leaves=5,
)
templates = st.one_of(
    statements.map(lambda s: "{% set ns = namespace(a=1) %}" + s),
    st.text(max_size=60),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=templates)
def test_a_random_template_fails_only_as_a_template_error(template):
    renderer = ChatRenderer(template, render_chars=SMALL.render_chars)
    with suppress(jinja2.TemplateError):
        renderer.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra=statements)
def test_a_random_template_through_the_turns_format_fails_only_as_a_build_error(extra):
    from test_turns import CHATML, fixture_tokenizer

    template = "{% set ns = namespace(a=1) %}" + extra + CHATML
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with suppress(BuildError):
        encoder = ConversationEncoder(
            fixture_tokenizer(),
            FormatSpec("turns", template, "<|endoftext|>", ("<|endoftext|>",), limits=SMALL),
        )
        encoder.encode([{"index": 0, "id": "a", "messages": conversation}])


values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from([LONG_INTEGER, 2**64, -(2**70)]),
        st.floats(),
        st.text(max_size=20),
        st.sampled_from(["2024-07-26", "a" * 40, "b" * 64, "o/r", "train", "*.jsonl", "../x"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _paths(doc, prefix=()):
    """Every key path of a nested mapping."""
    for key, value in doc.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


def _mutated(doc: dict, data) -> dict:
    for _ in range(data.draw(st.integers(1, 3))):
        *parents, last = data.draw(st.sampled_from(sorted(_paths(doc), key=str)))
        node = doc
        for key in parents:
            node = node[key]
        if not isinstance(node, dict):
            continue
        node[last if data.draw(st.booleans()) else data.draw(st.text(max_size=8))] = data.draw(
            values
        )
    return doc


def _yaml(doc: dict) -> str:
    """The YAML of ``doc``, each ``LONG_INTEGER`` written as an integer of 5,001 digits."""
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    return text.replace(LONG_INTEGER, "9" * 5001)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_random_manifest_fails_only_as_a_manifest_error(data):
    doc = _mutated(data.draw(st.sampled_from([fixture_doc, turns_doc]))(), data)
    with suppress(ManifestError):
        parse_manifest(_yaml(doc))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_random_text_as_a_manifest_fails_only_as_a_manifest_error(text):
    with suppress(ManifestError):
        parse_manifest(text)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_random_card_fails_only_as_a_manifest_error(tmp_path_factory, data):
    doc = _mutated(yaml.safe_load(CARD.read_text()), data)
    card = tmp_path_factory.mktemp("card") / "card.yaml"
    card.write_text(_yaml(doc), encoding="utf-8")
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    with suppress(ManifestError):
        read = read_card(card)
        compare(read, manifest)
        implied_manifest(read)
