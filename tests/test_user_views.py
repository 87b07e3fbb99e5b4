"""What users see.

Progress and logs, the data card and its plots, inspect, diff, ecosystem fit.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from builders.build import build
from builders.fixture.make import FIXTURE_TEMPLATE, edited_rows, synthetic_rows, tokenizer_json
from builders.formats.glm5_layout import EOS
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from builders.rows.card import PLOTS
from builders.rows.order import permutation
from helpers import EDITED, MANIFESTS, REPO, SELF_CONTAINED, encoder, lay_out_build, run_cli


@pytest.fixture(scope="module")
def cli_build(fixture_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-build")
    done = run_cli("--build", SELF_CONTAINED, "--out", str(out), hf_home=fixture_cache)
    assert done.returncode == 0, done.stderr
    return out, done


def test_plain_progress_lines_when_not_on_a_terminal(cli_build):
    _, done = cli_build
    lines = [line for line in done.stderr.splitlines() if line.startswith("building rows:")]
    assert lines and lines[-1].startswith("building rows: 48/48 rows (100%)")
    assert "\r" not in done.stderr


def test_the_readme_quotes_the_builds_summary_line(cli_build):
    """The README shows the line the self-contained build's log ends with.

    The line says what a window is.
    """
    _, done = cli_build
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quoted = readme.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert "windows skipped: 512-token stretches of the stream" in quoted
    assert quoted in done.stderr.splitlines()


def test_log_lines_come_at_a_steady_pace_with_the_wall_time_rate():
    """Bursts of progress make no burst of lines.

    One line per interval of wall time, each with the rate so far.
    """
    import io

    from builders.runtime.progress import _Lines

    now = [0.0]
    stream = io.StringIO()
    lines = _Lines(
        "building rows", total=1000, unit="rows", stream=stream, every=10.0, clock=lambda: now[0]
    )
    for second, done in [(1, 300), (2, 300), (12, 100), (13, 100), (25, 200)]:
        now[0] = second
        lines.update(done)
    lines.finish()
    assert stream.getvalue().splitlines() == [
        "building rows: 700/1000 rows (70%), 58.3 rows/s over 12 s",
        "building rows: 1000/1000 rows (100%), 40.0 rows/s over 25 s",
    ]


def test_quiet_and_verbose(fixture_cache, tmp_path):
    quiet = run_cli(
        "--build", SELF_CONTAINED, "--out", str(tmp_path / "q"), "-q", hf_home=fixture_cache
    )
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = run_cli(
        "--build", SELF_CONTAINED, "--out", str(tmp_path / "v"), "-v", hf_home=fixture_cache
    )
    assert "tokenizer snapshot" in loud.stderr


def test_json_report_on_stdout(fixture_cache, tmp_path):
    done = run_cli(
        "--build", SELF_CONTAINED, "--out", str(tmp_path), "--json", hf_home=fixture_cache
    )
    report = json.loads(done.stdout)
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    assert report["verified"] and report["figures"]["rows_sha256"] == manifest.expect.rows_sha256
    verified = run_cli("verify", str(tmp_path / f"{SELF_CONTAINED}.parquet"), "--json")
    assert json.loads(verified.stdout)["verified"] is True and verified.returncode == 0


def test_version_and_python_dash_m():
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("fixed-sft ")
    done = subprocess.run(
        [sys.executable, "-m", "builders", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0 and "inspect" in done.stdout and "diff" in done.stdout


def front_matter(card: str) -> dict:
    _, head, _ = card.split("---\n", 2)
    return yaml.safe_load(head)


def test_card_describes_the_build(cli_build):
    out, _ = cli_build
    card = (out / f"{SELF_CONTAINED}.md").read_text(encoding="utf-8")
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    meta = front_matter(card)
    assert meta["license"] == "cc0-1.0" and meta["size_categories"] == ["n<1K"]
    assert meta["source_datasets"] == [manifest.dataset.repo]
    assert manifest.expect.rows_sha256 in card and manifest.dataset.revision in card
    report = json.loads((out / f"{SELF_CONTAINED}.report.json").read_text())
    for source in report["stats"]["by_source"]:
        assert (
            f"| {source['source']} | {source['conversations']:,} | {source['tokens']:,} |" in card
        )
    assert (
        f"windows skipped for having no supervised token: {report['stats']['windows_skipped']}"
        in card
    )
    for plot in PLOTS:
        assert f"({SELF_CONTAINED}.{plot}.png)" in card
        assert (out / f"{SELF_CONTAINED}.{plot}.png").read_bytes().startswith(b"\x89PNG")


def test_report_and_card_say_how_many_workers_encoded(cli_build, fixture_cache, tmp_path):
    """--workers auto (the default) is recorded with what it chose.

    What it chose on this machine; a number is recorded as given.
    """
    out, _ = cli_build
    cores = len(os.sched_getaffinity(0))
    report = json.loads((out / f"{SELF_CONTAINED}.report.json").read_text())
    assert (report["workers_requested"], report["cores"]) == ("auto", cores)
    # docs/performance.md: in-process on 2 cores
    assert report["workers"] == (1 if cores <= 2 else cores)
    card = (out / f"{SELF_CONTAINED}.md").read_text(encoding="utf-8")
    assert f"(`--workers auto`, {cores} cores available;" in card
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(tmp_path),
        "--workers",
        "2",
        "--no-card",
        hf_home=fixture_cache,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / f"{SELF_CONTAINED}.report.json").read_text())
    assert (report["workers_requested"], report["workers"]) == ("2", 2)
    refused = run_cli(
        "--build", SELF_CONTAINED, "--out", str(tmp_path), "--workers", "0", hf_home=fixture_cache
    )
    assert (
        refused.returncode == 2
        and "--workers: a number of at least 1, or auto, not '0'" in refused.stderr
    )


def test_conversations_that_train_nothing_are_counted(tmp_path):
    """Empty answers and answerless conversations are counted.

    Empty answers train only their stop tokens, a conversation without an answer trains nothing: the
    report, the card and the log line count both, over the conversations the build consumed.
    """

    def chat(*turns):
        return [
            {"role": role, "content": text}
            for role, text in zip(("user", "assistant") * 3, turns, strict=False)
        ]

    kinds = [
        chat("What is 2 + 2?", "4."),
        chat("Say nothing.", ""),
        chat("And again?", "  ", "Still?", ""),
        chat("Only a question."),
        chat("Hi", "", "Now answer.", "Here it is."),
    ]
    rows = [
        {"id": f"c{k}", "source": f"kind{k % len(kinds)}", "messages": kinds[k % len(kinds)]}
        for k in range(60)
    ]
    manifest = lay_out_build(tmp_path / "hf", rows, row_tokens=64, build_rows=12)
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path / "hf"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "custom.report.json").read_text())["stats"]
    consumed = [rows[i] for i in permutation(3, len(rows))[: report["conversations_consumed"]]]
    answers = [
        [m["content"].strip() for m in r["messages"] if m["role"] == "assistant"] for r in consumed
    ]
    only_stops = sum(1 for a in answers if a and not any(a))
    nothing = sum(1 for a in answers if not a)
    assert only_stops > 0 and nothing > 0
    assert (
        report["conversations_training_only_stop_tokens"],
        report["conversations_unsupervised"],
    ) == (only_stops, nothing)
    card = (tmp_path / "out" / "custom.md").read_text(encoding="utf-8")
    assert (
        f"every answer empty): {only_stops:,}" in card
        and f"(no answer, or none trained): {nothing:,}" in card
    )
    assert (
        f"conversations training only stop tokens (every answer empty): {only_stops}, "
        f"nothing at all: "
        f"{nothing}" in done.stderr
    )


def test_card_and_plots_are_deterministic(cli_build, fixture_cache, tmp_path):
    out, _ = cli_build
    again = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(tmp_path),
        hf_home=fixture_cache,
        env={"PYTHONHASHSEED": "77"},
    )
    assert again.returncode == 0
    for name in [f"{SELF_CONTAINED}.md"] + [f"{SELF_CONTAINED}.{plot}.png" for plot in PLOTS]:
        assert (out / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_plots_show_the_data(cli_build):
    """Look at the pictures: the plots show the supervised data in green.

    The source plot has a supervised (green) bar, the supervision plot a green line.
    """
    import matplotlib.image

    out, _ = cli_build
    green = np.array([0x22, 0xAA, 0x77]) / 255
    for plot in ("tokens-per-source", "row-supervision"):
        pixels = matplotlib.image.imread(out / f"{SELF_CONTAINED}.{plot}.png")[..., :3]
        assert (np.abs(pixels - green).max(axis=-1) < 0.05).sum() > 50, plot
    lengths = matplotlib.image.imread(out / f"{SELF_CONTAINED}.conversation-lengths.png")[..., :3]
    blue = np.array([0x44, 0x77, 0xAA]) / 255
    assert (np.abs(lengths - blue).max(axis=-1) < 0.05).sum() > 200


def test_inspect_a_row(cli_build, fixture_cache, tmp_path):
    out, _ = cli_build
    path = out / f"{SELF_CONTAINED}.parquet"
    html_path = tmp_path / "row.html"
    done = run_cli(
        "inspect",
        str(path),
        "--row",
        "3",
        "--color",
        "never",
        "--html",
        str(html_path),
        "--fixture-cache",
        str(fixture_cache),
    )
    assert done.returncode == 0, done.stderr
    row = pq.read_table(path).slice(3, 1).to_pylist()[0]
    assert done.stdout.startswith("row 3: 512 tokens")
    for index, id_ in zip(
        row["metadata"]["source_index"], row["metadata"]["source_id"], strict=True
    ):
        assert f"source row {index} (id {id_})" in done.stdout
    tokenizer = Tokenizer.from_str(tokenizer_json().decode())
    ids, mask = np.array(row["input_ids"]), np.array(row["loss_mask"])
    bounds = np.flatnonzero(np.diff(mask)) + 1
    runs = [(r, m[0]) for r, m in zip(np.split(ids, bounds), np.split(mask, bounds), strict=True)]
    expected = [tokenizer.decode(r.tolist(), skip_special_tokens=False) for r, m in runs if m == 1]
    # after the title, the chat format and the legend
    body = done.stdout.split("\n", 3)[3]
    shown = [
        s.replace("⏎" + EOS + "\n", EOS).replace("«", "").replace("»", "")
        for s in re.findall("⟦(.*?)⟧", body, re.S)
    ]
    assert shown == expected and expected
    assert done.stdout.splitlines()[1] == (
        "loss_mask glm5: chat_template 'chat_template.jinja'; eos '<|endoftext|>'; "
        "stop ['<|endoftext|>', '<|user|>', '<|observation|>']"
    )
    assert done.stdout.splitlines()[2].startswith("legend: ⟦…⟧ supervised")
    page = html_path.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and 'class="sup"' in page


def test_inspect_json_gives_the_view(cli_build, fixture_cache):
    out, _ = cli_build
    path = out / f"{SELF_CONTAINED}.parquet"
    done = run_cli(
        "inspect", str(path), "--row", "3", "--json", "--fixture-cache", str(fixture_cache)
    )
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    row = pq.read_table(path).slice(3, 1).to_pylist()[0]
    assert view["title"].startswith("row 3: 512 tokens") and view["continues"] is True
    assert view["labels"] == [
        f"source row {i} (id {d})" + (" (continued from an earlier row)" if k == 0 else "")
        for k, (i, d) in enumerate(
            zip(row["metadata"]["source_index"], row["metadata"]["source_id"], strict=True)
        )
    ]
    tokenizer = Tokenizer.from_str(tokenizer_json().decode())
    ids, mask = np.array(row["input_ids"]), np.array(row["loss_mask"])
    supervised = tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
    assert "".join(s["text"] for s in view["spans"] if s["supervised"]) == supervised
    assert "".join(s["text"] for s in view["spans"]) == tokenizer.decode(
        ids.tolist(), skip_special_tokens=False
    )


def test_inspect_a_source_conversation(fixture_cache):
    done = run_cli(
        "inspect",
        "--build",
        SELF_CONTAINED,
        "--source-index",
        "0",
        "--color",
        "never",
        "--fixture-cache",
        str(fixture_cache),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("source row 0 (id ")


def test_diff_two_builds_that_differ_in_one_conversation(tmp_path):
    rows = synthetic_rows(seed=5, count=80)
    a = load_manifest(lay_out_build(tmp_path / "a", rows, build_rows=20))
    changed = [dict(r) for r in rows]
    # change a conversation the build consumes: the 4th in permutation order
    victim = int(permutation(3, len(rows))[3])
    changed[victim] = {
        **rows[victim],
        "messages": [
            *rows[victim]["messages"][:-1],
            {"role": "assistant", "content": "a different answer"},
        ],
    }
    b = load_manifest(lay_out_build(tmp_path / "b", changed, build_rows=20))
    built_a = build(a, tmp_path / "out-a", Hub(tmp_path / "a" / "hub", offline=True), card=False)
    built_b = build(b, tmp_path / "out-b", Hub(tmp_path / "b" / "hub", offline=True), card=False)
    done = run_cli("diff", str(built_a.parquet), str(built_b.parquet), "--json")
    assert done.returncode == 8
    first = json.loads(done.stdout)["first"]
    assert first["a"]["source_id"] == rows[victim]["id"] == first["b"]["source_id"]
    assert first["a"]["source_index"] == victim
    table_a = pq.read_table(built_a.parquet).slice(first["row"], 1).to_pylist()[0]
    table_b = pq.read_table(built_b.parquet).slice(first["row"], 1).to_pylist()[0]
    assert table_a["input_ids"][: first["token"]] == table_b["input_ids"][: first["token"]]
    assert table_a["input_ids"][first["token"]] != table_b["input_ids"][first["token"]]
    text = run_cli("diff", str(built_a.parquet), str(built_b.parquet))
    assert (
        f"first difference: row {first['row']}, token {first['token']}, in the tokens"
        in text.stdout
    )


def test_diff_identical_and_against_a_fresh_build(cli_build, fixture_cache):
    out, _ = cli_build
    path = out / f"{SELF_CONTAINED}.parquet"
    same = run_cli("diff", str(path), str(path))
    assert same.returncode == 0 and same.stdout.startswith("identical: 48 rows")
    fresh = run_cli(
        "diff", str(path), "--build", SELF_CONTAINED, "--fixture-cache", str(fixture_cache), "-q"
    )
    assert (
        fresh.returncode == 0
        and "identical" in fresh.stdout
        and "b built with loss_mask glm5" in fresh.stdout
    )


def test_loads_with_datasets_and_pyarrow(cli_build, tmp_path):
    import datasets

    out, _ = cli_build
    path = out / f"{SELF_CONTAINED}.parquet"
    table = pq.read_table(path)
    loaded = datasets.load_dataset(
        "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "datasets-cache")
    )
    assert loaded.num_rows == table.num_rows == 48
    assert loaded[7]["input_ids"] == table.column("input_ids")[7].as_py()
    assert loaded[7]["metadata"]["row_index"] == 7


@pytest.mark.parametrize("library", ["polars", "duckdb"])
def test_loads_with_other_readers_when_installed(cli_build, library):
    module = pytest.importorskip(
        library, reason=f"{library} is not a dependency; checked where installed"
    )
    path = cli_build[0] / f"{SELF_CONTAINED}.parquet"
    if library == "polars":
        assert module.read_parquet(path).height == 48
    else:
        assert module.sql(f"select count(*) from '{path}'").fetchall()[0][0] == 48


def test_diff_the_edited_fixture_as_the_readme_shows(cli_build, fixture_cache, tmp_path):
    out, _ = cli_build
    edited = run_cli("--build", EDITED, "--out", str(tmp_path), "-q", hf_home=fixture_cache)
    assert edited.returncode == 0, edited.stderr
    done = run_cli(
        "diff", str(out / f"{SELF_CONTAINED}.parquet"), str(tmp_path / f"{EDITED}.parquet")
    )
    rows = synthetic_rows()
    victim = int(permutation(42, len(rows))[5])
    assert done.returncode == 8
    assert f"from source row {victim} (id {rows[victim]['id']})" in done.stdout
    # with the tokenizer at hand (A's name names its manifest), the text around the difference
    decoded = run_cli(
        "diff",
        str(out / f"{SELF_CONTAINED}.parquet"),
        str(tmp_path / f"{EDITED}.parquet"),
        hf_home=fixture_cache,
    )
    assert decoded.returncode == 8, decoded.stderr
    lines = decoded.stdout.splitlines()
    a_text, b_text = (
        lines[lines.index(next(x for x in lines if x.startswith(f"  {side}:"))) + 1]
        for side in "AB"
    )
    assert a_text.startswith("     text: ") and b_text.startswith("     text: ")
    edited = [m for m in edited_rows()[victim]["messages"] if m["role"] == "assistant"][-1][
        "content"
    ]
    original = [m for m in rows[victim]["messages"] if m["role"] == "assistant"][-1]["content"]
    before, rest = b_text.split("⟨", 1)
    # the same text up to the difference
    assert before == a_text.split("⟨", 1)[0]
    token, after = rest.split("⟩", 1)
    assert edited.startswith(token + after[:10]) and not original.startswith(token + after[:10])
    report = json.loads(
        run_cli(
            "diff",
            str(out / f"{SELF_CONTAINED}.parquet"),
            str(tmp_path / f"{EDITED}.parquet"),
            "--json",
            hf_home=fixture_cache,
        ).stdout
    )
    assert report["first"]["b"]["text"]["token"] == token


def test_card_front_matter_stays_yaml_for_any_manifest_text():
    from builders.manifest import parse_manifest
    from builders.rows.card import front_matter as card_front_matter

    odd = "Custom: see https://example.org/#terms, 'quoted' — and \"more\""
    text = (
        (MANIFESTS / f"{SELF_CONTAINED}.yaml")
        .read_text()
        .replace("license: CC0-1.0 (generated)", f"license: {json.dumps(odd)}")
    )
    meta = front_matter(card_front_matter(parse_manifest(text)) + "\n")
    assert meta["license"] == "other" and meta["license_name"] == odd


def test_inspect_tells_special_token_text_in_a_message_from_the_template(fixture_cache, tmp_path):
    """hard_case_0 (source row 0) types role tokens into its messages.

    Into its user and assistant messages.
    """
    page = tmp_path / "conversation.html"
    done = run_cli(
        "inspect",
        "--build",
        SELF_CONTAINED,
        "--source-index",
        "0",
        "--color",
        "never",
        "--html",
        str(page),
        "--fixture-cache",
        str(fixture_cache),
    )
    assert done.returncode == 0, done.stderr
    assert (
        "<|user|>What does «<|assistant|>» mean? And «<|user|>», «<|endoftext|>», «[gMASK]<sop>»?"
        "<|assistant|></think>⟦They are GLM's role tokens: «<|user|>» starts" in done.stdout
    )
    html_text = page.read_text(encoding="utf-8")
    # six typed tokens, and the legend's example
    assert html_text.count('class="literal"') == 6 + 1


def test_inspect_marks_a_row_that_ends_mid_conversation(cli_build, fixture_cache, tmp_path):
    out, _ = cli_build
    path = out / f"{SELF_CONTAINED}.parquet"
    meta = pq.read_table(path).column("metadata").to_pylist()
    # row 3's last conversation goes on in row 4
    assert meta[4]["source_index"][0] == meta[3]["source_index"][-1]
    done = run_cli(
        "inspect",
        str(path),
        "--row",
        "3",
        "--color",
        "never",
        "--fixture-cache",
        str(fixture_cache),
    )
    assert done.stdout.rstrip().endswith("⋯ (continues in the next row)")
    # rows that end exactly where a conversation ends: four copies of one conversation fill a row
    conversation = [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello, friend"},
    ]
    (encoded,) = encoder(FIXTURE_TEMPLATE.read_text()).encode(
        [{"index": 0, "id": "x", "messages": conversation}]
    )
    # with its EOS
    length = len(encoded.ids) + 1
    rows = [{"id": f"same_{k}", "source": "same", "messages": conversation} for k in range(20)]
    manifest = lay_out_build(tmp_path / "hf", rows, row_tokens=4 * length, build_rows=3)
    built = build(
        load_manifest(manifest),
        tmp_path / "out",
        Hub(tmp_path / "hf" / "hub", offline=True),
        card=False,
    )
    done = run_cli(
        "inspect",
        str(built.parquet),
        "--row",
        "1",
        "--manifest",
        str(manifest),
        "--color",
        "never",
        hf_home=tmp_path / "hf",
    )
    assert done.returncode == 0, done.stderr
    assert "continues" not in done.stdout and done.stdout.count("── source row") == 4
