"""Command line: build, verify, inspect and diff row files named by manifests.

``generate_fixed_sft.py --build NAME`` (and ``--manifest FILE``, ``--verify FILE``) keep working:
they are the ``build`` and ``verify`` subcommands written as options.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import traceback
from importlib import metadata
from pathlib import Path

from builders.errors import BuildError, UsageError, VerificationError

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
COMMANDS = ("build", "verify", "inspect", "diff")

EPILOG = """\
examples:
  %(prog)s --build glm47flash-tulu3-fixed8192-v1          # manifests/NAME.yaml → out/NAME.parquet
  %(prog)s --build fixture-synthetic-v1 --fixture-cache .fixture-cache   # self-contained, offline
  %(prog)s --manifest my.yaml --out /data/rows
  %(prog)s --verify out/glm47flash-tulu3-fixed8192-v1.parquet
  %(prog)s inspect out/fixture-synthetic-v1.parquet --row 3 --fixture-cache .fixture-cache
  %(prog)s diff out/a/NAME.parquet out/b/NAME.parquet

commands (each has --help): build (the default), verify, inspect, diff.
inputs come from the Hugging Face Hub, or offline from the HF cache (HF_HOME, HF_HUB_OFFLINE=1).

exit codes:
  0  built or verified: every figure the manifest pins matches (diff: the files are identical)
  1  internal error (a bug: please report it), or diff: the files differ
  2  bad command line or manifest
  3  a pinned input is missing, unresolvable or does not match its sha256
  4  the source holds a conversation the row contract cannot render, or too few rows
  5  a figure differs from the manifest (a build keeps its file as NAME.unverified.parquet)
  6  the output cannot be written (disk full, no permission)
  7  a worker process died (killed, or out of memory)
  130 interrupted (SIGINT or SIGTERM); temporary files are removed
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="generate_fixed_sft.py", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Deterministically build fixed-length SFT rows named by a manifest, and verify their hashes.")
    p.add_argument("--version", action="version", version=f"fixed-sft {_own_version()}")
    commands = p.add_subparsers(dest="command", metavar="COMMAND")

    b = commands.add_parser("build", help="build a manifest's rows (the default command)")
    _manifest_options(b)
    b.add_argument("--out", metavar="DIR", type=Path, default=Path("out"),
                   help="output folder for NAME.parquet, NAME.report.json and the data card NAME.md (default: out)")
    b.add_argument("--no-card", action="store_true", help="do not write the data card and its plots")
    b.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes that render and tokenize (default 1, whose tokenizer already uses all "
                        f"{os.cpu_count()} cores; more processes also spread the Python-side work, which measured "
                        "slower on 2 cores: see bench/); the rows are the same for any number")
    _hub_options(b)
    _output_options(b)

    v = commands.add_parser("verify", help="re-read a built file and check it against its manifest")
    v.add_argument("file", type=Path, help="the parquet file to verify")
    _manifest_options(v, default_help="default: manifests/NAME.yaml for a file named NAME.parquet")
    _output_options(v)

    i = commands.add_parser("inspect", help="show a row or a source conversation decoded, supervision highlighted")
    i.add_argument("file", type=Path, nargs="?", help="a built parquet file (omit with --source-index)")
    i.add_argument("--row", type=int, default=0, help="the row to show (default 0)")
    i.add_argument("--source-index", type=int, help="show this source conversation's tokens instead of a row")
    i.add_argument("--html", metavar="FILE", type=Path, help="also write the view as an HTML page")
    i.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="highlight supervised tokens with terminal colors (default: when printing to a terminal)")
    _manifest_options(i, default_help="default: manifests/NAME.yaml for a file named NAME.parquet")
    _hub_options(i)

    d = commands.add_parser("diff", help="compare two built files: the first row and token where they differ")
    d.add_argument("a", type=Path, help="a built parquet file")
    d.add_argument("b", type=Path, nargs="?", help="another built parquet file (or give --build/--manifest to "
                                                   "build that manifest now and compare with it)")
    _manifest_options(d, default_help="build this manifest into a temporary folder and compare A with it")
    _hub_options(d)
    _output_options(d)
    return p


def _manifest_options(p, default_help: str | None = None) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--build", dest="name", metavar="NAME", help="the manifest manifests/NAME.yaml"
                       + (f" ({default_help})" if default_help else ""))
    which.add_argument("--manifest", metavar="FILE", type=Path, help="the manifest in FILE")
    p.add_argument("--manifests", metavar="DIR", type=Path, default=MANIFESTS,
                   help=f"where --build looks up NAME.yaml (default: {MANIFESTS})")


def _hub_options(p) -> None:
    p.add_argument("--fixture-cache", metavar="DIR", type=Path,
                   help="lay out the fixture HF cache (the repos the fixture-* manifests pin) in DIR and read the "
                        "pinned inputs offline from it")
    p.add_argument("--shared", metavar="DIR", type=Path,
                   help="the real data folder (pinned/ and data/) that fixture-tulu100-v1 is made from "
                        "(default: $FIXED_SFT_SHARED)")


def _output_options(p) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="print only errors and the result")
    loud.add_argument("-v", "--verbose", action="store_true", help="print details of each step")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(_with_command(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGTERM, _terminate)  # unwind like Ctrl-C, so temporary files are removed
    try:
        return {"build": _build, "verify": _verify, "inspect": _inspect, "diff": _diff}[args.command](args)
    except BuildError as err:
        if getattr(args, "verbose", False):  # -v: the whole chain, with what caused it
            traceback.print_exception(err, file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("error: interrupted; nothing was left at the final path", file=sys.stderr)
        return 130


def _with_command(argv: list[str]) -> list[str]:
    """The option forms ``--build NAME``, ``--manifest FILE`` and ``--verify FILE`` as subcommands."""
    if argv and argv[0] in COMMANDS or any(a in ("-h", "--help", "--version") for a in argv[:1]):
        return argv
    if "--verify" in argv:
        at = argv.index("--verify")
        return ["verify", *argv[at + 1:at + 2], *argv[:at], *argv[at + 2:]]
    if not argv:
        raise SystemExit(_usage("nothing to do: give --build NAME, --manifest FILE or --verify FILE (see --help)"))
    return ["build", *argv]


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return UsageError.exit_code


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _reporter(args):
    from builders.progress import Reporter

    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
    return Reporter(verbosity=0 if quiet else 2 if getattr(args, "verbose", False) else 1)


def _hub(args):
    from builders.fixture.make import make_fixture_cache, shared_dir
    from builders.pinned import Hub

    if getattr(args, "fixture_cache", None) is None:
        return Hub()
    make_fixture_cache(args.fixture_cache, shared_dir(args.shared))
    return Hub(cache_dir=args.fixture_cache / "hub", offline=True)


def _manifest(args, file: Path | None = None):
    from builders.manifest import load_manifest

    if args.manifest is not None:
        return load_manifest(args.manifest)
    name = args.name
    if name is None and file is not None:
        name = file.name.removesuffix(".parquet").removesuffix(".unverified")
    if name is None:
        raise UsageError("which manifest? give --build NAME or --manifest FILE (see --help)")
    if Path(name).name != name or name in ("", ".", ".."):
        raise UsageError(f"--build takes a manifest name, not a path: {name!r}")
    candidate = args.manifests / f"{name}.yaml"
    if not candidate.is_file():
        known = sorted(p.stem for p in args.manifests.glob("*.yaml"))
        raise UsageError(f"no manifest {candidate} (known: {', '.join(known) or 'none'})")
    return load_manifest(candidate)


def _build(args) -> int:
    from builders.build import build

    manifest = _manifest(args)
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, not {args.workers}")
    result = build(manifest, args.out, _hub(args), _reporter(args), card=not args.no_card, workers=args.workers)
    if args.json:
        print(result.report.read_text(encoding="utf-8"), end="")
    else:
        _print_checks(result.verification)
        print(f"{'verified' if result.verified else 'NOT verified'}: {result.parquet} (report: {result.report})")
    return _exit_code(result.verification)


def _verify(args) -> int:
    from dataclasses import asdict

    from builders.figures import file_figures, verify

    manifest = _manifest(args, args.file)
    if not args.file.is_file():
        raise UsageError(f"verify: no file {args.file}")
    figures = file_figures(args.file, manifest.row_tokens)
    verification = verify(figures, manifest)
    if args.json:
        print(json.dumps({"file": str(args.file), "manifest": str(manifest.path), "verified": verification.verified,
                          "figures": figures, "checks": [asdict(c) for c in verification.checks],
                          "notes": verification.notes}, indent=2, sort_keys=True))
    else:
        _print_checks(verification)
        print(f"{'verified' if verification.verified else 'NOT verified'}: {args.file} against {manifest.path}")
    return _exit_code(verification)


def _exit_code(verification) -> int:
    return 0 if verification.verified else VerificationError.exit_code


def _inspect(args) -> int:
    from builders.pinned import load_pinned_tokenizer
    from builders.row_view import as_html, as_terminal, conversation_view, row_view

    if args.file is None and args.source_index is None:
        raise UsageError("inspect: give a built FILE (and --row N), or --source-index I with --build/--manifest")
    manifest = _manifest(args, args.file)
    hub = _hub(args)
    pinned = load_pinned_tokenizer(manifest.tokenizer, hub)
    if args.source_index is not None:
        view = _source_view(manifest, hub, pinned, args.source_index, conversation_view)
    else:
        from builders.rows import RowReader

        reader = RowReader(args.file)
        if not -len(reader) <= args.row < len(reader):
            raise UsageError(f"inspect: {args.file} has rows 0..{len(reader) - 1}, not {args.row}")
        view = row_view(pinned.tokenizer, reader[args.row])
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(as_terminal(view, color), end="")
    if args.html:
        args.html.write_text(as_html(view), encoding="utf-8")
        print(f"HTML view: {args.html}", file=sys.stderr)
    return 0


def _source_view(manifest, hub, pinned, index, conversation_view):
    from builders.encode import ConversationEncoder
    from builders.packing import with_eos
    from builders.pinned import dataset_files
    from builders.source import ParquetSource

    source = ParquetSource(dataset_files(manifest.dataset, hub))
    if not 0 <= index < source.num_rows:
        raise UsageError(f"inspect: the source has rows 0..{source.num_rows - 1}, not {index}")
    encoder = ConversationEncoder(pinned.tokenizer, pinned.chat_template)
    (conversation,) = encoder.encode(source.take([index]).to_pylist())
    ids, mask = with_eos(conversation.ids, conversation.mask, conversation.ends_with_answer, encoder.eos_id)
    return conversation_view(pinned.tokenizer, index, conversation.id, ids, mask)


def _diff(args) -> int:
    from builders.build import build
    from builders.diff import describe, diff_files

    for path in (args.a, args.b):
        if path is not None and not path.is_file():
            raise UsageError(f"diff: no file {path}")
    if args.b is not None:
        result, b = diff_files(args.a, args.b), args.b
    else:
        manifest = _manifest(args, None)
        with tempfile.TemporaryDirectory() as folder:
            built = build(manifest, Path(folder), _hub(args), _reporter(args), card=False)
            result, b = diff_files(args.a, built.parquet), Path(f"(a fresh build of {manifest.name})")
    print(json.dumps(result.as_dict(), indent=2, sort_keys=True) if args.json else describe(result, args.a, b))
    return 0 if result.identical else 1


def _print_checks(verification) -> None:
    for check in verification.checks:
        if check.status == "differs":
            print(f"  DIFFERS     {check.figure}: expected {check.expected}, got {check.got}")
        elif check.status == "ok":
            print(f"  ok          {check.figure}: {check.got}")
        else:
            print(f"  not pinned  {check.figure}: {check.got}")
    for note in verification.notes:
        print(f"note: {note}", file=sys.stderr)


def _own_version() -> str:
    try:
        return metadata.version("fixed-sft")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"
