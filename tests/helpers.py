"""What the tests share.

Paths, fixture names, the CLI run as a user runs it, custom builds laid out, the readings dataset.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from builders.build import build
from builders.encode.encoder import ConversationEncoder
from builders.fixture.conversations import hard_cases, synthetic
from builders.fixture.hf_cache import MESSAGE_WITH_REASONING, parquet_shards, put_snapshot
from builders.fixture.make import FIXTURE_TEMPLATE, PINNED_TEMPLATE, shared_dir, tokenizer_json
from builders.fixture.tokenizer import with_glm4_post_processor
from builders.formats import glm5_spec
from builders.inputs.pinned import Hub
from builders.manifest import Manifest, load_manifest
from builders.rows.packing import with_eos
from builders.runtime.stopping import SAY_STARTED
from reference import reference_rows

REPO = Path(__file__).resolve().parents[1]
# the real data folder: $FIXED_SFT_SHARED, or ../shared beside the checkout (as CI has it); the
# processes the tests start inherit it
if "FIXED_SFT_SHARED" not in os.environ and (REPO.parent / "shared").is_dir():
    os.environ["FIXED_SFT_SHARED"] = str(REPO.parent / "shared")
MANIFESTS = REPO / "manifests"
CLI = REPO / "data" / "generate_fixed_sft.py"
SELF_CONTAINED = "fixture-synthetic-v1"
EDITED = "fixture-synthetic-edited-v1"
FROM_SHARED = "fixture-tulu100-v1"
NEEDS_SHARED = pytest.mark.skipif(
    shared_dir() is None, reason="needs ../shared (real chat template and Tulu 3 rows)"
)

TEMPLATES = [
    pytest.param(lambda: FIXTURE_TEMPLATE.read_text(encoding="utf-8"), id="fixture-template"),
    pytest.param(
        lambda: (shared_dir() / PINNED_TEMPLATE).read_text(encoding="utf-8"),
        id="pinned-template",
        marks=NEEDS_SHARED,
    ),
]


def manifest_names(with_shared: bool = True) -> list:
    names = [SELF_CONTAINED, EDITED]
    if with_shared:
        names.append(pytest.param(FROM_SHARED, marks=NEEDS_SHARED))
    return names


def encoder(template: str) -> ConversationEncoder:
    """The builder's encoder with the fixture tokenizer and ``template``."""
    return ConversationEncoder(Tokenizer.from_str(tokenizer_json().decode()), glm5_spec(template))


def with_its_eos(enc: ConversationEncoder, conversation) -> tuple[list[int], list[int]]:
    """An encoded conversation as it enters the stream.

    Its tokens and the EOS after them.
    """
    ids, mask = with_eos(
        conversation.ids, conversation.mask, conversation.ends_with_answer, enc.eos_id
    )
    return ids.tolist(), mask.tolist()


def cli_env(hf_home: Path | None = None, env: dict | None = None, cwd: Path | None = None) -> dict:
    """A user's environment: offline, HF_HOME set, no hash seed inherited."""
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHONHASHSEED"))
    }
    environment["HF_HUB_OFFLINE"] = "1"
    environment["HF_HOME"] = str(hf_home) if hf_home else str(Path(cwd or REPO) / ".no-hf-home")
    environment.update(env or {})
    return environment


def run_cli(
    *args: str,
    hf_home: Path | None = None,
    env: dict | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    **run,
):
    """Run data/generate_fixed_sft.py in a fresh process, offline.

    As a user would.
    """
    return subprocess.run(
        [sys.executable, str(CLI), *args],
        capture_output=True,
        text=True,
        env=cli_env(hf_home, env, cwd),
        cwd=cwd or REPO,
        timeout=timeout,
        **run,
    )


def start_cli(
    *args: str, hf_home: Path | None = None, env: dict | None = None, **popen
) -> subprocess.Popen:
    """``run_cli`` without waiting: the process, its output piped."""
    return subprocess.Popen(
        [sys.executable, str(CLI), *args],
        env=cli_env(hf_home, env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def start_cli_ready(
    *args: str, hf_home: Path | None = None, env: dict | None = None, **popen
) -> subprocess.Popen:
    """``start_cli``, returning once the process says its stop handler is installed.

    From then on a SIGINT or SIGTERM ends it with exit 130, whenever it lands: tests signal a
    moment the process shows, never a guessed one. The line is read off its stderr.
    """
    process = start_cli(*args, hf_home=hf_home, env={**(env or {}), SAY_STARTED: "1"}, **popen)
    line = process.stderr.readline()
    if not line.startswith(f"started: pid {process.pid}; stop handler installed"):
        process.kill()
        _, rest = process.communicate()
        raise AssertionError(f"the command never said it started: {line + rest}")
    return process


def worker_processes(pid: int) -> tuple[list[int], list[int]]:
    """Build ``pid``'s workers' parents (its children running ``builders.encode.family``), and the
    processes they forked, and those forked in turn (the sampler's), all on the same command line.
    """
    parents = [c for c in _children(pid) if b"builders.encode.family" in _cmdline(c)]
    forked, generation = [], parents
    while generation:
        generation = [child for process in generation for child in _children(process)]
        forked.extend(generation)
    return parents, forked


def serving(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are running workers of the build's rows (not the sampler's)."""
    return [pid for pid in pids if _comm(pid) == b"sft-worker\n" and running(pid)]


def _comm(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            # the task, or the process, has ended
            continue
    return children


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def wait_for(predicate, timeout: float = 120.0) -> bool:
    """Whether ``predicate()`` came true (polled) before ``timeout`` seconds.

    The timeout only ends a test that hangs; what the test waits for is ``predicate``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def lay_out_build(
    hf_home: Path,
    rows: list[dict],
    *,
    name: str = "custom",
    seed: int = 3,
    row_tokens: int = 200,
    build_rows: int = 30,
    shards: int = 4,
    row_group_rows: int = 5,
    dataset_files: dict | None = None,
    tokenizer_files: dict | None = None,
    dataset_in_git: tuple[str, ...] = (),
) -> Path:
    """Lay out a dataset and tokenizer repo in ``hf_home``.

    Then write a manifest naming them. The dataset's files ``dataset_in_git`` are stored in git,
    the others in LFS.
    """
    dataset_files = dataset_files or parquet_shards(
        rows, shards=shards, row_group_rows=row_group_rows, message_type=MESSAGE_WITH_REASONING
    )
    tokenizer_files = tokenizer_files or {
        "tokenizer.json": tokenizer_json(),
        "chat_template.jinja": FIXTURE_TEMPLATE.read_bytes(),
    }
    dataset = put_snapshot(
        hf_home, f"someone/{name}-chat", "dataset", dataset_files, in_git=dataset_in_git
    )
    tokenizer = put_snapshot(hf_home, f"someone/{name}-tokenizer", "model", tokenizer_files)
    sha = ", ".join(f"{k}: {hashlib.sha256(v).hexdigest()}" for k, v in tokenizer_files.items())
    manifest = hf_home / f"{name}.yaml"
    manifest.write_text(f"""\
name: {name}
dataset: {{repo: someone/{name}-chat, revision: {dataset}, split: train}}
tokenizer:
  repo: someone/{name}-tokenizer
  revision: {tokenizer}
  sha256: {{{sha}}}
loss_mask: glm5
seed: {seed}
row_tokens: {row_tokens}
rows: {build_rows}
""")
    return manifest


# the readings dataset: where the contract's readings differ (ROWS.md, "Readings the recipe card
# leaves open"); its builds take about 60% of its stream, in any order
READINGS_ROW_TOKENS, READINGS_ROWS = 256, 40


def glm4_tokenizer_files(template: bytes) -> dict:
    """The fixture tokenizer with a post-processor: [gMASK]<sop> first.

    encode: add-special adds it.
    """
    return {
        "tokenizer.json": with_glm4_post_processor(tokenizer_json().decode()).encode(),
        "chat_template.jinja": template,
    }


def readings_rows() -> list[dict]:
    """Four copies of every hard case among 40 seeded conversations.

    Whatever the order, a build of 60% of the stream meets each case where the readings differ.
    """
    hard = [
        {"id": f"hard_{copy}_{i}", "source": "hard", "messages": m}
        for copy in range(4)
        for i, m in enumerate(hard_cases())
    ]
    return hard + [
        {"id": f"synthetic_{k}", "source": "synthetic", "messages": m}
        for k, m in enumerate(synthetic(9, 40))
    ]


def lay_out_readings(hf_home: Path) -> Path:
    """The readings dataset and the GLM-4-style tokenizer, laid out.

    They are laid out in ``hf_home``; returns its manifest.
    """
    return lay_out_build(
        hf_home,
        readings_rows(),
        name="readings",
        seed=42,
        row_tokens=READINGS_ROW_TOKENS,
        build_rows=READINGS_ROWS,
        shards=3,
        row_group_rows=16,
        tokenizer_files=glm4_tokenizer_files(FIXTURE_TEMPLATE.read_bytes()),
    )


def manifest_under(
    hf_home: Path, name: str, readings: dict, folder: Path, expect: str = ""
) -> Manifest:
    """Manifest ``name`` with a ``contract:`` selecting ``readings``.

    ``expect`` lines are added; it is written in ``folder``.
    """
    text = (hf_home / f"{name}.yaml").read_text()
    if readings:
        text += "contract:\n" + "".join(f"  {key}: {value}\n" for key, value in readings.items())
    path = folder / f"{name}.yaml"
    path.write_text(text + expect)
    return load_manifest(path)


def build_under(hf_home: Path, name: str, readings: dict, tmp_path: Path):
    """Build the laid-out manifest under ``readings``.

    Return the result and the manifest.
    """
    manifest = manifest_under(hf_home, name, readings, tmp_path)
    return build(
        manifest, tmp_path / "out", Hub(hf_home / "hub", offline=True), card=False
    ), manifest


def reference_under(hf_home: Path, manifest: Manifest, readings: dict, **more):
    """tests/reference.py's rows of a laid-out manifest under ``readings``.

    ``more`` goes to ``reference_rows`` (``left_out``, ``consumed``).
    """
    snapshots = hf_home / "hub"
    data = next(
        snapshots.glob(f"datasets--*{manifest.dataset.repo.split('/')[1]}/snapshots/*/data")
    )
    tok = next(snapshots.glob(f"models--*{manifest.tokenizer.repo.split('/')[1]}/snapshots/*"))
    return reference_rows(
        sorted(data.glob("train-*.parquet")),
        tok / "tokenizer.json",
        (tok / "chat_template.jinja").read_text(encoding="utf-8"),
        manifest.seed,
        manifest.row_tokens,
        manifest.rows,
        readings,
        **more,
    )


def reference_for(manifest: Manifest, hub: Hub, segments: list | None = None):
    """tests/reference.py's rows of a manifest whose inputs ``hub`` holds.

    Each row's segment starts are appended to ``segments``.
    """

    def snapshot(repo: str, repo_type: str, revision: str) -> Path:
        return hub.cache_dir / f"{repo_type}s--{repo.replace('/', '--')}" / "snapshots" / revision

    data = snapshot(manifest.dataset.repo, "dataset", manifest.dataset.revision) / "data"
    tok = snapshot(manifest.tokenizer.repo, "model", manifest.tokenizer.revision)
    return reference_rows(
        sorted(data.glob("train-*.parquet")),
        tok / "tokenizer.json",
        (tok / "chat_template.jinja").read_text(encoding="utf-8"),
        manifest.seed,
        manifest.row_tokens,
        manifest.rows,
        segments=segments,
    )


def file_rows(path: Path) -> list[tuple[list[int], list[int]]]:
    table = pq.read_table(path)
    return list(
        zip(
            table.column("input_ids").to_pylist(),
            table.column("loss_mask").to_pylist(),
            strict=True,
        )
    )


def write_random_rows(path: Path, rows: int, row_tokens: int = 16, seed: int = 0) -> Path:
    """A row file of random tokens, masks and segments, written by the builder's writer.

    Its row groups hold 64 rows each, the last one the rest.
    """
    import numpy as np

    from builders.rows.packing import Row
    from builders.rows.rowfile import RowWriter

    rng = np.random.default_rng(seed)
    with RowWriter(path) as writer:
        for k in range(rows):
            cuts = rng.choice(np.arange(1, row_tokens), size=int(rng.integers(0, 4)), replace=False)
            starts = [0, *sorted(int(c) for c in cuts)]
            writer.write(
                Row(
                    rng.integers(3, 1000, row_tokens, dtype=np.int32),
                    rng.integers(0, 2, row_tokens).astype(np.uint8),
                    [k * 10 + j for j in range(len(starts))],
                    [f"c{k}-{j}" for j in range(len(starts))],
                    starts,
                )
            )
    return path


def in_workers(tmp_path: Path, code: str) -> Path:
    """A folder whose ``sitecustomize.py`` runs ``code`` in each worker process, for PYTHONPATH.

    ``code`` runs as the interpreter starts, in a worker only (not in the build or other tools).
    """
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "if any('builders.encode.family' in a for a in sys.orig_argv):\n"
        + textwrap.indent(code, "    ")
    )
    return site
