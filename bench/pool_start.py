#!/usr/bin/env python3
"""A pool's time from its start-up messages to every worker's engine chosen.

On the recipe-scale bench inputs (those of bench/build_at_scale.py, in bench/.cache):

    .venv/bin/python bench/pool_start.py 2      # two workers

Twice: with the message sent at once (the workers still importing) and 4 s after the pool was
entered (their interpreters up, as in a build whose inputs take that long to open). Prints the
seconds from ``start`` to ``settle`` and the engine chosen.
"""

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HOME", str(REPO / "bench" / ".cache" / "hf"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders.encode import pool as parallel  # noqa: E402
from builders.inputs.pinned import Hub, pinned_inputs  # noqa: E402
from builders.manifest import load_manifest  # noqa: E402


def main() -> None:
    manifest = load_manifest(REPO / "bench" / ".cache" / "bench.yaml")
    pinned, source = pinned_inputs(manifest, Hub())
    for delay in (0, 4):
        with parallel.Pool(int(sys.argv[1])) as pool:
            time.sleep(delay)
            started = time.perf_counter()
            pool.load(
                pinned.snapshot / "tokenizer.json", manifest.tokenizer.sha256["tokenizer.json"]
            )
            pool.start(pinned, manifest.contract, "fastokens", source)
            chosen = pool.settle()
            print(
                f"message {delay} s after the pool started: start to ready "
                f"{time.perf_counter() - started:.2f} s "
                f"({chosen.name})"
            )


if __name__ == "__main__":
    main()
