#!/usr/bin/env python3
"""A one-process build's CPU by thread: where the CPU of ``--workers 1`` goes.

    FIXED_SFT_SHARED=../shared HF_HOME=/tmp/bc/hf HF_HUB_OFFLINE=1 python bench/thread_cpu.py \\
        --manifest /tmp/bc/bench.yaml --out /tmp/thread-cpu --engine fastokens --workers 1 -q \\
        --no-card

The arguments are the build's own (``generate_fixed_sft.py``'s). The build runs in this process;
a sampling thread reads every thread's CPU time from ``/proc/self/task`` every 20 ms and keeps
each one's last reading, so a thread that ends counts too (less its last 20 ms). A Python thread
is named by its name less its number (``cross-check``, ``row-writer``, ``engine-choice``...);
a thread Python did not start (rayon's, pyarrow's, the engines' own) by ``native:`` and its
command name. Prints the process's CPU and each name's, largest first. With
``TOKENIZERS_PARALLELISM=false`` the reference's encoding runs in the thread that calls it (the
cross-check's), not in rayon's threads, so it is counted apart.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Each thread of this process: its command name and CPU seconds."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        fields = rest.split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def main() -> None:
    seen: dict[int, tuple[str, float]] = {}
    names: dict[int, str] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})
            seen.update(thread_cpu())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    sampler.start()
    sys.argv = ["generate_fixed_sft.py", *sys.argv[1:]]
    from builders.cli import main as build

    started = time.process_time()
    build()
    cpu = time.process_time() - started
    done.set()
    sampler.join()
    by_name: collections.Counter = collections.Counter()
    for tid, (command, seconds) in seen.items():
        name = names.get(tid)
        by_name[re.sub(r"[-_]?\d+$", "", name) if name else f"native:{command}"] += seconds
    print(f"process CPU {cpu:.2f} s (the build's, from its start)")
    for name, seconds in by_name.most_common():
        print(f"{seconds:7.2f} s  {name}")


if __name__ == "__main__":
    main()
