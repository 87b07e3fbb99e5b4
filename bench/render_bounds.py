#!/usr/bin/env python3
"""What the bounded template sandbox costs: ChatRenderer against transformers' own render.

    python bench/render_bounds.py [--conversations 1000] [--repeats 7] [--profile]

with ``FIXED_SFT_SHARED`` (default ``../shared``) and ``FIXED_SFT_PYPI_CACHE`` set as the tests
set them.

Renders the Tulu 3 fixture's 100 conversations (``../shared/data``, repeated to
``--conversations``) and as many seeded tool-calling traces (``tests/tool_conversations.py``,
Qwen3 only) with the pinned GLM-4.7-Flash template and TRL's Qwen3 template, each way best of
``--repeats``: ``ChatRenderer.render_all`` (bounded), ``ChatRenderer.render_with_spans``
(bounded, as ``turns`` renders) and transformers' compiled template
(``_cached_compile_jinja_template``, unbounded, the data made plain as
``render_jinja_template`` does). Times are CPU seconds of this process
(``time.process_time``), so a busy machine moves them less than wall time; the ratios are from
one run. Every render must equal transformers'. Prints one JSON line; with ``--profile``, the
bounded render's top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FIXED_SFT_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    from tool_conversations import tool_conversations

    from real_models import trl_template

    tulu = [
        json.loads(line)["messages"]
        for line in (SHARED / "data" / "tulu-3-sft-mixture-first100.jsonl").open()
    ]
    tulu = (tulu * (args.conversations // len(tulu) + 1))[: args.conversations]
    traces = tool_conversations(7, args.conversations)
    glm = (SHARED / "pinned" / "GLM-4.7-Flash" / "chat_template.jinja").read_text()
    qwen3 = trl_template("qwen3").decode()
    cases = {
        "glm5 tulu": (glm, tulu, None),
        "qwen3 tulu": (qwen3, tulu, None),
        "qwen3 tools": (qwen3, [m for m, _ in traces], [t for _, t in traces]),
    }
    results = {name: measure(*case, args.repeats) for name, case in cases.items()}
    print(json.dumps({"conversations": args.conversations, "cpu_s": results}))
    if args.profile:
        for name, (template, conversations, tools) in cases.items():
            print(f"--- {name}: ChatRenderer.render_all")
            renderer = _renderer(template)
            profiler = cProfile.Profile()
            profiler.runcall(renderer.render_all, conversations, tools=tools)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def _renderer(template: str):
    from builders.formats.render import ChatRenderer

    renderer = ChatRenderer(template)
    renderer.environment()
    return renderer


def measure(template: str, conversations: list, tools: list | None, repeats: int) -> dict:
    """Best CPU seconds of each way, their ratios; every render checked against transformers'."""
    from transformers.utils.chat_template_utils import _cached_compile_jinja_template

    from builders.formats.render import _alias_reasoning_fields, _plain_template_data

    compiled = _cached_compile_jinja_template(template)
    each = tools or [None] * len(conversations)

    def unbounded():
        # as render_jinja_template: the data made plain, the reasoning fields aliased
        return [
            compiled.render(
                messages=_alias_reasoning_fields(_plain_template_data(chat)),
                tools=_plain_template_data(chat_tools),
                documents=None,
                add_generation_prompt=False,
            )
            for chat, chat_tools in zip(conversations, each, strict=True)
        ]

    renderer = _renderer(template)
    ways = {
        "unbounded": unbounded,
        "render_all": lambda: renderer.render_all(conversations, tools=tools),
        "render_with_spans": lambda: renderer.render_with_spans(conversations, tools=tools)[0],
    }
    expected = unbounded()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(repeats):
        # alternately, so a change in the machine's load reaches every way alike
        for name, way in ways.items():
            start = time.process_time()
            rendered = way()
            best[name] = min(best[name], time.process_time() - start)
            if rendered != expected:
                raise SystemExit(f"{name} renders otherwise than transformers")
    ratios = {f"{name}/unbounded": round(best[name] / best["unbounded"], 3) for name in ways}
    del ratios["unbounded/unbounded"]
    return {**{name: round(s, 4) for name, s in best.items()}, **ratios}


if __name__ == "__main__":
    main()
