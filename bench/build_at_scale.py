#!/usr/bin/env python3
"""The builder at recipe scale against the tokenizer floor, in one run.

    pip install -r bench/requirements.txt
    python bench/build_at_scale.py                      # full scale: 939,343 conversations, 6,400 rows
    python bench/build_at_scale.py --scale 0.05 --rows 400 800   # a quick run

It lays out (once, in --cache) a GLM-scale tokenizer with the pinned chat template and a
Tulu-shaped source (bench/scale_inputs.py), then measures, each build in a fresh process as
users run it (``generate_fixed_sft.py --manifest M --workers N``):

- build time, tokens/s and peak RSS (the main process; and the largest worker) at 6,400 rows
  with 1 and 2 workers, at 800, 1,600 and 3,200 rows, and from a source a quarter the size;
- the floor: ``tokenizers.Tokenizer.encode_batch`` of exactly the rendered texts of the
  conversations the 6,400-row build consumed, on the same cores;
- a naive baseline on a sample: per-message ``apply_chat_template`` masking, as miles'
  ``MultiTurnLossMaskGenerator`` does, extrapolated to the same conversations;
- rows_sha256 of every build, and whether it is the prefix of the 6,400-row build's rows.

It prints a table and writes it as JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale_inputs import lay_out, manifest_text  # noqa: E402

from builders.build import permutation  # noqa: E402
from builders.chat import ChatRenderer, normalize_messages  # noqa: E402
from builders.figures import RowFigures  # noqa: E402
from builders.fixture.make import PINNED_TEMPLATE, shared_dir  # noqa: E402
from builders.manifest import load_manifest  # noqa: E402
from builders.pinned import Hub, dataset_files, load_pinned_tokenizer, resolve  # noqa: E402
from builders.rows import RowReader  # noqa: E402
from builders.source import ParquetSource  # noqa: E402

CHILD = """
import json, resource, sys, time
sys.argv = ["generate_fixed_sft.py", *sys.argv[1:]]
from builders.cli import main
started = time.perf_counter()
code = main()
elapsed = time.perf_counter() - started
print(json.dumps({"exit": code, "seconds": elapsed,
                  "main_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def run_build(manifest: Path, out: Path, hf_home: Path, workers: int) -> dict:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, "--manifest", str(manifest), "--out", str(out),
                           "--workers", str(workers), "-q", "--no-card"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"build failed: {done.stderr}")
    measured = json.loads(lines[-1])
    report = json.loads((out / f"{load_manifest(manifest).name}.report.json").read_text())
    return {**measured, "rows_sha256": report["figures"]["rows_sha256"],
            "conversations": report["stats"]["conversations_consumed"],
            "tokens": report["figures"]["rows"] * report["figures"]["row_tokens"],
            "parquet": str(out / report["parquet"])}


def floor(manifest_path: Path, hub: Hub, conversations: int) -> dict:
    """encode_batch of the rendered texts of the first ``conversations`` in permutation order."""
    manifest = load_manifest(manifest_path)
    snapshots = resolve(manifest, hub)
    pinned = load_pinned_tokenizer(manifest.tokenizer, snapshots.tokenizer)
    source = ParquetSource(dataset_files(manifest.dataset, snapshots.dataset))
    order = permutation(manifest.seed, source.num_rows)[:conversations]
    renderer = ChatRenderer(pinned.chat_template)
    texts = [renderer.render(normalize_messages(row["messages"])) for row in source.take(order).to_pylist()]
    started = time.perf_counter()
    encodings = pinned.tokenizer.encode_batch(texts, add_special_tokens=False)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tokens": sum(len(e.ids) for e in encodings), "conversations": len(texts),
            "texts": texts, "pinned": pinned, "rows": source.take(order[:300]).to_pylist()}


def naive(pinned, rows: list[dict], tmp: Path) -> float:
    """Seconds per conversation of per-message apply_chat_template masking (miles' way)."""
    from transformers import PreTrainedTokenizerFast

    (tmp / "tokenizer.json").write_text(pinned.tokenizer.to_str())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"), chat_template=pinned.chat_template)
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
    return (time.perf_counter() - started) / len(rows)


def prefix_sha(parquet: str, rows: int, row_tokens: int = 8192) -> str:
    figures = RowFigures(row_tokens)
    for row in RowReader(parquet).rows():
        if row["index"] >= rows:
            break
        figures.add(row["input_ids"], row["loss_mask"])
    return figures.as_dict()["rows_sha256"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="source size as a share of 939,343 conversations")
    parser.add_argument("--rows", type=int, nargs="+", default=[800, 1600, 3200, 6400],
                        help="row counts to build; the largest is also built with 1 worker and from the smaller "
                             "source")
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache", help="where inputs are laid out")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "build_at_scale.json")
    args = parser.parse_args()
    shared = shared_dir()
    if shared is None:
        raise SystemExit("the benchmark renders with the pinned GLM-4.7-Flash template: it needs ../shared "
                         "(or FIXED_SFT_SHARED)")
    template = (shared / PINNED_TEMPLATE).read_bytes()
    hf_home = args.cache / "hf"
    started = time.perf_counter()
    big = lay_out(hf_home, template, args.scale)
    small = lay_out(hf_home, template, args.scale / 4)
    layout_s = time.perf_counter() - started
    most = max(args.rows)
    results = []

    def measure(label, facts, rows, workers):
        manifest = args.cache / f"{label}.yaml"
        manifest.write_text(manifest_text(facts, "bench", rows))
        result = run_build(manifest, args.cache / "out" / label, hf_home, workers)
        results.append({"config": label, "source_rows": int(facts["dataset_rows"]), "rows": rows,
                        "workers": workers, **result})
        print(f"  {label}: {result['seconds']:.1f} s", file=sys.stderr, flush=True)
        return manifest

    print(f"inputs laid out in {layout_s:.0f} s; building", file=sys.stderr, flush=True)
    full = measure(f"rows{most}-workers2", big, most, 2)
    measure(f"rows{most}-workers1", big, most, 1)
    for rows in sorted(args.rows)[:-1]:
        measure(f"rows{rows}-workers2", big, rows, 2)
    measure(f"rows{most}-workers2-quarter-source", small, most, 2)

    hub = Hub(cache_dir=hf_home / "hub", offline=True)
    ref = results[0]
    base = floor(full, hub, ref["conversations"])
    per_conversation = naive(base["pinned"], base["rows"], args.cache)
    reference_parquet = ref["parquet"]
    table = []
    for r in results:
        same_source = r["source_rows"] == ref["source_rows"]
        expected_sha = prefix_sha(reference_parquet, r["rows"]) if same_source else None
        table.append({k: r[k] for k in ("config", "source_rows", "rows", "workers", "conversations", "rows_sha256")}
                     | {"seconds": round(r["seconds"], 1), "tokens_per_s": round(r["tokens"] / r["seconds"]),
                        "main_peak_rss_mib": round(r["main_peak_rss_mib"]),
                        "worker_peak_rss_mib": round(r["worker_peak_rss_mib"]),
                        "same_rows_as_largest_build": (r["rows_sha256"] == expected_sha) if same_source else None})
    summary = {
        "floor_seconds": round(base["seconds"], 1), "floor_tokens": base["tokens"],
        "floor_conversations": base["conversations"],
        "build_over_floor": round(ref["seconds"] / base["seconds"], 2),
        "build_1_worker_over_floor": round(results[1]["seconds"] / base["seconds"], 2),
        "naive_seconds_estimated": round(per_conversation * ref["conversations"], 1),
        "naive_over_build": round(per_conversation * ref["conversations"] / ref["seconds"], 1),
        "seconds_per_1000_rows": {r["config"]: round(1000 * r["seconds"] / r["rows"], 2) for r in results},
        "layout_seconds": round(layout_s), "source_mib": {"full": big["dataset_mib"], "quarter": small["dataset_mib"]},
        "cores": os.cpu_count(), "python": sys.version.split()[0],
    }
    print(f"\n{'config':<34} {'source':>8} {'rows':>5} {'w':>2} {'seconds':>8} {'tokens/s':>9} {'RSS MiB':>8} "
          f"{'worker':>7}  same rows")
    for t in table:
        print(f"{t['config']:<34} {t['source_rows']:>8} {t['rows']:>5} {t['workers']:>2} {t['seconds']:>8} "
              f"{t['tokens_per_s']:>9} {t['main_peak_rss_mib']:>8} {t['worker_peak_rss_mib']:>7}  "
              f"{t['same_rows_as_largest_build']}")
    print(f"\nfloor (encode_batch of the {base['conversations']:,} consumed conversations' texts, {os.cpu_count()} "
          f"cores): {base['seconds']:.1f} s; build / floor = {summary['build_over_floor']} (2 workers), "
          f"{summary['build_1_worker_over_floor']} (1 worker)")
    print(f"naive per-message apply_chat_template masking: ~{summary['naive_seconds_estimated']} s for the same "
          f"conversations, {summary['naive_over_build']}x the build")
    args.json.write_text(json.dumps({"builds": table, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
