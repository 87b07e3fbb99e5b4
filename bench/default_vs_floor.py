#!/usr/bin/env python3
"""Builds at given worker counts against the encode floor, and against an earlier builder.

Nothing else: the short part of bench/build_at_scale.py, for a host lent briefly (about 3 minutes
with the inputs' lay-out on 16 cores), or a before/after on a shared machine.

    FIXED_SFT_SHARED=../shared python bench/default_vs_floor.py auto 1
    # this tree against a checkout made by ``git archive main | tar -x -C /tmp/main-base``,
    # alternated, 3 builds each, at a twentieth of the scale (inputs in bench/.cache)
    FIXED_SFT_SHARED=../shared python bench/default_vs_floor.py 1 2 --baseline /tmp/main-base \\
        --repeats 3 --scale 0.05 --rows 800 --cache bench/.cache
    # against two earlier builders at once (--baseline again), each named by its folder
    FIXED_SFT_SHARED=../shared python bench/default_vs_floor.py 2 --baseline /tmp/main-base \\
        --baseline /tmp/old-base --repeats 3 --scale 0.05 --rows 3200 --no-floor

Prints, for each worker count (and tree), each build's seconds, the CPU of the main process and
of its children, cores busy, the peak RSS of the build and of its largest child, the garbage
collector's full passes in the main process and their CPU (``gc_full_s``), rows_sha256 and
timings, and its ratio to ``encode_batch_fast`` of the consumed conversations' texts (the first
build's; measured once in each repeat, after its builds, and the median taken); with
``--baseline``, the medians (seconds, main-process CPU, GC, the build's peak RSS) and this tree's
over each baseline's. The share of the CPUs other processes used in the 2 s before each build is
printed (``busy_before``): on a shared machine only the ratios within one run say anything.
Inputs are laid out in --cache (default /tmp/bc, full scale; bench/scale_inputs.py) and shared;
each run writes its manifest and builds in a folder of its own there, removed at its end, so that
runs sharing a cache do not rewrite each other's manifest or outputs.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from build_at_scale import TOKENIZER_FLOOR, build  # noqa: E402

from builders.fixture.make import PINNED_TEMPLATE, shared_dir  # noqa: E402
from measure import FULL_ROWS, FULL_SCALE, child  # noqa: E402
from scale_inputs import lay_out, manifest_text  # noqa: E402

SHOWN = (
    "workers_used",
    "busy_before",
    "seconds",
    "main_cpu_s",
    "workers_cpu_s",
    "cores_busy",
    "gc_full_passes",
    "gc_full_s",
    "main_peak_rss_mib",
    "worker_peak_rss_mib",
)


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workers", nargs="+", help="worker counts (auto: the builder's choice)")
    parser.add_argument("--scale", type=float, default=FULL_SCALE, help="share of the source")
    parser.add_argument("--rows", type=int, default=FULL_ROWS, help="rows of 8,192 tokens")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/bc"), help="inputs' folder")
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="a checkout of an earlier builder (again: another one)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="builds of each, alternated")
    parser.add_argument("--no-floor", action="store_true", help="the builds alone")
    return parser.parse_args()


def main() -> None:
    args = options()
    # the baseline's builds run in its own folder
    args.cache = args.cache.resolve()
    hf = args.cache / "hf"
    started = time.perf_counter()
    facts = lay_out(hf, (shared_dir() / PINNED_TEMPLATE).read_bytes(), args.scale)
    print(f"laid out in {time.perf_counter() - started:.0f} s", flush=True)
    own = Path(tempfile.mkdtemp(prefix="default_vs_floor-", dir=args.cache))
    try:
        measure(args, hf, own, facts)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def measure(args: argparse.Namespace, hf: Path, own: Path, facts: dict) -> None:
    """The builds and the floor, with the manifest and outputs in this run's own folder."""
    manifest = own / "bench.yaml"
    manifest.write_text(manifest_text(facts, "bench", args.rows))
    trees = {"this": REPO, **{tree.resolve().name: tree.resolve() for tree in args.baseline}}
    if len(trees) != 1 + len(args.baseline):
        raise SystemExit("each --baseline needs a folder name of its own (not 'this')")
    runs = {(w, name): [] for w in args.workers for name in trees}
    floors = []
    for _ in range(args.repeats):
        for workers in args.workers:
            for name, tree in trees.items():
                out = own / "out" / f"{name}-{workers}"
                runs[workers, name].append(
                    build(manifest, out, hf, "fastokens", workers, tree=tree)
                )
                r = runs[workers, name][-1]
                print(name, workers, json.dumps({k: r[k] for k in SHOWN}), flush=True)
        if not args.no_floor:
            # the floor too moves between runs: measured in each repeat, beside its builds
            conversations = str(runs[args.workers[0], "this"][0]["conversations"])
            floors.append(
                child(TOKENIZER_FLOOR, str(manifest), conversations, hf_home=hf)["seconds"]
            )
            print("encode floor", round(floors[-1], 2), flush=True)
    first = runs[args.workers[0], "this"][0]
    floor = statistics.median(floors) if floors else float("nan")
    print("encode floor (median)", round(floor, 2))
    for (workers, name), measured in runs.items():
        if len({r["rows_sha256"] for r in measured}) != 1 or (
            measured[0]["rows_sha256"] != first["rows_sha256"]
        ):
            raise SystemExit(f"{name}, {workers} workers: other rows than the first build's")
        medians = {
            k: round(statistics.median(r[k] for r in measured), 2)
            for k in ("seconds", "main_cpu_s", "gc_full_s", "main_peak_rss_mib")
        }
        line = {**medians, "x_floor": round(medians["seconds"] / floor, 3)}
        if name != "this":
            mine = runs[workers, "this"]
            line["this_over_baseline"] = {
                k: round(statistics.median(r[k] for r in mine) / v, 3)
                for k, v in medians.items()
                if v
            }
        print(name, workers, json.dumps(line), "timings", json.dumps(measured[0]["timings"]))
    print("rows_sha256", first["rows_sha256"])


if __name__ == "__main__":
    main()
