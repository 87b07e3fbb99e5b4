#!/usr/bin/env python3
"""Where a worker's start-up goes, each step timed (wall s, CPU s).

One worker alone, then N at once:

    pip install -r bench/requirements.txt
    python bench/worker_start.py ../shared/pinned/GLM-4.7-Flash/chat_template.jinja 4 16

Each worker is a fresh interpreter (one thread, as the workers' parent runs) that imports
``builders.encode.family`` (what the workers' parent imports), reads the GLM-scale
``tokenizer.json`` of bench/scale_inputs.py, loads it with tokenizers, makes the glm5
``ConversationEncoder``, loads fastokens and runs the engine's probes: what stands between a
build's start and its first batch. It prints the steps' times and, for N at once, their medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = r"""
import json, resource, sys, time
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
started, used, out = time.perf_counter(), cpu(), {}
def step(name):
    global started, used
    out[name] = [round(time.perf_counter() - started, 2), round(cpu() - used, 2)]
    started, used = time.perf_counter(), cpu()
sys.path.insert(0, sys.argv[1])
import builders.encode.family; step("import builders.encode.family")
import builders.formats.render; step("import the chat renderer (transformers)")
text, template = open(sys.argv[2]).read(), open(sys.argv[3]).read(); step("read tokenizer.json")
from tokenizers import Tokenizer
from builders.encode import engines
from builders.encode.encoder import ConversationEncoder
from builders.formats import FormatSpec
tokenizer = Tokenizer.from_str(text); step("Tokenizer.from_str")
encoder = ConversationEncoder(tokenizer, FormatSpec("glm5", template)); step("ConversationEncoder")
fast = engines.FastokensEngine(text); step("fastokens load")
reference = engines.TokenizersEngine(tokenizer)
engines._disagreements(fast, reference, engines.probes(tokenizer, template)); step("probes")
print(json.dumps(out))
"""


def worker(tokenizer_json: Path, template: Path) -> dict:
    # as the build's
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", STEPS, str(REPO), str(tokenizer_json), str(template)],
        capture_output=True,
        text=True,
        env=environment,
    )
    if done.returncode != 0:
        raise SystemExit(f"a worker's start-up failed: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from scale_inputs import glm_scale_tokenizer

    template, counts = Path(sys.argv[1]), [int(n) for n in sys.argv[2:]] or [4]
    with tempfile.TemporaryDirectory() as folder:
        tokenizer_json = Path(folder) / "tokenizer.json"
        tokenizer_json.write_text(glm_scale_tokenizer())
        alone = worker(tokenizer_json, template)
        print(f"{os.cpu_count()} cores; one worker alone: {json.dumps(alone)}")
        for count in counts:
            started = time.perf_counter()
            with ThreadPoolExecutor(count) as pool:
                results = list(pool.map(lambda _: worker(tokenizer_json, template), range(count)))
            medians = {
                step: [statistics.median(r[step][k] for r in results) for k in (0, 1)]
                for step in results[0]
            }
            print(
                f"{count} at once ({time.perf_counter() - started:.1f} s in all), "
                f"median [wall, CPU] per step: "
                f"{json.dumps(medians)}"
            )


if __name__ == "__main__":
    main()
