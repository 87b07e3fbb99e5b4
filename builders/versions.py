"""Versions: this builder's own, and the toolchain's.

The builder's own version (and its git commit, run from a checkout), and the toolchain's.

The builder's version moves whenever the rows some manifest gives could change (a new rule, a
changed default), so a report that names it says which rows its code makes.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

from builders import __version__

LIBRARIES = (
    "numpy",
    "pyarrow",
    "tokenizers",
    "fastokens",
    "transformers",
    "huggingface_hub",
    "jinja2",
    "datasets",
    "PyYAML",
    "matplotlib",
)
# the folder that holds builders/, a git checkout or not
CHECKOUT = Path(__file__).resolve().parents[1]


def package_version(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def builder_commit() -> str | None:
    """The git commit of the checkout this code runs from, or None.

    It ends in ``+dirty`` where the checkout has uncommitted changes.
    """
    if not (CHECKOUT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (
        "+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else ""
    )


def toolchain() -> dict:
    """The versions that the report and card record.

    This builder's version and commit, Python's and the libraries' versions.
    """
    return {
        "fixed-sft": __version__,
        "fixed-sft commit": builder_commit(),
        "python": platform.python_version(),
        **{lib: package_version(lib) for lib in LIBRARIES},
    }
