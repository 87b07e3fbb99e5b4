"""The command line as users run it.

Offline from HF_HOME, exit codes, what is left on disk.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from builders.fixture.make import TOKENIZER_REPO, synthetic_rows
from builders.rows.card import PLOTS
from helpers import MANIFESTS, REPO, SELF_CONTAINED, lay_out_build, run_cli


def manifest_copy(tmp_path, name=SELF_CONTAINED, **changes):
    doc = yaml.safe_load((MANIFESTS / f"{name}.yaml").read_text())
    for path, value in changes.items():
        node = doc
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_build_offline_from_hf_home_then_verify(fixture_cache, tmp_path):
    out = tmp_path / "out"
    done = run_cli("--build", SELF_CONTAINED, "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 0, done.stderr
    assert "verified" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{SELF_CONTAINED}.parquet", f"{SELF_CONTAINED}.report.json", f"{SELF_CONTAINED}.md"]
        + [f"{SELF_CONTAINED}.{plot}.png" for plot in PLOTS]
        + ["README.md"]
    )
    again = run_cli("--verify", str(out / f"{SELF_CONTAINED}.parquet"))
    assert again.returncode == 0, again.stdout + again.stderr


def test_fixture_cache_flag_needs_no_environment(tmp_path):
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--fixture-cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr


def tampered_cache(fixture_cache, tmp_path):
    cache = tmp_path / "hf"
    shutil.copytree(fixture_cache, cache, symlinks=True)
    snapshots = cache / "hub" / f"models--{TOKENIZER_REPO.replace('/', '--')}" / "snapshots"
    target = next(snapshots.iterdir()) / "tokenizer.json"
    data = target.read_bytes()
    # replace the link, not the shared blob
    target.unlink()
    target.write_bytes(
        data.replace(b'"hello"', b'"hellp"', 1) if b'"hello"' in data else data + b" "
    )
    return cache, target


def test_tampered_tokenizer_fails_before_any_work(fixture_cache, tmp_path):
    cache, target = tampered_cache(fixture_cache, tmp_path)
    out = tmp_path / "out"
    done = run_cli("--build", SELF_CONTAINED, "--out", str(out), hf_home=cache)
    assert done.returncode == 3
    assert str(target) in done.stderr and "sha256" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_unknown_revision_offline_fails_clearly(fixture_cache, tmp_path):
    manifest = manifest_copy(tmp_path, dataset__repo="someone/chat", dataset__revision="0" * 40)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 3
    assert f"dataset someone/chat at {'0' * 40}: data/train-*.parquet" in done.stderr
    assert (
        f"download someone/chat --repo-type dataset --revision {'0' * 40} "
        f"--include 'data/train-*.parquet'"
        in done.stderr
        and f"\n  fixed-sft download --manifest {manifest}\n" in done.stderr
    )
    assert "HF_HUB_OFFLINE" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_an_empty_cache_offline_lists_every_missing_repo(tmp_path):
    done = run_cli(
        "--build",
        "glm47flash-tulu3-fixed8192-v1",
        "--out",
        str(tmp_path / "out"),
        hf_home=tmp_path / "empty",
    )
    assert done.returncode == 3, done.stderr
    assert (
        "model zai-org/GLM-4.7-Flash at 7dd20894a642a0aa287e9827cb1a1f7f91386b67: tokenizer.json, "
        "chat_template.jinja" in done.stderr
    )
    assert (
        "dataset allenai/tulu-3-sft-mixture at b14afda60f1bbebe55d5d2fa1e4df5042f97f8be"
        in done.stderr
    )
    # commands for the machine that reaches the Hub: nothing of this environment's paths
    assert "\n  fixed-sft download --build glm47flash-tulu3-fixed8192-v1\n" in done.stderr
    assert (
        "\n  hf download zai-org/GLM-4.7-Flash --revision 7dd20894a642a0aa287e9827cb1a1f7f91386b67 "
        "--include "
        "tokenizer.json chat_template.jinja\n" in done.stderr
    )
    assert (
        str(Path(sys.executable).parent) not in done.stderr
        and "offline (HF_HUB_OFFLINE=1)" in done.stderr
    )


# nothing listens on port 9
UNREACHABLE_HUB = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}


def test_a_hub_out_of_reach_is_said_at_once(tmp_path):
    """Online, with no cache and no Hub, the first failed request ends it.

    huggingface_hub's retries took 46 s.
    """
    done = run_cli(
        "--build",
        "glm47flash-tulu3-fixed8192-v1",
        "--out",
        str(tmp_path / "out"),
        hf_home=tmp_path / "empty",
        env=UNREACHABLE_HUB,
        timeout=20,
    )
    assert done.returncode == 3, done.stderr
    assert "the Hub cannot be reached from here (http://127.0.0.1:9: ConnectError" in done.stderr
    assert "Retrying" not in done.stderr and "\n  fixed-sft download --build" in done.stderr


def test_a_filled_cache_builds_at_once_when_the_hub_is_out_of_reach(tmp_path):
    rows = synthetic_rows(seed=2, count=40)
    manifest = lay_out_build(tmp_path / "hf", rows, build_rows=5)
    done = run_cli(
        "--manifest",
        str(manifest),
        "--out",
        str(tmp_path / "out"),
        "--no-card",
        hf_home=tmp_path / "hf",
        env=UNREACHABLE_HUB,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "Retrying" not in done.stderr


def test_a_fixture_build_without_the_fixture_cache_says_what_to_add(tmp_path):
    # online: the fixture repos are never asked for
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(tmp_path / "out"),
        hf_home=tmp_path / "empty",
        env={"HF_HUB_OFFLINE": "0"},
        timeout=20,
    )
    assert done.returncode == 3 and "add --fixture-cache DIR" in done.stderr, done.stderr


def test_bad_manifest_exit_2(tmp_path):
    manifest = manifest_copy(tmp_path, dataset__revision="main")
    done = run_cli("--manifest", str(manifest))
    assert done.returncode == 2 and "dataset.revision" in done.stderr


def test_figure_mismatch_keeps_file_unverified(fixture_cache, tmp_path):
    manifest = manifest_copy(tmp_path, expect__rows_sha256="0" * 64, expect__parquet_bytes=1)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 5
    assert "DIFFERS     rows_sha256: expected " + "0" * 64 in done.stdout
    assert "DIFFERS     parquet_bytes: expected 1" in done.stdout
    assert not (out / f"{SELF_CONTAINED}.parquet").exists()
    assert (out / f"{SELF_CONTAINED}.unverified.parquet").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    # built from exactly the pinned inputs: the note sends to explain, saying why
    assert (
        "built from exactly what the manifest pins" in done.stderr
        and " explain --manifest " in done.stderr
    )
    # the card names the manifest the build was given
    card = (out / f"{SELF_CONTAINED}.md").read_text(encoding="utf-8")
    assert f"**NOT verified** against `{manifest}`." in card and "manifests/" not in card
    # what data/README.md asks users to send back is what such a build writes
    data_readme = (REPO / "data" / "README.md").read_text(encoding="utf-8")
    send_back = data_readme.split("Send back", 1)[1].split(" and `pip freeze`")[0]
    asked = re.findall(r"`out/(NAME[^`]*)`", send_back)
    assert asked and all(
        (out / name.replace("NAME", SELF_CONTAINED)).is_file() for name in asked
    ), asked


def test_verify_says_why_a_file_is_not_verified(two_builds, tmp_path):
    """A manifest that pins no hash, and a file with another row count.

    The reason is printed.
    """
    _, b, _ = two_builds
    manifest = manifest_copy(tmp_path, row_tokens=256, rows=21, expect=None)
    done = run_cli("--verify", str(b), "--manifest", str(manifest))
    assert done.returncode == 5
    assert "  DIFFERS     rows: expected 21, got 20" in done.stdout
    assert f"NOT verified (rows expected 21, got 20): {b}" in done.stdout


@pytest.mark.slow
def test_rows_built_from_other_inputs_name_them_not_explain(fixture_cache, tmp_path):
    """--verify of rows built with another seed.

    The report beside the file names the difference; without that report, both causes are given.
    """
    out = tmp_path / "out"
    built = run_cli(
        "--manifest",
        str(manifest_copy(tmp_path, seed=7, expect=None)),
        "--out",
        str(out),
        "--no-card",
        "-q",
        hf_home=fixture_cache,
    )
    assert built.returncode == 0, built.stderr
    # against the shipped manifest, by name
    done = run_cli("--verify", str(out / f"{SELF_CONTAINED}.parquet"))
    assert done.returncode == 5 and "DIFFERS     rows_sha256" in done.stdout
    assert (
        "built from something else than the manifest pins: seed 7 (the manifest: 42)" in done.stderr
    )
    assert "explain" not in done.stderr and f"build --build {SELF_CONTAINED}" in done.stderr
    alone = tmp_path / "alone" / f"{SELF_CONTAINED}.parquet"
    alone.parent.mkdir()
    shutil.copy(out / f"{SELF_CONTAINED}.parquet", alone)
    done = run_cli("--verify", str(alone))
    assert done.returncode == 5 and "what this file was built from is not known here" in done.stderr
    assert (
        f"build --build {SELF_CONTAINED}" in done.stderr
        and f"explain --build {SELF_CONTAINED}" in done.stderr
    )


def test_source_too_small_fails_and_writes_nothing(fixture_cache, tmp_path):
    manifest = manifest_copy(tmp_path, rows=100000)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 4 and "the source ran out" in done.stderr
    assert list(out.iterdir()) == []


def test_help_lists_exit_codes():
    done = run_cli("--help")
    assert done.returncode == 0 and "exit codes" in done.stdout and "--verify" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--build", "../etc/passwd"],
        ["--build", "no-such-build"],
        [],
        ["inspect"],
        ["diff", "no-such-file.parquet", "x.parquet"],
    ],
)
def test_usage_errors(argv):
    done = run_cli(*argv)
    assert done.returncode == 2 and done.stderr.startswith("error:")


def test_rows_that_match_in_a_file_that_does_not_are_called_out(fixture_cache, tmp_path):
    manifest = manifest_copy(
        tmp_path, expect__parquet_sha256="1" * 64, expect__writer="pyarrow 1.0.0"
    )
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=fixture_cache
    )
    assert done.returncode == 5
    assert "ok          rows_sha256" in done.stdout and "DIFFERS     parquet_sha256" in done.stdout
    assert (
        "rows are exactly the pinned rows" in done.stderr
        and "made with pyarrow 1.0.0" in done.stderr
    )


def test_verbose_errors_show_their_cause(tmp_path):
    manifest = tmp_path / "broken.yaml"
    manifest.write_text("name: [unclosed\n")
    plain = run_cli("--manifest", str(manifest))
    assert (
        plain.returncode == 2
        and "Traceback" not in plain.stderr
        and "not valid YAML" in plain.stderr
    )
    verbose = run_cli("--manifest", str(manifest), "-v")
    assert verbose.returncode == 2
    assert "ParserError" in verbose.stderr and "direct cause" in verbose.stderr
    # the summary comes last
    assert verbose.stderr.rindex("\nerror: ") > verbose.stderr.rindex("Traceback")


@pytest.fixture(scope="module")
def two_builds(fixture_cache, tmp_path_factory):
    """The self-contained fixture, and a build of it with shorter rows.

    Shorter rows and fewer of them.
    """
    out = tmp_path_factory.mktemp("two-builds")
    first = run_cli("--build", SELF_CONTAINED, "--out", str(out / "a"), "-q", hf_home=fixture_cache)
    manifest = manifest_copy(out, row_tokens=256, rows=20, expect=None)
    second = run_cli("--manifest", str(manifest), "--out", str(out / "b"), hf_home=fixture_cache)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    return out / "a" / f"{SELF_CONTAINED}.parquet", out / "b" / f"{SELF_CONTAINED}.parquet", second


def test_a_build_that_pins_nothing_says_so(two_builds):
    _, _, built = two_builds
    assert "built, nothing pinned to verify:" in built.stdout
    assert "not pinned" not in built.stdout and "verified" not in built.stdout
    assert "  rows_sha256: " in built.stdout


def test_diff_of_rows_of_different_lengths_says_so_first(two_builds):
    a, b, _ = two_builds
    done = run_cli("diff", str(a), str(b))
    assert done.returncode == 8
    assert done.stdout.startswith("the rows differ in length: 512 tokens in A, 256 in B")


def test_diff_of_files_with_different_row_counts(two_builds, tmp_path):
    import pyarrow.parquet as pq

    a, _, _ = two_builds
    shorter = tmp_path / "shorter.parquet"
    pq.write_table(pq.read_table(a).slice(0, 40), shorter)
    # --json before the command
    done = run_cli("--json", "diff", str(a), str(shorter))
    report = json.loads(done.stdout)
    assert done.returncode == 8 and (
        report["rows_a"],
        report["rows_b"],
        report["differing_rows"],
    ) == (48, 40, 8)
    assert report["first"]["row"] == 40 and report["first"]["kind"] == "row missing"
    text = run_cli("diff", str(a), str(shorter), "-q")
    assert (
        "different row counts: 48 in A, 40 in B" in text.stdout
        and "row missing in B" in text.stdout
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--verify", "nowhere.parquet"], "nowhere.parquet: no such file"),
        (["--verify", "README.md"], "README.md: not a parquet file"),
        (["verify", "pyproject.toml", "--build", SELF_CONTAINED], "not a parquet file"),
        (["diff", "README.md", "README.md"], "not a parquet file"),
        (["biuld", "--build", SELF_CONTAINED], "unknown command 'biuld'; did you mean 'build'?"),
        (["--build", SELF_CONTAINED, "--worker", "2"], "unrecognized arguments: --worker"),
        (
            ["--build", SELF_CONTAINED, "--fixture-cach", "x"],
            "unrecognized arguments: --fixture-cach",
        ),
    ],
)
def test_bad_input_files_and_words_are_named(argv, message):
    done = run_cli(*argv)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_parquet_file_that_is_no_row_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / f"{SELF_CONTAINED}.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    done = run_cli("--verify", str(path))
    assert done.returncode == 2 and "no column 'input_ids'; not a fixed-SFT row file" in done.stderr


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["-q", "--help"], ["inspect", "--help"]]
)
def test_help_and_version_load_nothing_heavy(argv):
    done = run_cli(*argv, env={"PYTHONWARNINGS": "default"}, **{})
    assert done.returncode == 0 and done.stderr == ""
    imported = run_cli(*argv, env={"PYTHONPROFILEIMPORTTIME": "1"})
    heavy = {
        "transformers",
        "tokenizers",
        "huggingface_hub",
        "pyarrow",
        "numpy",
        "builders.fixture",
    }
    assert not [
        line for line in imported.stderr.splitlines() if line.split("|")[-1].strip() in heavy
    ]


@pytest.mark.parametrize(
    "order, code", [("numpy-generator", 3), ("numpy-legacy", 0), ("source", 0)]
)
def test_the_pinned_permutation_guards_the_default_order_only(fixture_cache, tmp_path, order, code):
    """dataset.permutation_sha256 pins numpy-generator's stream.

    Another order reading is not checked by it.
    """
    manifest = manifest_copy(
        tmp_path, dataset__permutation_sha256="0" * 64, expect=None, contract={"order": order}
    )
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=fixture_cache
    )
    assert done.returncode == code, done.stderr
    assert ("permutation of 333 rows with seed 42" in done.stderr) == (code == 3)
