#!/usr/bin/env python3
"""The builder at recipe scale against its floors, in one run.

    pip install -r bench/requirements.txt
    # full scale: 939,343 conversations, 6,400 rows of 8,192
    python bench/build_at_scale.py
    # a smoke run (its results go to bench/.cache)
    python bench/build_at_scale.py --scale 0.01 --rows 40
    python bench/build_at_scale.py --workers 1,2,4,8,16 --engines fastokens --profile

It lays out (once, in --cache) a GLM-scale tokenizer with the pinned chat template and a
Tulu-shaped source (bench/scale_inputs.py), then measures, each build in a fresh process as
users run it (``generate_fixed_sft.py --manifest M``), on an otherwise idle machine (the share of
CPU time other processes used in the 2 seconds before each measurement is recorded, and the run
says whether the machine was idle):

- the build with each engine (``--engines``, default fastokens,tokenizers) and each worker count
  (``--workers``, default 1,2; ``auto`` is the builder's own choice): seconds, the CPU of the main
  process and of its workers (``getrusage`` SELF and CHILDREN), the main process's share of it,
  cores busy (CPU / seconds), peak RSS (the main process; and the largest worker), rows_sha256,
  which must be the same for all;
- with ``--profile`` (needs py-spy), each build once more under py-spy: the main process's CPU by
  stage (bench/stages.py: source decode, hand-off to and from workers, the guard's cross-check,
  placement and masking, hashing, the parquet writer, ...);
- the tokenizer floor: ``tokenizers.Tokenizer.encode_batch_fast`` of exactly the rendered texts of
  the conversations the build consumed, on the same cores (the fastest way tokenizers encodes);
- the source-decode floor: one pyarrow pass over the ``messages`` column of every shard;
- a whole-source build at a quarter of the scale (every conversation consumed) and its cost per
  consumed conversation, against the 6,400-row build's;
- a naive baseline on a sample: per-message ``apply_chat_template`` masking, as miles'
  ``MultiTurnLossMaskGenerator`` does, extrapolated to the same conversations.

It prints a table and writes JSON: bench/build_at_scale.json for a full-scale run with the
default rows, bench/.cache/build_at_scale.smoke.json for any other run (a smoke run never
overwrites the committed results).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from measure import CLI, IDLE_BUSY, busy, child, scale_options, write_results  # noqa: E402
from scale_inputs import lay_out, manifest_text  # noqa: E402
from stages import profiled  # noqa: E402

TOKENIZER_FLOOR = """
import json, sys, time
from builders.formats.render import ChatRenderer
from builders.messages import normalize_messages
from builders.manifest import load_manifest
from builders.rows.order import permutation
from builders.inputs.pinned import Hub, pinned_inputs
manifest = load_manifest(sys.argv[1])
pinned, source = pinned_inputs(manifest, Hub())
rows = source.take(permutation(manifest.seed, source.num_rows)[:int(sys.argv[2])]).to_pylist()
renderer = ChatRenderer(pinned.chat_template, pinned.spec.render_date)
texts = [renderer.render(normalize_messages(row["messages"])) for row in rows]
started = time.perf_counter()
encodings = pinned.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
seconds = time.perf_counter() - started
tokens = sum(len(e.ids) for e in encodings)
print(json.dumps({"seconds": seconds, "tokens": tokens, "conversations": len(texts)}))
"""

DECODE_FLOOR = """
import json, sys, time
import pyarrow.parquet as pq
from builders.manifest import load_manifest
from builders.inputs.pinned import Hub, dataset_files, resolve
manifest = load_manifest(sys.argv[1])
files = dataset_files(manifest.dataset, resolve(manifest, Hub()).datasets[0])
started = time.perf_counter()
rows = sum(pq.read_table(path, columns=["messages"]).num_rows for _, path in files)
print(json.dumps({"seconds": time.perf_counter() - started, "rows": rows}))
"""

NAIVE = """
import json, sys, time
from transformers import PreTrainedTokenizerFast
from builders.messages import normalize_messages
from builders.manifest import load_manifest
from builders.rows.order import permutation
from builders.inputs.pinned import Hub, open_source, resolve
manifest = load_manifest(sys.argv[1])
snapshots = resolve(manifest, Hub())
tok = PreTrainedTokenizerFast(
    tokenizer_file=str(snapshots.tokenizer / "tokenizer.json"),
    chat_template=(snapshots.tokenizer / "chat_template.jinja").read_text(),
)
source = open_source(manifest, snapshots)
rows = source.take(permutation(manifest.seed, source.num_rows)[:int(sys.argv[2])]).to_pylist()
prefix = len(tok.apply_chat_template([{"role": "user", "content": ""}], tokenize=True)) - 1
started = time.perf_counter()
for row in rows:
    ids, mask = [], []
    for i, message in enumerate(normalize_messages(row["messages"])):
        piece = tok.apply_chat_template([message], tokenize=True)
        piece = piece["input_ids"] if hasattr(piece, "keys") else piece
        piece = piece if i == 0 else piece[prefix:]
        ids += piece
        mask += [int(message["role"] == "assistant")] * len(piece)
print(json.dumps({"seconds_per_conversation": (time.perf_counter() - started) / len(rows)}))
"""


def build(
    manifest: Path,
    out: Path,
    hf_home: Path,
    engine: str,
    workers: str,
    profile: bool = False,
    tree: Path = REPO,
) -> dict:
    load = busy()
    command = (
        "--manifest",
        str(manifest),
        "--out",
        str(out),
        "--engine",
        engine,
        "--workers",
        workers,
        "-q",
        "--no-card",
    )
    result = child(CLI, *command, hf_home=hf_home, tree=tree)
    if result["exit"] != 0:
        raise SystemExit(f"build failed: {result['stderr']}")
    report = json.loads(next(out.glob("*.report.json")).read_text())
    cpu = result["main_cpu_s"] + result["workers_cpu_s"]
    measured = {
        "engine": engine,
        "workers": workers,
        "workers_used": report["workers"],
        "busy_before": round(load, 3),
        "seconds": round(result["seconds"], 2),
        "main_cpu_s": round(result["main_cpu_s"], 2),
        "workers_cpu_s": round(result["workers_cpu_s"], 2),
        "main_cpu_share": round(result["main_cpu_s"] / cpu, 3),
        "cores_busy": round(cpu / result["seconds"], 2),
        "main_peak_rss_mib": round(result["main_peak_rss_mib"]),
        "gc_full_passes": result["gc_full_passes"],
        "gc_full_s": round(result["gc_full_s"], 2),
        "worker_peak_rss_mib": round(result["worker_peak_rss_mib"]),
        "conversations": report["stats"]["conversations_consumed"],
        "tokens": report["figures"]["rows"] * report["figures"]["row_tokens"],
        "rows_sha256": report["figures"]["rows_sha256"],
        "cross_checked": report["engine"]["conversations_cross_checked"],
        "source_reading": report["source_reading"],
        "timings": report["timings"],
    }
    # once more, under py-spy: the main process's CPU by stage (not timed: the sampler costs CPU)
    if profile:
        spied = child(CLI, *command, hf_home=hf_home, run=profiled)
        measured["profiled_main_cpu_s"] = round(spied["main_cpu_s"], 2)
        measured["main_cpu_by_stage_s"] = {
            stage: round(share * spied["main_cpu_s"], 2)
            for stage, share in spied["stage_shares"].items()
            if share
        }
    return measured


def whole_source_rows(manifest: Path, out: Path, hf_home: Path) -> int:
    """How many rows the whole source makes.

    A build asked for too many says how far it got.
    """
    probe = child(
        CLI, "--manifest", str(manifest), "--out", str(out), "-q", "--no-card", hf_home=hf_home
    )
    found = re.search(r"(\d+) of \d+ rows", probe["stderr"])
    if probe["exit"] != 4 or not found:
        raise SystemExit(f"the whole-source probe did not run out as expected: {probe['stderr']}")
    return int(found.group(1))


def options(parser) -> None:
    parser.add_argument(
        "--workers",
        type=lambda text: text.split(","),
        default=["1", "2"],
        help="worker counts to build with, comma-separated (auto: the builder's choice); "
        "default 1,2",
    )
    parser.add_argument(
        "--engines",
        type=lambda text: text.split(","),
        default=["fastokens", "tokenizers"],
        help="engines to build with, comma-separated; default fastokens,tokenizers",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run each build once more under py-spy: the main process's CPU by stage",
    )


def main() -> None:
    args, results, template = scale_options(
        __doc__, "build_at_scale", "rows of 8,192 tokens to build", options
    )
    hf_home = args.cache / "hf"
    started = time.perf_counter()
    facts = lay_out(hf_home, template, args.scale)
    quarter = lay_out(hf_home, template, args.scale / 4)
    print(
        f"inputs laid out in {time.perf_counter() - started:.0f} s; measuring",
        file=sys.stderr,
        flush=True,
    )

    manifest = args.cache / "bench.yaml"
    manifest.write_text(manifest_text(facts, "bench", args.rows))
    builds = []
    for workers in args.workers:
        for engine in args.engines:
            builds.append(
                build(
                    manifest,
                    args.cache / "out" / f"{engine}-{workers}",
                    hf_home,
                    engine,
                    workers,
                    args.profile,
                )
            )
            print(
                f"  {engine}, {workers} worker(s): {builds[-1]['seconds']} s",
                file=sys.stderr,
                flush=True,
            )
    consumed = builds[0]["conversations"]
    tokenizer_floor = child(TOKENIZER_FLOOR, str(manifest), str(consumed), hf_home=hf_home)
    decode_floor = child(DECODE_FLOOR, str(manifest), hf_home=hf_home)
    naive = child(NAIVE, str(manifest), "300", hf_home=hf_home)

    whole_manifest = args.cache / "bench-whole.yaml"
    whole_manifest.write_text(manifest_text(quarter, "benchwhole", 10**9))
    rows = whole_source_rows(whole_manifest, args.cache / "out" / "whole-probe", hf_home)
    whole_manifest.write_text(manifest_text(quarter, "benchwhole", rows))
    whole = build(
        whole_manifest, args.cache / "out" / "whole", hf_home, args.engines[0], args.workers[0]
    )
    print(
        f"  whole source ({quarter['dataset_rows']} conversations, {rows} rows): "
        f"{whole['seconds']} s",
        file=sys.stderr,
        flush=True,
    )

    best = builds[0]
    per_conversation = {
        "rows_build_ms": round(1000 * best["seconds"] / best["conversations"], 3),
        "whole_source_ms": round(1000 * whole["seconds"] / whole["conversations"], 3),
    }
    loads = [b["busy_before"] for b in [*builds, whole]]
    summary = {
        "machine": {
            "cores": os.cpu_count(),
            "python": sys.version.split()[0],
            "idle": max(loads) < IDLE_BUSY,
            "cpu_busy_before_each_build": loads,
        },
        "tokenizer_floor_seconds": round(tokenizer_floor["seconds"], 2),
        "tokenizer_floor_tokens": tokenizer_floor["tokens"],
        "decode_floor_seconds": round(decode_floor["seconds"], 2),
        "build_over_tokenizer_floor": {
            f"{b['engine']}-{b['workers']}": round(b["seconds"] / tokenizer_floor["seconds"], 3)
            for b in builds
        },
        "build_over_decode_floor": {
            f"{b['engine']}-{b['workers']}": round(b["seconds"] / decode_floor["seconds"], 2)
            for b in builds
        },
        "same_rows": len({b["rows_sha256"] for b in builds}) == 1,
        "naive_seconds_estimated": round(naive["seconds_per_conversation"] * consumed, 1),
        "naive_over_build": round(
            naive["seconds_per_conversation"] * consumed / best["seconds"], 1
        ),
        "whole_source": {
            "conversations": whole["conversations"],
            "rows": rows,
            "seconds": whole["seconds"],
            "main_peak_rss_mib": whole["main_peak_rss_mib"],
            "source_reading": whole["source_reading"],
        },
        "cost_per_consumed_conversation": {
            **per_conversation,
            "whole_over_rows_build": round(
                per_conversation["whole_source_ms"] / per_conversation["rows_build_ms"], 2
            ),
        },
        "scale": args.scale,
        "rows": args.rows,
        "source_conversations": int(facts["dataset_rows"]),
    }
    print(
        f"\n{'engine':<11} {'workers':>7} {'seconds':>8} {'× tok floor':>11} "
        f"{'× decode floor':>14} "
        f"{'main CPU':>8} {'workers CPU':>11} {'main share':>10} {'cores busy':>10} "
        f"{'RSS MiB':>8} {'worker RSS':>10} {'cross-checked':>13}  rows_sha256"
    )
    for b in builds:
        workers = (
            b["workers"]
            if b["workers"] == str(b["workers_used"])
            else f"{b['workers']}={b['workers_used']}"
        )
        print(
            f"{b['engine']:<11} {workers:>7} {b['seconds']:>8} "
            f"{b['seconds'] / tokenizer_floor['seconds']:>11.3f} "
            f"{b['seconds'] / decode_floor['seconds']:>14.2f} "
            f"{b['main_cpu_s']:>8} {b['workers_cpu_s']:>11} {b['main_cpu_share']:>10.1%} "
            f"{b['cores_busy']:>10} "
            f"{b['main_peak_rss_mib']:>8} {b['worker_peak_rss_mib'] or '-':>10} "
            f"{b['cross_checked']:>13}  "
            f"{b['rows_sha256'][:16]}"
        )
    if args.profile:
        print(
            "\nthe main process's CPU seconds by stage "
            "(a second run of each build: its CPU time split by the shares of py-spy's samples):"
        )
        names = list(dict.fromkeys(stage for b in builds for stage in b["main_cpu_by_stage_s"]))
        print(
            f"{'stage':<30} "
            + " ".join(f"{b['engine'][:4] + '-' + b['workers']:>10}" for b in builds)
        )
        for name in names:
            print(
                f"{name:<30} "
                + " ".join(f"{b['main_cpu_by_stage_s'].get(name, 0):>10}" for b in builds)
            )
        print(
            f"{'(main CPU of that run)':<30} "
            + " ".join(f"{b['profiled_main_cpu_s']:>10}" for b in builds)
        )
    print(
        f"\ntokenizer floor (encode_batch_fast of the {consumed:,} consumed conversations' texts, "
        f"{tokenizer_floor['tokens']:,} tokens): {tokenizer_floor['seconds']:.2f} s; "
        f"source-decode floor (messages column of every shard): {decode_floor['seconds']:.2f} s; "
        f"same rows for every engine and worker count: "
        f"{summary['same_rows']}"
    )
    print(
        f"whole source: {whole['conversations']:,} conversations into {rows:,} rows "
        f"in {whole['seconds']} s, "
        f"{per_conversation['whole_source_ms']} ms per conversation "
        f"against {per_conversation['rows_build_ms']} ms "
        f"({summary['cost_per_consumed_conversation']['whole_over_rows_build']}×), peak RSS "
        f"{whole['main_peak_rss_mib']} MiB"
    )
    print(
        f"naive per-message apply_chat_template masking: "
        f"~{summary['naive_seconds_estimated']} s for the same conversations, "
        f"{summary['naive_over_build']}× the build"
    )
    print(
        f"machine: {os.cpu_count()} cores, idle "
        f"(other processes below {IDLE_BUSY:.0%} of the CPUs before every build): "
        f"{summary['machine']['idle']} (busy: {', '.join(f'{b:.1%}' for b in loads)})"
    )
    write_results(results, {"builds": builds, "summary": summary})


if __name__ == "__main__":
    main()
