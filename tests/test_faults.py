"""Faults and tampering: the right file or a clear error.

Every one ends in the right file or a clear error, never a wrong file at the final path (issue: bad
input, faults and tampering).
"""

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from builders.errors import ManifestError, SourceDataError
from builders.fixture.hf_cache import MESSAGE, parquet_shards
from builders.fixture.make import FIXTURE_TEMPLATE, synthetic_rows
from builders.runtime.stopping import STOPPED
from builders.yamlfile import read_yaml
from helpers import (
    CLI,
    REPO,
    SELF_CONTAINED,
    cli_env,
    encoder,
    lay_out_build,
    run_cli,
    start_cli_ready,
    wait_for,
)

BIG = dict(name="big", row_tokens=512, build_rows=4800, shards=3, row_group_rows=200)


@pytest.fixture(scope="module")
def big_build(tmp_path_factory):
    """A build that takes a few seconds, to interrupt.

    It comes with its uninterrupted bytes.
    """
    hf_home = tmp_path_factory.mktemp("big")
    manifest = lay_out_build(hf_home, synthetic_rows(seed=11, count=9600), **BIG)
    out = tmp_path_factory.mktemp("big-out")
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=hf_home)
    assert done.returncode == 0, done.stderr
    return hf_home, manifest, (out / "big.parquet").read_bytes()


def start_build(hf_home, manifest, out, *more, **popen):
    """The build, started; returns once its stop handler is installed."""
    return start_cli_ready(
        "--manifest", str(manifest), "--out", str(out), *more, hf_home=hf_home, **popen
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("when", ["starting", "writing"])
def test_interrupted_build_leaves_no_file_and_a_rerun_is_identical(
    big_build, tmp_path, signum, when
):
    hf_home, manifest, expected = big_build
    out = tmp_path / "out"
    process = start_build(hf_home, manifest, out)
    if when == "writing":
        assert wait_for(lambda: any(p.suffix == ".tmp" for p in temporaries_and_outputs(out))), (
            "the build never started writing"
        )
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert not (out / "big.parquet").exists() and not (out / "big.unverified.parquet").exists()
    if signum != signal.SIGKILL:
        assert process.returncode == 130 and stderr.strip().splitlines()[-1] == STOPPED, stderr
        assert "Traceback" not in stderr and not temporaries_and_outputs(out)
    rerun = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=hf_home)
    assert rerun.returncode == 0, rerun.stderr
    assert (out / "big.parquet").read_bytes() == expected
    assert not [p for p in out.iterdir() if p.suffix == ".tmp"], (
        "a killed build's temporary file was left"
    )


def test_a_stop_signal_landing_in_a_finalizer_still_stops_the_build(fixture_cache, tmp_path):
    """A SIGTERM whose KeyboardInterrupt Python swallows still stops.

    It landed while a ``__del__`` ran: "Exception ignored", seen with regex's Group.__del__ while
    the template compiles. The build still ends with exit 130 and nothing left: the stop is
    remembered and checked at every row and at the commit.
    """
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "if any('generate_fixed_sft' in a for a in sys.orig_argv):\n"
        "    import builders.encode.stream\n"
        "    real = builders.encode.stream.Stream.plan\n"
        "    class Finalizer:\n"
        "        def __del__(self):\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            # the handler runs here, inside __del__, and its exception is ignored\n"
        "            sum(range(1000))\n"
        "    def plan(self, encoder):\n"
        "        Finalizer()\n"
        "        return real(self, encoder)\n"
        "    builders.encode.stream.Stream.plan = plan\n"
    )
    out = tmp_path / "out"
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        hf_home=fixture_cache,
        env={"PYTHONPATH": str(site)},
    )
    # the KeyboardInterrupt was swallowed where it landed
    assert "Exception ignored" in done.stderr, done.stderr
    assert done.returncode == 130 and "interrupted" in done.stderr.strip().splitlines()[-1], (
        done.stderr
    )
    assert not out.exists() or not list(out.iterdir())


def worker_pids(pid: int) -> list[int]:
    """The build's worker processes.

    Started as ``python -c ... builders.encode.worker ...``.
    """
    children = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [int(p) for p in children.read_text().split()] if children.exists() else []
    return [p for p in pids if _is_worker(p)]


def _is_worker(pid: int) -> bool:
    try:
        return b"builders.encode.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        # it has exited
        return False


def gone(pids: list[int]) -> bool:
    """Whether these processes have exited and been reaped.

    No zombie is left.
    """
    return not any(Path(f"/proc/{pid}").exists() and _is_worker(pid) for pid in pids)


def temporaries_and_outputs(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if p.suffix in (".tmp", ".parquet")] if out.exists() else []


# moments a worker is killed, each one the test sees: as it starts (its interpreter still
# loading), or once the build's parquet holds this share of the finished file's bytes
KILL_MOMENTS = ["starting", "writing+0", "writing+1/4", "writing+1/2"]


def parquet_written(out: Path) -> int:
    """Bytes of the build's temporary parquet so far (0 before it exists)."""
    sizes = []
    for path in out.glob(".big.parquet.*.tmp") if out.exists() else []:
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            sizes.append(0)
    return max(sizes, default=0)


@pytest.mark.parametrize("moment", KILL_MOMENTS)
def test_a_killed_worker_fails_the_build_clearly(big_build, tmp_path, moment):
    """SIGKILL of one worker at any moment: exit 7 within seconds.

    As the out-of-memory killer sends it. Then the documented message, the other worker ended and
    reaped, nothing left.
    """
    hf_home, manifest, expected = big_build
    out = tmp_path / "out"
    process = start_build(hf_home, manifest, out, "--workers", "2", "-q")
    if moment == "starting":
        assert wait_for(lambda: worker_pids(process.pid)), "no worker seen"
    else:
        numerator, _, denominator = moment.removeprefix("writing+").partition("/")
        share = int(numerator) / int(denominator or 1)
        assert wait_for(
            lambda: (
                any(p.suffix == ".tmp" for p in temporaries_and_outputs(out))
                and parquet_written(out) >= share * len(expected)
                and len(worker_pids(process.pid)) >= 2
            )
        ), "no workers seen"
    workers = worker_pids(process.pid)
    if process.poll() is not None or not workers:
        pytest.fail(f"the build ended before the kill at {moment}: make the build longer")
    os.kill(workers[-1], signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - killed < 10, "the build took more than 10 s to notice"
    assert process.returncode == 7 and "worker process died" in stderr, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert gone(workers), "a worker outlived the build"
    assert not temporaries_and_outputs(out)


def worker_fault(tmp_path: Path, fault: str) -> dict:
    """An environment whose worker processes meet ``fault``.

    Only they do, as their interpreter starts.
    """
    folder = tmp_path / "fault"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"""\
import os, signal, sys
if any("builders.encode.worker" in a for a in sys.orig_argv):
    if {fault!r} == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        sys.path.insert(0, {str(REPO)!r})
        import builders.encode.encoder
        def refuse(*args, **kwargs):
            raise RuntimeError("injected start-up failure")
        builders.encode.encoder.ConversationEncoder.__init__ = refuse
""")
    return {"PYTHONPATH": str(folder)}


@pytest.mark.parametrize(
    "fault, message",
    [
        ("killed", "worker process died while starting (killed by SIGKILL"),
        ("init raises", "worker process could not start: RuntimeError: injected start-up failure"),
    ],
)
def test_a_worker_that_cannot_start_fails_the_build_at_once(big_build, tmp_path, fault, message):
    hf_home, manifest, _ = big_build
    out = tmp_path / "out"
    process = start_build(
        hf_home, manifest, out, "--workers", "2", "-q", env=worker_fault(tmp_path, fault)
    )
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 7 and message in stderr, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not temporaries_and_outputs(out)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("moment", ["workers starting", "writing"])
def test_interrupting_a_build_with_workers_prints_one_line(big_build, tmp_path, signum, moment):
    """Ctrl-C or SIGTERM to the build: exit 130, one line.

    Ctrl-C is SIGINT to the whole process group, as a terminal sends it. No worker's traceback, the
    workers reaped, nothing left.
    """
    hf_home, manifest, _ = big_build
    out = tmp_path / "out"
    process = start_build(hf_home, manifest, out, "--workers", "2", "-q", start_new_session=True)
    if moment == "workers starting":
        assert wait_for(lambda: len(worker_pids(process.pid)) >= 2), "no workers seen"
    else:
        assert wait_for(
            lambda: (
                any(p.suffix == ".tmp" for p in temporaries_and_outputs(out))
                and len(worker_pids(process.pid)) >= 2
            )
        ), "no workers seen"
    workers = worker_pids(process.pid)
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        "error: interrupted; nothing was left at the final path"
    ], stderr
    assert gone(workers), "a worker outlived the build"
    assert not temporaries_and_outputs(out)


def test_two_builds_into_one_folder_at_once(big_build, tmp_path):
    hf_home, manifest, expected = big_build
    out = tmp_path / "out"
    first, second = start_build(hf_home, manifest, out), start_build(hf_home, manifest, out)
    for process in (first, second):
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    assert (out / "big.parquet").read_bytes() == expected
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert "big.parquet" in {p.name for p in out.iterdir()}


def limit_file_size():
    # a write past the limit fails with EFBIG instead
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, 16_000))


def test_full_disk_fails_clearly(fixture_cache, tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        hf_home=fixture_cache,
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=limit_file_size,
    )
    assert done.returncode == 6, done.stderr
    assert (
        "cannot write " in done.stderr
        and "File too large" in done.stderr
        and "Traceback" not in done.stderr
    )
    assert list(out.iterdir()) == []


# --- inputs that are not what they claim, through the command line


def other_template():
    return FIXTURE_TEMPLATE.read_bytes().replace(b"written for", b"made for")


@pytest.mark.parametrize(
    "case",
    [
        "template tampered",
        "tokenizer missing",
        "shard not parquet",
        "shard truncated",
        "no messages column",
        "messages of another type",
    ],
)
def test_bad_input_names_the_file_and_writes_nothing(tmp_path, case):
    rows = synthetic_rows(seed=2, count=40)
    good = parquet_shards(rows, shards=2, row_group_rows=8, message_type=MESSAGE)
    bad_name = "data/train-00001-of-00002.parquet"
    dataset, expected = dict(good), bad_name
    if case == "template tampered":
        manifest = lay_out_build(tmp_path / "hf", rows, dataset_files=dataset)
        snapshot = next(
            (tmp_path / "hf" / "hub" / "models--someone--custom-tokenizer" / "snapshots").iterdir()
        )
        (snapshot / "chat_template.jinja").unlink()
        (snapshot / "chat_template.jinja").write_bytes(other_template())
        expected = "chat_template.jinja: sha256 is"
    elif case == "tokenizer missing":
        manifest = lay_out_build(tmp_path / "hf", rows, dataset_files=dataset)
        snapshot = next(
            (tmp_path / "hf" / "hub" / "models--someone--custom-tokenizer" / "snapshots").iterdir()
        )
        (snapshot / "tokenizer.json").unlink()
        expected = "tokenizer.json: cannot read the pinned file"
    else:
        dataset[bad_name] = {
            "shard not parquet": b"<html>not found</html>",
            "shard truncated": good[bad_name][: len(good[bad_name]) // 2],
            "no messages column": _parquet(pa.table({"id": ["a"], "conversation": ["x"]})),
            "messages of another type": _parquet(pa.table({"id": ["a"], "messages": [["x"]]})),
        }[case]
        manifest = lay_out_build(tmp_path / "hf", rows, dataset_files=dataset)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=tmp_path / "hf")
    assert done.returncode == 3, done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def _parquet(table):
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_unrenderable_conversation_names_source_index_and_id(tmp_path):
    rows = synthetic_rows(seed=2, count=30)
    rows[13]["messages"].append({"role": "function", "content": "x"})
    manifest = lay_out_build(tmp_path / "hf", rows, build_rows=60)
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path / "hf"
    )
    assert done.returncode == 4
    assert (
        f"source row 13 (id '{rows[13]['id']}')" in done.stderr and "role 'function'" in done.stderr
    )
    assert list((tmp_path / "out").iterdir()) == []


# --- verification that can be trusted


def tampered(table: pa.Table, how: str) -> pa.Table:
    if how == "row removed":
        return pa.concat_tables([table.slice(0, 20), table.slice(21)])
    if how == "rows swapped":
        order = list(range(table.num_rows))
        order[4], order[5] = order[5], order[4]
        return table.take(order)
    masks = table.column("loss_mask").to_pylist()
    masks[30][7] ^= 1
    return table.set_column(
        1, "loss_mask", pa.array(masks, type=table.schema.field("loss_mask").type)
    )


@pytest.mark.parametrize(
    "how, figure",
    [("row removed", "rows"), ("rows swapped", "rows_sha256"), ("mask bit flipped", "rows_sha256")],
)
def test_verify_detects_row_changes(built, tmp_path, how, figure):
    path = tmp_path / f"{SELF_CONTAINED}.parquet"
    pq.write_table(tampered(pq.read_table(built(SELF_CONTAINED).parquet), how), path)
    done = run_cli("--verify", str(path))
    assert done.returncode == 5
    assert f"DIFFERS     {figure}:" in done.stdout and "DIFFERS     parquet_sha256:" in done.stdout


@pytest.mark.parametrize("where", [0, 4, 0.25, 0.5, 0.75, -12, -5, -1])
def test_verify_detects_a_flipped_byte_anywhere(built, tmp_path, where):
    data = bytearray(built(SELF_CONTAINED).parquet.read_bytes())
    offset = int(where * len(data)) if isinstance(where, float) else where % len(data)
    data[offset] ^= 0x01
    path = tmp_path / f"{SELF_CONTAINED}.parquet"
    path.write_bytes(bytes(data))
    done = run_cli("--verify", str(path))
    assert "Traceback" not in done.stderr
    # the PAR1 magic: no longer a parquet file at all
    if offset < 4 or offset >= len(data) - 4:
        assert done.returncode == 2 and "not a parquet file" in done.stderr, done.stderr
    else:
        assert done.returncode == 5, done.stdout + done.stderr
        assert "DIFFERS     parquet_sha256:" in done.stdout or "cannot read" in done.stderr


# --- untrusted files stay data


def test_template_cannot_reach_python_internals():
    sneaky = "[gMASK]<sop>{{ ''.__class__.__mro__[1].__subclasses__() }}"
    enc = encoder(sneaky)
    with pytest.raises(SourceDataError, match="the chat template failed"):
        enc.encode([{"index": 0, "id": "x", "messages": [{"role": "user", "content": "hi"}]}])


def billion_laughs(levels: int = 9) -> str:
    """An alias bomb: 9 lines that expand to 9**9 strings."""
    lines = ['    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"    l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


def limit_memory():
    # a bomb that gets through fails here, not on the machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_yaml_alias_bomb_in_a_manifest_is_refused(fixture_cache, tmp_path):
    """A billion laughs in ``tokenizer.template_vars``: exit 2 naming the file and line."""
    text = (REPO / "manifests" / f"{SELF_CONTAINED}.yaml").read_text()
    head, tokenizer, tail = text.partition("tokenizer:\n")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(head + tokenizer + "  template_vars:\n" + billion_laughs() + tail)
    done = run_cli(
        "--manifest",
        str(bomb),
        "--out",
        str(tmp_path / "out"),
        hf_home=fixture_cache,
        timeout=120,
        preexec_fn=limit_memory,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {bomb}: line ") and "YAML nodes" in done.stderr, (
        done.stderr
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, named",
    [
        # 15 levels under the top one, then 2 more around an alias of them
        ("a: &a " + "[" * 15 + "1" + "]" * 15 + "\nb: [[*a]]\n", "nested deeper than 16 levels"),
        (
            "a: &a [" + ", ".join(["x"] * 999) + "]\nb: " + "[" + ", ".join(["*a"] * 51) + "]\n",
            "more than 50,000 YAML nodes",
        ),
        ("a: &a [1, 2]\nb: [*a, *a]\nc: *b\n", None),
    ],
    ids=["deep through an alias", "wide through aliases", "undefined alias"],
)
def test_yaml_bounds_count_what_aliases_repeat(tmp_path, text, named):
    """The bounds hold for the document as built, aliases expanded; a small one loads."""
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as refused:
        read_yaml(path, "manifest")
    assert str(refused.value).startswith(f"{path}: "), refused.value
    assert (named or "not valid YAML") in str(refused.value), refused.value
    fine = tmp_path / "fine.yaml"
    fine.write_text("a: &a {x: [1, 2.50]}\nb: [*a, *a]\n")
    assert read_yaml(fine, "manifest") == {"a": {"x": [1, 2.5]}, "b": [{"x": [1, 2.5]}] * 2}


def test_no_code_is_executed_from_inputs():
    sources = "\n".join(p.read_text() for p in (REPO / "builders").rglob("*.py"))
    sources += "\n".join(p.read_text() for p in (REPO / "patches").rglob("*.py"))
    for forbidden in ("trust_remote_code=True", "pickle", "yaml.load(", "eval(", "exec("):
        assert forbidden not in sources, forbidden


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_command_line_loads(fixture_cache, tmp_path, signum):
    """Stopped as its modules load, the command ends as it does later: one line, exit 130.

    The signal is sent as soon as the command says its stop handler is installed, before it loads
    the command line's modules (before that, a signal is Python's to handle).
    """
    process = start_cli_ready(
        "--build", SELF_CONTAINED, "--out", str(tmp_path / "out"), hf_home=fixture_cache
    )
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and stderr.strip().splitlines() == [STOPPED], stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


ENTRY_POINTS = {
    "data/generate_fixed_sft.py": [sys.executable, str(CLI)],
    "python -m builders": [sys.executable, "-m", "builders"],
    "fixed-sft": [str(Path(sys.executable).with_name("fixed-sft"))],
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_v_says_when_the_stop_handler_is_installed(entry):
    """``-v``'s first line, from every entry point: the process id, and the handler installed."""
    done = subprocess.run(
        [*ENTRY_POINTS[entry], "-v", "--verify", str(REPO / "no-such.parquet")],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=120,
    )
    first = done.stderr.splitlines()[0]
    assert first.startswith("started: pid ") and first.endswith("; stop handler installed"), (
        done.stderr
    )
    assert done.returncode == 2 and "no-such.parquet" in done.stderr, done.stderr
