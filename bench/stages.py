"""Where a build's main process spends its CPU, by stage.

A py-spy profile of that process alone.

``profiled(command)`` runs ``command`` under ``py-spy record`` (sampling every thread of the main
process, not its workers; idle threads are not sampled) and returns each stage's share of the
samples. A thread waiting for a busy CPU counts as active too, so the shares, not the sampled
seconds, are what to trust: the benchmark multiplies them by the process's own CPU time. A
sample's stage is found in its stack: start-up first (the whole stack), else the innermost frame
a rule names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RATE = 100  # samples per second

# frames whose whole call is start-up: imports, opening the inputs, the engine's choice, the plan,
# workers starting
STARTUP = [
    ("<frozen importlib._bootstrap>", r"_find_and_load"),
    ("pinned.py", r"pinned_inputs"),
    ("build.py", r"_checked_order"),
    ("engines.py", r"choose"),
    ("stream.py", r"plan"),
    ("pool.py", r"__enter__"),
]

# (stage, file name, function names): the innermost frame that matches decides
RULES = [
    ("guard cross-check", "engines.py", r"check|cross_check|_compare|finish"),
    ("source decode (and spill)", "source.py", r".*"),
    ("source decode (and spill)", "stream.py", r"_read|_bucket|add|in_order|_in_order"),
    ("source decode (and spill)", "held.py", r".*"),
    ("rendering and encoding", "encode.py", r".*"),
    ("rendering and encoding", "chat.py", r".*"),
    # the glm5 layout and placement (builders/ and builders/formats/)
    ("placement and masking", "glm5.py", r".*"),
    ("placement and masking", "turns.py", r".*"),
    ("placement and masking", "peers.py", r".*"),
    ("rendering and encoding", "worker.py", r"encode_rows"),
    ("hand-off to and from workers", "pool.py", r".*"),
    ("hand-off to and from workers", "worker.py", r".*"),
    ("placement and masking", "packing.py", r".*"),
    ("placement and masking", "build.py", r"_rows"),
    ("hashing", "figures.py", r".*"),
    ("hashing", "pinned.py", r"checked|hashed_files"),
    ("parquet writer", "rowfile.py", r".*"),
    # pyarrow.parquet, in the writer's thread
    ("parquet writer", "core.py", r"write_table|close"),
    ("stats", "stats.py", r".*"),
    ("report and card", "card.py", r".*"),
]
STAGES = ["start-up", *dict.fromkeys(stage for stage, _, _ in RULES), "other"]
FRAME = re.compile(r"^(?P<function>\S+) \((?P<file>[^:]*):\d*\)$")


def py_spy() -> str | None:
    return shutil.which("py-spy") or next(
        (str(p) for p in [Path(sys.executable).parent / "py-spy"] if p.exists()), None
    )


def stage_of(stack: list[str]) -> str:
    """The stage of one sample's stack.

    The frames come root first, as py-spy writes them.
    """
    frames = [
        (Path(f["file"]).name, f["function"].split(".")[-1]) for f in map(FRAME.match, stack) if f
    ]
    if any(_named(frame, rule) for frame in frames for rule in STARTUP):
        return "start-up"
    for frame in reversed(frames):
        for stage, *rule in RULES:
            if _named(frame, rule):
                return stage
    return "other"


def _named(frame: tuple[str, str], rule) -> bool:
    return frame[0] == rule[0] and re.fullmatch(rule[1], frame[1]) is not None


def profiled(command: list[str], env: dict, cwd: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``command`` under py-spy.

    Return its result (py-spy's own lines taken out) and ``{"stage_shares": each stage's share of
    the main process's samples}``.
    """
    spy = py_spy()
    if spy is None:
        raise SystemExit("--profile needs py-spy: .venv/bin/python -m pip install py-spy")
    with tempfile.TemporaryDirectory() as folder:
        raw = Path(folder) / "profile.txt"
        done = subprocess.run(
            [
                spy,
                "record",
                "--nonblocking",
                "-r",
                str(RATE),
                "-f",
                "raw",
                "-o",
                str(raw),
                "--",
                *command,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
        )
        samples = dict.fromkeys(STAGES, 0)
        for line in raw.read_text().splitlines() if raw.exists() else []:
            stack, _, count = line.rpartition(" ")
            samples[stage_of(stack.split(";"))] += int(count)
    done.stdout = "".join(
        line for line in done.stdout.splitlines(keepends=True) if not line.startswith("py-spy>")
    )
    total = max(1, sum(samples.values()))
    return done, {"stage_shares": {stage: count / total for stage, count in samples.items()}}
