"""Resolve the pinned inputs of a manifest: Hub snapshots at fixed commits, checked by sha256.

``huggingface_hub.snapshot_download`` downloads when online and reads the HF cache
(``HF_HOME``, ``HF_HUB_OFFLINE=1``) when not, so a pre-filled cache builds with no network.
The tokenizer files are read once, as bytes, and hashed before anything parses them: what is
parsed is exactly what was checked.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
from tokenizers import Tokenizer

from builders.errors import PinnedInputError
from builders.manifest import TOKENIZER_FILES, DatasetPin, TokenizerPin


@dataclass(frozen=True)
class Hub:
    """Where snapshots come from: ``cache_dir`` (default: the HF cache that ``HF_HOME`` names),
    and whether to stay offline (also implied by ``HF_HUB_OFFLINE=1``)."""

    cache_dir: Path | None = None
    offline: bool = False


@dataclass(frozen=True)
class PinnedTokenizer:
    tokenizer: Tokenizer
    chat_template: str
    snapshot: Path


def resolve_snapshot(repo: str, repo_type: str, revision: str, allow_patterns: list[str], hub: Hub) -> Path:
    """Return the local folder of ``repo`` at ``revision``, downloading it if online."""
    try:
        folder = snapshot_download(repo, repo_type=repo_type, revision=revision, allow_patterns=allow_patterns,
                                   cache_dir=hub.cache_dir, local_files_only=hub.offline)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PinnedInputError(
            f"{repo_type} repo {repo} at revision {revision}: cannot resolve the pinned snapshot "
            f"({type(err).__name__}: {reason}). Offline (HF_HUB_OFFLINE=1), the snapshot must already be in "
            f"the HF cache (HF_HOME); online, the repo and commit must exist on the Hub."
        ) from err
    return Path(folder)


def load_pinned_tokenizer(pin: TokenizerPin, hub: Hub) -> PinnedTokenizer:
    """Resolve the tokenizer snapshot, check both files' sha256, then parse them."""
    snapshot = resolve_snapshot(pin.repo, "model", pin.revision, list(TOKENIZER_FILES), hub)
    contents = {name: read_checked(snapshot / name, pin.sha256[name]) for name in TOKENIZER_FILES}
    try:
        tokenizer = Tokenizer.from_str(contents["tokenizer.json"].decode("utf-8"))
        chat_template = contents["chat_template.jinja"].decode("utf-8")
    except Exception as err:  # the bytes matched their pin, so this is a bad pin, not a tampered file
        raise PinnedInputError(f"{snapshot}: the pinned tokenizer files cannot be parsed: {err}") from err
    return PinnedTokenizer(tokenizer=tokenizer, chat_template=chat_template, snapshot=snapshot)


def dataset_files(pin: DatasetPin, hub: Hub) -> list[Path]:
    """Resolve the dataset snapshot and list its split's parquet files in sorted file-name order."""
    pattern = f"data/{pin.split}-*.parquet"
    snapshot = resolve_snapshot(pin.repo, "dataset", pin.revision, [pattern], hub)
    files = sorted((snapshot / "data").glob(f"{pin.split}-*.parquet"), key=lambda p: p.name)
    if not files:
        raise PinnedInputError(
            f"dataset repo {pin.repo} at revision {pin.revision}: no parquet files match {pattern} in {snapshot}"
        )
    return files


def read_checked(path: Path, expected_sha256: str) -> bytes:
    """Read ``path`` and return its bytes if their sha256 is ``expected_sha256``."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PinnedInputError(f"{path}: cannot read the pinned file: {err.strerror or err}") from err
    got = hashlib.sha256(data).hexdigest()
    if got != expected_sha256:
        raise PinnedInputError(f"{path}: sha256 is {got}, but the manifest pins {expected_sha256}")
    return data
