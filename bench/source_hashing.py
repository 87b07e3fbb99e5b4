#!/usr/bin/env python3
"""What hashing the source shards beside the build costs it.

    python bench/source_hashing.py --scale 0.25  # 234,836 conversations, 6,400 rows of 8,192
    python bench/source_hashing.py --scale 0.01 --rows 40  # a smoke run

On the inputs of bench/build_at_scale.py (laid out once in --cache), each in a fresh process:
the hashing alone (``builders.inputs.pinned.hashed_files`` over the source's shards), and builds as
users run them (``--no-card``), with the hashing and with it skipped (its hashing process
replaced by one that reads nothing), alternately, twice each. A build records in
its report's ``timings.hash_s`` how long it waited, after its rows, for the parquet's and the
shards' hashes: near 0 when the shards were hashed beside the rows. Results go to
bench/source_hashing.json for a full-scale run, bench/.cache/source_hashing.smoke.json otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from measure import CLI, busy, child, scale_options, write_results  # noqa: E402
from scale_inputs import lay_out, manifest_text  # noqa: E402

REPEATS = 2
HASHING_ALONE = """
import json, resource, sys, time
from builders.manifest import load_manifest
from builders.inputs.pinned import Hub, dataset_files, hashed_files, pinned_files, resolve
manifest = load_manifest(sys.argv[1])
files = dataset_files(manifest.dataset, resolve(manifest, Hub()).datasets[0])
# this process's and its children's (the hashing process's, once reaped)
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
started, before = time.perf_counter(), cpu()
with hashed_files(pinned_files(files)) as hashes:
    recorded = hashes.checked()
print(json.dumps({"seconds": time.perf_counter() - started, "cpu_seconds": cpu() - before,
                  "bytes": sum(f["bytes"] for f in recorded)}))
"""

# the build with the shards' hashing skipped: the same code, its hashing process replaced by one
# that reads nothing (each file's digest is the name of its blob)
UNHASHED = (
    """
import os
from concurrent.futures import Future
from pathlib import Path
import builders.inputs.pinned

class Unhashed:
    def __init__(self, paths, git_blob_ids=None):
        self.digests = [Future() for _ in paths]
        for digest, path in zip(self.digests, paths):
            blob = Path(os.path.realpath(path)).name
            digest.set_result((blob, Path(path).stat().st_size, blob))

    def stop(self):
        pass

builders.inputs.pinned.HashingProcess = Unhashed
"""
    + CLI
)


def build(code: str, manifest: Path, out: Path, hf_home: Path) -> dict:
    load = busy()
    result = child(
        code, "--manifest", str(manifest), "--out", str(out), "-q", "--no-card", hf_home=hf_home
    )
    if result["exit"] != 0:
        raise SystemExit(f"build failed: {result['stderr']}")
    report = json.loads(next(out.glob("*.report.json")).read_text())
    return {
        "seconds": round(result["seconds"], 2),
        "busy_before": round(load, 3),
        "timings": report["timings"],
        "rows_sha256": report["figures"]["rows_sha256"],
    }


def main() -> None:
    args, results, template = scale_options(
        __doc__, "source_hashing", "rows of 8,192 tokens to build"
    )
    hf_home = args.cache / "hf"
    facts = lay_out(hf_home, template, args.scale)
    manifest = args.cache / "hashing.yaml"
    manifest.write_text(manifest_text(facts, "hashing", args.rows))

    alone = child(HASHING_ALONE, str(manifest), hf_home=hf_home)
    print(
        f"hashing alone: {alone['bytes'] / 2**20:,.0f} MiB in {alone['seconds']:.2f} s "
        f"({alone['cpu_seconds']:.2f} s of CPU)",
        file=sys.stderr,
        flush=True,
    )
    builds = {"hashed": [], "unhashed": []}
    for _ in range(REPEATS):
        for kind, code in (("hashed", CLI), ("unhashed", UNHASHED)):
            builds[kind].append(
                build(code, manifest, args.cache / "out" / f"hashing-{kind}", hf_home)
            )
            last = builds[kind][-1]
            print(
                f"  build, {kind}: {last['seconds']} s (hash_s {last['timings']['hash_s']})",
                file=sys.stderr,
                flush=True,
            )
    summary = {
        "machine": {
            "cores": os.cpu_count(),
            "cpu_busy_before_each_build": [b["busy_before"] for k in builds for b in builds[k]],
        },
        "source_mib": round(alone["bytes"] / 2**20),
        "hashing_alone_seconds": round(alone["seconds"], 2),
        "hashing_alone_cpu_seconds": round(alone["cpu_seconds"], 2),
        "builds": builds,
        "same_rows": len({b["rows_sha256"] for k in builds for b in builds[k]}) == 1,
        "scale": args.scale,
        "rows": args.rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "builds"}))
    for kind, runs in builds.items():
        print(
            f"{kind:>9}: seconds {[b['seconds'] for b in runs]}, "
            f"hash_s {[b['timings']['hash_s'] for b in runs]}, "
            f"build_s {[b['timings']['build_s'] for b in runs]}"
        )
    write_results(results, summary)


if __name__ == "__main__":
    main()
