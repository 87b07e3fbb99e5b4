"""Same inputs, same bytes.

Across processes, hash seeds, thread counts and fixture generation.
"""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from builders.fixture.make import make_fixture_cache, shared_dir
from builders.manifest import load_manifest
from builders.rows.order import permutation, permutation_sha256
from helpers import MANIFESTS, SELF_CONTAINED, run_cli


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers, env",
    [
        ("1", {"PYTHONHASHSEED": "0", "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}),
        (
            "2",
            {
                "PYTHONHASHSEED": "12345",
                "RAYON_NUM_THREADS": "2",
                "OMP_NUM_THREADS": "2",
                "LC_ALL": "C",
            },
        ),
        (
            "3",
            {
                "LC_ALL": "C.UTF-8",
                "LANG": "C.UTF-8",
                "TOKENIZERS_PARALLELISM": "true",
                "OMP_NUM_THREADS": "1",
            },
        ),
    ],
)
def test_build_bytes_do_not_depend_on_the_process(workers, env, fixture_cache, built, tmp_path):
    """The session's build ran in-process with one worker.

    These run as users do, with 1 to 3 workers.
    """
    reference = built(SELF_CONTAINED).parquet.read_bytes()
    out = tmp_path / "out"
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        "--workers",
        workers,
        hf_home=fixture_cache,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert (out / f"{SELF_CONTAINED}.parquet").read_bytes() == reference
    # workers encode the plan's sample with tokenizers while fastokens loads: the same count
    engine = json.loads((out / f"{SELF_CONTAINED}.report.json").read_text())["engine"]
    in_process = json.loads(built(SELF_CONTAINED).report.read_text())["engine"]
    assert engine["name"] == in_process["name"] == "fastokens"
    assert engine["conversations_cross_checked"] == in_process["conversations_cross_checked"] > 0


def test_fixture_cache_is_the_same_in_another_process(tmp_path):
    """The manifests pin the fixture repos' commits.

    A fresh process with another hash seed lays out exactly those (tokenizer training included).
    """
    code = (
        "import sys; from pathlib import Path; "
        "from builders.fixture.make import make_fixture_cache, shared_dir;"
        "print(sorted(make_fixture_cache(Path(sys.argv[1]), shared_dir()).items()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "a")],
        capture_output=True,
        text=True,
        env={
            "PYTHONHASHSEED": "987",
            "PATH": "/usr/bin:/bin",
            **{k: v for k, v in os.environ.items() if k == "FIXED_SFT_SHARED"},
        },
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    here = sorted(make_fixture_cache(tmp_path / "b", shared_dir()).items())
    assert done.stdout.strip() == str(here)
    for path in MANIFESTS.glob("fixture-*.yaml"):
        m = load_manifest(path)
        for repo, revision in (
            (m.dataset.repo, m.dataset.revision),
            (m.tokenizer.repo, m.tokenizer.revision),
        ):
            if repo in dict(here):
                assert dict(here)[repo] == revision, f"{path.name}: {repo}"


def test_permutation_is_datasets_shuffle_order():
    import datasets

    n = 1000
    shuffled = datasets.Dataset.from_dict({"i": list(range(n))}).shuffle(seed=42)["i"]
    assert permutation(42, n).tolist() == list(shuffled)


def test_tulu_permutation_facts_from_the_spec():
    """ROWS.md's permutation: seed 42 over 939,343 rows.

    It starts [741378, 724234, 107024, 213324, 885092, ...].
    """
    order = permutation(42, 939343)
    assert order[:5].tolist() == [741378, 724234, 107024, 213324, 885092]
    assert order.dtype == np.int64
    real = load_manifest(MANIFESTS / "glm47flash-tulu3-fixed8192-v1.yaml")
    assert permutation_sha256(order) == real.dataset.permutation_sha256
    assert (
        hashlib.sha256(order.astype("<i8").tobytes()).hexdigest()
        == "64d16f4fc4f567adbbffa38982db84f0e659576820d939f40d7b2aae58ed3599"
    )
