#!/usr/bin/env python3
"""A recipe-scale ``turns`` build against the glm5 build, in one run.

Issue 17, item 8.

    pip install -r bench/requirements.txt
    python bench/turns_at_scale.py                         # full scale: 6,400 rows of 8,192
    python bench/turns_at_scale.py --scale 0.01 --rows 40  # a smoke run (results in bench/.cache)
    git archive main | tar -x -C /tmp/base                 # another commit's builder, then
    python bench/turns_at_scale.py --against /tmp/base     # each build by it and by this one

Inputs (laid out once in --cache, shared with bench/build_at_scale.py): the GLM-scale byte-level BPE
and Tulu-shaped source of bench/scale_inputs.py. The glm5 build renders with the pinned
GLM-4.7-Flash template; the ``turns`` build renders the same source with Qwen3's template (TRL's
copy, fetched by tests/real_models.py) over the same BPE with Qwen's ``<|im_start|>`` and
``<|im_end|>`` added, eos ``<|endoftext|>``, stop ``<|im_end|>`` and ``<|endoftext|>``, prefills
``{}`` and ``{enable_thinking: false}``. Each build runs in a fresh process as users run it
(fastokens engine, one process unless ``--workers`` says, no card); the share of CPU time other
processes used in the 2 seconds before each is recorded. Targets (issue 29, item 4): ``turns``
within 1.3x glm5's time, at most 1.5 GiB RSS.

Writes bench/turns_at_scale.json for a full-scale run, bench/.cache/turns_at_scale.smoke.json
otherwise.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from build_at_scale import build  # noqa: E402

from builders.fixture.hf_cache import put_snapshot  # noqa: E402
from measure import against_option, alternated, compared, scale_options, write_results  # noqa: E402
from scale_inputs import lay_out, manifest_text  # noqa: E402

QWEN_TURN_TOKENS = ["<|im_start|>", "<|im_end|>"]
RSS_TARGET_MIB, TIME_TARGET = 1536, 1.3


def turns_tokenizer(hf_home: Path, facts: dict) -> dict:
    """The GLM-scale BPE with Qwen's turn tokens and Qwen3's template.

    Laid out as a tokenizer repo; returns the manifest's fields.
    """
    from real_models import trl_template, with_tokens

    base = hf_home / "hub" / f"models--{facts['tokenizer_repo'].replace('/', '--')}" / "snapshots"
    tokenizer_json = with_tokens(
        (base / facts["tokenizer_revision"] / "tokenizer.json").read_text(), QWEN_TURN_TOKENS
    )
    files = {"tokenizer.json": tokenizer_json, "chat_template.jinja": trl_template("qwen3")}
    revision = put_snapshot(hf_home, "bench/glm-scale-qwen3-tokenizer", "model", files)
    return {
        "repo": "bench/glm-scale-qwen3-tokenizer",
        "revision": revision,
        "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
        "eos": "<|endoftext|>",
        "stop": ["<|im_end|>", "<|endoftext|>"],
        "prefills": [{}, {"enable_thinking": False}],
    }


def turns_manifest(glm5_manifest: str, tokenizer: dict) -> str:
    """The glm5 manifest with the turns tokenizer and ``loss_mask: turns``."""
    head, rest = glm5_manifest.split("tokenizer:\n", 1)
    rest = rest[rest.index("loss_mask:") :].replace("loss_mask: glm5", "loss_mask: turns")
    return (
        head.replace("name: bench", "name: bench-turns")
        + "tokenizer: "
        + json.dumps(tokenizer)
        + "\n"
        + rest
    )


def builds_of(args, builds: dict, hf_home: Path, started: float, tag: str) -> dict:
    """Each of ``builds`` (name -> manifest), fastokens, ``--workers``, alternately by builder.

    First says how long the inputs took to lay out (since ``started``); outputs go to
    ``OUT/NAME-TAG`` in the inputs' folder.
    """
    print(
        f"inputs laid out in {time.perf_counter() - started:.0f} s; measuring",
        file=sys.stderr,
        flush=True,
    )
    return alternated(
        args,
        builds,
        lambda name, manifest, tree: build(
            manifest,
            args.cache / "out" / f"{name}-{tag}",
            hf_home,
            "fastokens",
            args.workers,
            tree=tree,
        ),
        hf_home,
    )


def with_workers(args, results: Path) -> Path:
    """Where results go: ``--workers`` other than 1 to a file of their own."""
    if args.workers == "1":
        return results
    return results.with_name(results.name.replace(".json", f".workers-{args.workers}.json"))


def main() -> None:
    args, results, template = scale_options(
        __doc__, "turns_at_scale", "rows of 8,192 tokens to build", against_option
    )
    hf_home = args.cache / "hf"
    started = time.perf_counter()
    facts = lay_out(hf_home, template, args.scale)
    glm5 = args.cache / "bench.yaml"
    glm5.write_text(manifest_text(facts, "bench", args.rows))
    turns = args.cache / "bench-turns.yaml"
    turns.write_text(turns_manifest(glm5.read_text(), turns_tokenizer(hf_home, facts)))
    measured = builds_of(args, {"glm5": glm5, "turns": turns}, hf_home, started, "vs")
    results = with_workers(args, results)
    if args.annotate:
        results = results.with_name(results.name.replace(".json", ".annotate.json"))
    summary = {
        **compared(
            measured, ("turns", "Qwen3 template"), ("glm5", ""), TIME_TARGET, RSS_TARGET_MIB
        ),
        "scale": args.scale,
        "rows": args.rows,
    }
    write_results(results, summary)


if __name__ == "__main__":
    main()
