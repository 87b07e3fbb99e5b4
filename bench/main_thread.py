#!/usr/bin/env python3
"""The build's own thread after the workers: CPU per conversation, this tree against another.

With workers, the build's thread takes each worker's answer (Arrow IPC) into conversations, puts
them in stream order, packs rows, counts stats, hashes rows and hands row groups to the parquet
writer (which compresses in a thread of its own). On 16 cores that thread bounds the build. This
measures it alone: the first --conversations of the bench's stream, encoded once here (untimed)
and laid out as the workers' answers of 256, go through each tree's own code for those steps,
each run in a fresh process, the trees alternated; the figure is that thread's CPU time
(``time.thread_time``) per conversation, which a busy machine disturbs less than wall time.

    FIXED_SFT_SHARED=../shared python bench/main_thread.py --baseline /tmp/main-base \\
        --scale 0.05 --conversations 12000 --repeats 5 --cache bench/.cache

(``/tmp/main-base``: ``git archive main | tar -x -C /tmp/main-base``.) Every run must give the
same rows_sha256 and stats.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from measure import busy  # noqa: E402

ENCODE = """
import pickle, sys
import numpy as np
from builders.build import stream_order
from builders.encode.encoder import ConversationEncoder
from builders.encode.worker import _conversations_table, _ipc, encode_rows
from builders.inputs.layout import conversations
from builders.inputs.pinned import Hub, pinned_inputs
from builders.manifest import load_manifest
manifest = load_manifest(sys.argv[1])
pinned, source = pinned_inputs(manifest, Hub())
_, order = stream_order(manifest, source, manifest.contract.order)
encoder = ConversationEncoder(pinned.tokenizer, pinned.spec, manifest.contract)
answers = []
wanted = order[: int(sys.argv[2])]
for first in range(0, len(wanted), 256):
    table = source.take(wanted[first : first + 256])
    results = encode_rows(encoder, conversations(table), np.arange(first, first + len(table)))
    answers.append(_ipc(_conversations_table(results)).to_pybytes())
pickle.dump(answers, open(sys.argv[3], "wb"))
"""

# the timed part, run in the tree under measure (its own builder)
CHAIN = """
import json, pickle, sys, tempfile, time
from pathlib import Path
import numpy as np
from builders.build import _write_rows, build_stats, packed
from builders.encode.encoder import ConversationEncoder
from builders.encode.stream import Stream
from builders.encode.worker import _conversations, _read
from builders.inputs.pinned import Hub, pinned_inputs
from builders.manifest import load_manifest
from builders.runtime.progress import Reporter
manifest = load_manifest(sys.argv[1])
answers = pickle.load(open(sys.argv[2], "rb"))
pinned, source = pinned_inputs(manifest, Hub())
encoder = ConversationEncoder(pinned.tokenizer, pinned.spec, manifest.contract)

def in_order():
    encoded = {}
    position = 0
    for data in answers:
        encoded.update(_conversations(_read(data)))
        while position in encoded:
            yield encoded.pop(position)
            position += 1

stream = Stream.__new__(Stream)
stream.refused, stream.leave_out = [], 0
stream._in_order = in_order
out = Path(tempfile.mkdtemp()) / "rows.parquet"
# what the first rows import, before the clock starts
_write_rows(manifest, iter([]), out, build_stats(manifest, encoder), Reporter.silent())
_conversations(_read(answers[0]))
stats = build_stats(manifest, encoder)
started = time.thread_time()
rows = packed(manifest, source, encoder, stream, stats, None)
try:
    figures = _write_rows(manifest, rows, out, stats, Reporter.silent())
except Exception as err:
    figures = None
seconds = time.thread_time() - started
summary = stats.summary()
print(json.dumps({"thread_cpu_s": seconds, "conversations": summary["conversations_consumed"],
                  "rows": figures.rows if figures else None,
                  "rows_sha256": figures.as_dict()["rows_sha256"] if figures else None,
                  "stats": summary}))
"""


def run(code: str, *args: str, tree: Path, hf: Path) -> dict:
    env = {**os.environ, "HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tree
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, required=True, help="an earlier checkout")
    parser.add_argument("--scale", type=float, default=0.05, help="share of the source")
    parser.add_argument("--conversations", type=int, default=12000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache")
    args = parser.parse_args()
    from builders.fixture.make import PINNED_TEMPLATE, shared_dir
    from scale_inputs import lay_out, manifest_text

    cache = args.cache.resolve()
    hf = cache / "hf"
    facts = lay_out(hf, (shared_dir() / PINNED_TEMPLATE).read_bytes(), args.scale)
    manifest = cache / "main-thread.yaml"
    # rows: all of what the conversations give
    manifest.write_text(manifest_text(facts, "mainthread", 10**9))
    answers = cache / f"main-thread-{args.conversations}.pickle"
    if not answers.exists():
        run(ENCODE, str(manifest), str(args.conversations), str(answers), tree=REPO, hf=hf)
    trees = {"baseline": args.baseline.resolve(), "this": REPO}
    runs = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            load = busy()
            runs[name].append(run(CHAIN, str(manifest), str(answers), tree=tree, hf=hf))
            r = runs[name][-1]
            print(
                name, f"busy before {load:.2f}", f"thread CPU {r['thread_cpu_s']:.3f} s", flush=True
            )
    results = [r for measured in runs.values() for r in measured]
    if any(
        (r["rows_sha256"], r["stats"]) != (results[0]["rows_sha256"], results[0]["stats"])
        for r in results
    ):
        raise SystemExit("the trees made different rows or stats")
    per = {
        name: statistics.median(r["thread_cpu_s"] for r in measured) / measured[0]["conversations"]
        for name, measured in runs.items()
    }
    print(
        json.dumps(
            {
                "conversations": results[0]["conversations"],
                "rows": results[0]["rows"],
                "rows_sha256": results[0]["rows_sha256"],
                "us_per_conversation": {k: round(v * 1e6, 2) for k, v in per.items()},
                "this_over_baseline": round(per["this"] / per["baseline"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
