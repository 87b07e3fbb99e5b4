#!/usr/bin/env python3
"""What every thread of a build did, and when: a timeline from a py-spy profile.

Record the build with py-spy (every process and thread, idle samples too, in speedscope form),
then print one line per thread, a character per time slice: the state most of its samples were
in.

    py-spy record --idle --threads --subprocesses --nonblocking -r 100 -f speedscope \\
        -o build.speedscope.json -- python3 data/generate_fixed_sft.py --manifest M --out O -q
    python3 bench/timeline.py build.speedscope.json --slice 0.25

speedscope gives each thread's samples in order, not when the thread started: a thread is drawn
ending when its process ends, and a worker's process ending ``--worker-end`` seconds before the
build's (the build reaps them last). A thread that ended early (a pool's short-lived thread) is
drawn too late; read its length, not its place.

States: I imports, P the tokenizer parsed, F fastokens loading, T encoding with tokenizers,
f encoding with fastokens, R a row group decoded, S a worker sending its answer (waiting for the
build to read it), W the parquet writer, H the source hashed, h the build waiting for the writer,
r rendering, p packing, counting and hashing rows, . waiting, o anything else.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

# (state, words of which one names a frame of the sample's stack), the first that matches; a
# sample in none of these whose innermost frame waits is waiting (``h`` on the writer, ``.``
# else), and only then can it be one of ``BUSY``
STATES = [
    ("I", ["_find_and_load"]),
    ("P", ["Tokenizer.from_str", "_parsed_tokenizer"]),
    ("F", ["FastokensEngine.__init__"]),
    ("S", ["_send_results"]),
    ("T", ["TokenizersEngine.encode"]),
    ("f", ["FastokensEngine.encode"]),
    ("R", ["read_row_group", "ParquetFile.read"]),
    ("W", ["_write_group"]),
    ("H", ["HashingProcess", "file_digests"]),
]
BUSY = [
    ("r", ["ChatRenderer", "BoundedSandbox"]),
    ("p", ["packed", "Packer", "RowHash", "BuildStats"]),
]
# innermost frames of a thread that waits
WAITING = ["select", "wait", "_recv", "_next_task", "acquire", "_worker", "sleep", "poll"]
THREAD = re.compile(r'Process (?P<pid>\d+) Thread (?P<tid>\d+) "(?P<name>.*)"')


def state(names: list[str]) -> str:
    """The state of one sample, from its frames' names (root first)."""

    def named(words: list[str]) -> bool:
        return any(word in name for name in names for word in words)

    for letter, words in STATES:
        if named(words):
            return letter
    if names and any(word in names[-1] for word in WAITING):
        return "h" if named(["RowWriter.hand_over"]) else "."
    return next((letter for letter, words in BUSY if named(words)), "o")


def timeline(profile: dict, slice_s: float, worker_end: float) -> list[str]:
    """One line for each thread, the build's process first."""
    names = [frame["name"] for frame in profile["shared"]["frames"]]
    threads = defaultdict(list)
    for thread in profile["profiles"]:
        found = THREAD.match(thread["name"])
        if found and thread["endValue"] > slice_s:
            threads[found["pid"]].append((found["name"], thread))
    if not threads:
        return []
    build = next(iter(threads))
    total = max(t["endValue"] for _, t in threads[build])
    lines = []
    for pid, of_process in threads.items():
        end = total if pid == build else total - worker_end
        for name, thread in of_process:
            if "_receive" in name:
                # a worker's reader of its channel: always waiting
                continue
            slices: dict[int, Counter] = defaultdict(Counter)
            at = end - thread["endValue"]
            for stack, weight in zip(thread["samples"], thread["weights"], strict=True):
                slices[int(at / slice_s)][state([names[k] for k in stack])] += 1
                at += weight
            drawn = "".join(
                slices[k].most_common(1)[0][0] if k in slices else " "
                for k in range(int(total / slice_s) + 1)
            )
            who = "build" if pid == build else f"w{pid}"
            lines.append(f"{who:7s} {name[:14]:14s}|{drawn}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", type=Path, help="py-spy's speedscope JSON")
    parser.add_argument("--slice", type=float, default=0.25, help="seconds a character stands for")
    parser.add_argument("--worker-end", type=float, default=0.3, help="see above")
    args = parser.parse_args()
    profile = json.loads(args.profile.read_text())
    print("\n".join(timeline(profile, args.slice, args.worker_end)))


if __name__ == "__main__":
    main()
