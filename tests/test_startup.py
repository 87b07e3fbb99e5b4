"""A build's start-up: workers started before the command's imports, refusals in their order."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_tools import lay_out_tool_build
from tokenizers import Tokenizer
from tool_conversations import tool_conversations

import real_models
from builders import cli
from builders.cli import main as cli_main
from builders.encode import family, spawn
from builders.errors import WorkerError
from builders.fixture.hf_cache import MESSAGE, parquet_shards
from builders.fixture.make import synthetic_rows, tokenizer_json
from builders.inputs.pinned import Hub
from builders.runtime import stopping
from helpers import (
    SELF_CONTAINED,
    lay_out_build,
    run_cli,
    running,
    start_cli_ready,
    wait_for,
    worker_processes,
)

BAD_SHARD = "data/train-00001-of-00002.parquet"


@pytest.fixture
def stop_handler():
    """The command line's stop handler, installed in this process for the test, then removed."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    unraisable = sys.unraisablehook
    stopping.install()
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)
    sys.unraisablehook = unraisable
    stopping._asked.clear()


def _stopped_after_the_first(monkeypatch, name: str) -> list:
    """Every worker ``spawn.start`` starts; a SIGTERM to this process after the first ``NAME``."""
    started, start = [], spawn.start

    def recorded(count):
        started.extend(start(count))
        return started[-count:]

    monkeypatch.setattr(spawn, "start", recorded)
    first, unstopped = [True], getattr(spawn, name)

    def then_stopped(*args):
        done = unstopped(*args)
        if first:
            first.pop()
            os.kill(os.getpid(), signal.SIGTERM)
        return done

    monkeypatch.setattr(spawn, name, then_stopped)
    return started


@pytest.mark.parametrize("when", ["start", "stop"])
def test_a_stop_as_workers_start_or_are_reaped_leaves_none_running(stop_handler, monkeypatch, when):
    """A stop that lands as they have just started, or while they are reaped, unwinds after."""
    started = _stopped_after_the_first(monkeypatch, when)
    with pytest.raises(KeyboardInterrupt), spawn.early(3):
        # a build that fails: the workers are reaped
        raise RuntimeError("a refused manifest")
    assert len(started) == 3
    assert [process.poll() is not None for process, _ in started] == [True] * 3


def test_a_stop_inside_nested_deferred_blocks_unwinds_as_the_outer_one_ends(stop_handler):
    """The teardown reaps its workers in a block a stop does not break into, and reads each
    report of their parent in a block of its own: a stop unwinds once the teardown is done."""
    done = []
    with pytest.raises(KeyboardInterrupt), stopping.deferred():
        with stopping.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("a report read and kept")
        done.append("the other workers reaped")
    assert done == ["a report read and kept", "the other workers reaped"]


# a stop that lands in a finalizer, after one that fails otherwise
STOP_IN_A_FINALIZER = """
import os, signal, sys
from builders.runtime import stopping
class Broken:
    def __del__(self):
        raise ValueError("not a stop")
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        # the handler runs here, between this loop's instructions
        for _ in range(10_000):
            pass
stopping.install()
Broken()
Finalized()
print("went on", flush=True)
try:
    stopping.check()
except KeyboardInterrupt:
    print(stopping.STOPPED, file=sys.stderr)
    sys.exit(stopping.INTERRUPTED)
"""


def test_a_stop_swallowed_in_a_finalizer_ends_with_one_line():
    """Python swallows a stop raised while a finalizer runs, and reports it ("Exception ignored").

    The stop is remembered and unwinds at the next check, and its report is left out: a stop
    ends with one line, wherever it lands. Another error out of a finalizer is still reported.
    """
    done = subprocess.run(
        [sys.executable, "-c", STOP_IN_A_FINALIZER],
        capture_output=True,
        text=True,
        cwd=spawn.ROOT,
        timeout=60,
    )
    assert done.returncode == stopping.INTERRUPTED, done.stderr
    assert done.stdout == "went on\n"
    assert "ValueError: not a stop" in done.stderr
    assert "KeyboardInterrupt" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == stopping.STOPPED


def test_workers_a_pool_took_are_reaped_if_it_stopped_as_it_took_them():
    with pytest.raises(KeyboardInterrupt), spawn.early(2) as started:
        assert spawn.taken(2) == started
        # the pool stopped before it held them
        raise KeyboardInterrupt
    assert [process.poll() is not None for process, _ in started] == [True, True]


def test_workers_started_early_are_taken_by_the_pool_or_reaped():
    with spawn.early(2) as started:
        assert spawn.taken(2) == started and len(started) == 2
        assert spawn.taken(2) == []
    spawn.stop(started)
    with spawn.early(3) as started:
        # a pool of another size takes none of them
        assert spawn.taken(2) == []
    assert [process.poll() is not None for process, _ in started] == [True] * 3
    with spawn.early(1) as started:
        assert started == []


def _descriptors() -> set[str]:
    """This process's open sockets."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                sockets.add(target)
    return sockets


@pytest.mark.parametrize(
    "fault", [OSError(errno.EAGAIN, "Resource temporarily unavailable"), ValueError("x")]
)
def test_a_refused_start_leaves_nothing_open(monkeypatch, fault):
    """The system refusing the workers' parent: none early (the pool says why); else raised."""
    before = _descriptors()

    def refused(*args, **kwargs):
        raise fault

    monkeypatch.setattr(subprocess, "Popen", refused)
    if isinstance(fault, OSError):
        # the pool starts its own, and says why it cannot
        with spawn.early(6) as started:
            assert started == [] and spawn.taken(6) == []
        with pytest.raises(WorkerError, match=r"could not start: .*Resource temporarily"):
            spawn.start(6)
    else:
        with pytest.raises(ValueError), spawn.early(6):
            pass
    # every socket made for them closed
    assert _descriptors() == before


def _built_with(manifest: Path, tmp_path: Path, counts: tuple[str, ...], *more, env=None) -> dict:
    """The command line's build of ``manifest`` with each ``--workers`` count, into its folder."""
    return {
        workers: run_cli(
            "--manifest",
            str(manifest),
            "--out",
            str(tmp_path / workers),
            *more,
            "--workers",
            workers,
            hf_home=tmp_path / "hf",
            env=env,
        )
        for workers in counts
    }


def test_the_workers_are_forked_by_one_parent_that_parses_once(tmp_path):
    """Three workers: one parent parsed the tokenizer and loaded fastokens, with one thread as it
    forked them.

    The build's process parses it too; the rows are those of one process.
    """
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    site = tmp_path / "site"
    site.mkdir()
    trace = tmp_path / "trace"
    (site / "sitecustomize.py").write_text(f"""\
import os, fastokens, tokenizers
def traced(name, then):
    def call(*args, **kwargs):
        threads = open("/proc/self/status").read().split("\\nThreads:\\t")[1].split()[0]
        with open({str(trace)!r}, "a") as out:
            out.write(f"{{name}} {{os.getpid()}} {{threads}}\\n")
        return then(*args, **kwargs)
    return call
tokenizers.Tokenizer.from_str = traced("parse", tokenizers.Tokenizer.from_str)
fastokens.Tokenizer.from_json_str = traced("fastokens", fastokens.Tokenizer.from_json_str)
os.fork = traced("fork", os.fork)
""")
    # the sampler is left out (it is forked from 3 cores: the next test's)
    environment = {"PYTHONPATH": str(site), family.SAMPLER: "0"}
    runs = _built_with(manifest, tmp_path, ("1", "3"), "-q", env=environment)
    assert [done.returncode for done in runs.values()] == [0, 0], runs["3"].stderr
    events = [line.split() for line in trace.read_text().splitlines()]
    forks = [(pid, threads) for name, pid, threads in events if name == "fork"]
    parents = {pid for pid, _ in forks}
    assert len(forks) == 3 and len(parents) == 1 and {t for _, t in forks} == {"1"}, events
    # the parent's parse and fastokens' load; the one-process build's own; the build's own parse
    for name, count in (("parse", 3), ("fastokens", 2)):
        assert [pid for kind, pid, _ in events if kind == name and pid in parents] == [*parents]
        assert sum(kind == name for kind, _, _ in events) == count, events
    assert (tmp_path / "1" / "custom.parquet").read_bytes() == (
        tmp_path / "3" / "custom.parquet"
    ).read_bytes()


# in the workers' parent and every process it forks: each parse, fastokens load, fork and batch
# sent, with the process, its parent and its threads; the parent's fastokens load waits until a
# batch has been sent
SAMPLER_TRACE = """
import os, sys, time
if any("builders.encode.family" in a for a in sys.orig_argv):
    import fastokens, tokenizers
    from multiprocessing import connection
    TRACE = TRACE_FILE
    def note(name):
        threads = open("/proc/self/status").read().split("\\nThreads:\\t")[1].split()[0]
        with open(TRACE, "a") as out:
            out.write(f"{name} {os.getpid()} {os.getppid()} {threads}\\n")
    def traced(name, then):
        def call(*args, **kwargs):
            note(name)
            return then(*args, **kwargs)
        return call
    def batch_sent():
        return os.path.exists(TRACE) and "batch " in open(TRACE).read()
    def gated(then):
        def call(*args, **kwargs):
            # what the test waits for, not a duration: 120 s only ends a builder that never sends
            deadline = time.monotonic() + 120
            while not batch_sent() and time.monotonic() < deadline:
                time.sleep(0.01)
            note("fastokens")
            return then(*args, **kwargs)
        return call
    send = connection.Connection.send_bytes
    def sent(self, data, *args, **kwargs):
        if bytes(data[:8]) == b'{"batch"':
            note("batch")
        return send(self, data, *args, **kwargs)
    tokenizers.Tokenizer.from_str = traced("parse", tokenizers.Tokenizer.from_str)
    fastokens.Tokenizer.from_json_str = gated(fastokens.Tokenizer.from_json_str)
    os.fork = traced("fork", os.fork)
    connection.Connection.send_bytes = sent
"""


def test_the_sample_is_encoded_while_fastokens_loads(tmp_path):
    """With the sampler, three sample workers send the plan's sample before fastokens has loaded.

    The parent forks the sampler, which parses the tokenizer too and forks the sample workers;
    the parent loads fastokens once, and forks the three workers of the rest of the build as the
    sample workers hand over: one thread at every fork, and the rows are those of one process.
    """
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    site = tmp_path / "site"
    site.mkdir()
    trace = tmp_path / "trace"
    (site / "sitecustomize.py").write_text(SAMPLER_TRACE.replace("TRACE_FILE", repr(str(trace))))
    environment = {"PYTHONPATH": str(site), family.SAMPLER: "1"}
    runs = _built_with(manifest, tmp_path, ("1", "3"), env=environment)
    assert [done.returncode for done in runs.values()] == [0, 0], runs["3"].stderr
    assert "encoding with fastokens" in runs["3"].stderr, runs["3"].stderr
    events = [line.split() for line in trace.read_text().splitlines()]
    forks = {}
    for name, pid, _, threads in events:
        if name == "fork":
            forks.setdefault(pid, []).append(threads)
    assert len(forks) == 2 and all(set(t) == {"1"} for t in forks.values()), events
    (parent, sampler) = sorted(forks, key=lambda pid: -len(forks[pid]))
    # the parent forks the sampler and the three workers; the sampler, three sample workers
    assert (len(forks[parent]), len(forks[sampler])) == (4, 3), events
    assert sorted(pid for name, pid, _, _ in events if name == "parse") == sorted([parent, sampler])
    loads = [k for k, (name, pid, _, _) in enumerate(events) if name == "fastokens"]
    assert [events[k][1] for k in loads] == [parent], events
    batches = [(k, ppid) for k, (name, _, ppid, _) in enumerate(events) if name == "batch"]
    # the first batch before the load, from a sample worker; the pass's from the workers after
    assert batches[0][0] < loads[0] and batches[0][1] == sampler, events
    assert any(ppid == parent for _, ppid in batches), events
    assert (tmp_path / "1" / "custom.parquet").read_bytes() == (
        tmp_path / "3" / "custom.parquet"
    ).read_bytes()


def test_a_build_with_workers_takes_those_the_command_started(tmp_path, monkeypatch):
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    started = []

    def counted(count):
        started.extend(start(count))
        return started[-count:]

    start = spawn.start
    monkeypatch.setattr(spawn, "start", counted)
    monkeypatch.setattr(
        cli, "_hub", lambda args, manifest: Hub(tmp_path / "hf" / "hub", offline=True)
    )
    code = cli_main(["--manifest", str(manifest), "--out", str(tmp_path / "out"), "-q"])
    code_2 = cli_main(
        ["--manifest", str(manifest), "--out", str(tmp_path / "out2"), "-q", "--workers", "2"]
    )
    # a manifest refused: the two workers started for it are ended and reaped
    refused = cli_main(["--manifest", str(tmp_path / "no.yaml"), "-q", "--workers", "2"])
    assert (code, code_2, refused, len(started)) == (0, 0, 2, 4)
    assert all(process.poll() is not None for process, _ in started)
    assert (tmp_path / "out" / "custom.parquet").read_bytes() == (
        tmp_path / "out2" / "custom.parquet"
    ).read_bytes()


# the build's process, its pool's ``sample`` recorded: was transformers imported before it?
SAMPLE_BEFORE_TRANSFORMERS = """
import json, sys
from pathlib import Path
from builders import cli
from builders.encode import pool
from builders.inputs.pinned import Hub

seen, sample = [], pool.Pool.sample

def recorded(self, *args):
    seen.append("transformers" in sys.modules)
    return sample(self, *args)

pool.Pool.sample = recorded
cli._hub = lambda args, manifest: Hub(Path(sys.argv[1]), offline=True)
code = cli.main(sys.argv[2:])
print(json.dumps([code, seen, "transformers" in sys.modules]))
"""


def test_the_workers_have_the_plan_s_sample_before_the_build_imports_transformers(tmp_path):
    """The command's imports up to the sample leave out the renderer's (transformers: 0.5 s)."""
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    hub = str(tmp_path / "hf" / "hub")
    command = ["--manifest", str(manifest), "--out", str(tmp_path / "out"), "-q", "--workers", "2"]
    done = subprocess.run(
        [sys.executable, "-c", SAMPLE_BEFORE_TRANSFORMERS, hub, *command],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    # the build renders (and imports transformers) after it has handed the sample out
    assert json.loads(done.stdout.splitlines()[-1]) == [0, [False], True], done.stderr


# the build's process: is pandas imported by the end of the build, card and all?
PANDAS_AFTER = """
import json, sys
from pathlib import Path
from builders import cli
from builders.inputs.pinned import Hub

hub = Path(sys.argv[1])
cli._hub = lambda args, manifest: Hub(hub, offline=True)
# the process's own command line, as the console script runs it
sys.argv = ["fixed-sft", *sys.argv[2:]]
code = cli.main()
print(json.dumps([code, "pandas" in sys.modules, "transformers" in sys.modules]))
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_build_never_imports_pandas_and_its_rows_are_the_same(tmp_path, monkeypatch, workers):
    """pyarrow imports pandas at some conversions where it can (0.2 s): a build refuses it."""
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    hub = str(tmp_path / "hf" / "hub")
    outputs = []
    for refused, out in ((True, tmp_path / "out"), (False, tmp_path / "in-process")):
        command = ["--manifest", str(manifest), "--out", str(out), "-q", "--workers", workers]
        if refused:
            done = subprocess.run(
                [sys.executable, "-c", PANDAS_AFTER, hub, *command],
                capture_output=True,
                text=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            # transformers, which probes for pandas at its import, was imported
            assert json.loads(done.stdout.splitlines()[-1]) == [0, False, True], done.stderr
        else:
            # the same build in this process, where pandas may be imported
            import pandas  # noqa: F401

            monkeypatch.setattr(cli, "_hub", lambda args, manifest: Hub(Path(hub), offline=True))
            assert cli_main(command) == 0
        outputs.append(sorted(p.read_bytes() for p in out.glob("*.parquet")))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("also", [None, "a bad shard"])
def test_a_refused_template_is_named_first_whatever_the_workers(tmp_path, also):
    """The build's own refusal, before the workers' and the source's: as with no workers."""
    rows = synthetic_rows(seed=2, count=40)
    dataset = dict(parquet_shards(rows, shards=2, row_group_rows=8, message_type=MESSAGE))
    if also:
        dataset[BAD_SHARD] = b"<html>not found</html>"
    manifest = lay_out_build(
        tmp_path / "hf",
        rows,
        dataset_files=dataset,
        tokenizer_files={"tokenizer.json": tokenizer_json(), "chat_template.jinja": b"{% if %}"},
    )
    runs = _built_with(manifest, tmp_path, ("1", "2"))
    for workers, done in runs.items():
        assert done.returncode == 3, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the pinned chat template (chat_template.jinja) is not valid")
        assert "Traceback" not in done.stderr and not (tmp_path / workers).exists()
    assert runs["1"].stderr == runs["2"].stderr


def test_a_tokenizer_json_that_does_not_parse_is_named_before_the_config(tmp_path):
    """Its parse error first, as when the tokenizer was parsed before the template was read."""
    broken = b'{"version": "1.0", "model": '
    manifest = lay_out_build(
        tmp_path / "hf",
        synthetic_rows(seed=2, count=10),
        tokenizer_files={"tokenizer.json": broken, "tokenizer_config.json": b'{"eos": 1}'},
    )
    with pytest.raises(Exception) as parse:
        Tokenizer.from_str(broken.decode())
    done = run_cli(
        "--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path / "hf"
    )
    assert done.returncode == 3, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(f"the pinned tokenizer files cannot be parsed: {parse.value}")
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_build_stopped_once_its_workers_run_leaves_none_running(tmp_path, signum):
    """Stopped as its early workers start, the build ends as ever (exit 130), and they with it."""
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    out = tmp_path / "out"
    process = start_cli_ready(
        "--manifest", str(manifest), "--out", str(out), "--workers", "2", hf_home=tmp_path / "hf"
    )
    workers = set()

    def both_seen() -> bool:
        parents, forked = worker_processes(process.pid)
        workers.update(parents, forked)
        return len(workers) >= 3 or process.poll() is not None

    # their parent, and the two it forked (or the sampler and a sample worker)
    assert wait_for(both_seen) and len(workers) >= 3
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130 and stderr.strip().splitlines()[-1] == stopping.STOPPED
    assert "Traceback" not in stderr and not (out / "custom.parquet").exists()
    assert [pid for pid in workers if running(pid)] == []


def test_commands_that_encode_in_this_process_or_not_at_all_start_no_worker(
    tmp_path, monkeypatch, hub
):
    """Only build and plan with workers start them early: no other command, nor ``--help``."""
    started = []
    monkeypatch.setattr(spawn, "start", lambda count: started.append(count))
    monkeypatch.setattr(cli, "_hub", lambda args, manifest: hub)
    # auto, on two cores: this process
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for command in (["--help"], ["build", "--help"], ["plan", "--workers", "3", "--help"]):
        with pytest.raises(SystemExit) as done:
            cli_main(command)
        assert done.value.code == 0
    out = tmp_path / "out"
    parquet = str(out / f"{SELF_CONTAINED}.parquet")
    commands = [
        ["--build", SELF_CONTAINED, "--out", str(out), "--workers", "1"],
        ["--build", SELF_CONTAINED, "--out", str(tmp_path / "auto"), "--no-card"],
        ["plan", "--build", SELF_CONTAINED, "--workers", "1"],
        ["--verify", parquet],
        ["inspect", parquet, "--row", "1"],
        ["diff", parquet, str(tmp_path / "auto" / f"{SELF_CONTAINED}.parquet")],
        ["export", parquet, "--to", "trl"],
        ["explain", "--build", SELF_CONTAINED],
        ["download", "--build", SELF_CONTAINED],
        ["pin", "--dataset", str(tmp_path / "auto"), "--files", "*.parquet"],
    ]
    codes = [cli_main(["-q", *command]) for command in commands]
    assert (codes, started) == ([0] * len(commands), [])
    report = json.loads((tmp_path / "auto" / f"{SELF_CONTAINED}.report.json").read_text())
    assert (report["workers"], report["workers_requested"], report["cores"]) == (1, "auto", 2)


@pytest.mark.parametrize("cores", [3, 4])
def test_auto_starts_the_workers_the_build_uses_and_its_rows_are_the_same(
    tmp_path, monkeypatch, cores
):
    """``--workers auto`` on more than two cores: one worker a core, each started early, taken."""
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)
    started, start = [], spawn.start

    def counted(count):
        started.extend(start(count))
        return started[-count:]

    monkeypatch.setattr(spawn, "start", counted)
    monkeypatch.setattr(cli, "_hub", lambda args, _: Hub(tmp_path / "hf" / "hub", offline=True))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    args = ["--manifest", str(manifest), "-q", "--no-card", "--out"]
    assert cli_main([*args, str(tmp_path / "auto")]) == 0
    # the pool took every worker started early, and started none of its own
    assert len(started) == cores
    assert all(process.poll() is not None for process, _ in started)
    assert cli_main([*args, str(tmp_path / "one"), "--workers", "1"]) == 0
    assert len(started) == cores
    report = json.loads((tmp_path / "auto" / "custom.report.json").read_text())
    assert (report["workers"], report["workers_requested"], report["cores"]) == (
        cores,
        "auto",
        cores,
    )
    assert (tmp_path / "auto" / "custom.parquet").read_bytes() == (
        tmp_path / "one" / "custom.parquet"
    ).read_bytes()


@pytest.mark.parametrize(
    "cores, tool_traces, workers",
    [(1, False, 1), (1, True, 1), (2, False, 1), (2, True, 2), (3, False, 3), (3, True, 3)],
)
def test_auto_is_this_process_on_one_core_and_on_two_without_tools(
    monkeypatch, cores, tool_traces, workers
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert spawn.worker_count("auto", tool_traces) == workers
    assert spawn.worker_count(5, tool_traces) == 5


def test_auto_spreads_tool_traces_over_two_cores_and_their_rows_are_the_same(tmp_path, monkeypatch):
    """Tool traces on two cores: ``auto`` gives a worker a core (started by the pool once the
    manifest is read); the rows are those of one process."""
    hf_home = tmp_path / "hf"
    manifest = lay_out_tool_build(hf_home, real_models.qwen3(), "tools", tool_conversations(5, 24))
    started, start = [], spawn.start

    def counted(count):
        started.extend(start(count))
        return started[-count:]

    monkeypatch.setattr(spawn, "start", counted)
    monkeypatch.setattr(cli, "_hub", lambda args, _: Hub(hf_home / "hub", offline=True))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    args = ["--manifest", str(manifest), "-q", "--no-card", "--out"]
    assert cli_main([*args, str(tmp_path / "auto")]) == 0
    assert len(started) == 2
    assert all(process.poll() is not None for process, _ in started)
    assert cli_main([*args, str(tmp_path / "one"), "--workers", "1"]) == 0
    report = json.loads((tmp_path / "auto" / "tools.report.json").read_text())
    assert (report["workers"], report["workers_requested"], report["cores"]) == (2, "auto", 2)
    assert (tmp_path / "auto" / "tools.parquet").read_bytes() == (
        tmp_path / "one" / "tools.parquet"
    ).read_bytes()


def test_workers_the_system_refuses_are_refused_where_the_build_started_them(
    tmp_path, monkeypatch, capsys
):
    """No process left: a refused manifest is named first, else exit 7, never a traceback."""
    manifest = lay_out_build(tmp_path / "hf", synthetic_rows(seed=4, count=40), build_rows=10)

    def refused(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(
        spawn, "subprocess", SimpleNamespace(Popen=refused, DEVNULL=subprocess.DEVNULL)
    )
    monkeypatch.setattr(cli, "_hub", lambda args, _: Hub(tmp_path / "hf" / "hub", offline=True))
    errors = {}
    for workers in ("1", "2"):
        code = cli_main(["--manifest", str(tmp_path / "no.yaml"), "-q", "--workers", workers])
        errors[workers] = (code, capsys.readouterr().err)
    assert errors["1"] == errors["2"] and errors["1"][0] == 2
    out = tmp_path / "out"
    code = cli_main(["--manifest", str(manifest), "--out", str(out), "-q", "--workers", "2"])
    assert code == 7 and capsys.readouterr().err == (
        "error: a tokenizing worker process could not start: [Errno 11] Resource temporarily "
        "unavailable; nothing was left at the final path\n"
    )
    assert not (out / "custom.parquet").exists()
    assert cli_main(["--manifest", str(manifest), "--out", str(out), "-q", "--workers", "1"]) == 0
