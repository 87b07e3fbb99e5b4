#!/usr/bin/env python3
"""Every row a source makes, at several source sizes: time, memory, and how both grow.

    pip install -r bench/requirements.txt
    python bench/whole_source.py --json whole_source.json            # scales 0.25, 0.5, 1
    python bench/whole_source.py --json /tmp/ws.json --scales 0.01,0.02   # a smoke run

For each ``--scales`` share of the Tulu-shaped source of bench/scale_inputs.py (1: 939,343
conversations, about 115,000 rows of 8,192 tokens), laid out once in --cache, a ``rows: all``
build at ``--workers`` (default auto), in a fresh process as users run it. Prints and writes to
``--json``, for each scale: seconds, cores busy, the main process's CPU, peak RSS of the main
process and of the largest child, the rows spilled to disk and the passes (the report's
``source_reading``), and per million conversations; then the growth from the smallest scale to
each (seconds and peak RSS as ratios), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from build_at_scale import build  # noqa: E402
from first_batch import template  # noqa: E402

from scale_inputs import lay_out, manifest_text  # noqa: E402


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, required=True, help="where the results go")
    parser.add_argument(
        "--scales",
        type=lambda text: [float(s) for s in text.split(",")],
        default=[0.25, 0.5, 1.0],
        help="source sizes as shares of 939,343 conversations, comma-separated",
    )
    parser.add_argument("--workers", default="auto", help="--workers of the builds (default auto)")
    parser.add_argument(
        "--cache", type=Path, default=REPO / "bench" / ".cache", help="where inputs are laid out"
    )
    return parser.parse_args()


def main() -> None:
    args = options()
    hf_home, results = args.cache / "hf", []
    for scale in args.scales:
        facts = lay_out(hf_home, template(), scale)
        manifest = args.cache / f"whole-{scale}.yaml"
        manifest.write_text(manifest_text(facts, "whole", "all"))
        built = build(
            manifest, args.cache / "out" / f"whole-{scale}", hf_home, "auto", args.workers
        )
        conversations = int(facts["dataset_rows"])
        result = {
            "scale": scale,
            "source_conversations": conversations,
            "source_mib": int(facts["dataset_mib"]),
            "rows": built["tokens"] // 8192,
            **{
                k: built[k]
                for k in (
                    "workers_used",
                    "seconds",
                    "cores_busy",
                    "main_cpu_s",
                    "workers_cpu_s",
                    "main_peak_rss_mib",
                    "worker_peak_rss_mib",
                    "conversations",
                    "rows_sha256",
                    "source_reading",
                    "timings",
                )
            },
            "seconds_per_million_conversations": round(built["seconds"] / conversations * 1e6, 1),
        }
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "source_reading"}), flush=True)
    first = results[0]
    growth = [
        {
            "scale": r["scale"],
            "source_over_smallest": round(
                r["source_conversations"] / first["source_conversations"], 2
            ),
            "seconds_over_smallest": round(r["seconds"] / first["seconds"], 2),
            "main_rss_over_smallest": round(r["main_peak_rss_mib"] / first["main_peak_rss_mib"], 2),
        }
        for r in results
    ]
    for g in growth:
        print(f"growth: {json.dumps(g)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "machine": {
                    "cores": len(os.sched_getaffinity(0)),
                    "python": sys.version.split()[0],
                },
                "workers": args.workers,
                "builds": results,
                "growth": growth,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
