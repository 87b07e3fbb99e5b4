#!/usr/bin/env python3
"""Seconds from the command's start to the first encoded batch, against an earlier builder.

    pip install -r bench/requirements.txt
    python bench/first_batch.py --json first_batch.json --baseline 8690c98
    # a smoke run on 2 cores
    python bench/first_batch.py --json /tmp/fb.json --scale 0.05 --rows 400 --repeats 1
    # on 2 cores, the build's process and one worker, each with a core (the order shows)
    python bench/first_batch.py --json /tmp/fb.json --scale 0.05 --rows 400 --workers 1 \
        --pool-of-one --baseline BASE

It lays out (once, in --cache) the inputs of bench/build_at_scale.py (a GLM-scale tokenizer with
the pinned template, a Tulu-shaped source of ``939,343 × --scale`` conversations), then runs the
build as users run it (``data/generate_fixed_sft.py --manifest M``, a fresh process each time) for
each ``--workers`` count, with this tree's builder and, with ``--baseline``, an earlier one
(a git revision, laid out with ``git archive``, or a folder holding a checkout), alternately,
``--repeats`` times. Every process of each build appends timestamps to a trace
(bench/first_batch_site: its interpreter's start, key imports, the start-up message, each
worker's ``ready`` and first batch), read against the moment the bench started the command:

- ``first_batch_s``: the first batch of encoded conversations leaving a worker (or, with one
  process, the first batch the command's process encoded) — goal 1 of issue 29: at most 1.5 s;
- ``first_ready_s`` / ``last_ready_s``: the first and the last worker ready (able to encode);
- ``last_engine_s``: the last worker to say which engine it chose (where that is a message of
  its own: builders from de0d367 on; before, ``ready`` said it);
- ``tokenizer_sent_s`` / ``start_up_sent_s``: the build telling its first worker where the
  tokenizer lies (from de0d367 on) / sending it the start-up message;
- ``main_imported_s``: the command's process done importing ``builders.build``;
- ``main_renderer_s``: the command's process done importing the renderer (transformers): before
  ``main_imported_s`` in builders before the start-up's third round, after ``sample_sent_s`` from
  it on;
- ``sample_sent_s``: the build handing the plan's sample to the workers (builders that do:
  from the start-up's second round on; before, the build encoded it itself);
- ``first_group_s``: the build handing out the pass's first row group (it has planned);
- ``workers_spawned_s``: the last worker's interpreter up (where the workers' parent forks them:
  the last one forked); ``seconds``: the whole build;
  ``cpu_s``: the CPU time (user and system) of the build and every process it reaped, which a
  busy machine changes less than ``seconds``.
- ``timings``: the build report's own stages.

It prints each run, then the medians and their ratios (this tree over the baseline, each
measured in the same run: on a shared machine compare nothing across runs), and writes them all
as JSON to ``--json``. Every build's ``rows_sha256`` must be the same.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from scale_inputs import lay_out, manifest_text  # noqa: E402

SITE = REPO / "bench" / "first_batch_site"
MEASURES = (
    "main_imported_s",
    "main_renderer_s",
    "tokenizer_sent_s",
    "start_up_sent_s",
    "workers_spawned_s",
    "sample_sent_s",
    "first_group_s",
    "first_ready_s",
    "last_ready_s",
    "last_engine_s",
    "first_batch_s",
    "seconds",
    "cpu_s",
)


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, required=True, help="where the results go")
    parser.add_argument("--scale", type=float, default=1.0, help="share of 939,343 conversations")
    parser.add_argument("--rows", type=int, default=6400, help="rows of 8,192 tokens to build")
    parser.add_argument(
        "--cache", type=Path, default=REPO / "bench" / ".cache", help="where inputs are laid out"
    )
    parser.add_argument(
        "--workers",
        type=lambda text: text.split(","),
        default=["auto"],
        help="worker counts, comma-separated (default auto)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="builds of each kind (default 3)")
    parser.add_argument(
        "--pool-of-one",
        action="store_true",
        help="with --workers 1, encode in a pool of one worker process (a trace's patch, not an "
        "option of the build): the build's process and one worker, each with a core on 2 cores, "
        "as each has on 16",
    )
    parser.add_argument(
        "--baseline",
        help="an earlier builder to compare with: a git revision of this repository, or a folder "
        "holding a checkout",
    )
    return parser.parse_args()


def template() -> bytes:
    from builders.fixture.make import PINNED_TEMPLATE, shared_dir

    shared = shared_dir() or (REPO.parent / "shared" if (REPO.parent / "shared").is_dir() else None)
    if shared is None:
        raise SystemExit("the bench renders with the pinned template: it needs FIXED_SFT_SHARED")
    return (shared / PINNED_TEMPLATE).read_bytes()


def baseline_tree(baseline: str, cache: Path) -> Path:
    """The folder of the earlier builder: given, or ``git archive`` of a revision."""
    if Path(baseline).is_dir():
        return Path(baseline).resolve()
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", baseline], capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(
            f"--baseline {baseline}: no such folder, nor a revision of this checkout "
            f"({found.stderr.strip()}); make a folder with git archive REV | tar -x -C DIR"
        )
    revision = found.stdout.strip()
    tree = cache / f"baseline-{revision}"
    if not (tree / "data" / "generate_fixed_sft.py").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def build(
    tree: Path, manifest: Path, hf_home: Path, workers: str, out: Path, pool_of_one: bool
) -> dict:
    """One build by ``tree``'s builder, traced; its measures in seconds from its start."""
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        environment = {
            **os.environ,
            **({"FIRST_BATCH_POOL_OF_ONE": "1"} if pool_of_one else {}),
            "HF_HOME": str(hf_home),
            "HF_HUB_OFFLINE": "1",
            # before any PYTHONPATH of the environment (a --target install of the wheels)
            "PYTHONPATH": os.pathsep.join(
                [str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "FIRST_BATCH_TRACE": str(trace),
        }
        command = [
            sys.executable,
            str(tree / "data" / "generate_fixed_sft.py"),
            *("--manifest", str(manifest), "--out", str(out), "--workers", workers),
            *("-q", "--no-card"),
        ]
        started, before = time.time(), _children_cpu()
        done = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tree)
        seconds, cpu = time.time() - started, _children_cpu() - before
        if done.returncode != 0:
            raise SystemExit(f"the build failed ({done.returncode}): {done.stderr}")
        events = [json.loads(line) for line in trace.read_text().splitlines()]
    report = json.loads(next(out.glob("*.report.json")).read_text())
    # the command's process traces first
    main = events[0][0]

    def first(name: str, pid=None, last: bool = False, detail=None):
        times = [t for p, e, t, d in events if e == name and (pid is None or p == pid)]
        if name in ("sent batch", "in-process batch"):
            times = [t for p, e, t, d in events if e == name and d]
        if name == "sent group":
            times = [t for p, e, t, d in events if e == name and bool(d) == detail]
        if not times:
            return None
        return round((max(times) if last else min(times)) - started, 3)

    ready = {p for p, e, _, _ in events if e == "sent ready"}
    # a worker's interpreter up, or (builders whose workers are forked) the worker forked
    workers_python = [t for p, e, t, _ in events if e in ("python", "forked") and p in ready]
    return {
        "workers": workers,
        "workers_used": report["workers"],
        "main_imported_s": first("imported builders.build", main),
        "main_renderer_s": first("imported builders.formats.render", main),
        "start_up_sent_s": first("sent contract"),
        "workers_spawned_s": round(max(workers_python) - started, 3) if workers_python else None,
        "tokenizer_sent_s": first("sent tokenizer"),
        "sample_sent_s": first("sent group", detail=True),
        "first_group_s": first("sent group", detail=False),
        "first_ready_s": first("sent ready"),
        "last_ready_s": first("sent ready", last=True),
        "last_engine_s": first("sent engine", last=True),
        "first_batch_s": first("sent batch") or first("in-process batch"),
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu, 3),
        "rows_sha256": report["figures"]["rows_sha256"],
        "timings": report["timings"],
    }


def _children_cpu() -> float:
    """User and system CPU seconds of this process's reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def medians(runs: list[dict]) -> dict:
    return {
        measure: round(statistics.median(values), 3)
        for measure in MEASURES
        if (values := [r[measure] for r in runs if r[measure] is not None])
    }


def main() -> None:
    args = options()
    hf_home = args.cache / "hf"
    started = time.perf_counter()
    facts = lay_out(hf_home, template(), args.scale)
    manifest = args.cache / "first_batch.yaml"
    manifest.write_text(manifest_text(facts, "firstbatch", args.rows))
    print(f"inputs laid out in {time.perf_counter() - started:.0f} s", flush=True)
    trees = {"this": REPO}
    if args.baseline:
        trees = {"baseline": baseline_tree(args.baseline, args.cache), **trees}
    runs = []
    for repeat in range(args.repeats):
        for workers in args.workers:
            for name, tree in trees.items():
                out = args.cache / "out" / "first_batch"
                run = build(tree, manifest, hf_home, workers, out, args.pool_of_one)
                runs.append({"tree": name, "repeat": repeat, **run})
                shown = {k: run[k] for k in MEASURES}
                print(f"{name:>8} workers={workers}: {json.dumps(shown)}", flush=True)
    summary = {}
    for workers in args.workers:
        by_tree = {
            name: medians([r for r in runs if r["tree"] == name and r["workers"] == workers])
            for name in trees
        }
        entry = {"median": by_tree}
        if "baseline" in by_tree:
            entry["this_over_baseline"] = {
                measure: round(value / by_tree["baseline"][measure], 3)
                for measure, value in by_tree["this"].items()
                if by_tree["baseline"].get(measure)
            }
        summary[workers] = entry
        print(f"workers={workers} medians: {json.dumps(by_tree)}")
        if "this_over_baseline" in entry:
            print(f"workers={workers} this / baseline: {json.dumps(entry['this_over_baseline'])}")
    same = len({r["rows_sha256"] for r in runs}) == 1
    print(f"same rows in every build: {same}")
    results = {
        "machine": {"cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]},
        "scale": args.scale,
        "rows": args.rows,
        "baseline": args.baseline,
        "pool_of_one": args.pool_of_one,
        "same_rows": same,
        "summary": summary,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.json}")
    if not same:
        raise SystemExit("the builds' rows differ")


if __name__ == "__main__":
    main()
