"""Shared fixtures: the fixture HF cache, fixture builds, and the CLI run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders.build import build
from builders.fixture.make import make_fixture_cache, shared_dir
from builders.manifest import load_manifest
from builders.pinned import Hub

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
SELF_CONTAINED = "fixture-synthetic-v1"
FROM_SHARED = "fixture-tulu100-v1"


@pytest.fixture(scope="session")
def shared() -> Path:
    folder = shared_dir()
    if folder is None:
        pytest.skip("needs ../shared (the real chat template and Tulu 3 rows), which this checkout lacks")
    return folder


@pytest.fixture(scope="session")
def fixture_cache(tmp_path_factory) -> Path:
    """An HF_HOME holding every fixture repo (the shared-based ones where ../shared exists)."""
    hf_home = tmp_path_factory.mktemp("hf_home")
    make_fixture_cache(hf_home, shared_dir())
    return hf_home


@pytest.fixture(scope="session")
def hub(fixture_cache) -> Hub:
    return Hub(cache_dir=fixture_cache / "hub", offline=True)


def manifest_names(with_shared: bool = True) -> list:
    names = [SELF_CONTAINED]
    if with_shared:
        names.append(pytest.param(FROM_SHARED, marks=pytest.mark.skipif(
            shared_dir() is None, reason="needs ../shared (real chat template and Tulu 3 rows)")))
    return names


@pytest.fixture(scope="session")
def built(tmp_path_factory, hub):
    """Build a fixture manifest once per session; returns its BuildResult."""
    results = {}

    def get(name: str):
        if name not in results:
            out = tmp_path_factory.mktemp(f"built-{name}")
            results[name] = build(load_manifest(MANIFESTS / f"{name}.yaml"), out, hub)
        return results[name]

    return get


def run_cli(*args: str, hf_home: Path | None = None, env: dict | None = None, cwd: Path | None = None):
    """Run data/generate_fixed_sft.py in a fresh process, offline, as a user would."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHONHASHSEED"))}
    environment["HF_HUB_OFFLINE"] = "1"
    environment["HF_HOME"] = str(hf_home) if hf_home else str(Path(cwd or REPO) / ".no-hf-home")
    environment.update(env or {})
    return subprocess.run([sys.executable, str(REPO / "data" / "generate_fixed_sft.py"), *args],
                          capture_output=True, text=True, env=environment, cwd=cwd or REPO, timeout=600)
