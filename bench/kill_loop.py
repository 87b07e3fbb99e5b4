"""Kill a ``--workers 2`` build's worker, many times: how builds end.

Each time at a random moment; the outcomes are counted.

Each run starts the build as a user does (``data/generate_fixed_sft.py``), waits for its first
worker process, sleeps a random time within the first three quarters of the workers' lifetime
(measured first in one build left alone), sends SIGKILL to one worker (as the out-of-memory
killer does) and waits up to ``--timeout`` seconds. Outcomes: ``exit 7 within N s`` (with the
documented message, nothing left in the output folder, no worker left running; the message
says whether the worker was still starting), anything else by its exit code, ``hang`` (still
running at the timeout; then it is killed), ``finished before the kill`` (the moment fell after
the workers' end), and ``exit 0, the same file`` (byte for byte as the build left alone: the
worker was killed when the build no longer needed it, having returned every batch the rows took).
Usage:

    .venv/bin/python bench/kill_loop.py --runs 50 --fixture-cache .fixture-cache
    HF_HOME=DIR HF_HUB_OFFLINE=1 .venv/bin/python bench/kill_loop.py --manifest DIR/NAME.yaml
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "data" / "generate_fixed_sft.py"


def workers_of(pid: int) -> list[int]:
    """The build's worker processes.

    Their parent is the build's child ``python -c ... builders.encode.family ...``; it forks them,
    so they run the same command line.
    """
    return [w for parent in _children(pid) if _is_worker(parent) for w in _children(parent)]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _is_worker(pid: int) -> bool:
    try:
        return b"builders.encode.family" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def start(args, out: Path) -> subprocess.Popen:
    which = (
        ["--manifest", str(args.manifest)]
        if args.manifest
        else ["--build", args.build, "--fixture-cache", str(args.fixture_cache)]
    )
    return subprocess.Popen(
        [sys.executable, str(CLI), *which, "--out", str(out), "--workers", "2", "-q"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def first_workers(process: subprocess.Popen, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if pids := workers_of(process.pid):
            return pids
        time.sleep(0.005)
    return []


def left_alone(args) -> tuple[float, bytes]:
    """The workers' lifetime in a build left alone, and its file.

    The lifetime is the seconds from the first worker seen to the last one's end.
    """
    with tempfile.TemporaryDirectory(prefix="kill-loop-") as out:
        process = start(args, Path(out))
        if not first_workers(process, args.timeout):
            sys.exit(f"no worker seen in a build left alone: {process.communicate()[1]}")
        seen = time.monotonic()
        while workers_of(process.pid):
            time.sleep(0.005)
        ended = time.monotonic()
        _, stderr = process.communicate(timeout=args.timeout)
        if process.returncode != 0:
            sys.exit(f"the build left alone failed (exit {process.returncode}): {stderr}")
        return ended - seen, next(Path(out).glob("*.parquet")).read_bytes()


def one_run(args, rng: random.Random, window: float, expected: bytes) -> tuple[str, float | None]:
    with tempfile.TemporaryDirectory(prefix="kill-loop-") as out:
        process = start(args, Path(out))
        pids = first_workers(process, args.timeout)
        time.sleep(rng.uniform(0, 0.75 * window))
        alive = workers_of(process.pid) or pids
        victim = rng.choice(alive) if alive else None
        if victim is None or process.poll() is not None or not _is_worker(victim):
            process.communicate()
            return "finished before the kill", None
        seen = set(alive)
        # it had exited: the build was past its workers
        if not _kill(victim):
            process.communicate()
            return "finished before the kill", None
        killed = time.monotonic()
        try:
            _, stderr = process.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            seen |= set(workers_of(process.pid))
            os.killpg(process.pid, signal.SIGKILL)
            for pid in seen:
                _kill(pid)
            process.communicate()
            return "hang", None
        took = time.monotonic() - killed
        left = [p.name for p in Path(out).iterdir() if p.suffix in (".tmp", ".parquet")]
        survivors = [pid for pid in seen if _is_worker(pid)]
        if (
            process.returncode == 7
            and "worker process died" in stderr
            and "Traceback" not in stderr
            and not left
            and not survivors
        ):
            when = "while starting" if "while starting" in stderr else "mid-build"
            return (
                f"exit 7 within {args.within:g} s, {when}"
                if took <= args.within
                else f"exit 7 after {args.within:g} s, {when}",
                took,
            )
        files = list(Path(out).glob("*.parquet"))
        if (
            process.returncode == 0
            and not survivors
            and len(files) == 1
            and files[0].read_bytes() == expected
        ):
            return (
                "exit 0, the same file as the build left alone: "
                "the worker was killed after its last batch",
                took,
            )
        lines = stderr.strip().splitlines()
        detail = (
            f" ({len(lines)} stderr lines, last: {lines[-1][:100] if lines else ''!r}"
            f"{', left ' + ', '.join(left) if left else ''}"
            f"{', workers left running' if survivors else ''})"
        )
        return f"exit {process.returncode}{detail}", took


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument(
        "--build",
        default="fixture-synthetic-v1",
        help="the manifest to build (default: %(default)s)",
    )
    p.add_argument("--fixture-cache", type=Path, default=REPO / ".fixture-cache")
    p.add_argument(
        "--manifest",
        type=Path,
        help="build this manifest instead, from the HF cache that HF_HOME names "
        "(with HF_HUB_OFFLINE=1)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60,
        help="seconds a run may take after the kill (default 60)",
    )
    p.add_argument(
        "--within",
        type=float,
        default=10,
        help="seconds in which exit 7 counts as prompt (default 10)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    window, expected = left_alone(args)
    print(
        f"workers live {window:.2f} s in a build of {args.manifest or args.build} left alone; "
        f"each run kills one "
        f"at a random moment in its first three quarters (seed {args.seed})",
        flush=True,
    )
    rng, outcomes, times = random.Random(args.seed), Counter(), []
    for run in range(args.runs):
        outcome, took = one_run(args, rng, window, expected)
        outcomes[outcome] += 1
        if took is not None:
            times.append(took)
        print(
            f"run {run + 1:>3}: {outcome}"
            + (f" ({took:.2f} s after the kill)" if took is not None else ""),
            flush=True,
        )
    print(f"\n{args.runs} runs:")
    for outcome, count in outcomes.most_common():
        print(f"  {count:>3}  {outcome}")
    if times:
        print(
            f"seconds from the kill to the exit: median {sorted(times)[len(times) // 2]:.2f}, "
            f"max {max(times):.2f}"
        )


if __name__ == "__main__":
    main()
