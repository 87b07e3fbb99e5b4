"""``pin``: the pinned YAML block of a dataset or tokenizer, for a manifest.

A Hub repo (its revision resolved online, or read from the HF cache offline) or a local folder (its
files' sha256). For a tokenizer: the sha256 of each file the build reads, ``stop`` from
``generation_config.json``, ``eos`` where the files name one token, the ``prefills`` whose
generation prompts differ (each template variable tried on a probe), and a note where the template
calls ``strftime_now``. It never guesses: what it cannot know it leaves out, saying so in a comment
of the block and on stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from builders.errors import OutputError, PinnedInputError, UsageError
from builders.text import shown

# the files a build may read from a tokenizer folder (builders.manifest's, which --help does not
# import: it loads numpy)
TOKENIZER_FILES = ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json")
TEMPLATE_FILES = TOKENIZER_FILES[1:]

# read to suggest eos and stop; not pinned: a build does not read it
GENERATION_CONFIG = "generation_config.json"
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# what apply_chat_template passes, or the template defines: never a prefill's variable
STANDARD_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "raise_exception",
        "strftime_now",
        "range",
        "namespace",
        "true",
        "false",
        "none",
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)
PROBE = [{"role": "user", "content": "Hello."}]
# what strftime_now prints while the probe renders (not written)
PROBE_DATE = "2000-01-01"


def add_options(p) -> None:
    p.add_argument(
        "--dataset", metavar="REPO|FOLDER", help="a Hub dataset repo id, or a local folder"
    )
    p.add_argument(
        "--tokenizer", metavar="REPO|FOLDER", help="a Hub model repo id, or a local folder"
    )
    p.add_argument(
        "--revision",
        default="main",
        help="the branch, tag or commit of a Hub repo (default main), resolved to its commit",
    )
    p.add_argument(
        "--files", metavar="GLOB", help="the dataset's files (default data/{split}-*.parquet)"
    )
    p.add_argument(
        "--split", default="train", help="the split naming the default files (default train)"
    )
    p.add_argument(
        "--chat-template-name",
        help="which of tokenizer_config.json's named templates (default: default)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write the block to FILE, a folder's path relative to FILE's folder (default: print "
        "it, a folder's path absolute)",
    )


@dataclass
class Block:
    """Lines of YAML, and what was left out (as comments and stderr lines)."""

    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str, indent: str = "  ") -> None:
        # it may quote the data (a file name, a token): one line, control characters escaped
        text = shown(text)
        self.notes.append(text)
        self.lines.append(f"{indent}# {text}")


def run(args, quiet: bool = False) -> int:
    """The ``pin`` command: print (or write) the blocks asked for."""
    if args.dataset is None and args.tokenizer is None:
        raise UsageError("pin: give --dataset REPO|FOLDER and/or --tokenizer REPO|FOLDER")
    base = args.output.resolve().parent if args.output is not None else None
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    block = Block()
    if args.dataset is not None:
        dataset_block(block, args, base, offline)
    if args.tokenizer is not None:
        tokenizer_block(block, args, base, offline)
    text = "\n".join(block.lines) + "\n"
    if args.output is None:
        print(text, end="")
    else:
        from builders.runtime.atomic import write_atomic

        try:
            write_atomic(args.output, text.encode("utf-8"))
        except OSError as err:
            raise OutputError(f"{args.output}: cannot write: {err.strerror or err}") from err
        print(f"wrote {args.output}")
    if not quiet:
        for note in block.notes:
            print(f"note: {note}", file=sys.stderr)
    return 0


def dataset_block(block: Block, args, base: Path | None, offline: bool) -> None:
    from builders.inputs.digest import file_digest
    from builders.inputs.pinned import matching_files

    pattern = args.files or f"data/{args.split}-*.parquet"
    where = [f"  files: {_q(pattern)}"] if args.files else [f"  split: {_q(args.split)}"]
    folder = _local(args.dataset)
    block.lines.append("dataset:")
    if folder is not None:
        files = matching_files(pattern, folder)
        if not files:
            raise PinnedInputError(
                f"{folder}: no files match {pattern} (--files GLOB names the dataset's files)"
            )
        block.lines += [f"  path: {_q(_written_path(folder, base))}", *where, "  sha256:"]
        block.lines += [f"    {_q(name)}: {file_digest(path)[0]}" for name, path in files]
    else:
        from huggingface_hub.utils import filter_repo_objects

        commit, names = _commit(args.dataset, "dataset", args.revision, offline)
        block.lines += [f"  repo: {args.dataset}", f"  revision: {commit}", *where]
        if not list(filter_repo_objects(names, allow_patterns=[pattern])):
            if not offline:
                raise PinnedInputError(
                    f"dataset repo {args.dataset} at {commit}: no file matches {pattern} "
                    "(--files GLOB names the dataset's files)"
                )
            block.note(f"files: none matching {pattern} is in the HF cache; not checked")
    block.note(
        "rows: not written (the row count is verified where pinned; fixed-sft plan --all "
        "counts the source's conversations)"
    )


def tokenizer_block(block: Block, args, base: Path | None, offline: bool) -> None:
    from builders.inputs.digest import file_digest

    folder = _local(args.tokenizer)
    if folder is None:
        commit, _ = _commit(args.tokenizer, "model", args.revision, offline)
        folder = _snapshot(args.tokenizer, commit, offline)
        origin = [f"  repo: {args.tokenizer}", f"  revision: {commit}"]
    else:
        origin = [f"  path: {_q(_written_path(folder, base))}"]
    read = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if "tokenizer.json" not in read or not any(name in read for name in TEMPLATE_FILES):
        raise PinnedInputError(
            f"{args.tokenizer}: a build reads tokenizer.json and a chat template "
            f"({' or '.join(TEMPLATE_FILES)}); found {', '.join(read) or 'neither'}"
        )
    block.lines += ["tokenizer:", *origin, "  sha256:"]
    block.lines += [f"    {name}: {file_digest(folder / name)[0]}" for name in read]
    if args.chat_template_name:
        block.lines.append(f"  chat_template_name: {_q(args.chat_template_name)}")
    format_fields(block, folder, args.chat_template_name)


def format_fields(block: Block, folder: Path, template_name: str | None) -> None:
    """A tokenizer folder's ``eos``, ``stop``, ``prefills`` and notes (``loss_mask: turns``)."""
    from tokenizers import Tokenizer

    from builders.formats.turns import calls_strftime_now
    from builders.inputs.pinned import config_template, special_tokens

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = _json(folder / "tokenizer_config.json")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    else:
        template, _ = config_template(config, template_name)
    stop = _generation_stops(folder, tokenizer)
    config_eos = special_tokens(config or {}).get("eos_token")
    if stop:
        block.lines.append(f"  stop: {_flow(stop)}")
    else:
        block.note(f"stop: not written: no {GENERATION_CONFIG} names the tokens that end an answer")
    candidates = list(dict.fromkeys([*([config_eos] if config_eos else []), *stop]))
    if len(candidates) == 1:
        block.lines.append(f"  eos: {_q(candidates[0])}")
    else:
        block.note(
            "eos: not written: the token joined after every conversation is yours to choose"
            + (
                f" among {', '.join(candidates)} (tokenizer_config.json's eos_token, "
                f"{GENERATION_CONFIG}'s eos_token_id)"
                if candidates
                else " (no tokenizer_config.json eos_token, no generation_config.json)"
            )
        )
    clock = calls_strftime_now(template)
    prefills, others = _prefills(template, special_tokens(config or {}), clock)
    block.lines.append(f"  prefills: {_flow(prefills)}")
    for variables in prefills[1:]:
        block.note(
            f"prefills: {_flow(variables)} renders another generation prompt: an answer may start "
            "after it (forgetting it trains that prompt's text as answer)"
        )
    if others:
        block.note(
            f"template variables read but not given: {', '.join(others)} (template_vars: pins "
            "any your data needs)"
        )
    if clock:
        block.note(
            "render_date: not written: the template calls strftime_now (it prints a date); pin "
            "the date it prints, render_date: YYYY-MM-DD"
        )


def _prefills(template: str, special: dict, clock: bool) -> tuple[list[dict], list[str]]:
    """The variable settings whose generation prompt differs from the default's.

    Each variable the template reads (not ``apply_chat_template``'s own) is set to true and to
    false on a probe conversation; those that change the generation prompt are prefills. The other
    variables are returned by name.
    """
    from jinja2 import meta, nodes

    from builders.formats.render import ChatRenderer

    renderer = ChatRenderer(template, PROBE_DATE if clock else None)
    parsed = renderer.environment().parse(template)
    # set, looped over or a macro's parameter somewhere: the template's own, not the caller's
    own = {n.name for n in parsed.find_all(nodes.Name) if n.ctx in ("store", "param")}
    variables = sorted(
        meta.find_undeclared_variables(parsed) - STANDARD_VARIABLES - set(special) - own
    )

    def prompt(extra: dict) -> str | None:
        try:
            return renderer.render_all([PROBE], {**special, **extra}, add_generation_prompt=True)[0]
        except Exception:
            return None

    default = prompt({})
    prefills, toggles = [{}], set()
    for name in variables:
        for value in (True, False):
            rendered = prompt({name: value})
            if rendered is not None and rendered != default:
                prefills.append({name: value})
                toggles.add(name)
    return prefills, [name for name in variables if name not in toggles]


def _generation_stops(folder: Path, tokenizer) -> list[str]:
    """``generation_config.json``'s ``eos_token_id`` as tokens; none where it has none."""
    config = _json(folder / GENERATION_CONFIG)
    ids = (config or {}).get("eos_token_id")
    ids = [ids] if isinstance(ids, int) else ids if isinstance(ids, list) else []
    tokens = [tokenizer.id_to_token(i) for i in ids if isinstance(i, int)]
    return [t for t in dict.fromkeys(tokens) if t is not None]


def _commit(repo: str, repo_type: str, revision: str, offline: bool) -> tuple[str, list[str]]:
    """The commit ``revision`` names, and the repo's files there.

    The Hub's answer, or offline the HF cache's (the files it holds).
    """
    if offline:
        folder = _snapshot(repo, revision, offline, repo_type)
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        return folder.name, names
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().repo_info(repo, repo_type=repo_type, revision=revision)
        return info.sha, [sibling.rfilename for sibling in info.siblings or []]
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise PinnedInputError(
            f"{repo_type} repo {repo} at {revision}: cannot resolve the revision "
            f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            "); offline (HF_HUB_OFFLINE=1) it is read from the HF cache"
        ) from err


def _snapshot(repo: str, revision: str, offline: bool, repo_type: str = "model") -> Path:
    """The local folder of ``repo`` at ``revision``; a tokenizer's small files only."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = [*TOKENIZER_FILES, GENERATION_CONFIG] if repo_type == "model" else []
    try:
        return Path(
            snapshot_download(
                repo,
                repo_type=repo_type,
                revision=revision,
                allow_patterns=patterns or ["(none)"],
                local_files_only=offline,
            )
        )
    except LocalEntryNotFoundError as err:
        raise PinnedInputError(
            f"{repo_type} repo {repo} at {revision} is not in the HF cache (HF_HOME), and the "
            "Hub is not asked offline (HF_HUB_OFFLINE=1)"
        ) from err
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise PinnedInputError(f"{repo_type} repo {repo} at {revision}: {err}") from err


def _local(source: str) -> Path | None:
    """The local folder ``source`` names; None for a Hub repo id."""
    path = Path(source)
    if path.is_dir():
        return path
    if _REPO_ID.fullmatch(source) and not source.startswith((".", "/")):
        return None
    raise UsageError(f"pin: {source!r} is neither a folder nor a Hub repo id 'owner/name'")


def _written_path(folder: Path, base: Path | None) -> str:
    """A folder's path as the block says it: relative to ``base``, else absolute."""
    absolute = os.path.abspath(folder)
    return os.path.relpath(absolute, base) if base is not None else absolute


def _json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise PinnedInputError(f"{path}: not valid JSON: {err}") from err


def _q(text: str) -> str:
    """A YAML scalar: JSON's quoting, which YAML reads."""
    return json.dumps(text, ensure_ascii=False)


def _flow(value) -> str:
    """A YAML flow value (JSON, which YAML reads)."""
    return json.dumps(value, ensure_ascii=False)
