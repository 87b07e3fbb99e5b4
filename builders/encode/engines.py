"""Tokenizer engines: ``tokenizers`` and ``fastokens``.

``tokenizers`` is the contract's reference, ``fastokens`` a guarded accelerator. Both load the
pinned ``tokenizer.json`` and encode texts with ``add_special_tokens=False``. The fast engine is
never trusted on its word:

- before any row is built, both encode a fixed set of probe strings (every added token, text
  around them, whitespace and newline runs, digits, CJK, emoji, combining marks, the chat
  template's own fragments) and must agree, else ``auto`` falls back to ``tokenizers`` with a
  note and ``fastokens`` is refused;
- while building, every conversation whose source index is a multiple of ``CROSS_CHECK_EVERY``,
  and every one over ``CROSS_CHECK_LONG`` tokens, is encoded by both; a difference stops the
  build (``EngineDisagreement``) before the file reaches its final path.

``rows_sha256`` verification stays the final word.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from builders.errors import EngineDisagreement, UsageError
from builders.versions import package_version

ENGINES = ("auto", "fastokens", "tokenizers")
CROSS_CHECK_EVERY = 64
CROSS_CHECK_LONG = 16_384


class Engine:
    """What encodes texts for a chat format.

    It has ``encode``, and a guard's ``cross_check`` and ``finish`` (an unguarded engine samples
    nothing and has nothing to wait for).
    """

    name: str
    version: str | None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids (``add_special_tokens=False``), int32."""
        raise NotImplementedError

    def cross_check(
        self, texts: list[str], ids: list[np.ndarray], indices: list[int]
    ) -> list[bool]:
        """Which of the encoded ``texts`` the reference encodes too.

        It encodes them beside the build; ``indices`` are their source rows.
        """
        return [False] * len(texts)

    def finish(self) -> None:
        """Wait for the pending cross-checks; raise the first disagreement."""

    def unguarded(self) -> Engine:
        """The engine that encodes, without a guard's cross-checks (this one, unguarded)."""
        return self


class TokenizersEngine(Engine):
    """The reference: ``tokenizers.Tokenizer.encode_batch_fast``.

    It computes no offsets.
    """

    name = "tokenizers"

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.version = package_version("tokenizers")

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [np.array(e.ids, dtype=np.int32) for e in encodings]


class FastokensEngine(Engine):
    """``fastokens.Tokenizer.encode_batch_flat``.

    It gives every text's ids in one buffer, no per-token objects.
    """

    name = "fastokens"

    def __init__(self, tokenizer_json: str):
        import fastokens

        self.tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.version = package_version("fastokens")

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        ids, offsets = self.tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        flat = np.frombuffer(ids, dtype="<u4").astype(np.int32)
        bounds = np.frombuffer(offsets, dtype="<u8").tolist()
        return [flat[a:b] for a, b in itertools.pairwise(bounds)]


class Guarded(Engine):
    """A fast engine whose sampled conversations the reference encodes too.

    The reference encodes them in a thread of its own. ``cross_check`` returns at once; the
    comparisons run beside the build (the reference releases the GIL while it encodes). A
    disagreement is raised by the next ``cross_check`` and, at the latest, by ``finish``, which the
    build calls before its file reaches the final path.
    """

    def __init__(self, fast, reference: TokenizersEngine):
        self.fast, self.reference = fast, reference
        self.name, self.version = fast.name, fast.version
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cross-check")
        self._pending: list[Future] = []

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return self.fast.encode(texts)

    def unguarded(self) -> Engine:
        return self.fast

    def cross_check(
        self, texts: list[str], ids: list[np.ndarray], indices: list[int]
    ) -> list[bool]:
        """Have the reference encode the sampled ones of ``texts``.

        Return which were sampled. ``indices`` are the conversations' source indices.
        """
        self._raise_finished()
        chosen = sampled(ids, indices)
        picked = [k for k, s in enumerate(chosen) if s]
        if picked:
            self.check(
                [texts[k] for k in picked], [ids[k] for k in picked], [indices[k] for k in picked]
            )
        return chosen

    def check(self, texts: list[str], ids: list[np.ndarray], indices: list[int]) -> None:
        """Compare ``ids`` with the reference's encoding of ``texts``.

        The comparison runs beside the build.
        """
        self._pending.append(self._checker.submit(self._compare, texts, ids, indices))

    def finish(self) -> None:
        """Wait for every comparison; raise the first disagreement."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def _raise_finished(self) -> None:
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for future in done:
            future.result()

    def _compare(self, texts: list[str], ids: list[np.ndarray], indices: list[int]) -> None:
        for text_ids, expected, index in zip(
            ids, self.reference.encode(texts), indices, strict=True
        ):
            if not np.array_equal(text_ids, expected):
                common = min(len(text_ids), len(expected))
                differ = np.flatnonzero(text_ids[:common] != expected[:common])
                at = int(differ[0]) if differ.size else common
                raise EngineDisagreement(
                    f"source row {index}: the {self.name} engine's tokens differ from tokenizers' "
                    f"at token {at} ({len(text_ids)} vs {len(expected)} tokens); "
                    f"nothing was written to the final path. "
                    f"Build with --engine tokenizers, and please report the conversation"
                )


def sampled(ids: list[np.ndarray], indices: list[int]) -> list[bool]:
    """Which encoded conversations a guard cross-checks.

    Those whose source index (``indices``) is a multiple of ``CROSS_CHECK_EVERY``, and every one
    over ``CROSS_CHECK_LONG`` tokens.
    """
    return [
        i % CROSS_CHECK_EVERY == 0 or len(t) > CROSS_CHECK_LONG
        for i, t in zip(indices, ids, strict=True)
    ]


@dataclass(frozen=True)
class Choice:
    """The engine a build encodes with, and why.

    ``engine`` is None where the worker processes made their own (each makes the same choice:
    ``builders.encode.worker``).
    """

    name: str
    version: str | None
    requested: str
    note: str | None  # why auto did not use fastokens
    # TokenizersEngine or Guarded, made in this process
    engine: object | None = None

    @classmethod
    def of(cls, engine, requested: str, note: str | None) -> Choice:
        return cls(engine.name, engine.version, requested, note, engine)

    def describe(self) -> str:
        return f"encoding with {self.name} {self.version}" + (
            f" ({self.note})" if self.note else ""
        )

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "requested": self.requested,
            "note": self.note,
        }


def choose(
    requested: str,
    tokenizer: Tokenizer,
    tokenizer_json: str,
    chat_template: str,
    fast: FastokensEngine | None = None,
) -> Choice:
    """The engine for a build.

    ``auto`` uses fastokens when it loads the pinned ``tokenizer.json`` and agrees with tokenizers
    on every probe, else tokenizers (with a note). ``fast``: fastokens loaded already
    (``loading_fast``), else it loads here.
    """
    if requested not in ENGINES:
        raise UsageError(f"unknown engine {requested!r} (known: {', '.join(ENGINES)})")
    reference = TokenizersEngine(tokenizer)
    if requested == "tokenizers":
        return Choice.of(reference, requested, None)
    try:
        fast = fast or FastokensEngine(tokenizer_json)
    except Exception as err:
        # not installed, or cannot load this tokenizer.json
        problem = f"fastokens cannot load the pinned tokenizer.json ({type(err).__name__}: {err})"
        if requested == "fastokens":
            raise UsageError(f"--engine fastokens: {problem}") from err
        return Choice.of(reference, requested, f"{problem}; encoding with tokenizers")
    differing = _disagreements(fast, reference, probes(tokenizer, chat_template))
    if differing:
        problem = (
            f"fastokens and tokenizers encode {len(differing)} probe strings differently (first: "
            f"{differing[0]!r})"
        )
        if requested == "fastokens":
            raise EngineDisagreement(
                f"--engine fastokens: {problem}; build with --engine tokenizers"
            )
        return Choice.of(reference, requested, f"{problem}; encoding with tokenizers")
    return Choice.of(Guarded(fast, reference), requested, None)


class Choosing:
    """The engine of a worker, chosen (``choose``) in a thread while it starts encoding.

    Until then it encodes the plan's sample with ``provisional``: the reference, which gives the
    same tokens (only their lengths count there). The thread (from ``start``) loads the fast
    engine (unless ``fast`` has it loaded already) and runs its probes; ``chosen()`` is called
    when it is done.
    """

    def __init__(
        self,
        requested: str,
        tokenizer: Tokenizer,
        tokenizer_json: str,
        chat_template: str,
        chosen: Callable[[], None],
        fast: FastokensEngine | None = None,
    ):
        self.provisional = TokenizersEngine(tokenizer)
        self._arguments = requested, tokenizer, tokenizer_json, chat_template, fast
        self._chosen = chosen
        self._choice: Future | None = None

    def start(self) -> None:
        """Start the choice in its thread (again: nothing)."""
        if self._choice is None:
            thread = ThreadPoolExecutor(1, thread_name_prefix="engine-choice")
            self._choice = thread.submit(choose, *self._arguments)
            self._choice.add_done_callback(lambda _: self._chosen())
            thread.shutdown(wait=False)

    def done(self) -> bool:
        return self._choice is not None and self._choice.done()

    def result(self) -> Choice:
        """The engine chosen; a refused ``--engine`` raises here."""
        return self._choice.result()


def may_load_fast(requested: str) -> bool:
    """Whether the engine ``requested`` may be fastokens, and fastokens is installed."""
    return requested != "tokenizers" and importlib.util.find_spec("fastokens") is not None


def loading_fast(requested: str, tokenizer_json: str) -> Callable[[], FastokensEngine | None]:
    """Load fastokens in a thread, where ``requested`` may use it; the call returned waits for it.

    The load leaves the GIL as it parses, so it runs beside the caller's own start-up; the caller
    waits for it on every way out (a process must not end while the load runs), and may fork once
    the call returned: its thread has ended. The call gives
    None where ``requested`` is tokenizers, or fastokens is not installed or cannot load (``choose``
    then tries again, and says why).
    """
    loaded: list[FastokensEngine] = []
    if not may_load_fast(requested):
        return lambda: None

    def load() -> None:
        # a failure is choose's to report
        with suppress(Exception):
            loaded.append(FastokensEngine(tokenizer_json))

    thread = threading.Thread(target=load, name="fastokens-load")
    thread.start()

    def result() -> FastokensEngine | None:
        thread.join()
        # the system's thread outlives the join for a moment: gone, the process has one thread
        while os.path.exists(f"/proc/self/task/{thread.native_id}"):
            time.sleep(0.001)
        return loaded[0] if loaded else None

    return result


def _disagreements(fast, reference, texts: list[str]) -> list[str]:
    return [
        text
        for text, a, b in zip(texts, fast.encode(texts), reference.encode(texts), strict=True)
        if not np.array_equal(a, b)
    ]


def probes(tokenizer: Tokenizer, chat_template: str) -> list[str]:
    """Strings on which a second engine must agree with tokenizers.

    It must agree on them before it encodes anything.
    """
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    around = [
        form.format(t=t)
        for t in added
        for form in ("{t}", "x{t}y", " {t} ", "{t}{t}", "\n{t}\n", "{t}  a")
    ]
    whitespace = [
        " ",
        "  ",
        "   x",
        "x   ",
        "\n",
        "\n\n",
        "\n\n\n",
        " \n \n ",
        "\t",
        "\t\t x",
        "\r\n",
        "a\r\n\r\nb",
        "  \n\n  \n",
    ]
    digits = [
        "0",
        "12",
        "123",
        "1234",
        "12345678",
        "3.14159",
        "2026-12-03",
        "1,000,000",
        "x1y22z333",
    ]
    scripts = [
        "東京の天気は？",
        "模型数据训练",
        "안녕하세요 세계",
        "Привет, мир",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "😀🚀",
        "👨‍👩‍👧‍👦",
        "🇯🇵🇫🇷",
        "Cafe\u0301 e\u0301\u0301 n\u0303",
        "ﬁ ½ Ⅻ ｶﾀｶﾅ",
        "\u200b\u200d\ufeff",
    ]
    mixed = [
        "Hello, world! It's 42°C.",
        "def f(x):\n    return x ** 2\n",
        '{"key": [1, 2, {"a": null}]}',
        "<|user|>What does <|assistant|> mean?<|assistant|></think>"
        "It is a role token.<|endoftext|>",
    ]
    fragments = [
        f
        for f in re.split(r"\{%.*?%\}|\{\{.*?\}\}|\{#.*?#\}", chat_template, flags=re.S)
        if f.strip()
    ]
    return around + whitespace + digits + scripts + mixed + fragments + ["".join(fragments)]
