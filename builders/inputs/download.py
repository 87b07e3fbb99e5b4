"""Fetch into the HF cache exactly the files a build reads.

A build then runs offline from the cache.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants

from builders.inputs.pinned import (
    Hub,
    PinnedRepo,
    dataset_repo,
    matching_files,
    resolve,
    tokenizer_repo,
)
from builders.manifest import Manifest, cli_command


@dataclass(frozen=True)
class Fetched:
    repo: PinnedRepo
    # the matched files in the snapshot folder
    files: list[Path]

    @property
    def bytes(self) -> int:
        return sum(path.stat().st_size for path in self.files)


def download(manifest: Manifest, hub: Hub) -> list[Fetched]:
    """Resolve every pinned repo online.

    The cache answers for what it already holds; a local folder (``path:``) is not fetched.
    """
    snapshots = resolve(manifest, hub)
    tokenizer = tokenizer_repo(manifest.tokenizer)
    fetched = [
        Fetched(
            tokenizer,
            [
                snapshots.tokenizer / name
                for name in tokenizer.patterns
                if (snapshots.tokenizer / name).is_file()
            ],
        )
    ]
    for pin, folder in zip(manifest.datasets, snapshots.datasets, strict=True):
        fetched.append(
            Fetched(dataset_repo(pin), [path for _, path in matching_files(pin.pattern, folder)])
        )
    return [f for f in fetched if f.repo.path is None]


def describe(fetched: list[Fetched], manifest: Manifest, hub: Hub) -> str:
    """What was fetched, where, and the command that builds from it offline."""
    if not fetched:
        return (
            f"nothing to download: every input of {manifest.name} is a local folder (path:), "
            f"read where it is: {cli_command('build', manifest, portable=True)}"
        )
    cache = hub.cache_dir or Path(constants.HF_HUB_CACHE)
    total = sum(f.bytes for f in fetched)
    lines = [f"in the HF cache {cache}: {sum(len(f.files) for f in fetched)} files, {_size(total)}"]
    for f in fetched:
        names = ", ".join(path.name for path in f.files[:3])
        names += f", … ({len(f.files)} files)" if len(f.files) > 3 else ""
        lines.append(
            f"  {f.repo.repo_type} {f.repo.repo} at {f.repo.revision[:12]}: "
            f"{names} ({_size(f.bytes)})"
        )
    home = shlex.quote(str(hub.cache_dir.parent if hub.cache_dir else constants.HF_HOME))
    lines.append(
        "build offline from it, here or where this cache is copied to (as HF_HOME/hub), "
        "with fixed-sft (or python -m builders in a checkout):\n"
        f"  HF_HUB_OFFLINE=1 HF_HOME={home} {cli_command('build', manifest, portable=True)}"
    )
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"
