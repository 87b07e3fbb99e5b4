#!/usr/bin/env python3
"""The speed of an epoch in the shuffled order, against file order.

    python bench/reading_order.py [--rows 6400] [--row-tokens 8192] [--json PATH]

It writes a row file of random tokens with the builder's writer (the recipe's size by default, in
a temporary folder), then, in this one process, reads whole epochs with ``RowReader.rows``: in
file order, shuffled with ``window_groups`` 16 and 4, and a sample of rows at random positions
through ``reader[i]`` (one cached group: what a shuffle by random access costs). Each figure is
the median of ``--repeats`` runs, in rows/s; the ratios are to file order, measured in the same
run. The machine's load during the run is reported (``busy``): on a busy machine the figures are
provisional. Nothing is committed; ``--json PATH`` writes the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from iterate_rows import write_file

from builders.rows import RowReader
from measure import busy


def rows_per_s(read, repeats: int) -> float:
    speeds = []
    for _ in range(repeats):
        started = time.perf_counter()
        count = sum(1 for _ in read())
        speeds.append(count / (time.perf_counter() - started))
    return statistics.median(speeds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=6400)
    parser.add_argument("--row-tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-sample", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.parquet"
        write_file(path, args.rows, args.row_tokens)
        reader = RowReader(path)
        load = busy()
        sample = np.random.default_rng(0).permutation(len(reader))[: args.random_sample]
        results = {
            "rows": len(reader),
            "row_tokens": args.row_tokens,
            "busy_before": round(load, 3),
            "file_order": rows_per_s(lambda: reader.rows(), args.repeats),
            "shuffled_w16": rows_per_s(lambda: reader.rows(seed=1, epoch=0), args.repeats),
            "shuffled_w4": rows_per_s(lambda: reader.rows(seed=1, window_groups=4), args.repeats),
            "random_access": rows_per_s(lambda: (reader[int(i)] for i in sample), 1),
            "busy_after": round(busy(), 3),
        }
    for key in ("shuffled_w16", "shuffled_w4", "random_access"):
        results[f"{key}_to_file_order"] = round(results[key] / results["file_order"], 3)
    for key, value in results.items():
        print(f"{key:>28}: {f'{value:.4g}' if isinstance(value, float) else value}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
