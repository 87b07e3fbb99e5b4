"""The command line as users run it: offline from HF_HOME, exit codes, what is left on disk."""

import shutil

import pytest
import yaml
from helpers import MANIFESTS, SELF_CONTAINED, run_cli

from builders.card import PLOTS
from builders.fixture.make import TOKENIZER_REPO


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
        + [f"{SELF_CONTAINED}.{plot}.png" for plot in PLOTS])
    again = run_cli("--verify", str(out / f"{SELF_CONTAINED}.parquet"))
    assert again.returncode == 0, again.stdout + again.stderr


def test_fixture_cache_flag_needs_no_environment(tmp_path):
    done = run_cli("--build", SELF_CONTAINED, "--fixture-cache", str(tmp_path / "cache"), "--out",
                   str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr


def tampered_cache(fixture_cache, tmp_path):
    cache = tmp_path / "hf"
    shutil.copytree(fixture_cache, cache, symlinks=True)
    snapshots = cache / "hub" / f"models--{TOKENIZER_REPO.replace('/', '--')}" / "snapshots"
    target = next(snapshots.iterdir()) / "tokenizer.json"
    data = target.read_bytes()
    target.unlink()  # replace the link, not the shared blob
    target.write_bytes(data.replace(b'"hello"', b'"hellp"', 1) if b'"hello"' in data else data + b" ")
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
    manifest = manifest_copy(tmp_path, dataset__revision="0" * 40)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 3
    assert "0" * 40 in done.stderr and "HF_HUB_OFFLINE" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


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


def test_source_too_small_fails_and_writes_nothing(fixture_cache, tmp_path):
    manifest = manifest_copy(tmp_path, rows=100000)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 4 and "the source ran out" in done.stderr
    assert list(out.iterdir()) == []


def test_help_lists_exit_codes():
    done = run_cli("--help")
    assert done.returncode == 0 and "exit codes" in done.stdout and "--verify" in done.stdout


@pytest.mark.parametrize("argv", [["--build", "../etc/passwd"], ["--build", "no-such-build"], [],
                                  ["inspect"], ["diff", "no-such-file.parquet", "x.parquet"]])
def test_usage_errors(argv):
    done = run_cli(*argv)
    assert done.returncode == 2 and done.stderr.startswith("error:")


def test_rows_that_match_in_a_file_that_does_not_are_called_out(fixture_cache, tmp_path):
    manifest = manifest_copy(tmp_path, expect__parquet_sha256="1" * 64, expect__writer="pyarrow 1.0.0")
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=fixture_cache)
    assert done.returncode == 5
    assert "ok          rows_sha256" in done.stdout and "DIFFERS     parquet_sha256" in done.stdout
    assert "rows are exactly the pinned rows" in done.stderr and "made with pyarrow 1.0.0" in done.stderr


def test_verbose_errors_show_their_cause(tmp_path):
    manifest = tmp_path / "broken.yaml"
    manifest.write_text("name: [unclosed\n")
    plain = run_cli("--manifest", str(manifest))
    assert plain.returncode == 2 and "Traceback" not in plain.stderr and "not valid YAML" in plain.stderr
    verbose = run_cli("--manifest", str(manifest), "-v")
    assert verbose.returncode == 2
    assert "ParserError" in verbose.stderr and "direct cause" in verbose.stderr
    assert verbose.stderr.rindex("\nerror: ") > verbose.stderr.rindex("Traceback")  # the summary comes last
