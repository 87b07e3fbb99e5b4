#!/usr/bin/env python3
"""SIGTERM to builds at random moments: how many leave anything behind.

    .venv/bin/python bench/stop_signal_loop.py 80 0.25 1.2  # 80 builds, the signal 0.25-1.2 s in
    .venv/bin/python bench/stop_signal_loop.py 30 0.2 1.5 --workers 2  # with worker processes

Each build (the fault tests' big build, laid out once in a temporary folder) gets SIGTERM after a
seeded random delay; a build counts as bad when it exits with anything but 130 (or dies by the
signal itself, before its handler is installed) or leaves any file in its output folder. Prints
each bad build's exit code, files and stderr, then the count.
"""

import random
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from test_faults import BIG  # noqa: E402

from builders.fixture.make import synthetic_rows  # noqa: E402
from helpers import lay_out_build, start_cli  # noqa: E402


def main() -> None:
    runs, low, high, more = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    folder = Path(tempfile.mkdtemp())
    manifest = lay_out_build(folder / "hf", synthetic_rows(seed=11, count=9600), **BIG)
    rng, bad = random.Random(1), 0
    for run in range(runs):
        out, delay = folder / f"out{run}", rng.uniform(low, high)
        process = start_cli(
            "--manifest", str(manifest), "--out", str(out), *more, hf_home=folder / "hf"
        )
        time.sleep(delay)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        left = sorted(p.name for p in out.iterdir()) if out.exists() else []
        if left or process.returncode not in (130, -signal.SIGTERM):
            bad += 1
            print(
                f"run {run}, signal after {delay:.2f} s: exit {process.returncode}, left {left}, "
                f"stderr "
                f"{stderr.strip()[:1500]!r}"
            )
    print(f"{bad} of {runs} builds left something or did not exit 130")


if __name__ == "__main__":
    main()
