"""Reading a dataset in each format the builder takes: time and memory.

Time to open (count rows, find blocks) and to decode every block, and the process's peak memory,
for the same rows stored as parquet, JSON Lines and one JSON list (ShareGPT layout for the JSON).
The memory bound is the claim: a block at a time, so the peak stays far below the file's size.

    # 400 MB of JSON Lines: writes bench/read_formats.json
    .venv/bin/python bench/read_formats.py
    # a smoke run: bench/.cache/read_formats.smoke.json
    .venv/bin/python bench/read_formats.py --mb 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from builders.fixture.make import synthetic_rows  # noqa: E402
from measure import PEAK_RSS, write_results  # noqa: E402

READ = (
    PEAK_RSS
    + """
import json, sys, time
from pathlib import Path
from builders.manifest import DatasetPin
from builders.inputs.source import Source
path, fields = Path(sys.argv[1]), json.loads(sys.argv[2])
imported = peak_rss_mib()
started = time.perf_counter()
pin = DatasetPin(repo="b/b", revision="0" * 40, files=path.name, **fields)
source = Source([(pin, [(path.name, path)])])
opened = time.perf_counter()
messages = sum(
    len(source.read_group(g).column("messages").combine_chunks().values)
    for g in range(source.num_groups)
)
print(json.dumps({"rows": source.num_rows, "blocks": source.num_groups, "messages": messages,
                  "open_s": round(opened - started, 2),
                  "read_s": round(time.perf_counter() - opened, 2),
                  "peak_rss_mib": round(peak_rss_mib()),
                  "peak_rss_after_imports_mib": round(imported)}))
"""
)
# the committed results' size
FULL_MB = 400
SHAREGPT = {
    "messages": "conversations",
    "keys": ("from", "value", "reasoning_content", "tool_calls", "tool_call_id", "name"),
    "roles": [["system", "system"], ["human", "user"], ["gpt", "assistant"], ["tool", "tool"]],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mb", type=float, default=FULL_MB, help="size of the JSON Lines file (MB)"
    )
    args = parser.parse_args()
    base = synthetic_rows(seed=1, count=2000)
    names = {"user": "human", "assistant": "gpt", "system": "system", "tool": "tool"}
    records = [
        {
            "id": r["id"],
            "source": r["source"],
            "conversations": [
                {"from": names[m["role"]], "value": m["content"]} for m in r["messages"]
            ],
        }
        for r in base
    ]
    lines = [json.dumps(r) for r in records]
    repeat = max(1, int(args.mb * 1e6 / sum(len(line) + 1 for line in lines)))
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        with open(folder / "x.jsonl", "w") as jsonl, open(folder / "x.json", "w") as whole:
            whole.write("[\n")
            for k in range(repeat):
                jsonl.write("\n".join(lines) + "\n")
                whole.write(",\n".join(lines) + (",\n" if k < repeat - 1 else "\n"))
            whole.write("]\n")
        table = pa.Table.from_pylist(
            [
                {
                    "id": r["id"],
                    "source": r["source"],
                    "messages": [
                        {"role": m["role"], "content": m["content"]} for m in r["messages"]
                    ],
                }
                for r in base
            ]
            * repeat
        )
        pq.write_table(table, folder / "x.parquet", row_group_size=10_000, compression="zstd")
        del table
        for name, fields in (("x.parquet", {}), ("x.jsonl", SHAREGPT), ("x.json", SHAREGPT)):
            done = subprocess.run(
                [sys.executable, "-c", READ, str(folder / name), json.dumps(fields)],
                capture_output=True,
                text=True,
                cwd=REPO,
                check=True,
            )
            results[name] = {
                "file_mb": round((folder / name).stat().st_size / 1e6),
                **json.loads(done.stdout),
            }
            print(name, results[name], flush=True)
    # a smoke run never overwrites the committed results
    write_results(
        REPO
        / "bench"
        / ("read_formats.json" if args.mb == FULL_MB else ".cache/read_formats.smoke.json"),
        results,
    )


if __name__ == "__main__":
    main()
