"""The rows through the real miles code (bench/real_miles.py).

It runs where a miles checkout is at hand: it is skipped unless MILES_SRC points to a miles checkout
at the recipe's commit 78527b91 (miles is not on PyPI, so CI never runs this). MILES_PYTHON names
the interpreter of an environment with miles' dependencies (default: this one). Run it with:

    MILES_SRC=/path/to/miles MILES_PYTHON=/path/to/miles-env/bin/python \\
        python -m pytest tests/test_real_miles.py
"""

import os
import subprocess
import sys

import pytest

from helpers import REPO, manifest_names

pytestmark = pytest.mark.skipif(
    not os.environ.get("MILES_SRC"),
    reason="needs MILES_SRC, a miles checkout (not on PyPI; never in CI)",
)


def run_check(*args: str) -> subprocess.CompletedProcess:
    python = os.environ.get("MILES_PYTHON", sys.executable)
    return subprocess.run(
        [python, str(REPO / "bench" / "real_miles.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
    )


@pytest.mark.parametrize("name", manifest_names())
def test_miles_trains_exactly_the_reference_loss(built, name):
    done = run_check(str(built(name).parquet))
    assert done.returncode == 0, done.stdout + done.stderr
    assert " NO" not in done.stdout and "micro-batches equal the reference" in done.stdout


def test_the_check_catches_a_response_from_token_0(built):
    done = run_check(str(built(manifest_names()[0]).parquet), "--response-from-token-0")
    assert done.returncode == 1 and "crashed" in done.stdout, done.stdout + done.stderr


def test_miles_trains_a_prompt_files_order(built):
    done = run_check(str(built(manifest_names()[0]).parquet), "--prompt-seed", "42")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " NO" not in done.stdout and "micro-batches equal the reference" in done.stdout
