"""A JSON Lines row holding one huge message: the build's time, exit code and peak memory.

Issue 25: a 200 MB message once grew a build to 22 GB. The row is refused unread (longer than
``limits.conversation_chars``); this measures that it ends in seconds, with exit 4, in little
memory. The command is run under ``/usr/bin/time -v`` (its maximum resident set size counts the
build's process; the process hashing the source is measured too where GNU time reports it).

    .venv/bin/python bench/huge_row.py            # a 200 MB message
    .venv/bin/python bench/huge_row.py --mb 20    # a smaller one
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from builders.fixture.hf_cache import put_snapshot  # noqa: E402
from builders.fixture.make import FIXTURE_TEMPLATE, synthetic_rows, tokenizer_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="size of the message (MB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        rows = synthetic_rows(seed=2, count=20)
        data = tmp = home / "rows.jsonl"
        with open(tmp, "w", encoding="utf-8") as out:
            for k, row in enumerate(rows):
                if k == 3:
                    row = {
                        **row,
                        "messages": [{"role": "user", "content": "x" * int(args.mb * 1e6)}],
                    }
                out.write(json.dumps(row) + "\n")
        dataset = put_snapshot(home, "b/huge", "dataset", {"data/train.jsonl": data.read_bytes()})
        files = {
            "tokenizer.json": tokenizer_json(),
            "chat_template.jinja": FIXTURE_TEMPLATE.read_bytes(),
        }
        tokenizer = put_snapshot(home, "b/tok", "model", files)
        manifest = home / "huge.yaml"
        manifest.write_text(
            yaml.safe_dump(
                {
                    "name": "huge",
                    "dataset": {"repo": "b/huge", "revision": dataset, "files": "data/*.jsonl"},
                    "tokenizer": {
                        "repo": "b/tok",
                        "revision": tokenizer,
                        "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in files.items()},
                    },
                    "loss_mask": "glm5",
                    "seed": 1,
                    "row_tokens": 256,
                    "rows": 1000,
                },
                sort_keys=False,
            )
        )
        started = time.perf_counter()
        done = subprocess.run(
            [
                "/usr/bin/time",
                "-v",
                sys.executable,
                str(REPO / "data" / "generate_fixed_sft.py"),
                "--manifest",
                str(manifest),
                "--out",
                str(home / "out"),
                "--workers",
                "1",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )
        elapsed = time.perf_counter() - started
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    print(
        json.dumps(
            {
                "message_mb": args.mb,
                "exit_code": done.returncode,
                "seconds": round(elapsed, 1),
                "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
                "error": [line for line in done.stderr.splitlines() if "error" in line.lower()][:2],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
