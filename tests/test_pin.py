"""``pin``: the pinned YAML block of a tokenizer or dataset, for a Hub repo or a local folder.

What it writes is held to independent sources: hashlib over the files, the shipped manifest's
pins of the fixture repos (offline, from the HF cache), Qwen3's real template and the tokens its
generation config names; and the block, completed, must build.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import yaml
from tokenizers import Tokenizer

import real_models
from builders.fixture.hf_cache import MESSAGE_WITH_REASONING, parquet_shards
from builders.fixture.make import synthetic_rows
from builders.manifest import load_manifest
from helpers import MANIFESTS, SELF_CONTAINED, run_cli


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    """Qwen3's real template and tokenizer, with its tokenizer and generation configs."""
    model = real_models.qwen3()
    folder = tmp_path_factory.mktemp("qwen3")
    for name, data in model.files.items():
        (folder / name).write_bytes(data)
    tokenizer = Tokenizer.from_str(model.files["tokenizer.json"].decode())
    # as Qwen/Qwen3-8B publishes them
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    ids = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return folder


def test_qwen3_gets_its_stop_tokens_and_thinking_prefill_and_no_guessed_eos(qwen3_folder):
    done = run_cli("pin", "--tokenizer", str(qwen3_folder))
    assert done.returncode == 0, done.stderr
    block = yaml.safe_load(done.stdout)["tokenizer"]
    assert block["path"] == str(qwen3_folder)
    files = ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json")
    assert block["sha256"] == {
        name: hashlib.sha256((qwen3_folder / name).read_bytes()).hexdigest() for name in files
    }
    assert block["stop"] == ["<|im_end|>", "<|endoftext|>"]
    assert block["prefills"] == [{}, {"enable_thinking": False}]
    # two candidates: left out, and said so in the block and on stderr
    assert "eos" not in block
    assert "# eos: not written" in done.stdout
    assert "eos: not written" in done.stderr and "<|im_end|>, <|endoftext|>" in done.stderr
    assert "enable_thinking" in done.stderr
    # the template's own variables (set, looped over) are not the caller's to give
    assert "not given" not in done.stderr
    quiet = run_cli("pin", "-q", "--tokenizer", str(qwen3_folder))
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_template_that_reads_the_clock_is_noted(qwen3_folder, tmp_path):
    folder = tmp_path / "clock"
    shutil.copytree(qwen3_folder, folder)
    template = folder / "chat_template.jinja"
    template.write_text("{{ strftime_now('%d %b %Y') }}\n" + template.read_text())
    done = run_cli("pin", "--tokenizer", str(folder))
    assert done.returncode == 0, done.stderr
    assert "render_date: not written: the template calls strftime_now" in done.stdout
    assert "render_date" not in yaml.safe_load(done.stdout)["tokenizer"]


def test_offline_from_the_hf_cache_it_writes_the_shipped_pins(fixture_cache):
    shipped = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    done = run_cli(
        "pin",
        "--tokenizer",
        shipped.tokenizer.repo,
        "--dataset",
        shipped.dataset.repo,
        hf_home=fixture_cache,
    )
    assert done.returncode == 0, done.stderr
    block = yaml.safe_load(done.stdout)
    assert block["tokenizer"]["revision"] == shipped.tokenizer.revision
    assert block["tokenizer"]["sha256"] == shipped.tokenizer.sha256
    assert block["dataset"]["revision"] == shipped.dataset.revision
    assert block["dataset"]["split"] == "train"
    uncached = run_cli(
        "pin", "--dataset", shipped.dataset.repo, "--files", "*.jsonl", hf_home=fixture_cache
    )
    assert uncached.returncode == 0
    assert "files: none matching *.jsonl is in the HF cache" in uncached.stderr
    missing = run_cli("pin", "--tokenizer", "someone/absent", hf_home=fixture_cache)
    assert missing.returncode == 3 and "not in the HF cache" in missing.stderr


def test_a_pinned_local_block_completed_builds(qwen3_folder, tmp_path):
    data = tmp_path / "data" / "chats"
    data.mkdir(parents=True)
    shards = parquet_shards(
        synthetic_rows(seed=4, count=40), 2, 8, MESSAGE_WITH_REASONING, split="x"
    )
    for name, content in shards.items():
        (data / name.replace("data/", "")).write_bytes(content)
    manifest = tmp_path / "m" / "mine.yaml"
    manifest.parent.mkdir()
    done = run_cli(
        "pin",
        "--dataset",
        str(data),
        "--files",
        "*.parquet",
        "--tokenizer",
        str(qwen3_folder),
        "-o",
        str(manifest),
    )
    assert done.returncode == 0, done.stderr
    block = yaml.safe_load(manifest.read_text())
    assert block["dataset"]["path"] == "../data/chats"
    assert set(block["dataset"]["sha256"]) == {n.replace("data/", "") for n in shards}
    with manifest.open("a") as f:
        f.write('  eos: "<|endoftext|>"\nname: mine\nloss_mask: turns\nseed: 1\n')
        f.write("row_tokens: 128\nrows: 4\n")
    built = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"))
    assert built.returncode == 0, built.stderr
    assert "built, nothing pinned to verify" in built.stdout


def test_pin_knows_the_files_a_build_reads():
    from builders import manifest
    from builders.inputs import pin_command

    assert pin_command.TOKENIZER_FILES == manifest.TOKENIZER_FILES
    assert pin_command.TEMPLATE_FILES == manifest.TEMPLATE_FILES


def test_online_the_hub_names_the_commit_and_the_files(monkeypatch, capsys):
    """The Hub's answer (repo_info) stood in for: its commit, and a glob that names no file."""
    from types import SimpleNamespace

    import huggingface_hub

    from builders.cli import main

    commit = "ab" * 20

    def repo_info(self, repo, repo_type=None, revision=None):
        assert (repo, repo_type, revision) == ("someone/chats", "dataset", "v2")
        files = [SimpleNamespace(rfilename=n) for n in ("README.md", "data/train-0.parquet")]
        return SimpleNamespace(sha=commit, siblings=files)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", repo_info)
    assert main(["pin", "--dataset", "someone/chats", "--revision", "v2"]) == 0
    block = yaml.safe_load(capsys.readouterr().out)["dataset"]
    assert block == {"repo": "someone/chats", "revision": commit, "split": "train"}
    assert (
        main(["pin", "--dataset", "someone/chats", "--revision", "v2", "--files", "*.jsonl"]) == 3
    )
    assert "no file matches *.jsonl" in capsys.readouterr().err
