"""Faults and tampering: the right file or a clear error.

Every one ends in the right file or a clear error, never a wrong file at the final path (issue: bad
input, faults and tampering).
"""

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import builders.encode.held as held_module
import builders.encode.stream as stream_module
from builders.build import build
from builders.cli import main as cli_main
from builders.encode import family
from builders.errors import ManifestError, SourceDataError
from builders.fixture.hf_cache import MESSAGE, parquet_shards
from builders.fixture.make import FIXTURE_TEMPLATE, synthetic_rows
from builders.inputs.pin_command import Block
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from builders.runtime.stopping import STOPPED
from builders.text import shown
from builders.yamlfile import read_yaml
from helpers import (
    CLI,
    REPO,
    SELF_CONTAINED,
    cli_env,
    encoder,
    in_workers,
    lay_out_build,
    run_cli,
    running,
    serving,
    start_cli_ready,
    wait_for,
    worker_processes,
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
    _, stderr = process.communicate(timeout=300)
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

    It landed while a ``__del__`` ran, as seen with regex's Group.__del__ while the template
    compiles: Python swallowed it, and the build went on past the finalizer. The build still ends
    with exit 130, one error line (no "Exception ignored" report of the stop) and nothing left: the
    stop is remembered and checked at every row and at the commit.
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
        f"        open({str(tmp_path / 'went on')!r}, 'w')\n"
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
    # the KeyboardInterrupt was swallowed where it landed, and not reported
    assert (tmp_path / "went on").exists()
    assert "Exception ignored" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    assert done.returncode == 130 and "interrupted" in done.stderr.strip().splitlines()[-1], (
        done.stderr
    )
    assert not out.exists() or not list(out.iterdir())


def gone(pids: list[int]) -> bool:
    """Whether these processes have exited (none running, none a zombie)."""
    return not any(running(pid) for pid in pids)


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
@pytest.mark.parametrize("whom", ["a worker", "their parent"])
def test_a_killed_worker_fails_the_build_clearly(big_build, tmp_path, moment, whom):
    """SIGKILL of one worker, or of the parent that forked them, at any moment: exit 7.

    As the out-of-memory killer sends it. Then the documented message, every other worker ended
    and reaped, nothing left. A worker dies with its parent (the kernel ends it).
    """
    hf_home, manifest, expected = big_build
    out = tmp_path / "out"
    process = start_build(hf_home, manifest, out, "--workers", "2", "-q")

    # the workers of the rows (with the sampler: once the sample workers have handed over)
    def workers() -> list[int]:
        return serving(worker_processes(process.pid)[1])

    if moment == "starting":
        # the parent is up; it forks the workers once it has parsed the tokenizer
        assert wait_for(
            lambda: workers() if whom == "a worker" else worker_processes(process.pid)[0]
        ), "none seen"
    else:
        numerator, _, denominator = moment.removeprefix("writing+").partition("/")
        share = int(numerator) / int(denominator or 1)
        assert wait_for(
            lambda: (
                any(p.suffix == ".tmp" for p in temporaries_and_outputs(out))
                and parquet_written(out) >= share * len(expected)
                and len(workers()) >= 2
            )
        ), "no workers seen"
    parents, forked = worker_processes(process.pid)
    killed = workers()[-1:] if whom == "a worker" else parents
    if process.poll() is not None or not killed:
        pytest.fail(f"the build ended before the kill at {moment}: make the build longer")
    os.kill(killed[0], signal.SIGKILL)
    # how soon it ends is bench/kill_loop.py's to measure: a test holds on a busy machine
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 7 and "worker process died" in stderr, stderr
    assert "killed by SIGKILL" in stderr, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    # the build reaped what it knew of; one forked as their parent was killed ends with it
    assert wait_for(lambda: gone([*parents, *forked])), "a worker outlived the build"
    assert not temporaries_and_outputs(out)


# the sample workers never send the plan's sample: the sampler and they stay until the kill
HELD_SAMPLE = f"""
import threading
sys.path.insert(0, {str(REPO)!r})
from builders.encode import worker
work = worker._work
def held(channel, tasks, prepared, choosing):
    if choosing is None:
        threading.Event().wait()
    return work(channel, tasks, prepared, choosing)
worker._work = held
"""


@pytest.mark.parametrize("whom", ["the sampler", "a sample worker"])
def test_a_killed_sampler_or_sample_worker_fails_the_build_clearly(big_build, tmp_path, whom):
    """SIGKILL of the sampler, or of a sample worker, as they hold the plan's sample: exit 7.

    The documented message, every process ended and reaped, nothing left; the sample workers end
    with the sampler (the kernel ends them).
    """
    hf_home, manifest, _ = big_build
    out = tmp_path / "out"
    environment = {"PYTHONPATH": str(in_workers(tmp_path, HELD_SAMPLE)), family.SAMPLER: "1"}
    process = start_build(hf_home, manifest, out, "--workers", "2", "-q", env=environment)
    # the sampler, then its two sample workers: the parent's other workers come after the sample
    assert wait_for(lambda: len(worker_processes(process.pid)[1]) == 3), "no sample workers seen"
    parents, (sampler, *sample_workers) = worker_processes(process.pid)
    os.kill(sampler if whom == "the sampler" else sample_workers[-1], signal.SIGKILL)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 7 and "worker process died" in stderr, stderr
    assert "killed by SIGKILL" in stderr, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert wait_for(lambda: gone([*parents, sampler, *sample_workers])), "a process outlived it"
    assert not temporaries_and_outputs(out)


def worker_fault(tmp_path: Path, fault: str) -> dict:
    """An environment whose worker processes meet ``fault``.

    Only they do, as their parent's interpreter starts (``no second fork``: as it forks).
    """
    folder = tmp_path / "fault"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"""\
import errno, os, signal, sys
if any("builders.encode.family" in a for a in sys.orig_argv):
    if {fault!r} == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    elif {fault!r} == "no second fork":
        forks, fork = [], os.fork
        def refused():
            forks.append(None)
            if len(forks) == 2:
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
            return fork()
        os.fork = refused
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
        (
            "no second fork",
            "worker process could not start: BlockingIOError: [Errno 11] Resource temporarily",
        ),
    ],
)
def test_a_worker_that_cannot_start_fails_the_build_at_once(big_build, tmp_path, fault, message):
    hf_home, manifest, _ = big_build
    out = tmp_path / "out"
    process = start_build(
        hf_home, manifest, out, "--workers", "2", "-q", env=worker_fault(tmp_path, fault)
    )
    _, stderr = process.communicate(timeout=300)
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
        # their parent is up (it forks them once it has parsed the tokenizer)
        assert wait_for(lambda: worker_processes(process.pid)[0]), "no workers seen"
    else:
        assert wait_for(
            lambda: (
                any(p.suffix == ".tmp" for p in temporaries_and_outputs(out))
                and len(worker_processes(process.pid)[1]) >= 2
            )
        ), "no workers seen"
    parents, workers = worker_processes(process.pid)
    workers = [*parents, *workers]
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
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


def test_spilled_rows_wait_beside_the_output_and_stale_spills_are_removed(tmp_path, monkeypatch):
    """Rows waiting on disk go in ``OUT/.NAME.PID.spill``, removed when the build ends.

    A spill folder a build killed outright left (its process gone) is removed by the next build
    of that name; a live process's is kept.
    """
    hf_home, out = tmp_path / "hf", tmp_path / "out"
    manifest = load_manifest(
        lay_out_build(hf_home, synthetic_rows(seed=5, count=200), build_rows=60, row_group_rows=5)
    )
    out.mkdir()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    stale = out / f".custom.{ended.pid}.spill"
    stale.mkdir()
    (stale / "bucket-0.arrow").write_bytes(b"rows of a killed build")
    alive = out / f".custom.{os.getppid()}.spill"
    alive.mkdir()
    read_back = []

    def bucket(path):
        read_back.append(path.parent)
        return real_bucket(path)

    real_bucket = held_module._bucket
    monkeypatch.setattr(held_module, "_bucket", bucket)
    monkeypatch.setattr(stream_module, "MEMORY_ROWS_BYTES", 1)
    monkeypatch.setattr(stream_module, "ENCODE_BATCH", 16)
    build(manifest, out, Hub(hf_home / "hub", offline=True), card=False, workers=1)
    assert read_back and set(read_back) == {out / f".custom.{os.getpid()}.spill"}, read_back
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [alive.name, "custom.parquet", "custom.report.json"]
    )


def test_a_failed_build_ends_its_workers_before_it_removes_its_spill_folder(tmp_path, monkeypatch):
    """No worker can write a held row after the spill folder is gone.

    A worker waits, for good, before it writes its first held rows to the spill folder (a file it
    makes says so), and the build fails meanwhile: when the folder is removed, every worker has
    been ended and reaped, and nothing of the build is left.
    """
    import builders.encode.pool as pool_module
    from builders.runtime import atomic

    hf_home, out, waiting = tmp_path / "hf", tmp_path / "out", tmp_path / "waiting"
    manifest = load_manifest(
        lay_out_build(hf_home, synthetic_rows(seed=5, count=200), build_rows=60, row_group_rows=5)
    )
    waiting.mkdir()
    site = in_workers(
        tmp_path,
        "import os, time\n"
        "import pyarrow.ipc\n"
        "def held_back(*args, **kwargs):\n"
        f"    open(os.path.join({str(waiting)!r}, str(os.getpid())), 'w').close()\n"
        "    while True:\n"
        "        time.sleep(1)\n"
        "pyarrow.ipc.new_file = held_back\n",
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setattr(stream_module, "MEMORY_ROWS_BYTES", 1)
    monkeypatch.setattr(stream_module, "ENCODE_BATCH", 16)
    workers, removed = [], []
    real_enter, real_keep, real_rmtree = (
        pool_module.Pool.__enter__,
        pool_module.Pool.keep_group,
        atomic.shutil.rmtree,
    )

    def enter(self):
        real_enter(self)
        workers.extend(self.workers)
        return self

    def keep_group(self, group, rows, positions, share, encoded):
        real_keep(self, group, rows, positions, share, encoded)
        # the first group with rows its worker holds on disk
        if (positions >= share["memory_end"]).any():
            assert wait_for(lambda: any(waiting.iterdir()))
            raise RuntimeError("the build fails while a worker writes its held rows")

    def rmtree(path, *args, **kwargs):
        if Path(path).suffix == ".spill":
            removed.append((Path(path).name, [w.process.poll() for w in workers]))
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(pool_module.Pool, "__enter__", enter)
    monkeypatch.setattr(pool_module.Pool, "keep_group", keep_group)
    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)
    with pytest.raises(RuntimeError, match="while a worker writes its held rows"):
        build(manifest, out, Hub(hf_home / "hub", offline=True), card=False, workers=2)
    ((name, codes),) = removed
    assert name == f".custom.{os.getpid()}.spill" and len(codes) == 2
    assert None not in codes, codes
    assert not list(out.iterdir())


def test_a_plan_that_stops_ends_its_workers_before_it_removes_its_spill_folder(
    tmp_path, monkeypatch
):
    """A plan's temporary spill folder, too, outlives its workers, and the stop is reported.

    The stream stops at a refused conversation; the plan then asks the workers which engine they
    chose, and they end with the plan, before its spill folder is removed.
    """
    import tempfile

    import builders.encode.pool as pool_module
    from builders.rows.order import permutation
    from builders.runtime.progress import Reporter
    from builders.views.plan import plan

    rows = synthetic_rows(seed=5, count=200)
    # early in the stream (lay_out_build's seed 3)
    bad = int(permutation(3, len(rows))[5])
    narrator = {"role": "narrator", "content": "x"}
    rows[bad] = {**rows[bad], "messages": [*rows[bad]["messages"], narrator]}
    hf_home = tmp_path / "hf"
    manifest = load_manifest(lay_out_build(hf_home, rows, build_rows=60, row_group_rows=5))
    monkeypatch.setattr(stream_module, "MEMORY_ROWS_BYTES", 1)
    monkeypatch.setattr(stream_module, "ENCODE_BATCH", 16)
    workers, removed = [], []
    real_enter, real_cleanup = pool_module.Pool.__enter__, tempfile.TemporaryDirectory.cleanup

    def enter(self):
        real_enter(self)
        workers.extend(self.workers)
        return self

    def cleanup(self):
        if Path(self.name).name.startswith("fixed-sft-spill-"):
            removed.append([w.process.poll() for w in workers])
        real_cleanup(self)

    monkeypatch.setattr(pool_module.Pool, "__enter__", enter)
    monkeypatch.setattr(tempfile.TemporaryDirectory, "cleanup", cleanup)
    result = plan(manifest, Hub(hf_home / "hub", offline=True), Reporter.silent(), workers=2)
    assert f"source row {bad} " in result.stops and not result.ok
    (codes,) = removed
    assert len(codes) == 2 and None not in codes, codes


@pytest.mark.parametrize("copies", [2, 1000])
def test_the_same_dataset_twice_in_a_mixture_is_refused(tmp_path, copies):
    """An identical pin (the same files of a repo at a revision) twice: exit 2, both named."""
    single = lay_out_build(tmp_path / "hf", synthetic_rows(seed=2, count=20)).read_text()
    pin = next(line for line in single.splitlines() if line.startswith("dataset: "))
    other = pin.removeprefix("dataset: ").replace("split: train", "files: 'data/*.parquet'")
    pins = [other] + [pin.removeprefix("dataset: ")] * copies
    mixture = tmp_path / "mixture.yaml"
    mixture.write_text(
        single.replace(pin, "datasets:\n" + "".join(f"  - {p}\n" for p in pins)).replace(
            "\n\n", "\n"
        )
    )
    with pytest.raises(ManifestError) as refused:
        load_manifest(mixture)
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert message.startswith(f"{mixture}: datasets[2]: the same files as datasets[1] ("), message
    assert "someone/custom-chat" in message and "data/train-*.parquet" in message, message


def test_repeated_conversation_ids_are_counted_not_refused(tmp_path):
    """Conversations sharing an id are built; the report and card count them."""
    rows = synthetic_rows(seed=2, count=40)
    # the stream's order, as data/ROWS.md defines it: repeats among its first conversations
    order = np.random.default_rng(3).permutation(len(rows))
    for later, earlier in ((4, 1), (7, 1), (6, 2)):
        rows[order[later]]["id"] = rows[order[earlier]]["id"]
    manifest = lay_out_build(tmp_path / "hf", rows, seed=3, build_rows=30)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    stats = json.loads((out / "custom.report.json").read_text())["stats"]
    seen, repeated = set(), []
    for i in order[: stats["conversations_consumed"]]:
        if rows[i]["id"] in seen:
            repeated.append(rows[i]["id"])
        seen.add(rows[i]["id"])
    assert repeated, "the build consumed no repeated id: choose others"
    assert stats["conversations_with_a_repeated_id"] == len(repeated)
    assert stats["repeated_ids"] == repeated[:5]
    card = (out / "custom.md").read_text()
    assert f"(repeated ids, not refused): {len(repeated)} (the first: {repeated[0]!r}" in card


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


def snapshot_of(hf_home: Path, repo: str) -> Path:
    return next((hf_home / "hub" / repo / "snapshots").iterdir())


@pytest.mark.parametrize(
    "link", ["data/train-00001-of-00002.parquet", "chat_template.jinja", "to a device"]
)
def test_a_link_out_of_the_snapshots_cache_is_refused(tmp_path, link):
    """A snapshot file that links outside its repo's cache folder: exit 3 naming it.

    Even where the bytes it reaches are the right ones.
    """
    rows = synthetic_rows(seed=2, count=40)
    files = parquet_shards(rows, shards=2, row_group_rows=8, message_type=MESSAGE)
    manifest = lay_out_build(tmp_path / "hf", rows, dataset_files=files)
    repo = (
        "models--someone--custom-tokenizer"
        if link == "chat_template.jinja"
        else ("datasets--someone--custom-chat")
    )
    if link == "to a device":
        placed, target = (
            snapshot_of(tmp_path / "hf", repo) / "data/train-00001-of-00002.parquet",
            (Path("/dev/zero")),
        )
    else:
        placed, target = snapshot_of(tmp_path / "hf", repo) / link, tmp_path / "elsewhere"
        target.write_bytes(placed.read_bytes())
    placed.unlink()
    placed.symlink_to(target)
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=tmp_path / "hf")
    assert done.returncode == 3, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: {placed}: a link out of the snapshot's cache"), done.stderr
    assert str(target) in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def git_hash_object(data: bytes) -> str:
    """git's own blob id of ``data`` (``git hash-object``), or the formula where git is absent."""
    try:
        done = subprocess.run(
            ["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return done.stdout.decode().strip()


def test_files_stored_in_git_are_checked_against_their_git_blob_id(tmp_path):
    """A dataset file stored in git (not LFS) is checked as an LFS file is.

    Its blob in the HF cache is named by its git blob id; the report says what each file was
    checked against. Changed bytes are exit 3, naming the file.
    """
    rows = synthetic_rows(seed=2, count=40)
    files = parquet_shards(rows, shards=2, row_group_rows=8, message_type=MESSAGE)
    in_git = "data/train-00000-of-00002.parquet"
    hf_home = tmp_path / "hf"
    manifest = lay_out_build(hf_home, rows, dataset_files=files, dataset_in_git=(in_git,))
    blob = Path(os.path.realpath(snapshot_of(hf_home, "datasets--someone--custom-chat") / in_git))
    assert blob.name == git_hash_object(files[in_git])
    out = tmp_path / "out"
    done = run_cli("--manifest", str(manifest), "--out", str(out), hf_home=hf_home)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "custom.report.json").read_text())
    assert {f["name"]: f["checked_against"] for f in report["source_files"]} == {
        in_git: "its git blob id (the name of its blob in the HF cache)",
        "data/train-00001-of-00002.parquet": "its LFS object id (the name of its blob in the HF "
        "cache)",
    }
    # the same rows in other row groups: a file that reads, whose bytes are not the pinned ones
    assert "(checked against its git blob id)" in (out / "custom.md").read_text()
    changed = parquet_shards(rows, shards=2, row_group_rows=5, message_type=MESSAGE)[in_git]
    blob.unlink()
    blob.write_bytes(changed)
    again = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "again"), hf_home=hf_home)
    assert again.returncode == 3, again.stderr
    assert f"the git blob id of its bytes is {git_hash_object(changed)}" in again.stderr
    assert in_git in again.stderr and blob.name in again.stderr, again.stderr
    assert not (tmp_path / "again" / "custom.parquet").exists()


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


FORGED = "\x1b[2J\x1b[H\rerror: all good\nTraceback (most recent call last):\u202e"


def test_shown_escapes_every_control_character_and_keeps_the_rest():
    assert shown(FORGED) == (
        "\\x1b[2J\\x1b[H\\rerror: all good\\nTraceback (most recent call last):\\u202e"
    )
    assert shown("a\tb\nc\x07\x7f\x9b\u2028") == "a\\tb\\nc\\x07\\x7f\\x9b\\u2028"
    assert shown("line\n\tindented\x1b", keep_lines=True) == "line\n\tindented\\x1b"
    readable = "é ü 中文 😀 👩\u200d💻 \\x1b <|user|>"
    assert shown(readable) == readable


def test_a_pin_note_quoting_data_stays_one_escaped_comment():
    """``pin``'s notes quote tokens and file names: a line break there cannot add a YAML line."""
    block = Block()
    block.note("eos: among <|end|>\nstop: [1]\x1b[2J")
    assert block.lines == ["  # eos: among <|end|>\\nstop: [1]\\x1b[2J"]
    assert block.notes == ["eos: among <|end|>\\nstop: [1]\\x1b[2J"]


def no_control_characters(text: str) -> bool:
    """Whether ``text`` prints as plain lines: no control character but line breaks."""
    return not any(
        (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in text
    )


def test_a_template_raise_exception_is_printed_escaped():
    """A template's raise_exception text cannot clear the screen or forge a line."""
    enc = encoder("[gMASK]<sop>{{ raise_exception(" + repr(FORGED) + ") }}")
    with pytest.raises(SourceDataError) as refused:
        enc.encode([{"index": 7, "id": "x", "messages": [{"role": "user", "content": "hi"}]}])
    message = str(refused.value)
    assert message.startswith("source row 7 (id 'x'): the chat template failed")
    assert shown(FORGED) in message and no_control_characters(message), message
    assert "\n" not in message


def test_a_card_s_text_is_printed_escaped(tmp_path, capsys):
    """check-recipe and manifest --from-recipe print a card's values and keys escaped."""
    card = tmp_path / "card.yaml"
    text = (REPO / "tests" / "cards" / f"{SELF_CONTAINED}.yaml").read_text()
    text = text.replace(
        "license: CC0-1.0 (generated)", 'license: "CC0\\e[2K\\rerror: all good"'
    ).replace("patches: []", 'patches: []\n"\\e[31mkey\\u202e": 1')
    card.write_text(text)
    for command in (["check-recipe", str(card)], ["manifest", "--from-recipe", str(card)]):
        code = cli_main(command)
        out = capsys.readouterr()
        assert code in (0, 5), out
        assert no_control_characters(out.out + out.err), out
    check = cli_main(["check-recipe", str(card)])
    out = capsys.readouterr()
    assert check == 5 and "card CC0\\x1b[2K\\rerror: all good" in out.out, out
    assert "not read: \\x1b[31mkey\\u202e" in out.err, out.err


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
    _, stderr = process.communicate(timeout=300)
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
