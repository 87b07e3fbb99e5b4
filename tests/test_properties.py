"""Property tests of the builder and the manifest parser.

Random conversations through the builder and the reference give the same tokens and mask; random
manifests never crash the parser with anything but its own error.
"""

import contextlib

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders.errors import ManifestError
from builders.fixture.make import tokenizer_json
from builders.manifest import parse_manifest
from helpers import TEMPLATES, encoder, with_its_eos
from reference import Reference

settings.register_profile(
    "fixed-sft",
    derandomize=True,
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("fixed-sft")

MARKUP = [
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|observation|>",
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<think>",
    "</think>",
    "<tool_response>",
    "\n",
    " ",
    "\t",
    "  \n\n",
]
texts = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(MARKUP)), max_size=6).map("".join)
long_texts = st.builds(lambda t, n: t * n, texts, st.integers(1, 60))


padded = st.builds(
    lambda before, text, after: before + text + after,
    st.sampled_from(["", " ", "\n"]),
    texts,
    st.sampled_from(["", " ", "\n "]),
)


@st.composite
def messages(draw):
    out = []
    roles = draw(
        st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), min_size=1, max_size=6)
    )
    if draw(st.booleans()):
        # often end on an answer after the last user turn: reasoning shows
        roles += ["user", "assistant"]
    for role in roles:
        message = {"role": role, "content": draw(st.one_of(texts, long_texts, padded))}
        if role == "assistant" and draw(st.booleans()):
            message["reasoning_content"] = draw(padded)
        out.append(message)
    return out


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_bytes(tokenizer_json())
    return path


@pytest.mark.parametrize("template", TEMPLATES)
def test_builder_and_reference_agree_on_random_conversations(template, tokenizer_file):
    template = template()
    ours, theirs = encoder(template), Reference(tokenizer_file, template)

    @given(messages())
    def check(conversation):
        (encoded,) = ours.encode([{"index": 0, "id": "random", "messages": conversation}])
        assert with_its_eos(ours, encoded) == theirs.conversation(conversation)

    check()


yaml_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=50)
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "dataset",
                    "tokenizer",
                    "repo",
                    "revision",
                    "split",
                    "sha256",
                    "tokenizer.json",
                    "rows",
                    "chat_template.jinja",
                    "loss_mask",
                    "seed",
                    "row_tokens",
                    "expect",
                    "writer",
                    "x",
                ]
            ),
            children,
            max_size=6,
        ),
    ),
    max_leaves=20,
)


@given(yaml_values)
def test_manifest_parser_fails_only_with_its_own_error_on_structures(document):
    with contextlib.suppress(ManifestError):
        parse_manifest(yaml.safe_dump(document))


@given(st.text(max_size=300))
def test_manifest_parser_fails_only_with_its_own_error_on_text(text):
    with contextlib.suppress(ManifestError):
        parse_manifest(text)
