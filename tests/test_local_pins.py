"""Local pins: a dataset and a tokenizer read from folders, pinned by the sha256 of their files.

A copy of the self-contained fixture's snapshots, pinned by path, must build the very rows the
shipped manifest pins (by repo and revision); every file read must be pinned and match.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from builders.build import build
from builders.errors import ManifestError, PinnedInputError
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest, parse_manifest
from helpers import MANIFESTS, SELF_CONTAINED, run_cli

NO_HUB = Hub(cache_dir=Path("/nonexistent-hf-cache"), offline=True)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def folders(fixture_cache, tmp_path_factory) -> Path:
    """The fixture's dataset and tokenizer snapshots, copied as plain folders."""
    shipped = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    hub = fixture_cache / "hub"
    root = tmp_path_factory.mktemp("local")

    def copy(repo: str, kind: str, revision: str, to: str) -> None:
        snapshot = hub / f"{kind}s--{repo.replace('/', '--')}" / "snapshots" / revision
        shutil.copytree(snapshot, root / to, symlinks=False)

    copy(shipped.dataset.repo, "dataset", shipped.dataset.revision, "chats")
    copy(shipped.tokenizer.repo, "model", shipped.tokenizer.revision, "tok")
    return root


def local_manifest(folders: Path, name: str = "local", **changes) -> Path:
    """The shipped fixture manifest with both inputs pinned by relative ``path:``."""
    shipped = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    data = sorted((folders / "chats").rglob("*.parquet"))
    digests = changes.pop("dataset_sha256", None) or {
        p.relative_to(folders / "chats").as_posix(): _sha(p) for p in data
    }
    tok = changes.pop("tokenizer_sha256", None) or {
        n: _sha(folders / "tok" / n) for n in ("tokenizer.json", "chat_template.jinja")
    }
    lines = [
        f"name: {name}",
        "dataset:",
        "  path: chats",
        "  split: train",
        f"  rows: {shipped.dataset.rows}",
        "  sha256:",
        *[f"    {k}: {v}" for k, v in digests.items()],
        "tokenizer:",
        "  path: tok",
        "  sha256:",
        *[f"    {k}: {v}" for k, v in tok.items()],
        "loss_mask: glm5",
        f"seed: {shipped.seed}",
        f"row_tokens: {shipped.row_tokens}",
        f"rows: {shipped.rows}",
        "expect:",
        f"  rows_sha256: {shipped.expect.rows_sha256}",
        f"  segments_sha256: {shipped.expect.segments_sha256}",
        f"  supervised_token_ratio: {shipped.expect.supervised_token_ratio.text}",
    ]
    path = folders / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_local_copy_builds_the_pinned_rows_from_the_command_line(folders, tmp_path):
    manifest = local_manifest(folders)
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path), "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert "verified:" in done.stdout
    report = json.loads((tmp_path / "local.report.json").read_text())
    chats = str(folders / "chats")
    assert report["recipe"]["dataset.path"] == chats
    assert report["recipe"]["tokenizer.path"] == str(folders / "tok")
    assert "dataset.repo" not in report["recipe"]
    recorded = {f["name"]: f for f in report["source_files"]}
    for path in sorted((folders / "chats").rglob("*.parquet")):
        name = path.relative_to(folders / "chats").as_posix()
        assert recorded[name]["path"] == chats
        assert recorded[name]["sha256"] == _sha(path)
        assert report["recipe"][f"dataset.sha256.{name}"] == _sha(path)
    card = (tmp_path / "local.md").read_text()
    assert f"the local folder `{chats}`" in card
    assert _sha(folders / "tok" / "tokenizer.json") in card


def test_relative_paths_resolve_against_the_manifests_folder(folders, tmp_path):
    manifest = load_manifest(local_manifest(folders))
    assert manifest.dataset.path == str(folders / "chats")
    assert manifest.tokenizer.path == str(folders / "tok")


def test_a_file_that_differs_from_its_pin_is_refused_naming_it(folders, tmp_path):
    name = "data/train-00001-of-00003.parquet"
    digests = {
        p.relative_to(folders / "chats").as_posix(): _sha(p)
        for p in sorted((folders / "chats").rglob("*.parquet"))
    }
    digests[name] = "ab" * 32
    manifest = load_manifest(local_manifest(folders, "bad", dataset_sha256=digests))
    with pytest.raises(PinnedInputError, match=f"{name}: sha256 is [0-9a-f]{{64}}, but the man"):
        build(manifest, tmp_path, NO_HUB, workers=1)
    assert not list(tmp_path.iterdir())


def test_a_tokenizer_file_that_differs_is_refused(folders, tmp_path):
    tok = {
        "tokenizer.json": "cd" * 32,
        "chat_template.jinja": _sha(folders / "tok/chat_template.jinja"),
    }
    manifest = load_manifest(local_manifest(folders, "badtok", tokenizer_sha256=tok))
    with pytest.raises(PinnedInputError, match=r"tokenizer\.json: sha256 is"):
        build(manifest, tmp_path, NO_HUB, workers=1)


def test_every_file_read_must_be_pinned_and_every_pinned_file_there(folders, tmp_path):
    digests = {
        p.relative_to(folders / "chats").as_posix(): _sha(p)
        for p in sorted((folders / "chats").rglob("*.parquet"))
    }
    unlisted = dict(list(digests.items())[1:])
    manifest = load_manifest(local_manifest(folders, "unlisted", dataset_sha256=unlisted))
    first = next(iter(digests))
    with pytest.raises(PinnedInputError, match=f"{first}: the build reads it .* does not list it"):
        build(manifest, tmp_path, NO_HUB, workers=1)
    missing = {**digests, "data/train-00009-of-00009.parquet": "ef" * 32}
    manifest = load_manifest(local_manifest(folders, "missing", dataset_sha256=missing))
    with pytest.raises(PinnedInputError, match=r"00009\.parquet: pinned .* no such"):
        build(manifest, tmp_path, NO_HUB, workers=1)


def test_a_missing_folder_is_a_missing_input(folders, tmp_path):
    text = local_manifest(folders).read_text().replace("path: chats", "path: elsewhere")
    (folders / "elsewhere.yaml").write_text(text)
    done = run_cli("--manifest", str(folders / "elsewhere.yaml"), "--out", str(tmp_path))
    assert done.returncode == 3, done.stderr
    assert f"{folders / 'elsewhere'}: no such folder" in done.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["dataset"].update(repo="o/n"), "dataset.path: give path:"),
        (lambda d: d["dataset"].pop("sha256"), "dataset.sha256: missing: a local folder"),
        (lambda d: d["dataset"].pop("path"), "dataset.repo: missing (or path:"),
        (lambda d: d["tokenizer"].pop("path"), "tokenizer.repo: missing (or path:"),
        (
            lambda d: d["dataset"]["sha256"].update({"../x": "ab" * 32}),
            "dataset.sha256 (a file path): expected a file's path inside",
        ),
    ],
)
def test_malformed_local_pins_name_the_field(folders, change, message):
    doc = yaml.safe_load(local_manifest(folders).read_text())
    change(doc)
    with pytest.raises(ManifestError, match=re.escape(message)):
        parse_manifest(yaml.safe_dump(doc), path=folders / "m.yaml")


def test_download_has_nothing_to_fetch_for_local_folders(folders):
    done = run_cli("download", "--manifest", str(local_manifest(folders)))
    assert done.returncode == 0, done.stderr
    assert "nothing to download: every input of local is a local folder" in done.stdout


def test_a_mixture_of_a_local_folder_and_a_hub_repo(folders, fixture_cache, tmp_path):
    edited = load_manifest(MANIFESTS / "fixture-synthetic-edited-v1.yaml")
    text = local_manifest(folders, "mixed").read_text()
    local = text[text.index("dataset:\n") + len("dataset:\n") : text.index("tokenizer:")]
    items = [line[2:] for line in local.splitlines()]
    mixture = (
        "datasets:\n  - " + "\n    ".join(items) + f"\n  - {{repo: {edited.dataset.repo}, "
        f"revision: {edited.dataset.revision}, split: train, take: 50}}\n"
    )
    text = text.replace("dataset:\n" + local, mixture).replace("rows: 48", "rows: 20")
    text = text[: text.index("expect:")]
    (folders / "mixed.yaml").write_text(text)
    manifest = load_manifest(folders / "mixed.yaml")
    hub = Hub(cache_dir=fixture_cache / "hub", offline=True)
    result = build(manifest, tmp_path, hub, workers=1)
    report = json.loads(result.report.read_text())
    where = {(f.get("path"), f.get("repo")) for f in report["source_files"]}
    assert where == {(str(folders / "chats"), None), (None, edited.dataset.repo)}
    assert report["recipe"]["datasets[0].path"] == str(folders / "chats")
    assert report["recipe"]["datasets[1].repo"] == edited.dataset.repo
    card = (tmp_path / "mixed.md").read_text()
    assert f"| the local folder `{folders / 'chats'}` | `data/train-*.parquet` |" in card
