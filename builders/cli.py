"""Command line: build a manifest's rows, or verify an existing file against its manifest."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from builders.build import build
from builders.errors import BuildError, UsageError
from builders.figures import Check, check_notes, compare, file_figures
from builders.fixture.make import make_fixture_cache, shared_dir
from builders.manifest import Manifest, load_manifest
from builders.pinned import Hub

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"

EPILOG = """\
examples:
  %(prog)s --build glm47flash-tulu3-fixed8192-v1          # manifests/NAME.yaml → out/NAME.parquet
  %(prog)s --manifest my.yaml --out /data/rows
  %(prog)s --verify out/glm47flash-tulu3-fixed8192-v1.parquet
  %(prog)s --build fixture-synthetic-v1 --fixture-cache .fixture-cache   # self-contained, offline

inputs come from the Hugging Face Hub, or offline from the HF cache (HF_HOME, HF_HUB_OFFLINE=1).

exit codes:
  0  built or verified: every figure the manifest pins matches
  1  internal error (a bug: please report it)
  2  bad command line or manifest
  3  a pinned input is missing, unresolvable or does not match its sha256
  4  the source holds a conversation the row contract cannot render, or too few rows
  5  a figure differs from the manifest (a build keeps its file as NAME.unverified.parquet)
  6  the output cannot be written (disk full, no permission)
  130 interrupted (SIGINT or SIGTERM); temporary files are removed
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="generate_fixed_sft.py", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Deterministically build fixed-length SFT rows named by a manifest, and verify their hashes.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--build", metavar="NAME", help="build the manifest manifests/NAME.yaml")
    which.add_argument("--manifest", metavar="FILE", type=Path, help="build the manifest in FILE")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("out"),
                   help="output folder for NAME.parquet and NAME.report.json (default: out)")
    p.add_argument("--verify", metavar="FILE", type=Path,
                   help="do not build: re-read FILE and check its figures against the manifest (given by --build "
                        "or --manifest, else manifests/NAME.yaml for FILE named NAME.parquet)")
    p.add_argument("--fixture-cache", metavar="DIR", type=Path,
                   help="lay out the fixture HF cache (the repos the fixture-* manifests pin) in DIR, "
                        "then build offline from it")
    p.add_argument("--manifests", metavar="DIR", type=Path, default=MANIFESTS,
                   help=f"where --build looks up NAME.yaml (default: {MANIFESTS})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # unwind like Ctrl-C, so temporary files are removed
    try:
        if args.verify is not None:
            return _verify(args)
        if args.build is None and args.manifest is None:
            raise UsageError("nothing to do: give --build NAME, --manifest FILE or --verify FILE (see --help)")
        manifest = _manifest(args.build, args.manifest, args.manifests)
        hub = Hub()
        if args.fixture_cache is not None:
            make_fixture_cache(args.fixture_cache, shared_dir())
            hub = Hub(cache_dir=args.fixture_cache / "hub", offline=True)
        result = build(manifest, args.out, hub, log=lambda line: print(line, file=sys.stderr))
        _print_checks(result.checks, result.notes)
        print(f"{'verified' if result.verified else 'NOT verified'}: {result.parquet} (report: {result.report})")
        return 0 if result.verified else 5
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; nothing was left at the final path", file=sys.stderr)
        return 130


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _manifest(name: str | None, path: Path | None, manifests: Path) -> Manifest:
    if path is not None:
        return load_manifest(path)
    if not Path(name).name == name or name in ("", ".", ".."):
        raise UsageError(f"--build takes a manifest name, not a path: {name!r}")
    candidate = manifests / f"{name}.yaml"
    if not candidate.is_file():
        known = sorted(p.stem for p in manifests.glob("*.yaml"))
        raise UsageError(f"no manifest {candidate} (known: {', '.join(known) or 'none'})")
    return load_manifest(candidate)


def _verify(args) -> int:
    if args.build is None and args.manifest is None:
        stem = args.verify.name.removesuffix(".parquet").removesuffix(".unverified")
        args.build = stem
    manifest = _manifest(args.build, args.manifest, args.manifests)
    if not args.verify.is_file():
        raise UsageError(f"--verify: no file {args.verify}")
    checks = compare(file_figures(args.verify, manifest.row_tokens), manifest.expect, manifest.rows)
    notes = check_notes(checks, manifest.expect)
    _print_checks(checks, notes)
    verified = all(check.status != "differs" for check in checks)
    print(f"{'verified' if verified else 'NOT verified'}: {args.verify} against {manifest.path}")
    return 0 if verified else 5


def _print_checks(checks: list[Check], notes: list[str]) -> None:
    for check in checks:
        if check.status == "differs":
            print(f"  DIFFERS     {check.figure}: expected {check.expected}, got {check.got}")
        elif check.status == "ok":
            print(f"  ok          {check.figure}: {check.got}")
        else:
            print(f"  not pinned  {check.figure}: {check.got}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
