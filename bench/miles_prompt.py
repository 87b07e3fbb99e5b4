#!/usr/bin/env python3
"""miles' reading of ``--prompt-data``: the row file or a prompt file.

    python bench/miles_prompt.py [--rows 6400] [--row-tokens 8192] [--json PATH]

It writes a row file of random tokens with the builder's writer (the recipe's size by default, in
a temporary folder) and its prompt files (``fixed-sft export --to miles``: file order, and seeded),
then measures, each in a fresh process:

- miles' read loop over ``--prompt-data`` (``miles/utils/data.py`` at 78527b91: ``read_file``'s
  ``iter_batches()`` and ``to_pylist()``, then ``Dataset.__init__``'s ``data.get``): seconds and
  peak RSS above the interpreter with its imports;
- the rollout (``pretokenized_sft_rollout.generate_rollout``) filling 128-sample steps in the
  prompt file's order: seconds per step (the median and the slowest), the rows file's check
  (its ``rows_sha256``) included in the first.

The machine's load is reported (``busy``): on a busy machine the figures are provisional, the
ratios (same run) less so. Nothing is committed; ``--json PATH`` writes the results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from iterate_rows import write_file

from builders.training.exports import export
from measure import PEAK_RSS, REPO, busy

READ = (
    PEAK_RSS
    + """
import json, sys, time
import pyarrow.parquet as pq
base = peak_rss_mib()
started = time.perf_counter()
samples = []
for batch in pq.ParquetFile(sys.argv[1]).iter_batches():
    for data in batch.to_pylist():
        samples.append((data.get("messages"), data.get("metadata") or {}))
print(json.dumps({"samples": len(samples), "seconds": time.perf_counter() - started,
                  "rss_growth_mib": peak_rss_mib() - base}))
"""
)
STEPS = """
import json, statistics, sys, time
from types import SimpleNamespace
import pyarrow.parquet as pq
import pretokenized_sft_rollout
order = [m["row_index"] for m in pq.read_table(sys.argv[1])["metadata"].to_pylist()]
args = SimpleNamespace(prompt_data=sys.argv[1], rollout_batch_size=128)
times = []
for first in range(0, min(len(order), int(sys.argv[2]) * 128), 128):
    step = [[SimpleNamespace(metadata={"row_index": i})] for i in order[first:first + 128]]
    buffer = SimpleNamespace(get_samples=lambda n, step=step: step)
    started = time.perf_counter()
    pretokenized_sft_rollout.generate_rollout(args, 0, buffer)
    times.append(time.perf_counter() - started)
print(json.dumps({"steps": len(times), "first_step_s": times[0],
                  "median_step_s": statistics.median(times[1:] or times),
                  "slowest_later_step_s": max(times[1:] or times)}))
"""


def child(code: str, *args: str) -> dict:
    env_path = f"{REPO}:{REPO / 'patches'}"
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=6400)
    parser.add_argument("--row-tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = Path(folder) / "rows.parquet"
        write_file(rows, args.rows, args.row_tokens)
        seeded = Path(folder) / "seeded"
        prompts = {
            "file order": export(rows, "miles"),
            "seed 1": export(rows, "miles", seeded, seed=1),
        }
        results = {"rows": args.rows, "row_tokens": args.row_tokens, "busy_before": busy()}
        results["read"] = {
            "row file": child(READ, str(rows)),
            **{f"prompt file, {k}": child(READ, str(p)) for k, p in prompts.items()},
        }
        results["steps"] = {k: child(STEPS, str(p), str(args.steps)) for k, p in prompts.items()}
        results["busy_after"] = busy()
        results["file_bytes"] = {
            "row file": rows.stat().st_size,
            **{f"prompt file, {k}": p.stat().st_size for k, p in prompts.items()},
        }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
