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
EDITED = "fixture-synthetic-edited-v1"
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
    names = [SELF_CONTAINED, EDITED]
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


def lay_out_build(hf_home: Path, rows: list[dict], *, name: str = "custom", seed: int = 3, row_tokens: int = 200,
                  build_rows: int = 30, shards: int = 4, row_group_rows: int = 5,
                  dataset_files: dict | None = None, tokenizer_files: dict | None = None) -> Path:
    """Lay out a dataset and tokenizer repo in ``hf_home`` and write a manifest naming them."""
    import hashlib

    from builders.fixture.hf_cache import MESSAGE_WITH_REASONING, parquet_shards, put_snapshot
    from builders.fixture.make import FIXTURE_TEMPLATE, tokenizer_json

    dataset_files = dataset_files or parquet_shards(rows, shards=shards, row_group_rows=row_group_rows,
                                                    message_type=MESSAGE_WITH_REASONING)
    tokenizer_files = tokenizer_files or {"tokenizer.json": tokenizer_json(),
                                          "chat_template.jinja": FIXTURE_TEMPLATE.read_bytes()}
    dataset = put_snapshot(hf_home, f"someone/{name}-chat", "dataset", dataset_files)
    tokenizer = put_snapshot(hf_home, f"someone/{name}-tokenizer", "model", tokenizer_files)
    sha = {k: hashlib.sha256(v).hexdigest() for k, v in tokenizer_files.items()}
    manifest = hf_home / f"{name}.yaml"
    manifest.write_text(f"""\
name: {name}
dataset: {{repo: someone/{name}-chat, revision: {dataset}, split: train}}
tokenizer:
  repo: someone/{name}-tokenizer
  revision: {tokenizer}
  sha256: {{tokenizer.json: {sha['tokenizer.json']}, chat_template.jinja: {sha['chat_template.jinja']}}}
loss_mask: glm5
seed: {seed}
row_tokens: {row_tokens}
rows: {build_rows}
""")
    return manifest
