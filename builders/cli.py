"""Command line: build, plan, pin, verify, inspect, diff, download, explain.

The commands build, verify, inspect, diff, download and explain row files named by manifests; write
the manifest a recipe card implies, and check a card against its manifest.

``generate_fixed_sft.py --build NAME`` (and ``--manifest FILE``, ``--verify FILE``) keep working:
they are the ``build`` and ``verify`` subcommands written as options. Modules are imported by
the command that needs them, so ``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import traceback
from pathlib import Path

from builders import __version__
from builders.errors import (
    BuildError,
    OutputError,
    SourceDataError,
    UsageError,
    VerificationError,
)
from builders.runtime import no_pandas, stopping
from builders.text import shown

COMMANDS = (
    "build",
    "plan",
    "pin",
    "verify",
    "inspect",
    "diff",
    "download",
    "explain",
    "manifest",
    "check-recipe",
    "export",
)
GLOBAL_FLAGS = ("-q", "--quiet", "-v", "--verbose", "--json")
# diff: the two files' rows differ
FILES_DIFFER = 8
CARD_HELP = "the recipe card (YAML, schema_version: 1), or a text or Markdown page holding it"
FILE_MANIFEST = (
    "default: manifests/NAME.yaml for a file named NAME.parquet, else the manifest recorded in "
    "the build report beside it, NAME.report.json"
)

EPILOG = """\
examples:
  %(prog)s --build glm47flash-tulu3-fixed8192-v1          # manifests/NAME.yaml → out/NAME.parquet
  %(prog)s --build fixture-synthetic-v1 --fixture-cache .fixture-cache   # self-contained, offline
  %(prog)s --manifest my.yaml --out /data/rows
  %(prog)s plan --manifest my.yaml --all                  # what the build will give, nothing written
  %(prog)s pin --dataset ./chats --files "*.jsonl"        # the pinned YAML block of a folder (or a repo)
  %(prog)s --verify out/glm47flash-tulu3-fixed8192-v1.parquet
  %(prog)s verify moved/NAME.parquet --rows-sha256 HEX  # a file without its report: the card's hash
  %(prog)s download --build glm47flash-tulu3-fixed8192-v1  # fetch the pinned inputs, then build offline
  %(prog)s inspect out/fixture-synthetic-v1.parquet --row 3 --fixture-cache .fixture-cache
  %(prog)s diff out/a/NAME.parquet out/b/NAME.parquet
  %(prog)s explain --build glm47flash-tulu3-fixed8192-v1  # which reading of data/ROWS.md makes the pinned rows
  %(prog)s manifest --from-recipe CARD.yaml -o my.yaml    # the manifest an OpenRecipes recipe card implies
  %(prog)s check-recipe CARD.yaml --rows out/NAME.parquet # CI: the card's figures = its manifest's (and the file's)
  %(prog)s export out/NAME.parquet --to trl --to miles    # beside it: NAME.trl.parquet, NAME.miles.parquet

commands (each has --help): build (the default), plan, pin, verify, inspect, diff, download,
explain, manifest, check-recipe, export.
-q, -v and --json go before or after the command.
inputs come from the Hugging Face Hub, or offline from the HF cache (HF_HOME, HF_HUB_OFFLINE=1).

exit codes:
  0   built or verified: every figure the manifest pins matches (diff: the files are identical;
      check-recipe: no figure on the card differs from the manifest's, nor, with --rows, the file's)
  1   internal error (a bug: please report it)
  2   bad command line, manifest, recipe card, or input file (no such file, not a parquet row file)
  3   a pinned input is missing, unresolvable or does not match its sha256
  4   the source holds a conversation the row contract cannot render, or too few rows
      (plan: the build would stop so)
  5   a figure differs from the manifest (a build keeps its file as NAME.unverified.parquet);
      explain: no reading of the row contract reproduces the pinned rows_sha256;
      check-recipe: a figure on the card differs from the manifest's, or the --rows file's
  6   the output cannot be written (disk full, no permission)
  7   a worker process died (killed, or out of memory) or could not start
  8   diff: the two files' rows differ
  9   the fastokens engine encoded a text otherwise than tokenizers (rebuild with --engine tokenizers)
  130 interrupted (SIGINT or SIGTERM); temporary files are removed
"""  # noqa: E501 (the epilog as --help prints it: some of its lines are wider than the code's)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=_prog(),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        description="Deterministically build fixed-length SFT rows named by a manifest, "
        "and verify their hashes.",
    )
    p.add_argument("--version", action="version", version=f"fixed-sft {__version__}")
    _global_options(p, suppress=False)
    commands = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, allow_abbrev=False)
        _global_options(sub, suppress=True)
        return sub

    b = command("build", "build a manifest's rows (the default command)")
    _manifest_options(b)
    b.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=Path("out"),
        help="output folder for NAME.parquet, NAME.report.json and the data card NAME.md "
        "(default: out)",
    )
    b.add_argument(
        "--no-card", action="store_true", help="do not write the data card and its plots"
    )
    _workers_option(b)
    _engine_option(b)
    _hub_options(b)

    pl = command(
        "plan",
        "what a build will give, streamed as the build streams, nothing written: rows, "
        "conversations, tokens, supervised ratio, refused conversations, rows the source can give",
    )
    _manifest_options(pl)
    pl.add_argument(
        "--all",
        dest="everything",
        action="store_true",
        help="read every source row: count every row the source gives and list every refused "
        "conversation (a build stops at the first, or past leave_out_refused)",
    )
    _workers_option(pl)
    _engine_option(pl)
    _hub_options(pl)

    pn = command(
        "pin",
        "write the pinned YAML block of a dataset or tokenizer: a Hub repo (its revision resolved "
        "online, or read from the HF cache offline) or a local folder; what it cannot know it "
        "leaves out and says so",
    )
    _pin_options(pn)

    v = command("verify", "re-read a built file and check it against its manifest")
    v.add_argument("file", type=Path, help="the parquet file to verify")
    _manifest_options(v, default_help=FILE_MANIFEST)
    v.add_argument(
        "--rows-sha256",
        metavar="HEX",
        type=_sha256,
        help="check the file's rows against this rows_sha256 alone, as a recipe card publishes "
        "it, with no manifest (for a file that travels without its report)",
    )

    i = command("inspect", "show a row or a source conversation decoded, supervision highlighted")
    i.add_argument(
        "file", type=Path, nargs="?", help="a built parquet file (omit with --source-index)"
    )
    i.add_argument("--row", type=int, default=0, help="the row to show (default 0)")
    i.add_argument(
        "--source-index", type=int, help="show this source conversation's tokens instead of a row"
    )
    i.add_argument("--html", metavar="FILE", type=Path, help="also write the view as an HTML page")
    i.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="highlight supervised tokens with terminal colors "
        "(default: when printing to a terminal)",
    )
    _manifest_options(i, default_help=FILE_MANIFEST)
    _hub_options(i)

    d = command("diff", "compare two built files: the first row and token where they differ")
    d.add_argument("a", type=Path, help="a built parquet file")
    d.add_argument(
        "b",
        type=Path,
        nargs="?",
        help="another built parquet file (or give --build/--manifest to "
        "build that manifest now and compare with it)",
    )
    _manifest_options(
        d, default_help="build this manifest into a temporary folder and compare A with it"
    )
    _hub_options(d)

    dl = command(
        "download",
        "fetch exactly the files a build reads into the HF cache (online), for an offline build",
    )
    _manifest_options(dl)
    _hub_options(dl)

    e = command(
        "explain",
        "search the readings of the row contract (data/ROWS.md) for those that reproduce the "
        "manifest's pinned rows_sha256, from the default outward",
    )
    _manifest_options(e)
    e.add_argument(
        "--all",
        dest="everything",
        action="store_true",
        help="try every reading (several hundred), not only up to the first that reproduces "
        "the rows",
    )
    e.add_argument(
        "--writer",
        action="store_true",
        help="then build the reproduced rows and write them as each writer variant does (see "
        "data/README.md), reporting which give the pinned parquet_bytes and parquet_sha256",
    )
    _engine_option(e)
    _hub_options(e)

    m = command(
        "manifest",
        "write the manifest an OpenRecipes recipe card implies (what the card does not carry "
        "is said in its opening comment)",
    )
    m.add_argument(
        "--from-recipe",
        metavar="CARD",
        type=Path,
        required=True,
        help=CARD_HELP,
    )
    m.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write the manifest to FILE (default: print it)",
    )

    c = command(
        "check-recipe",
        "check a recipe card's figures against its build's manifest, field by field, with "
        "no Hub (for a recipes repository's CI); with --rows, a built file against them too",
    )
    c.add_argument("card", type=Path, help=CARD_HELP)
    c.add_argument(
        "--rows",
        metavar="FILE",
        type=Path,
        help="also verify this parquet row file against the manifest",
    )
    _manifest_options(
        c, default_help="default: the shipped manifest the card's workload.dataset.build.name names"
    )
    _export_options(
        command(
            "export",
            "write a built file's rows as another trainer reads them, beside it (the row file is "
            "not changed): TRL, Megatron-Bridge, a miles prompt file (docs/training.md)",
        )
    )
    return p


def _export_options(p: argparse.ArgumentParser) -> None:
    from builders.training import EXPORT_SUFFIXES

    p.add_argument("file", type=Path, help="the built parquet row file")
    p.add_argument(
        "--to",
        action="append",
        required=True,
        choices=tuple(EXPORT_SUFFIXES),
        help="the export, repeatable: trl (NAME.trl.parquet), megatron-bridge "
        "(NAME.idx.parquet), miles (NAME.miles.parquet)",
    )
    p.add_argument("--out", metavar="DIR", type=Path, help="where (default: beside FILE)")
    p.add_argument(
        "--seed",
        type=int,
        help="miles: the prompt file's epochs in data/ROWS.md's reading order with this seed "
        "(default: file order)",
    )
    p.add_argument(
        "--epochs", type=int, default=1, help="miles: epochs in the prompt file (default 1)"
    )
    p.add_argument(
        "--window-groups",
        type=int,
        default=16,
        metavar="W",
        help="miles with --seed: row groups a window shuffles together (default 16)",
    )


def _global_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    """-q, -v and --json, accepted before the command and after it.

    Before the command with ``suppress=False``.
    """
    default = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout", **default
    )
    loud = p.add_mutually_exclusive_group()
    loud.add_argument(
        "-q", "--quiet", action="store_true", help="print only errors and the result", **default
    )
    loud.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print details of each step, and the causes of an error",
        **default,
    )


def _manifest_options(p, default_help: str | None = None) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--build",
        dest="name",
        metavar="NAME",
        help="the manifest manifests/NAME.yaml" + (f" ({default_help})" if default_help else ""),
    )
    which.add_argument("--manifest", metavar="FILE", type=Path, help="the manifest in FILE")
    p.add_argument(
        "--manifests",
        metavar="DIR",
        type=Path,
        help="where --build looks up NAME.yaml (default: the manifests shipped with fixed-sft)",
    )


def _workers_option(p) -> None:
    p.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        metavar="N|auto",
        help="processes that decode, render and tokenize (default auto: one per core the build may "
        "use, or this process alone, whose tokenizer uses every core, on 2 cores or fewer, where "
        "that measured fastest, except for a dataset that names a tools field: a worker a core "
        "from 2 cores up; see docs/performance.md); the rows are the same for any number",
    )


def _pin_options(p) -> None:
    from builders.inputs.pin_command import add_options

    add_options(p)


def _engine_option(p) -> None:
    p.add_argument(
        "--engine",
        choices=("auto", "fastokens", "tokenizers"),
        default="auto",
        help="what encodes the text: tokenizers (the contract's reference), or fastokens, many "
        "times faster, guarded by probes before the build and a sample of conversations encoded "
        "by both during it (auto, the default: fastokens where it loads and agrees, else "
        "tokenizers)",
    )


def _hub_options(p) -> None:
    p.add_argument(
        "--fixture-cache",
        metavar="DIR",
        type=Path,
        help="lay out the fixture HF cache (the repos the fixture-* manifests pin) in DIR and "
        "read the pinned inputs offline from it",
    )
    p.add_argument(
        "--shared",
        metavar="DIR",
        type=Path,
        help="the real data folder (pinned/ and data/) that fixture-tulu100-v1 is made from "
        "(default: $FIXED_SFT_SHARED)",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = None
    try:
        args = parser().parse_args(_with_command(sys.argv[1:] if argv is None else argv))
        if argv is None and args.command in ("build", "plan"):
            # the process is the command's own: pyarrow is kept from loading pandas, which it
            # would at its first conversions (the process then never has pandas)
            no_pandas.refuse()
        # unwind, so temporary files are removed (the entry point installed it already)
        stopping.install()
        return {
            "build": _build,
            "plan": _plan,
            "pin": _pin,
            "verify": _verify,
            "inspect": _inspect,
            "diff": _diff,
            "download": _download,
            "explain": _explain,
            "manifest": _manifest_from_recipe,
            "check-recipe": _check_recipe,
            "export": _export,
        }[args.command](args)
    except BuildError as err:
        # -v: the whole chain, with what caused it
        if getattr(args, "verbose", False):
            print(shown("".join(traceback.format_exception(err)), keep_lines=True), file=sys.stderr)
        # its values are escaped where it quotes them; no control character gets through here
        print(f"error: {shown(err, keep_lines=True)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(stopping.STOPPED, file=sys.stderr)
        return stopping.INTERRUPTED


def _with_command(argv: list[str]) -> list[str]:
    """The option forms as subcommands.

    The option forms are ``--build NAME``, ``--manifest FILE`` and ``--verify FILE``. Global flags
    may come first; a first word that is no command is refused with a suggestion.
    """
    at = next((k for k, a in enumerate(argv) if a not in GLOBAL_FLAGS), len(argv))
    first = argv[at] if at < len(argv) else None
    if first in COMMANDS or first in ("-h", "--help", "--version"):
        return argv
    if first is None:
        raise UsageError(
            "nothing to do: give --build NAME, --manifest FILE or --verify FILE (see --help)"
        )
    if not first.startswith("-"):
        close = difflib.get_close_matches(first, COMMANDS, n=1)
        raise UsageError(
            f"unknown command {first!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + f" (commands: {', '.join(COMMANDS)})"
        )
    if "--verify" in argv:
        v = argv.index("--verify")
        return ["verify", *argv[v + 1 : v + 2], *argv[:v], *argv[v + 2 :]]
    return ["build", *argv]


def _prog() -> str:
    name = Path(sys.argv[0]).name
    return name if name in ("fixed-sft", "generate_fixed_sft.py") else "fixed-sft"


def _reporter(args):
    from builders.runtime.progress import Reporter

    if args.quiet and args.verbose:
        raise UsageError("-q and -v together: choose one")
    return Reporter(verbosity=0 if args.quiet or args.json else 2 if args.verbose else 1)


def _hub(args, manifest):
    """Where the pinned inputs come from.

    The HF cache (and the Hub, online), or the fixture cache.
    """
    from builders.fixture.make import OWNER, make_fixture_cache, shared_dir, shared_repos
    from builders.inputs.pinned import Hub

    pins = (manifest.tokenizer, *manifest.datasets)
    repos = {pin.repo for pin in pins if not pin.local}
    if args.fixture_cache is None:
        fixtures = frozenset(repo for repo in repos if repo.startswith(f"{OWNER}/"))
        # fixture repos are never on the Hub: no time is spent asking it for them
        return Hub(offline=bool(fixtures), fixture_repos=fixtures)
    shared = shared_dir(args.shared)
    if shared is None and repos & shared_repos():
        raise UsageError(
            f"{manifest.name} is made from the real data folder (pinned/ and data/): add --shared "
            "DIR or set FIXED_SFT_SHARED"
        )
    if not (args.quiet or args.json):
        print(f"laying out the fixture HF cache in {args.fixture_cache}", file=sys.stderr)
    make_fixture_cache(args.fixture_cache, shared)
    return Hub(cache_dir=args.fixture_cache / "hub", offline=True)


def _manifest(args):
    from builders.manifest import load_manifest, shipped_manifest

    if args.manifest is not None:
        return load_manifest(args.manifest)
    if args.name is None:
        raise UsageError("which manifest? give --build NAME or --manifest FILE (see --help)")
    if Path(args.name).name != args.name or args.name in ("", ".", ".."):
        raise UsageError(f"--build takes a manifest name, not a path: {args.name!r}")
    return shipped_manifest(args.name, args.manifests)


def _file_manifest(args, file: Path, instead: str = "--manifest FILE or --build NAME"):
    """The manifest to read a built file with, and what to call it.

    ``--build``/``--manifest``; else the manifest named like the file (NAME.parquet,
    NAME.unverified.parquet); else the one the build report beside the file records.
    """
    from builders.manifest import shipped_manifest, shipped_manifests
    from builders.rows.figures import recorded_manifest, report_beside

    name = file.name.removesuffix(".parquet").removesuffix(".unverified")
    folder = args.manifests or shipped_manifests()
    if args.manifest is not None or args.name is not None:
        manifest = _manifest(args)
        return manifest, str(manifest.path)
    if name and (folder / f"{name}.yaml").is_file():
        manifest = shipped_manifest(name, args.manifests)
        return manifest, str(manifest.path)
    report = report_beside(file)
    manifest = recorded_manifest(file)
    if manifest is not None:
        return manifest, f"the manifest recorded in {report}"
    raise UsageError(
        f"{file}: which manifest? No {folder / f'{name}.yaml'} is named like it, and no build "
        f"report beside it ({report}) records one: give {instead}"
    )


def _sha256(text: str) -> str:
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise argparse.ArgumentTypeError(f"64 lowercase hex digits (a sha256), not {text!r}")
    return text


def _workers(text: str) -> str | int:
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a number of at least 1, or auto, not {text!r}")
    return int(text)


def _build(args) -> int:
    from builders.encode import spawn

    # the workers import beside this process's imports (a refused manifest ends them)
    with spawn.early(args.workers):
        # the manifest first: a bad one is refused before the build's modules load
        manifest = _manifest(args)
        from builders.build import build

        result = build(
            manifest,
            args.out,
            _hub(args, manifest),
            _reporter(args),
            card=not args.no_card,
            workers=args.workers,
            engine=args.engine,
        )
    if args.json:
        print(result.report.read_text(encoding="utf-8"), end="")
    else:
        _print_checks(result.verification)
        print(f"{_outcome(result.verification)}: {result.parquet} (report: {result.report})")
    return _exit_code(result.verification)


def _plan(args) -> int:
    from builders.encode import spawn

    # the workers import beside this process's imports (a refused manifest ends them)
    with spawn.early(args.workers):
        manifest = _manifest(args)
        from builders.views.plan import describe, plan

        result = plan(
            manifest,
            _hub(args, manifest),
            _reporter(args),
            everything=args.everything,
            workers=args.workers,
            engine=args.engine,
        )
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        for line in describe(result):
            print(line)
    return 0 if result.ok else SourceDataError.exit_code


def _pin(args) -> int:
    from builders.inputs.pin_command import run

    return run(args, quiet=args.quiet)


def _verify(args) -> int:
    from dataclasses import asdict

    from builders.rows.figures import (
        file_figures,
        recorded_recipe,
        verify,
        verify_rows_sha256,
    )
    from builders.rows.rowfile import check_row_file

    check_row_file(args.file)
    if args.rows_sha256 is not None:
        if args.manifest is not None or args.name is not None:
            raise UsageError("--rows-sha256 checks the rows alone: give it without a manifest")
        figures = file_figures(args.file, None)
        verification = verify_rows_sha256(figures, args.rows_sha256)
        manifest, against = None, f"rows_sha256 {args.rows_sha256}"
    else:
        manifest, against = _file_manifest(
            args,
            args.file,
            "--manifest FILE (the manifest it was built from), or --rows-sha256 HEX (the "
            "rows_sha256 its recipe card publishes)",
        )
        figures = file_figures(args.file, manifest.row_tokens, manifest.contract.hash)
        built_from = recorded_recipe(args.file, figures["parquet_sha256"])
        verification = verify(figures, manifest, built_from)
    if args.json:
        print(
            json.dumps(
                {
                    "file": str(args.file),
                    # None: the manifest a report records, gone from its file; or --rows-sha256
                    "manifest": str(manifest.path) if manifest and manifest.path else None,
                    "against": against,
                    "verified": verification.verified,
                    "figures": figures,
                    "checks": [asdict(c) for c in verification.checks],
                    "notes": verification.notes,
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        _print_checks(verification)
        print(f"{_outcome(verification)}: {args.file} against {against}")
    return _exit_code(verification)


def _export(args) -> int:
    from builders.training.exports import export

    ordered = args.seed is not None or args.epochs != 1
    if ordered and "miles" not in args.to:
        raise UsageError("--seed and --epochs order the miles prompt file: add --to miles")
    for to in dict.fromkeys(args.to):
        order = (args.seed, args.epochs) if to == "miles" else (None, 1)
        path = export(args.file, to, args.out, *order, args.window_groups)
        print(f"exported ({to}): {path}")
    return 0


def _outcome(verification) -> str:
    if not verification.verified:
        return f"NOT verified ({verification.summary()})"
    from builders.rows.figures import NOTHING_PINNED

    return NOTHING_PINNED if verification.nothing_pinned else "verified"


def _exit_code(verification) -> int:
    return 0 if verification.verified else VerificationError.exit_code


def _inspect(args) -> int:
    from builders.views.inspect import inspect_row, inspect_source

    if args.file is None and args.source_index is None:
        raise UsageError(
            "inspect: give a built FILE (and --row N), or --source-index I with --build/--manifest"
        )
    if args.file is not None:
        from builders.rows.rowfile import check_row_file

        check_row_file(args.file)
        manifest, _ = _file_manifest(args, args.file)
    else:
        manifest = _manifest(args)
    hub = _hub(args, manifest)
    _reporter(args).info(f"reading the pinned inputs of {manifest.name}")
    if args.source_index is not None:
        view = inspect_source(manifest, hub, args.source_index)
    else:
        view = inspect_row(manifest, hub, args.file, args.row)
    if args.json:
        print(json.dumps(view.as_dict(), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        print(view.as_terminal(color), end="")
    if args.html:
        args.html.write_text(view.as_html(), encoding="utf-8")
        print(f"HTML view: {args.html}", file=sys.stderr)
    return 0


def _diff(args) -> int:
    import tempfile

    from builders.build import build
    from builders.rows.rowfile import check_row_file
    from builders.views.diff import describe, diff_files

    for path in (args.a, args.b):
        if path is not None:
            check_row_file(path)
    # of the fresh build, when there is one
    chat_format = None
    if args.b is not None:
        manifest = (
            _manifest(args) if args.name or args.manifest else _manifest_named_like(args, args.a)
        )
        result, b = diff_files(args.a, args.b, _decoder(args, manifest)), args.b
    else:
        manifest = _manifest(args)
        hub = _hub(args, manifest)
        with tempfile.TemporaryDirectory() as folder:
            built = build(manifest, Path(folder), hub, _reporter(args), card=False)
            chat_format = json.loads(built.report.read_text(encoding="utf-8"))["chat_format"]
            result = diff_files(args.a, built.parquet, _decoder(args, manifest, hub))
            b = Path(f"(a fresh build of {manifest.name})")
    if args.json:
        print(
            json.dumps(
                {**result.as_dict(), **({"chat_format": chat_format} if chat_format else {})},
                indent=2,
                sort_keys=True,
                ensure_ascii=False,
            )
        )
    else:
        if chat_format:
            from builders.views.inspect import format_line

            print(f"b built with {format_line(chat_format)}")
        print(describe(result, args.a, b))
    return 0 if result.identical else FILES_DIFFER


def _manifest_named_like(args, file: Path):
    """The manifest of a built file, where one is found; else None.

    The one NAME.parquet names, or the one its build report records.
    """
    try:
        return _file_manifest(args, file)[0]
    except UsageError:
        return None


def _decoder(args, manifest, hub=None):
    """The manifest's pinned tokenizer's decode, or None where it cannot load.

    The decode keeps special tokens; where the tokenizer cannot load, a note says why.
    """
    from builders.errors import PinnedInputError
    from builders.inputs.pinned import pinned_tokenizer

    if manifest is None:
        reason = (
            "no manifest is named like A; give --build NAME or --manifest FILE to decode with its "
            "tokenizer"
        )
    else:
        try:
            tokenizer = pinned_tokenizer(manifest, hub or _hub(args, manifest)).tokenizer
            return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        except PinnedInputError as err:
            reason = f"the tokenizer of {manifest.name} cannot be loaded: {err}"
    if not args.quiet:
        print(f"note: no decoded text ({reason})", file=sys.stderr)
    return None


def _download(args) -> int:
    from builders.inputs.download import describe, download

    manifest = _manifest(args)
    hub = _hub(args, manifest)
    fetched = download(manifest, hub)
    if args.json:
        print(
            json.dumps(
                {
                    "manifest": str(manifest.path),
                    "repos": [
                        {
                            "repo": f.repo.repo,
                            "repo_type": f.repo.repo_type,
                            "revision": f.repo.revision,
                            "files": [str(p) for p in f.files],
                            "bytes": f.bytes,
                        }
                        for f in fetched
                    ],
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        print(describe(fetched, manifest, hub))
    return 0


def _explain(args) -> int:
    import tempfile

    from builders.views.explain import describe, describe_writers, explain, writers

    manifest = _manifest(args)
    hub = _hub(args, manifest)
    reporter = _reporter(args)
    explanation = explain(manifest, hub, reporter, everything=args.everything, engine=args.engine)
    written = None
    if args.writer and explanation.matches:
        with tempfile.TemporaryDirectory() as folder:
            written = writers(manifest, explanation.matches[0], hub, Path(folder), reporter)
    if args.json:
        out = {"manifest": str(manifest.path), **explanation.as_dict()}
        if args.writer:
            out["writers"] = (
                None if written is None else [w.as_dict(manifest.expect) for w in written]
            )
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for line in describe(explanation, manifest):
            print(line)
        if args.writer:
            for line in describe_writers(written, manifest):
                print(line)
    return 0 if explanation.reproduced else VerificationError.exit_code


def _manifest_from_recipe(args) -> int:
    from builders.inputs.recipe import implied_manifest, read_card
    from builders.runtime.atomic import write_atomic

    implied = implied_manifest(read_card(args.from_recipe))
    if args.output is not None:
        try:
            write_atomic(args.output, implied.text.encode("utf-8"))
        except OSError as err:
            raise OutputError(
                f"{args.output}: cannot write the manifest: {err.strerror or err}"
            ) from err
    if args.json:
        print(
            json.dumps(
                {
                    "card": str(args.from_recipe),
                    "output": None if args.output is None else str(args.output),
                    "manifest": implied.text,
                    "notes": list(implied.notes),
                },
                indent=2,
                sort_keys=True,
            )
        )
    elif args.output is None:
        print(implied.text, end="")
    else:
        name = shown(implied.manifest.name)
        print(f"wrote {args.output}: the manifest {name} of {args.from_recipe}")
    _print_notes(implied.notes, args)
    return 0


def _check_recipe(args) -> int:
    from dataclasses import asdict

    from builders.inputs.recipe import compare, read_card
    from builders.rows.figures import file_figures, verify
    from builders.rows.rowfile import check_row_file

    card = read_card(args.card)
    if not card.publishes_rows:
        raise UsageError(
            f"{args.card}: the card publishes no rows (workload.dataset): nothing to check"
        )
    if args.manifest is None and args.name is None:
        args.name = card.value("name")
        if args.name is None:
            raise UsageError(
                f"{args.card}: the card names no build (workload.dataset.build.name): give --build "
                "NAME or --manifest FILE"
            )
    manifest = _manifest(args)
    checks = compare(card, manifest)
    verification = None
    if args.rows is not None:
        check_row_file(args.rows)
        verification = verify(
            file_figures(args.rows, manifest.row_tokens, manifest.contract.hash), manifest
        )
    differing = [c.field for c in checks if c.status == "differs"]
    lacking = [c.field for c in checks if c.status == "not on the card"]
    matches = not differing and (verification is None or verification.verified)
    if args.json:
        print(
            json.dumps(
                {
                    "card": str(args.card),
                    "manifest": str(manifest.path),
                    "matches": matches,
                    "fields": [c.as_dict() for c in checks],
                    "notes": list(card.notes),
                    "rows": None
                    if verification is None
                    else {
                        "file": str(args.rows),
                        "verified": verification.verified,
                        "checks": [asdict(c) for c in verification.checks],
                        "notes": verification.notes,
                    },
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        # -q: the differing fields still, with both values
        for check in checks:
            if not args.quiet or check.status == "differs":
                _print_field(check)
        if verification is not None:
            print(f"{args.rows} against {manifest.path}:")
            _print_checks(verification)
        outcome = "matches" if not differing else f"DIFFERS in {', '.join(differing)}"
        print(
            f"card {outcome}: {args.card} against {manifest.path}"
            + (f"; not on the card: {', '.join(lacking)}" if lacking else "")
            + ("" if verification is None else f"; rows {_outcome(verification)}")
        )
    _print_notes(card.notes, args)
    return 0 if matches else VerificationError.exit_code


def _print_field(check) -> None:
    label = {
        "ok": "ok",
        "differs": "DIFFERS",
        "not on the card": "not on card",
        "not in the manifest": "not in manifest",
    }[check.status]
    card, manifest = _shown(check.card), _shown(check.manifest)
    if check.status == "ok":
        print(f"  {label:<16}{check.field}: {card} ({check.where})")
    elif check.status == "differs":
        print(f"  {label:<16}{check.field}: card {card} ({check.where}), manifest {manifest}")
    elif check.status == "not on the card":
        print(f"  {label:<16}{check.field} ({check.where}): manifest {manifest}")
    else:
        print(
            f"  {label:<16}{check.field}: card {card} ({check.where}), not pinned by the manifest"
        )


def _shown(value) -> str:
    from builders.manifest import Ratio

    return shown(value.text if isinstance(value, Ratio) else value)


def _print_notes(notes, args) -> None:
    if not args.quiet:
        for note in notes:
            print(f"note: {shown(note)}", file=sys.stderr)


def _print_checks(verification) -> None:
    for check in verification.checks:
        if check.status == "differs":
            print(f"  DIFFERS     {check.figure}: expected {check.expected}, got {check.got}")
        elif verification.nothing_pinned:
            print(f"  {check.figure}: {check.got}")
        elif check.status == "ok":
            print(f"  ok          {check.figure}: {check.got}")
        else:
            print(f"  not pinned  {check.figure}: {check.got}")
    for note in verification.notes:
        print(f"note: {shown(note)}", file=sys.stderr)
