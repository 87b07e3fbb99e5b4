"""What the benchmarks share.

A command run in a fresh process, and whether the machine is idle.
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
FULL_SCALE, FULL_ROWS = 1.0, 6400
# share of the CPUs used by other processes below which the machine counts as idle
IDLE_BUSY = 0.05
# what a summary keeps of each build
BUILD_FIGURES = (
    "seconds",
    "main_cpu_s",
    "workers_cpu_s",
    "main_peak_rss_mib",
    "conversations",
    "tokens",
    "rows_sha256",
    "timings",
)

# a child program's own peak RSS: VmHWM starts at exec, where ru_maxrss keeps what the forking
# parent had
PEAK_RSS = """
def peak_rss_mib():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
"""

# the command line, as users run it, timed in its own process; the last stdout line is the
# measurement
CLI = (
    PEAK_RSS
    + """
import gc, json, os, resource, sys, threading, time
sys.argv = ["generate_fixed_sft.py", *sys.argv[1:]]
# each descendant process's own peak RSS: the last VmHWM read of it (a child started by vfork
# shares this process's memory until its exec, and its ru_maxrss keeps this process's peak from
# then); the workers are the children of their parent, the build's child
children_peak = {}
def children_of(pid):
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            found += open(f"/proc/{pid}/task/{task}/children").read().split()
        except OSError:
            continue
    return found
def watch_children():
    while True:
        waiting = children_of("self")
        while waiting:
            pid = waiting.pop()
            try:
                status = open(f"/proc/{pid}/status").read()
                children_peak[pid] = int(status.split("VmHWM:")[1].split()[0]) / 1024
                waiting += children_of(pid)
            except (OSError, IndexError):
                pass
        time.sleep(0.2)
threading.Thread(target=watch_children, daemon=True).start()
# the CPU the garbage collector's full passes take, in the thread that runs them
collected = {"passes": 0, "seconds": 0.0, "started": 0.0}
def count_pass(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            collected["started"] = time.thread_time()
        else:
            collected["passes"] += 1
            collected["seconds"] += time.thread_time() - collected["started"]
gc.callbacks.append(count_pass)
from builders.cli import main
before = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
code = main()
elapsed = time.perf_counter() - started
own = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"exit": code, "seconds": elapsed,
                  "main_cpu_s": own.ru_utime + own.ru_stime - before.ru_utime - before.ru_stime,
                  "workers_cpu_s": children.ru_utime + children.ru_stime,
                  "main_peak_rss_mib": peak_rss_mib(),
                  "gc_full_passes": collected["passes"], "gc_full_s": collected["seconds"],
                  "worker_peak_rss_mib": max(children_peak.values(), default=0)}))
"""
)


# a chat format's annotate alone, on the first N conversations of the build's order, in its own
# process with the build's engine (fastokens): the CPU seconds of the best of 3, after one to warm
ANNOTATE = (
    PEAK_RSS
    + """
import hashlib, json, sys, time
from builders.encode.encoder import ConversationEncoder
from builders.encode.engines import FastokensEngine
from builders.inputs.layout import conversations
from builders.inputs.pinned import Hub, pinned_inputs
from builders.manifest import load_manifest
from builders.rows.order import permutation
manifest = load_manifest(sys.argv[1])
pinned, source = pinned_inputs(manifest, Hub())
rows = conversations(source.take(permutation(manifest.seed, source.num_rows)[:int(sys.argv[2])]))
encoder = ConversationEncoder(pinned.tokenizer, pinned.spec, manifest.contract,
                              engine=FastokensEngine(pinned.tokenizer_json))
best = (float("inf"), float("inf"))
for attempt in range(4):
    format = ConversationEncoder(pinned.tokenizer, pinned.spec, manifest.contract).format
    started, cpu = time.perf_counter(), time.process_time()
    out = [a for k in range(0, len(rows), 64)
           for a in format.annotate(rows[k:k + 64], encoder.engine)]
    taken = (time.process_time() - cpu, time.perf_counter() - started)
    best = min(best, taken) if attempt else best
digest = hashlib.sha256()
for a in out:
    digest.update(a.ids.tobytes() + a.classes.tobytes() + bytes([a.ends_with_answer]))
print(json.dumps({"seconds": best[1], "main_cpu_s": best[0], "main_peak_rss_mib": peak_rss_mib(),
                  "conversations": len(rows), "tokens": sum(len(a.ids) for a in out),
                  "rows_sha256": digest.hexdigest(), "timings": {}}))
"""
)


def annotated(manifest: Path, hf_home: Path, conversations: int, tree: Path = REPO) -> dict:
    """``ANNOTATE`` of ``manifest`` by the builder of ``tree``, with the machine's load before."""
    load = busy()
    run = child(ANNOTATE, str(manifest), str(conversations), hf_home=hf_home, tree=tree)
    return {
        **run,
        "seconds": round(run["seconds"], 3),
        "main_cpu_s": round(run["main_cpu_s"], 3),
        "main_peak_rss_mib": round(run["main_peak_rss_mib"]),
        "busy_before": round(load, 3),
    }


def child(code: str, *args: str, hf_home: Path, run=None, tree: Path = REPO) -> dict:
    """Run ``code`` in a fresh process, offline from ``hf_home``, with the builder of ``tree``.

    Its last stdout line is JSON. ``run(command, env, cwd)`` runs it another way (under a profiler)
    and returns (its result, more JSON). ``tree``: a checkout of the builder (another commit's,
    from ``git archive``), imported before the installed one.
    """
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    command, more = [sys.executable, "-c", code, *args], {}
    if run is None:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
    else:
        done, more = run(command, env, tree)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"benchmark step failed: {done.stderr}")
    return {**json.loads(lines[-1]), **more, "stdout": "\n".join(lines[:-1]), "stderr": done.stderr}


def against_option(parser) -> None:
    """``--against TREE``: each build made by another checkout of the builder too, alternately."""
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout of the builder (git archive COMMIT | tar -x -C TREE): each build is "
        "made by it, then by this one, and both are reported",
    )
    parser.add_argument(
        "--annotate",
        type=int,
        metavar="N",
        help="time only the chat format's annotate on the first N conversations of the build's "
        "order (CPU seconds, best of 3, one process), not the builds",
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="--workers of every build (default 1: one process; a count or auto); results of "
        "another than 1 go to a file of their own (NAME.workers-N.json)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="make every build this many times, alternating, and keep each one's fastest in CPU "
        "time (a shared machine)",
    )


def alternated(args, builds: dict, make, hf_home: Path) -> dict:
    """Each build of ``builds`` (name -> manifest) made by each builder (``trees``), alternately.

    ``make(name, manifest, tree)`` makes one (with ``--annotate``, ``annotated`` measures it
    instead); ``--rounds`` times, the fastest in CPU time kept. Returns them by builder label, by
    name.
    """
    if args.annotate:

        def make(name, manifest, tree):
            return annotated(manifest, hf_home, args.annotate, tree)

    fastest: dict = {}
    for _ in range(args.rounds):
        for name, manifest in builds.items():
            for label, tree in trees(args):
                run = make(name, manifest, tree)
                print(
                    f"  {name} ({label}): {run['seconds']} s, "
                    f"peak RSS {run['main_peak_rss_mib']} MiB",
                    file=sys.stderr,
                    flush=True,
                )
                kept = fastest.setdefault(label, {})
                if name not in kept or run["main_cpu_s"] < kept[name]["main_cpu_s"]:
                    kept[name] = run
    return fastest


def trees(args) -> list[tuple[str, Path]]:
    """The builders to measure, by label: this checkout, after ``--against``'s where given."""
    return (
        [("against", args.against.resolve()), ("this", REPO)] if args.against else [("this", REPO)]
    )


def cpu_s(run: dict) -> float:
    """A build's CPU seconds: its own process's and its children's (workers, hashing)."""
    return run["main_cpu_s"] + run.get("workers_cpu_s", 0.0)


def compared(
    measured: dict, over: tuple[str, str], base: tuple[str, str], target: float, rss_target: int
) -> dict:
    """Two builds' figures and ratio (``over`` / ``base``: name, what it is), printed.

    ``measured``: by builder label (``trees``), by build name, ``build_at_scale.build``'s runs;
    this checkout's are the summary's, another's go under ``against`` with whether the rows are
    the same.
    """
    summaries = {}
    for label, runs in measured.items():
        ratio = runs[over[0]]["seconds"] / runs[base[0]]["seconds"]
        # the CPU time of all the build's processes, which a busy machine moves less than the
        # wall time
        cpu_ratio = cpu_s(runs[over[0]]) / cpu_s(runs[base[0]])
        loads = [r["busy_before"] for r in runs.values()]
        summaries[label] = {
            "machine": {
                "cores": os.cpu_count(),
                "python": sys.version.split()[0],
                "idle": max(loads) < IDLE_BUSY,
                "cpu_busy_before_each_build": loads,
            },
            "builds": {
                name: {k: r[k] for k in BUILD_FIGURES if k in r} for name, r in runs.items()
            },
            f"{over[0]}_over_{base[0]}": round(ratio, 3),
            f"{over[0]}_over_{base[0]}_cpu": round(cpu_ratio, 3),
            "within_time_target": ratio <= target,
            "within_rss_target": runs[over[0]]["main_peak_rss_mib"] <= rss_target,
        }
        shown = [f"{n}{f' ({what})' if what else ''}" for n, what in (base, over)]
        print(
            f"\n{label}: "
            + "; ".join(
                f"{s}: {runs[n]['seconds']} s, {runs[n]['main_peak_rss_mib']} MiB"
                for s, (n, _) in zip(shown, (base, over), strict=True)
            )
            + f"; {over[0]}/{base[0]} = {ratio:.3f}, in CPU time {cpu_ratio:.3f} "
            f"(target {target}x, {rss_target} MiB); "
            f"machine idle: {max(loads) < IDLE_BUSY} (busy: {', '.join(f'{b:.1%}' for b in loads)})"
        )
    summary = summaries.pop("this")
    if "against" in summaries:
        summary["against"] = summaries["against"]
        summary["same_rows_as_against"] = all(
            run["rows_sha256"] == measured["against"][name]["rows_sha256"]
            for name, run in measured["this"].items()
        )
    return summary


def write_results(path: Path, results: dict) -> None:
    """Write a benchmark's results as JSON at ``path`` and say where.

    The folder is made.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {path}")


def busy(seconds: float = 2.0) -> float:
    """The share of all CPUs busy during ``seconds``.

    This process sleeps: the rest is others' work.
    """

    def ticks():
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        # all, idle + iowait
        return sum(fields), fields[3] + fields[4]

    total, idle = ticks()
    time.sleep(seconds)
    total2, idle2 = ticks()
    return 1 - (idle2 - idle) / max(1, total2 - total)


def scale_options(
    doc: str, name: str, rows_help: str, more=None
) -> tuple[argparse.Namespace, Path, bytes]:
    """A scale benchmark's options, where its results go, and its template.

    The options are --scale, --rows, --cache, and what ``more(parser)`` adds; the results go to
    bench/NAME.json for the full-scale run, bench/.cache/NAME.smoke.json for any other, so a smoke
    run never overwrites committed results; the template is the pinned chat template it renders
    with.
    """
    from builders.fixture.make import PINNED_TEMPLATE, shared_dir

    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=FULL_SCALE,
        help="source size as a share of 939,343 conversations",
    )
    parser.add_argument("--rows", type=int, default=FULL_ROWS, help=rows_help)
    parser.add_argument(
        "--cache", type=Path, default=REPO / "bench" / ".cache", help="where inputs are laid out"
    )
    if more is not None:
        more(parser)
    args = parser.parse_args()
    full = args.scale == FULL_SCALE and args.rows == FULL_ROWS
    results = REPO / "bench" / f"{name}.json" if full else args.cache / f"{name}.smoke.json"
    shared = shared_dir() or (REPO.parent / "shared" if (REPO.parent / "shared").is_dir() else None)
    if shared is None:
        raise SystemExit(
            "the benchmark renders with the pinned GLM-4.7-Flash template: it needs ../shared "
            "(or FIXED_SFT_SHARED)"
        )
    return args, results, (shared / PINNED_TEMPLATE).read_bytes()
