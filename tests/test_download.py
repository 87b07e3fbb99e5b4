"""download: exactly the files a build reads, into the HF cache.

It prints the command that builds from it.

No machine here reaches the Hub: the online path is checked by the arguments it hands to
huggingface_hub, and the whole command against a filled HF cache, offline.
"""

from pathlib import Path

import builders.inputs.pinned
from builders.inputs.download import download
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from helpers import MANIFESTS, SELF_CONTAINED, run_cli


def test_download_asks_the_hub_for_exactly_what_a_build_reads(monkeypatch, tmp_path):
    calls = []

    def snapshot_download(repo, **kwargs):
        calls.append((repo, kwargs))
        folder = tmp_path / repo.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    monkeypatch.setattr(builders.inputs.pinned, "snapshot_download", snapshot_download)
    # as if the Hub answered
    monkeypatch.setattr(builders.inputs.pinned, "hub_unreachable", lambda hub: None)
    manifest = load_manifest(MANIFESTS / "glm47flash-tulu3-fixed8192-v1.yaml")
    download(manifest, Hub(cache_dir=tmp_path / "hub"))
    assert calls == [
        (
            "zai-org/GLM-4.7-Flash",
            dict(
                repo_type="model",
                revision="7dd20894a642a0aa287e9827cb1a1f7f91386b67",
                allow_patterns=["tokenizer.json", "chat_template.jinja"],
                cache_dir=tmp_path / "hub",
                local_files_only=False,
            ),
        ),
        (
            "allenai/tulu-3-sft-mixture",
            dict(
                repo_type="dataset",
                revision="b14afda60f1bbebe55d5d2fa1e4df5042f97f8be",
                allow_patterns=["data/train-*.parquet"],
                cache_dir=tmp_path / "hub",
                local_files_only=False,
            ),
        ),
    ]


def test_offline_reads_only_the_cache(monkeypatch, tmp_path):
    """With HF_HUB_OFFLINE=1 the snapshots are asked for as local files.

    huggingface_hub before 2 (miles pins 1.33) otherwise asks the Hub's API for the file list and
    fails with OfflineModeIsEnabled instead of reading the cache.
    """
    asked = []

    def snapshot_download(repo, **kwargs):
        asked.append(kwargs["local_files_only"])
        folder = tmp_path / repo.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    monkeypatch.setattr(builders.inputs.pinned, "snapshot_download", snapshot_download)
    monkeypatch.setattr(builders.inputs.pinned.constants, "HF_HUB_OFFLINE", True)
    builders.inputs.pinned.resolve(
        load_manifest(MANIFESTS / "glm47flash-tulu3-fixed8192-v1.yaml"), Hub(cache_dir=tmp_path)
    )
    assert asked == [True, True]


def test_download_from_a_filled_cache_says_what_it_holds_and_how_to_build(fixture_cache):
    done = run_cli("download", "--build", SELF_CONTAINED, hf_home=fixture_cache)
    assert done.returncode == 0, done.stderr
    snapshot = fixture_cache / "hub" / "datasets--fixed-sft-fixtures--synthetic-chat"
    shards = sorted(snapshot.glob("snapshots/*/data/train-*.parquet"))
    size = sum(p.stat().st_size for p in shards)
    assert (
        f"dataset fixed-sft-fixtures/synthetic-chat at c139a2764c49: "
        f"{', '.join(p.name for p in shards)}" in done.stdout
    )
    assert f"{size / 1e3:.2f} kB" in done.stdout
    assert (
        f"HF_HUB_OFFLINE=1 HF_HOME={fixture_cache}" in done.stdout
        and f"--build {SELF_CONTAINED}" in done.stdout
    )
    # a portable command
    assert done.stdout.splitlines()[-1].endswith(f"fixed-sft build --build {SELF_CONTAINED}")
    # the printed command builds
    built = run_cli(
        *done.stdout.rsplit("fixed-sft ", 1)[1].split(),
        "--out",
        str(fixture_cache / "out"),
        hf_home=fixture_cache,
    )
    assert built.returncode == 0, built.stderr


def test_download_offline_with_an_empty_cache_lists_what_to_fetch(tmp_path):
    done = run_cli("download", "--build", "glm47flash-tulu3-fixed8192-v1", hf_home=tmp_path)
    assert done.returncode == 3
    assert "zai-org/GLM-4.7-Flash" in done.stderr and "allenai/tulu-3-sft-mixture" in done.stderr
    assert not (Path(tmp_path) / "hub").exists() or not any(
        (Path(tmp_path) / "hub").rglob("*.parquet")
    )
