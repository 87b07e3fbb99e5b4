#!/usr/bin/env python3
"""A recipe-scale build of synthetic tool-calling traces against a ``turns`` build, in one run.

Issue 26, item 6.

    pip install -r bench/requirements.txt
    python bench/tools_at_scale.py                         # full scale: 6,400 rows of 8,192
    python bench/tools_at_scale.py --scale 0.01 --rows 40  # a smoke run (results in bench/.cache)
    python bench/tools_at_scale.py --against /tmp/base     # and by another commit's builder

Both builds are ``loss_mask: turns`` with Qwen3's template (TRL's copy) over the GLM-scale byte-
level BPE with Qwen's turn tokens (bench/turns_at_scale.py's tokenizer), the same rows of the same
length, so the same token count. The baseline builds the Tulu-shaped source of
bench/scale_inputs.py; the tool build, parquet shards of tool-calling traces: the structure of
tests/tool_conversations.py (one to three tools, one to three steps of one to three calls, their
results, reasoning, a final answer), with the user's question, each tool result and the final
answer drawn from bench/scale_inputs.py's word pool at Tulu-like lengths (``--dense`` keeps the
generator's short texts: the most structure per token); arguments stored as JSON strings and the
tools as a JSON-string column, read under ``dataset.tools`` and ``arguments: object``: every row's
calls are parsed, checked for injected markup, marked and aligned for the completeness check, and
answers after tool results are found by the tool probe. Each build runs in a fresh process as users
run it (fastokens engine, one process unless ``--workers`` says, no card); the share of CPU time
other processes used in the 2 seconds before each is recorded. Targets: the tool build within
1.5x the ``turns`` build's time, at most 1.5 GiB RSS.

Writes bench/tools_at_scale.json for a full-scale run, bench/.cache/tools_at_scale.smoke.json
otherwise (``tools_at_scale.dense`` for ``--dense`` runs).
"""

from __future__ import annotations

import io
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from turns_at_scale import builds_of, turns_manifest, turns_tokenizer, with_workers  # noqa: E402

from builders.fixture.hf_cache import put_snapshot  # noqa: E402
from measure import against_option, compared, scale_options, write_results  # noqa: E402
from scale_inputs import _cut, lay_out, manifest_text, word_pool  # noqa: E402

RSS_TARGET_MIB, TIME_TARGET = 1536, 1.5
# tool conversations at full scale (about 80 M tokens: more than 6,400 rows of 8,192 consume)
FULL_CONVERSATIONS = 200_000
SHARDS = 8


def tool_source(hf_home: Path, scale: float, pool: str | None) -> dict:
    """Parquet shards of tool-calling traces, laid out once; the dataset pin's fields.

    ``pool``: the word pool the question, the results and the final answer are drawn from (None:
    the generator's short texts).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tool_conversations import tool_conversation

    total = max(2_000, round(FULL_CONVERSATIONS * scale))
    kind = "dense" if pool is None else "pooled"
    marker = hf_home / f"tools-layout-{kind}-{total}.json"
    if marker.exists():
        return json.loads(marker.read_text())
    rng, lengths = random.Random(26), np.random.default_rng(26)
    files = {}
    bounds = [total * s // SHARDS for s in range(SHARDS + 1)]
    for s in range(SHARDS):
        rows = []
        for k in range(bounds[s], bounds[s + 1]):
            messages, tools = tool_conversation(rng)
            if pool is not None:
                _with_pool_texts(messages, pool, lengths)
            for message in messages:
                for call in message.get("tool_calls", []):
                    call["function"]["arguments"] = json.dumps(
                        call["function"]["arguments"], ensure_ascii=False
                    )
            rows.append(
                {
                    "id": f"tools_{k}",
                    "messages": json.dumps(messages, ensure_ascii=False),
                    "tools": json.dumps(tools, ensure_ascii=False),
                }
            )
        table = pa.Table.from_pylist(rows)
        # messages as a list of structs, as a dataset on the Hub stores them
        table = table.set_column(1, "messages", pa.array([json.loads(r["messages"]) for r in rows]))
        buffer = io.BytesIO()
        pq.write_table(table, buffer, row_group_size=1000)
        files[f"data/train-{s:05d}-of-{SHARDS:05d}.parquet"] = buffer.getvalue()
    revision = put_snapshot(hf_home, f"bench/tool-traces-{kind}-{total}", "dataset", files)
    pin = {
        "repo": f"bench/tool-traces-{kind}-{total}",
        "revision": revision,
        "split": "train",
        "rows": total,
        "tools": "tools",
    }
    marker.write_text(json.dumps(pin))
    return pin


def _with_pool_texts(messages: list[dict], pool: str, lengths) -> None:
    """The first question, each non-empty tool result and the final answer drawn from ``pool``.

    Lengths in characters as bench/scale_inputs.py draws a Tulu-shaped user's and answer's.
    """
    user = next(m for m in messages if m["role"] == "user")
    user["content"] = _cut(pool, lengths, lengths.lognormal(6.2, 1.0))
    for message in messages:
        if message["role"] == "tool" and message["content"]:
            message["content"] = _cut(pool, lengths, lengths.lognormal(6.2, 1.0))
    final = next(m for m in reversed(messages) if m["role"] == "assistant")
    final["content"] = _cut(pool, lengths, lengths.lognormal(7.1, 0.8))


def tools_manifest(turns_text: str, pin: dict) -> str:
    """The turns manifest reading the tool traces instead of the Tulu-shaped source."""
    head, rest = turns_text.split("dataset:", 1)
    rest = rest[rest.index("tokenizer:") :]
    return (
        head.replace("name: bench-turns", "name: bench-tools")
        + "dataset: "
        + json.dumps(pin)
        + "\n"
        + rest
    )


def main() -> None:
    def options(parser) -> None:
        parser.add_argument(
            "--dense", action="store_true", help="the generator's short texts, no word pool"
        )
        against_option(parser)

    args, results, template = scale_options(
        __doc__, "tools_at_scale", "rows of 8,192 tokens to build", options
    )
    hf_home = args.cache / "hf"
    started = time.perf_counter()
    facts = lay_out(hf_home, template, args.scale)
    glm5 = manifest_text(facts, "bench", args.rows)
    turns = args.cache / "bench-turns.yaml"
    turns.write_text(turns_manifest(glm5, turns_tokenizer(hf_home, facts)))
    tools = args.cache / "bench-tools.yaml"
    if args.dense:
        results = results.with_name(results.name.replace("tools_at_scale", "tools_at_scale.dense"))
    pool = None
    if not args.dense:
        snapshot = hf_home / "hub" / "models--bench--glm-scale-tokenizer" / "snapshots"
        pool = word_pool((snapshot / facts["tokenizer_revision"] / "tokenizer.json").read_text())
    tools.write_text(tools_manifest(turns.read_text(), tool_source(hf_home, args.scale, pool)))
    measured = builds_of(args, {"turns": turns, "tools": tools}, hf_home, started, "tc")
    results = with_workers(args, results)
    if args.annotate:
        results = results.with_name(results.name.replace(".json", ".annotate.json"))
    summary = {
        **compared(
            measured,
            ("tools", "tool traces"),
            ("turns", "Tulu-shaped"),
            TIME_TARGET,
            RSS_TARGET_MIB,
        ),
        "scale": args.scale,
        "rows": args.rows,
        "traces": "dense" if args.dense else "pooled",
    }
    if not args.annotate:
        report = args.cache / "out" / "tools-tc" / "bench-tools.report.json"
        summary["tool_calls"] = json.loads(report.read_text())["stats"]["tool_calls"]
    write_results(results, summary)


if __name__ == "__main__":
    main()
