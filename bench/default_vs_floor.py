#!/usr/bin/env python3
"""Recipe-scale builds at given worker counts, and the encode floor.

Nothing else: the short part of bench/build_at_scale.py, for a host lent briefly (about 3 minutes
with the inputs' lay-out on 16 cores).

    FIXED_SFT_SHARED=../shared python bench/default_vs_floor.py auto 1

Prints, for each worker count, the build's seconds, CPU, cores busy, rows_sha256 and timings, and
its ratio to ``encode_batch_fast`` of the consumed conversations' texts (the first build's),
measured in the same run. Inputs are laid out in /tmp/bc (bench/scale_inputs.py, full scale).
"""

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from build_at_scale import TOKENIZER_FLOOR, build  # noqa: E402

from builders.fixture.make import PINNED_TEMPLATE, shared_dir  # noqa: E402
from measure import child  # noqa: E402
from scale_inputs import lay_out, manifest_text  # noqa: E402


def main() -> None:
    cache = Path("/tmp/bc")
    hf = cache / "hf"
    started = time.perf_counter()
    facts = lay_out(hf, (shared_dir() / PINNED_TEMPLATE).read_bytes(), 1.0)
    manifest = cache / "bench.yaml"
    manifest.write_text(manifest_text(facts, "bench", 6400))
    print(f"laid out in {time.perf_counter() - started:.0f} s", flush=True)
    results = {w: build(manifest, cache / "out" / w, hf, "fastokens", w) for w in sys.argv[1:]}
    floor = child(
        TOKENIZER_FLOOR, str(manifest), str(results[sys.argv[1]]["conversations"]), hf_home=hf
    )
    for workers, r in results.items():
        print(
            workers,
            json.dumps(
                {
                    k: r[k]
                    for k in (
                        "workers_used",
                        "seconds",
                        "main_cpu_s",
                        "workers_cpu_s",
                        "cores_busy",
                        "rows_sha256",
                        "timings",
                    )
                }
            ),
            f"x floor {r['seconds'] / floor['seconds']:.3f}",
        )
    print("encode floor", round(floor["seconds"], 2))


if __name__ == "__main__":
    main()
