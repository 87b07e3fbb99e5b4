"""Shared fixtures: the fixture HF cache and fixture builds.

Made once per session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builders.build import build
from builders.fixture.make import make_fixture_cache, shared_dir
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from helpers import MANIFESTS


@pytest.fixture(scope="session")
def shared() -> Path:
    folder = shared_dir()
    if folder is None:
        pytest.skip(
            "needs ../shared (the real chat template and Tulu 3 rows), which this checkout lacks"
        )
    return folder


@pytest.fixture(scope="session")
def fixture_cache(tmp_path_factory) -> Path:
    """An HF_HOME holding every fixture repo.

    The shared-based ones are there where ../shared exists.
    """
    hf_home = tmp_path_factory.mktemp("hf_home")
    make_fixture_cache(hf_home, shared_dir())
    return hf_home


@pytest.fixture(scope="session")
def hub(fixture_cache) -> Hub:
    return Hub(cache_dir=fixture_cache / "hub", offline=True)


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


@pytest.fixture(scope="session")
def row_file(request):
    """A fixture build's parquet.

    Built in this session, or, with ``$FIXED_SFT_BUILT``, the one in that folder. .ci/run tests the
    training side under miles' library versions that way: there the fixture inputs themselves come
    out differently (another tokenizers trains another tokenizer).
    """

    def get(name: str) -> Path:
        folder = os.environ.get("FIXED_SFT_BUILT")
        if not folder:
            return request.getfixturevalue("built")(name).parquet
        path = Path(folder) / f"{name}.parquet"
        if not path.is_file():
            pytest.fail(f"FIXED_SFT_BUILT={folder} has no {path.name}: build it first")
        return path

    return get
