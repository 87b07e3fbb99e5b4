"""Resolve the pinned inputs of a manifest.

They are Hub snapshots at fixed commits, or local folders (``path:``), checked by sha256.
``huggingface_hub.snapshot_download`` downloads when online and reads the HF cache (``HF_HOME``,
``HF_HUB_OFFLINE=1``) when not, so a pre-filled cache builds with no network. Each repo is asked for
exactly the files a build reads (``PinnedRepo.patterns``), so online a build fetches nothing else,
and ``download`` fetches the same. The tokenizer files are read once, as bytes, and hashed before
anything parses them: what is parsed is exactly what was checked. The source files, too large to
read twice before a build, are hashed in a process beside it (``hashed_files``) and checked against
the id that names them before its output is kept: a Hub file's LFS object id (its sha256) or, for
a file stored in git, its git blob id (each the name of its blob in the HF cache); a local
folder's file's pinned sha256 (every file a build reads from a folder must be pinned). A Hub
snapshot's file that links out of its repo's folder of the cache is refused.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
from huggingface_hub.utils import filter_repo_objects, get_session
from tokenizers import Tokenizer

from builders.errors import BuildError, PinnedInputError
from builders.formats import FormatSpec, format_class
from builders.inputs.digest import HashingProcess
from builders.inputs.source import Source
from builders.limits import DEFAULT_LIMITS, Limits
from builders.manifest import (
    PINNED_BY_MANIFEST,
    DatasetPin,
    Manifest,
    TokenizerPin,
    cli_command,
)


@dataclass(frozen=True)
class Hub:
    """Where snapshots come from, and whether to stay offline.

    ``cache_dir`` defaults to the HF cache that ``HF_HOME`` names; ``HF_HUB_OFFLINE=1`` also implies
    ``offline``.
    """

    cache_dir: Path | None = None
    offline: bool = False
    # repos this project's fixture cache lays out: never on the Hub
    fixture_repos: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PinnedRepo:
    """A Hub repo at a pinned commit, and the files a build reads from it."""

    repo: str
    repo_type: str  # "model" or "dataset"
    revision: str | None
    patterns: tuple[str, ...]
    # a local folder, in place of the repo
    path: str | None = None

    def hf_download_command(self) -> str:
        """The ``hf download`` line that fetches exactly these files.

        ``hf`` is huggingface_hub's command; the line works on any machine.
        """
        type_option = f" --repo-type {self.repo_type}" if self.repo_type != "model" else ""
        include = " ".join(shlex.quote(p) for p in self.patterns)
        return (
            f"hf download {self.repo}{type_option} --revision {self.revision} --include {include}"
        )


@dataclass(frozen=True)
class Snapshots:
    """The local folders of a manifest's pinned repos."""

    tokenizer: Path
    # one per dataset pin, in manifest order (none where only the tokenizer was asked for)
    datasets: list[Path]


@dataclass(frozen=True)
class PinnedTokenizer:
    tokenizer: Tokenizer
    # the checked text it was parsed from (another engine loads the same)
    tokenizer_json: str
    # the chat format: the manifest's loss_mask and its inputs, the pinned template
    spec: FormatSpec
    snapshot: Path

    @property
    def chat_template(self) -> str:
        return self.spec.chat_template


def tokenizer_repo(pin: TokenizerPin) -> PinnedRepo:
    return PinnedRepo(pin.repo, "model", pin.revision, pin.files, pin.path)


def dataset_repo(pin: DatasetPin) -> PinnedRepo:
    return PinnedRepo(pin.repo, "dataset", pin.revision, (pin.pattern,), pin.path)


HUB_PROBE_TIMEOUT_S = 10


def resolve(manifest: Manifest, hub: Hub, dataset: bool = True) -> Snapshots:
    """Resolve (online: download) every pinned repo of ``manifest``.

    With ``dataset=False``, the tokenizer's only. Online, the Hub is asked once, without retries,
    whether it answers; when it does not, the repos are read from the cache alone (huggingface_hub
    would retry each request for about 23 s before it fell back to the cache). A repo that is
    neither in the cache nor reachable is an error that lists every such repo of the manifest at
    once, with the commands that fetch them.
    """
    repos = [
        tokenizer_repo(manifest.tokenizer),
        *(dataset_repo(pin) for pin in manifest.datasets if dataset),
    ]
    unreachable = None if all(r.path for r in repos) else hub_unreachable(hub)
    if unreachable:
        hub = replace(hub, offline=True)
    folders, missing = [], []
    for repo in repos:
        try:
            folders.append(resolve_snapshot(repo, hub))
        except _NotInCache as err:
            missing.append((repo, err.__cause__))
    if missing:
        lines = [
            f"  {repo.repo_type} {repo.repo} at {repo.revision}: {', '.join(repo.patterns)}"
            for repo, _ in missing
        ]
        where = f" ({hub.cache_dir})" if hub.cache_dir else " (HF_HOME)"
        if any(repo.repo in hub.fixture_repos for repo, _ in missing):
            raise PinnedInputError(
                f"these pinned inputs are not in the HF cache{where}:\n"
                + "\n".join(lines)
                + f"\n{manifest.name} is made of fixtures this project lays out, not Hub repos: "
                "add --fixture-cache DIR"
            ) from missing[0][1]
        why = (
            f"the Hub cannot be reached from here ({unreachable})"
            if unreachable
            else "offline (HF_HUB_OFFLINE=1)"
            if hub.offline or constants.HF_HUB_OFFLINE
            else "the Hub did not answer"
        )
        commands = [f"  {repo.hf_download_command()}" for repo, _ in missing]
        raise PinnedInputError(
            f"these pinned inputs are not in the HF cache{where} and cannot be downloaded here: "
            f"{why}\n"
            + "\n".join(lines)
            + "\nfetch them into an HF cache on a machine that reaches the Hub, with fixed-sft "
            "(or python -m builders in a checkout):\n  "
            + cli_command("download", manifest, portable=True)
            + "\nor with huggingface_hub's hf command:\n"
            + "\n".join(commands)
            + "\nthen copy that cache here (HF_HOME) and build with HF_HUB_OFFLINE=1"
        ) from missing[0][1]
    return Snapshots(folders[0], folders[1:])


def hub_unreachable(hub: Hub) -> str | None:
    """Why the Hub does not answer (one request, no retries), or None.

    None: it answers, or the build is offline.
    """
    if hub.offline or constants.HF_HUB_OFFLINE:
        return None
    session = get_session()
    # huggingface_hub's HTTP library (httpx2 in the lock, httpx in older releases such as
    # miles' pin)
    transport_error = importlib.import_module(type(session).__module__.split(".")[0]).TransportError
    try:
        session.head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except transport_error as err:
        return f"{constants.ENDPOINT}: {type(err).__name__}: {err}"
    return None


class _NotInCache(PinnedInputError):
    """A pinned repo that is not in the cache and cannot be downloaded here."""


def resolve_snapshot(repo: PinnedRepo, hub: Hub) -> Path:
    """Return the local folder of ``repo`` at its revision.

    Online, its files are downloaded first. A local pin's folder is its own.
    """
    if repo.path is not None:
        if not Path(repo.path).is_dir():
            raise PinnedInputError(f"{repo.repo_type} folder {repo.path}: no such folder")
        return Path(repo.path)
    # offline, local files only: huggingface_hub before 2 would ask the Hub's API, and fail, not
    # read the cache
    try:
        folder = snapshot_download(
            repo.repo,
            repo_type=repo.repo_type,
            revision=repo.revision,
            allow_patterns=list(repo.patterns),
            cache_dir=hub.cache_dir,
            local_files_only=hub.offline or constants.HF_HUB_OFFLINE,
        )
    except LocalEntryNotFoundError as err:
        raise _NotInCache(
            f"{repo.repo_type} repo {repo.repo} at revision {repo.revision} is not in the HF cache"
        ) from err
    except (HfHubHTTPError, OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PinnedInputError(
            f"{repo.repo_type} repo {repo.repo} at revision {repo.revision}: cannot resolve the "
            f"pinned snapshot ({type(err).__name__}: {reason}). Offline (HF_HUB_OFFLINE=1), the "
            "snapshot must already be in the HF cache (HF_HOME); online, the repo and commit must "
            "exist on the Hub."
        ) from err
    return Path(folder)


def names_tools(manifest: Manifest) -> bool:
    """Whether a dataset of the manifest names a tools field (the template must print tools)."""
    return any(d.tools is not None for d in manifest.datasets)


@dataclass(frozen=True)
class TokenizerFiles:
    """A snapshot's tokenizer files, checked by sha256, and the chat format read from them.

    ``tokenizer.json`` is not parsed yet (``parsed``): the chat format's inputs, all a worker
    needs besides the file, are known before this process parses it.
    """

    tokenizer_json: str
    spec: FormatSpec
    snapshot: Path

    def parsed(self) -> PinnedTokenizer:
        """The tokenizer parsed, and the chat format's inputs checked against it."""
        tokenizer = _parsed_tokenizer(self.tokenizer_json, self.snapshot)
        format_class(self.spec.loss_mask).check_inputs(self.spec, tokenizer)
        return PinnedTokenizer(tokenizer, self.tokenizer_json, self.spec, self.snapshot)


def checked_tokenizer_files(
    pin: TokenizerPin,
    snapshot: Path,
    loss_mask: str,
    limits: Limits = DEFAULT_LIMITS,
    tools: bool = False,
) -> TokenizerFiles:
    """Check the snapshot's tokenizer files by sha256; read the chat format from them.

    ``tools``: the dataset names a tools field, so the template must print tools.
    """
    contents = {
        name: read_checked(in_its_cache(snapshot / name, snapshot), pin.sha256[name])
        for name in pin.files
    }
    try:
        tokenizer_json = contents["tokenizer.json"].decode("utf-8")
        config = (
            json.loads(contents["tokenizer_config.json"])
            if "tokenizer_config.json" in contents
            else None
        )
        if "chat_template.jinja" in contents:
            chat_template, source = (
                contents["chat_template.jinja"].decode("utf-8"),
                "chat_template.jinja",
            )
        else:
            chat_template, source = config_template(config, pin.chat_template_name)
    except Exception as err:
        raise _first_error(contents["tokenizer.json"], snapshot, err) from err
    spec = FormatSpec(
        loss_mask,
        chat_template,
        pin.eos,
        pin.stop,
        pin.prefills,
        pin.template_vars,
        pin.render_date,
        special_tokens(config) if config is not None else {},
        source,
        limits,
        tools,
    )
    return TokenizerFiles(tokenizer_json, spec, snapshot)


def _parsed_tokenizer(tokenizer_json: str, snapshot: Path) -> Tokenizer:
    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as err:
        raise _unparsable(snapshot, err) from err


def _first_error(tokenizer_json: bytes, snapshot: Path, err: Exception) -> PinnedInputError:
    """What reading the tokenizer files meets first: ``tokenizer.json``'s own parse is first."""
    try:
        _parsed_tokenizer(tokenizer_json.decode("utf-8"), snapshot)
    except UnicodeDecodeError as first:
        return _unparsable(snapshot, first)
    except PinnedInputError as first:
        return first
    return err if isinstance(err, PinnedInputError) else _unparsable(snapshot, err)


def _unparsable(snapshot: Path, err: Exception) -> PinnedInputError:
    # the bytes matched their pin, so this is a bad pin, not a tampered file
    return PinnedInputError(f"{snapshot}: the pinned tokenizer files cannot be parsed: {err}")


def config_template(config, name: str | None) -> tuple[str, str]:
    """A ``tokenizer_config.json``'s chat template, and where it came from.

    The config holds a string, or a list of ``{name, template}`` from which ``name`` picks
    (``default`` when not given).
    """
    if not isinstance(config, dict) or "chat_template" not in config:
        raise PinnedInputError(
            "the pinned tokenizer_config.json has no chat_template (and no chat_template.jinja "
            "is pinned)"
        )
    template = config["chat_template"]
    if isinstance(template, str):
        if name is not None:
            raise PinnedInputError(
                f"tokenizer.chat_template_name {name!r}: the pinned tokenizer_config.json has one "
                f"chat_template, not named ones"
            )
        return template, "tokenizer_config.json"
    named = (
        {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(template, list)
        else {}
    )
    wanted = name or "default"
    if not isinstance(named.get(wanted), str):
        raise PinnedInputError(
            f"the pinned tokenizer_config.json has no chat template named {wanted!r} (it has: "
            f"{', '.join(map(str, named)) or 'none'}); choose one with tokenizer.chat_template_name"
        )
    return named[wanted], f"tokenizer_config.json ({wanted})"


SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def special_tokens(config: dict) -> dict:
    """The special-token strings ``apply_chat_template`` gives a template.

    They are as transformers' ``special_tokens_map`` has them: each a string, or an AddedToken
    mapping's ``content``; ``additional_special_tokens`` a list.
    """

    def text(value):
        return value.get("content") if isinstance(value, dict) else value

    out = {
        key: text(config[key]) for key in SPECIAL_TOKENS if isinstance(text(config.get(key)), str)
    }
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t for t in map(text, extra) if isinstance(t, str)]
    return out


def pinned_inputs(manifest: Manifest, hub: Hub) -> tuple[PinnedTokenizer, Source]:
    """The manifest's tokenizer and source, resolved and checked."""
    snapshots = resolve(manifest, hub)
    return tokenizer_in(manifest, snapshots), open_source(manifest, snapshots)


def tokenizer_in(manifest: Manifest, snapshots: Snapshots) -> PinnedTokenizer:
    """The manifest's tokenizer from its resolved snapshot, checked and parsed."""
    return tokenizer_files_in(manifest, snapshots).parsed()


def tokenizer_files_in(manifest: Manifest, snapshots: Snapshots) -> TokenizerFiles:
    """The manifest's tokenizer files in its resolved snapshot, checked, not yet parsed."""
    return checked_tokenizer_files(
        manifest.tokenizer,
        snapshots.tokenizer,
        manifest.loss_mask,
        manifest.limits,
        names_tools(manifest),
    )


def pinned_tokenizer(manifest: Manifest, hub: Hub) -> PinnedTokenizer:
    """The manifest's tokenizer alone, resolved and checked.

    It is what decodes a built file's ids.
    """
    return tokenizer_in(manifest, resolve(manifest, hub, dataset=False))


def open_source(manifest: Manifest, snapshots: Snapshots) -> Source:
    """The source of the manifest's datasets, in their resolved snapshots."""
    return Source(
        [
            (pin, dataset_files(pin, folder))
            for pin, folder in zip(manifest.datasets, snapshots.datasets, strict=True)
        ],
        manifest.limits.conversation_chars,
    )


def dataset_files(pin: DatasetPin, snapshot: Path) -> list[tuple[str, Path]]:
    """The files the pin's glob names in the resolved snapshot.

    Each is (path in the snapshot, local path), in sorted path order; none is an error.
    """
    files = matching_files(pin.pattern, snapshot)
    if not files:
        raise PinnedInputError(f"dataset {pin.origin}: no files match {pin.pattern} in {snapshot}")
    if pin.local:
        check_listed(pin, [name for name, _ in files])
    return files


def check_listed(pin: DatasetPin, names: list[str]) -> None:
    """Refuse a local folder whose files read are not exactly the pinned ones.

    Each file the pin's glob matches must be listed in its ``sha256``, and each listed file must be
    there.
    """
    for name in names:
        if name not in pin.sha256:
            raise PinnedInputError(
                f"{Path(pin.path) / name}: the build reads it ({pin.pattern} matches it), but "
                "the manifest's sha256 does not list it: pin every file the build reads"
            )
    for name in pin.sha256:
        if name not in names:
            raise PinnedInputError(
                f"{Path(pin.path) / name}: pinned in the manifest's sha256, but "
                + (
                    f"it does not match {pin.pattern}"
                    if (Path(pin.path) / name).is_file()
                    else "no such file"
                )
            )


def source_files(source: Source) -> list[PinnedFile]:
    """The source's files with the sha256 each must have.

    A local folder's pinned sha256, a Hub snapshot's LFS object ids (``pinned_files``).
    """
    out = []
    for f in source.files:
        pin = source.pins[f.dataset]
        if pin.local:
            out.append(
                PinnedFile(f.name, f.path, pin.sha256[f.name], PINNED_BY_MANIFEST, local=True)
            )
        else:
            out.extend(pinned_files([(f.name, f.path)]))
    return out


def matching_files(pattern: str, snapshot: Path) -> list[tuple[str, Path]]:
    """The files of ``snapshot`` that ``pattern`` names, sorted by path.

    They are matched as the Hub's download filter matches (``*`` crosses ``/``), so they are exactly
    those ``snapshot_download`` fetched for it.
    """
    names = sorted(
        filter_repo_objects(
            (
                path.relative_to(snapshot).as_posix()
                for path in snapshot.rglob("*")
                if path.is_file() or path.is_symlink()
            ),
            allow_patterns=[pattern],
        )
    )
    return [(name, in_its_cache(snapshot / name, snapshot)) for name in names]


def in_its_cache(path: Path, snapshot: Path) -> Path:
    """``path``, a file of ``snapshot``, where it stays within the repo's folder of the HF cache.

    A snapshot's files link to the repo's blobs; a link that leaves the repo's folder (to
    ``/etc/passwd``, another repo, a device) is refused, naming it. A local folder (``path:``) is
    not a snapshot: its files are pinned by the manifest's sha256, wherever they are.
    """
    snapshot = Path(os.path.realpath(snapshot))
    if snapshot.parent.name != "snapshots":
        return path
    folder = snapshot.parent.parent
    target = Path(os.path.realpath(path))
    if not target.is_relative_to(folder):
        raise PinnedInputError(
            f"{path}: a link out of the snapshot's cache ({folder}) to {target}: refused (a "
            "pinned file is read only from its repo's folder of the HF cache)"
        )
    return path


@dataclass(frozen=True)
class PinnedFile:
    """An input file, and the sha256 (or git blob id) its bytes must have.

    With neither, nothing names its bytes: its sha256 is then recorded only.
    """

    name: str  # its path in the repo
    path: Path  # where it is read
    expected_sha256: str | None
    # what names the expected id, as messages and the report say it
    expected_from: str | None
    # the git blob id its bytes must have (a file stored in git, not LFS)
    expected_git_blob: str | None = None
    # pinned by the manifest (a local folder), not by the HF cache
    local: bool = False


LFS_OBJECT_ID = "its LFS object id (the name of its blob in the HF cache)"
GIT_BLOB_ID = "its git blob id (the name of its blob in the HF cache)"


def pinned_files(files: Iterable[tuple[str, Path]]) -> list[PinnedFile]:
    """Snapshot files (repo path, local path), with the id each must have.

    The HF cache names a file's blob by what names its bytes on the Hub: a Git LFS file's object
    id (its sha256), or a file stored in git itself by its git blob id (a sha1 of a header and the
    bytes). Each is checked against it; a file whose blob has neither name is recorded only.
    """
    pins = []
    for name, path in files:
        blob = Path(os.path.realpath(path)).name
        if re.fullmatch(r"[0-9a-f]{64}", blob):
            pins.append(PinnedFile(name, path, blob, LFS_OBJECT_ID))
        elif re.fullmatch(r"[0-9a-f]{40}", blob):
            pins.append(PinnedFile(name, path, None, GIT_BLOB_ID, blob))
        else:
            pins.append(PinnedFile(name, path, None, None))
    return pins


class FileHashes:
    """The sha256 of files' bytes, each read by a process beside the build.

    See ``hashed_files``.
    """

    def __init__(self, files: list[PinnedFile], digests: list[Future]):
        self._files = files
        self._digests = digests

    def checked(self) -> list[dict]:
        """Wait for every file's sha256; refuse a file whose bytes differ.

        A file's bytes must be the ones that name them. Returns, per file: its repo path, size, the
        sha256 of the bytes read, and what it was checked against.
        """
        recorded = []
        for file, digest in zip(self._files, self._digests, strict=True):
            try:
                sha256, size, git_blob = digest.result()
            except OSError as err:
                raise PinnedInputError(
                    f"{file.path}: cannot read the pinned file: {err.strerror or err}"
                ) from err
            if file.local and sha256 != file.expected_sha256:
                raise PinnedInputError(
                    f"{file.path}: sha256 is {sha256}, but the manifest pins "
                    f"{file.expected_sha256}: the folder does not hold the pinned file"
                )
            for kind, got, expected in (
                ("sha256", sha256, file.expected_sha256),
                ("git blob id", git_blob, file.expected_git_blob),
            ):
                if expected is not None and got != expected:
                    raise PinnedInputError(
                        f"{file.path}: the {kind} of its bytes is {got}, but "
                        f"{file.expected_from} is {expected}: the file was changed after it was "
                        f"downloaded; remove {os.path.realpath(file.path)} and download it again"
                    )
            recorded.append(
                {
                    "name": file.name,
                    "bytes": size,
                    "sha256": sha256,
                    "checked_against": file.expected_from,
                }
            )
        return recorded


@contextmanager
def hashed_files(files: list[PinnedFile]) -> Iterator[FileHashes]:
    """Hash ``files`` in a process of their own while the block runs.

    The process is ``builders.inputs.digest``'s. A build that fails otherwise (a conversation it
    cannot render, say) first waits for the hashes: a file that is not what names it is the cause
    to report. Otherwise the block's end does not wait: the process is ended.
    """
    hashing = HashingProcess(
        [file.path for file in files], [file.expected_git_blob is not None for file in files]
    )
    hashes = FileHashes(files, hashing.digests)
    try:
        yield hashes
    except BuildError as err:
        if not isinstance(err, PinnedInputError):
            hashes.checked()
        raise
    finally:
        hashing.stop()


def read_checked(path: Path, expected_sha256: str) -> bytes:
    """Return ``path``'s bytes if their sha256 is ``expected_sha256``."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PinnedInputError(
            f"{path}: cannot read the pinned file: {err.strerror or err}"
        ) from err
    got = hashlib.sha256(data).hexdigest()
    if got != expected_sha256:
        raise PinnedInputError(f"{path}: sha256 is {got}, but the manifest pins {expected_sha256}")
    return data
