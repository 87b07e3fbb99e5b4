#!/usr/bin/env python3
"""Peak memory and speed of iterating a built row file.

    python bench/iterate_rows.py [--rows 1000 4000] [--row-tokens 8192]
                                 [--json bench/iterate_rows.json]

For each size it writes a row file of random tokens with the builder's writer, then iterates it with
builders.rows.RowReader in a fresh process (so peak RSS is that of iterating alone) and reports the
file size, the peak RSS over the interpreter's baseline, and rows/s. Memory should not grow with the
file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from builders.rows.packing import Row
from builders.rows.rowfile import RowWriter
from measure import PEAK_RSS

CHILD = (
    PEAK_RSS
    + """
import sys, time
from builders.rows import RowReader
reader = RowReader(sys.argv[1])
base = peak_rss_mib()
started = time.perf_counter()
tokens = 0
for row in reader.rows():
    tokens += int(row["loss_mask"].sum())
elapsed = time.perf_counter() - started
peak = peak_rss_mib()
print(base, peak, elapsed, len(reader))
"""
)


def write_file(path: Path, rows: int, row_tokens: int) -> None:
    rng = np.random.default_rng(0)
    writer = RowWriter(path)
    for i in range(rows):
        writer.write(
            Row(
                input_ids=rng.integers(0, 151_000, row_tokens, dtype=np.int32),
                loss_mask=(rng.random(row_tokens) < 0.67).astype(np.uint8),
                source_index=[i],
                source_id=[f"c{i}"],
                segment_start=[0],
            )
        )
    writer.close()


def measure(rows: int, row_tokens: int, folder: Path) -> dict:
    path = folder / f"rows-{rows}.parquet"
    write_file(path, rows, row_tokens)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    base_mib, peak_mib, elapsed, count = out.stdout.split()
    return {
        "rows": int(count),
        "row_tokens": row_tokens,
        "file_mib": round(path.stat().st_size / 2**20, 1),
        "baseline_rss_mib": round(float(base_mib), 1),
        "peak_rss_mib": round(float(peak_mib), 1),
        "iteration_growth_mib": round(float(peak_mib) - float(base_mib), 1),
        "rows_per_s": round(int(count) / float(elapsed), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--row-tokens", type=int, default=8192)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = [measure(n, args.row_tokens, Path(folder)) for n in args.rows]
    print(f"{'rows':>6} {'file MiB':>9} {'peak RSS MiB':>13} {'growth MiB':>11} {'rows/s':>8}")
    for r in results:
        print(
            f"{r['rows']:>6} {r['file_mib']:>9} {r['peak_rss_mib']:>13} "
            f"{r['iteration_growth_mib']:>11} "
            f"{r['rows_per_s']:>8}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
