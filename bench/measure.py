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
import gc, json, resource, sys, time
sys.argv = ["generate_fixed_sft.py", *sys.argv[1:]]
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
                  "worker_peak_rss_mib": children.ru_maxrss / 1024}))
"""
)


def child(code: str, *args: str, hf_home: Path, run=None, tree: Path = REPO) -> dict:
    """Run ``code`` in a fresh process, offline from ``hf_home``.

    Its last stdout line is JSON. ``run(command, env, cwd)`` runs it another way (under a profiler)
    and returns (its result, more JSON). ``tree``: the checkout whose builder it imports.
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
