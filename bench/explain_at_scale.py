#!/usr/bin/env python3
"""``explain`` at recipe scale: how long its search over readings takes.

The search is over the contract's readings.

    # 6,400 rows of 8,192 from 939,343 conversations
    python bench/explain_at_scale.py
    # a smoke run (its results go to bench/.cache)
    python bench/explain_at_scale.py --scale 0.01 --rows 40

On the inputs of bench/build_at_scale.py (laid out once in --cache), with the tokenizer given a
GLM-4-style post-processor (``[gMASK]<sop>``) so that ``encode: add-special`` is a reading of its
own and the search is as large as it gets, it

1. builds the rows under a reading that is not the default (``PINNED``: two row deviations and
   another hash layout), as the recipe's unpublished builder might have;
2. writes a manifest that pins that build's ``rows_sha256`` and its ``supervised_token_ratio`` at
   three decimals (as the recipe card publishes it), and no ``contract:``;
3. runs ``explain`` on it (single and double deviations: the search stops after the level of
   its first match), then ``explain --all`` (every reading), each in a fresh process as users run
   it, recording seconds, peak RSS, what was tried and found, and whether the machine was idle;
4. runs ``explain --writer`` on a manifest pinning a default build's figures (rows found at the
   first reading, then rebuilt and written by every writer variant).

Results: bench/explain_at_scale.json for the full-scale run,
bench/.cache/explain_at_scale.smoke.json for any other.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from builders.fixture.hf_cache import put_snapshot  # noqa: E402
from builders.fixture.tokenizer import with_glm4_post_processor  # noqa: E402
from measure import CLI, IDLE_BUSY, busy, child, scale_options, write_results  # noqa: E402
from scale_inputs import lay_out, manifest_text  # noqa: E402

PINNED = {"order": "numpy-legacy", "mask_rule": "slime-pr1844", "hash": "i8-i8"}
GMASK_REPO = "bench/glm-scale-tokenizer-gmask"


def gmask_tokenizer(hf_home: Path, facts: dict) -> dict:
    """The bench tokenizer with a GLM-4-style post-processor.

    Laid out as a repo of its own.
    """
    import hashlib

    folder = hf_home / "hub" / f"models--{facts['tokenizer_repo'].replace('/', '--')}" / "snapshots"
    base = folder / facts["tokenizer_revision"]
    tokenizer_json = with_glm4_post_processor(
        (base / "tokenizer.json").read_text(encoding="utf-8")
    ).encode()
    files = {
        "tokenizer.json": tokenizer_json,
        "chat_template.jinja": (base / "chat_template.jinja").read_bytes(),
    }
    revision = put_snapshot(hf_home, GMASK_REPO, "model", files)
    return {
        **facts,
        "tokenizer_repo": GMASK_REPO,
        "tokenizer_revision": revision,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
    }


def run(hf_home: Path, *args: str) -> dict:
    load = busy()
    result = child(CLI, *args, "--json", hf_home=hf_home)
    return {**result, "busy_before": round(load, 3)}


def explain(manifest: Path, hf_home: Path, everything: bool) -> dict:
    result = run(
        hf_home, "explain", "--manifest", str(manifest), *(["--all"] if everything else [])
    )
    if result["exit"] not in (0, 5):
        raise SystemExit(f"explain failed: {result['stderr']}")
    found = json.loads(result["stdout"])
    return {
        "seconds": round(result["seconds"], 1),
        "main_peak_rss_mib": round(result["main_peak_rss_mib"]),
        "busy_before": result["busy_before"],
        "exit": result["exit"],
        "tried": found["tried"],
        "readings": found["readings"],
        "matches": [m["deviations"] for m in found["matches"]],
        "ratio_matches": len(found["ratio_matches"]),
        "notes": found["notes"],
    }


def main() -> None:
    args, results, template = scale_options(
        __doc__, "explain_at_scale", "rows of 8,192 tokens the manifest names"
    )
    hf_home = args.cache / "hf"
    started = time.perf_counter()
    facts = gmask_tokenizer(hf_home, lay_out(hf_home, template, args.scale))
    print(f"inputs laid out in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    base = manifest_text(facts, "explainbench", args.rows)
    built = args.cache / "explain-built.yaml"
    built.write_text(base + "contract:\n" + "".join(f"  {k}: {v}\n" for k, v in PINNED.items()))
    out = args.cache / "out" / "explain-built"
    build = run(hf_home, "build", "--manifest", str(built), "--out", str(out), "--no-card")
    if build["exit"] != 0:
        raise SystemExit(f"the build under {PINNED} failed: {build['stderr']}")
    figures = json.loads(build["stdout"])["figures"]
    pinned = args.cache / "explain-pinned.yaml"
    pinned.write_text(
        base + f"expect:\n  rows_sha256: {figures['rows_sha256']}\n"
        f"  supervised_token_ratio: {figures['supervised_token_ratio']:.3f}\n"
    )
    print(
        f"built under {PINNED} in {build['seconds']:.1f} s; explaining", file=sys.stderr, flush=True
    )

    nearest = explain(pinned, hf_home, everything=False)
    print(f"  explain: {nearest['seconds']} s", file=sys.stderr, flush=True)
    everything = explain(pinned, hf_home, everything=True)
    print(f"  explain --all: {everything['seconds']} s", file=sys.stderr, flush=True)

    default = args.cache / "explain-default.yaml"
    default.write_text(base)
    default_out = args.cache / "out" / "explain-default"
    default_build = run(
        hf_home, "build", "--manifest", str(default), "--out", str(default_out), "--no-card"
    )
    default_figures = json.loads(default_build["stdout"])["figures"]
    by_file = args.cache / "explain-writer.yaml"
    by_file.write_text(
        base + f"expect:\n  rows_sha256: {default_figures['rows_sha256']}\n"
        f"  parquet_bytes: {default_figures['parquet_bytes']}\n"
    )
    writer = run(hf_home, "explain", "--manifest", str(by_file), "--writer")
    if writer["exit"] != 0:
        raise SystemExit(f"explain --writer failed: {writer['stderr']}")
    written = json.loads(writer["stdout"])["writers"]
    writer_run = {
        "seconds": round(writer["seconds"], 1),
        "main_peak_rss_mib": round(writer["main_peak_rss_mib"]),
        "busy_before": writer["busy_before"],
        "files": len(written),
        "bytes_matches": [w for w in written if w["bytes_match"]],
        "sizes": sorted({w["parquet_bytes"] for w in written}),
    }
    print(f"  explain --writer: {writer_run['seconds']} s", file=sys.stderr, flush=True)

    loads = [
        build["busy_before"],
        nearest["busy_before"],
        everything["busy_before"],
        writer["busy_before"],
    ]
    summary = {
        "machine": {
            "cores": os.cpu_count(),
            "python": sys.version.split()[0],
            "idle": max(loads) < IDLE_BUSY,
            "cpu_busy_before_each_run": loads,
        },
        "pinned_reading": PINNED,
        "build_seconds": round(build["seconds"], 1),
        "explain": nearest,
        "explain_all": everything,
        "explain_writer": writer_run,
        "found_the_pinned_reading": PINNED in nearest["matches"]
        and PINNED in everything["matches"],
        "scale": args.scale,
        "rows": args.rows,
        "source_conversations": int(facts["dataset_rows"]),
    }
    for name, run_ in (("explain", nearest), ("explain --all", everything)):
        print(
            f"{name:<14} {run_['seconds']:>7} s  peak RSS {run_['main_peak_rss_mib']:>6} MiB  "
            f"{run_['tried']:>5} of {run_['readings']} contracts tried  matches: {run_['matches']}"
        )
    sizes_from = [
        w["writer"] + " " + w["input_ids"] + " " + w["loss_mask"]
        for w in writer_run["bytes_matches"]
    ]
    print(
        f"explain --writer {writer_run['seconds']:>7} s  "
        f"peak RSS {writer_run['main_peak_rss_mib']:>6} MiB  "
        f"{writer_run['files']} files, {len(writer_run['sizes'])} sizes; "
        f"the default build's size from: {sizes_from}"
    )
    print(
        f"the pinned reading {PINNED} found: {summary['found_the_pinned_reading']}; "
        f"build under it: "
        f"{summary['build_seconds']} s"
    )
    print(
        f"machine: {os.cpu_count()} cores, idle "
        f"(other processes below {IDLE_BUSY:.0%} of the CPUs before every run): "
        f"{summary['machine']['idle']} (busy: {', '.join(f'{b:.1%}' for b in loads)})"
    )
    write_results(results, summary)


if __name__ == "__main__":
    main()
