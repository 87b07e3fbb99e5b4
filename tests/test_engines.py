"""Tokenizer engines: fastokens builds the rows tokenizers builds.

Its guard stops a build that differs.

Also tokenizers with an NFC normalizer (as Qwen2-family tokenizer.json files have), on
decomposed text, against the offset-based reference.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from builders.build import build
from builders.encode import engines
from builders.errors import EngineDisagreement
from builders.fixture.conversations import hard_cases, synthetic
from builders.fixture.make import FIXTURE_TEMPLATE, tokenizer_json
from builders.fixture.tokenizer import with_nfc_normalizer
from builders.inputs.pinned import Hub
from builders.manifest import load_manifest
from helpers import (
    MANIFESTS,
    SELF_CONTAINED,
    in_workers,
    lay_out_build,
    manifest_names,
    run_cli,
)
from reference import reference_rows

DECOMPOSED = [
    [
        {"role": "user", "content": "Cafe\u0301 or cafe\u0301?"},
        {"role": "assistant", "content": "e\u0301 is é."},
    ],
    [
        {"role": "user", "content": "\u0301 starts with a combining mark"},
        {"role": "assistant", "content": "\u0301\u0301 and so does this answer, n\u0303"},
    ],
    [
        {"role": "system", "content": "A\u030a\u0301 O\u0308"},
        {"role": "user", "content": "ﬁ ½ Ⅻ"},
        {"role": "assistant", "content": "<think>e\u0301\u0301</think>\nvoila\u0300"},
    ],
]


@pytest.mark.parametrize("name", manifest_names())
def test_fastokens_and_tokenizers_build_the_same_rows(built, hub, name, tmp_path):
    manifest = load_manifest(MANIFESTS / f"{name}.yaml")
    results = {
        engine: build(manifest, tmp_path / engine, hub, card=False, engine=engine)
        for engine in ("fastokens", "tokenizers")
    }
    for engine, result in results.items():
        assert result.verified, (engine, result.verification.summary())
        report = json.loads(result.report.read_text())["engine"]
        assert report["name"] == engine and report["version"]
    assert results["fastokens"].parquet.read_bytes() == results["tokenizers"].parquet.read_bytes()
    checked = json.loads(results["fastokens"].report.read_text())["engine"][
        "conversations_cross_checked"
    ]
    consumed = json.loads(results["fastokens"].report.read_text())["stats"][
        "conversations_consumed"
    ]
    assert 0 < checked < consumed


def test_a_normalizing_tokenizer_on_decomposed_text(tmp_path):
    """NFC composes "e\u0301" into "é".

    The pieces are measured as the tokenizer sees them.
    """
    rows = [
        {"id": f"nfc_{k}", "source": "nfc", "messages": m} for k, m in enumerate(DECOMPOSED * 4)
    ]
    rows += [
        {"id": f"synthetic_{k}", "source": "synthetic", "messages": m}
        for k, m in enumerate(synthetic(4, 30))
    ]
    files = {
        "tokenizer.json": with_nfc_normalizer(tokenizer_json().decode()).encode(),
        "chat_template.jinja": FIXTURE_TEMPLATE.read_bytes(),
    }
    manifest_path = lay_out_build(
        tmp_path / "hf", rows, name="nfc", row_tokens=128, build_rows=30, tokenizer_files=files
    )
    manifest = load_manifest(manifest_path)
    hub = Hub(tmp_path / "hf" / "hub", offline=True)
    snapshot = next((tmp_path / "hf" / "hub").glob("datasets--*/snapshots/*/data"))
    tokenizer = next((tmp_path / "hf" / "hub").glob("models--*/snapshots/*"))
    expected = reference_rows(
        sorted(snapshot.glob("*.parquet")),
        tokenizer / "tokenizer.json",
        FIXTURE_TEMPLATE.read_text(),
        manifest.seed,
        manifest.row_tokens,
        manifest.rows,
    )
    for engine in ("tokenizers", "fastokens"):
        result = build(manifest, tmp_path / engine, hub, card=False, engine=engine)
        table = pq.read_table(result.parquet)
        assert (
            list(
                zip(
                    table.column("input_ids").to_pylist(),
                    table.column("loss_mask").to_pylist(),
                    strict=True,
                )
            )
            == expected
        )


class _Wrong(engines.Engine):
    """A fast engine that gets one conversation's tokens wrong."""

    name, version = "wrong", "0"

    def __init__(self, reference, victim_text: str):
        self.reference, self.victim = reference, victim_text

    def encode(self, texts):
        ids = self.reference.encode(texts)
        return [
            np.append(i[:-1], i[-1] + 1) if t == self.victim else i
            for t, i in zip(texts, ids, strict=True)
        ]


def test_the_guard_stops_a_build_whose_fast_engine_differs(monkeypatch, hub, tmp_path):
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    real_choose = engines.choose

    def choose(requested, tokenizer, tokenizer_json_text, chat_template):
        reference = engines.TokenizersEngine(tokenizer)
        from builders.formats.render import ChatRenderer
        from builders.messages import normalize_messages

        # source row 0
        victim = ChatRenderer(chat_template).render(normalize_messages(hard_cases()[0]))
        return engines.Choice.of(
            engines.Guarded(_Wrong(reference, victim), reference), requested, None
        )

    monkeypatch.setattr(engines, "choose", choose)
    with pytest.raises(
        EngineDisagreement,
        match=r"source row 0: the wrong engine's tokens differ from tokenizers' "
        r".*--engine tokenizers",
    ):
        build(manifest, tmp_path / "out", hub, card=False)
    assert not (tmp_path / "out" / f"{SELF_CONTAINED}.parquet").exists()
    monkeypatch.setattr(engines, "choose", real_choose)


def test_probes_refuse_an_engine_that_differs():
    from tokenizers import Tokenizer

    reference = engines.TokenizersEngine(Tokenizer.from_str(tokenizer_json().decode()))
    probes = engines.probes(reference.tokenizer, FIXTURE_TEMPLATE.read_text())
    assert len(probes) > 100 and "<|user|>" in probes and any("東京" in p for p in probes)
    assert engines._disagreements(reference, reference, probes) == []
    wrong = _Wrong(reference, "  \n\n  \n")
    assert engines._disagreements(wrong, reference, probes) == ["  \n\n  \n"]


@pytest.mark.slow
def test_auto_falls_back_to_tokenizers_with_a_note(fixture_cache, tmp_path):
    """Where fastokens cannot load, auto encodes with tokenizers.

    Here it is not importable; the build says why.
    """
    out = tmp_path / "out"
    sitecustomize = tmp_path / "site"
    sitecustomize.mkdir()
    (sitecustomize / "fastokens.py").write_text(
        "raise ImportError('fastokens is unavailable here')\n"
    )
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        hf_home=fixture_cache,
        env={"PYTHONPATH": str(sitecustomize)},
    )
    assert done.returncode == 0, done.stderr
    assert "encoding with tokenizers" in done.stderr and "fastokens cannot load" in done.stderr
    report = json.loads((out / f"{SELF_CONTAINED}.report.json").read_text())["engine"]
    assert report["name"] == "tokenizers" and "fastokens is unavailable here" in report["note"]
    refused = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        "--engine",
        "fastokens",
        hf_home=fixture_cache,
        env={"PYTHONPATH": str(sitecustomize)},
    )
    assert refused.returncode == 2 and "--engine fastokens: fastokens cannot load" in refused.stderr


def _wrong_in_workers(tmp_path, after_probes: bool) -> dict:
    """Worker processes whose fast engine gives one token too many.

    An environment where it does so on every call, or only after its first (the probes, which the
    worker encodes in one call).
    """
    site = in_workers(
        tmp_path,
        "import numpy as np\n"
        "from builders.encode import engines\n"
        "real, calls = engines.FastokensEngine.encode, []\n"
        "def wrong(self, texts):\n"
        "    calls.append(1)\n"
        f"    honest = {after_probes} and len(calls) == 1\n"
        "    if honest:\n"
        "        return real(self, texts)\n"
        "    return [np.append(i, 0) for i in real(self, texts)]\n"
        "engines.FastokensEngine.encode = wrong\n",
    )
    return {"PYTHONPATH": str(site)}


def test_a_worker_whose_fast_engine_differs_stops_the_build(fixture_cache, tmp_path):
    """Each worker cross-checks its own samples before it sends a batch.

    A fast engine that passes the probes and then differs from tokenizers in the workers stops the
    build with exit 9, the worker's message intact.
    """
    out = tmp_path / "out"
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        "--workers",
        "2",
        "--engine",
        "fastokens",
        hf_home=fixture_cache,
        env=_wrong_in_workers(tmp_path, after_probes=True),
    )
    assert (
        done.returncode == 9
        and "the fastokens engine's tokens differ from tokenizers'" in done.stderr
    ), done.stderr
    assert not (out / f"{SELF_CONTAINED}.parquet").exists()


@pytest.mark.slow
def test_workers_choose_the_engine_by_its_probes(fixture_cache, built, tmp_path):
    """The workers run the probes.

    Where the fast engine differs on them, --engine fastokens is refused (exit 9) and auto builds
    the same rows with tokenizers, saying why.
    """
    env = _wrong_in_workers(tmp_path, after_probes=False)
    refused = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(tmp_path / "refused"),
        "--workers",
        "2",
        "--engine",
        "fastokens",
        hf_home=fixture_cache,
        env=env,
    )
    assert (
        refused.returncode == 9
        and "--engine fastokens: fastokens and tokenizers encode" in refused.stderr
        and "probe strings differently" in refused.stderr
    ), refused.stderr
    assert not (tmp_path / "refused").exists() or not list((tmp_path / "refused").iterdir())
    out = tmp_path / "auto"
    done = run_cli(
        "--build",
        SELF_CONTAINED,
        "--out",
        str(out),
        "--workers",
        "2",
        hf_home=fixture_cache,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "encoding with tokenizers" in done.stderr and "probe strings differently" in done.stderr
    report = json.loads((out / f"{SELF_CONTAINED}.report.json").read_text())
    assert report["engine"]["name"] == "tokenizers" and report["engine"]["requested"] == "auto"
    assert report["workers"] == 2
    assert (out / f"{SELF_CONTAINED}.parquet").read_bytes() == built(
        SELF_CONTAINED
    ).parquet.read_bytes()


def test_a_worker_encodes_its_sample_while_fastokens_loads_and_its_rows_with_fastokens(
    tmp_path, monkeypatch
):
    """A pool's workers encode the plan's sample with the reference while their engine is chosen.

    The stream's rows are kept decoded, and encoded when asked for with the engine chosen: the
    reference costs many times fastokens' CPU. Their choice (the probes, after fastokens has
    loaded in their parent) waits for a file the test makes once every row group of the pass is
    kept, just before the first rows are asked for (no worker has chosen then); a worker that
    encodes with the reference as it keeps a group, or after that file exists, leaves a mark.
    Every conversation is what this process encodes with the guarded engine from the start: the
    same tokens, masks and cross-checked samples.
    """
    from builders.build import prepared
    from builders.encode import stream
    from builders.fixture.make import synthetic_rows
    from builders.runtime.progress import Reporter
    from builders.runtime.timings import Timings

    gate, spill = tmp_path / "fastokens may load", tmp_path / "spill"
    spill.mkdir()
    site = in_workers(
        tmp_path,
        "import os, threading, time\n"
        "from builders.encode import engines, share\n"
        "def mark(why):\n"
        f"    open(os.path.join({str(tmp_path)!r}, why + '-%d' % os.getpid()), 'w')\n"
        "real = engines._disagreements\n"
        "def gated(*args):\n"
        "    # a worker that waits for its engine to keep a group would wait for ever\n"
        "    deadline = time.monotonic() + 120\n"
        f"    while not os.path.exists({str(gate)!r}):\n"
        "        if time.monotonic() > deadline:\n"
        "            mark('gate-never-opened')\n"
        "            break\n"
        "        time.sleep(0.01)\n"
        "    return real(*args)\n"
        "engines._disagreements = gated\n"
        "keeping, keep = [], share.Share.add\n"
        "def kept(self, *args):\n"
        "    keeping.append(1)\n"
        "    try:\n"
        "        return keep(self, *args)\n"
        "    finally:\n"
        "        keeping.pop()\n"
        "share.Share.add = kept\n"
        "reference = engines.TokenizersEngine.encode\n"
        "def marked(self, texts):\n"
        "    # the worker's own encoding (the cross-check and the probes have threads of theirs)\n"
        "    if threading.current_thread() is threading.main_thread() and (\n"
        f"        keeping or os.path.exists({str(gate)!r})\n"
        "    ):\n"
        "        mark('late')\n"
        "    return reference(self, texts)\n"
        "engines.TokenizersEngine.encode = marked\n",
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setattr(stream, "ENCODE_BATCH", 16)
    rows = synthetic_rows(seed=3, count=200)
    # seed 11: conversations to cross-check (source indices that are multiples of 64)
    manifest = load_manifest(lay_out_build(tmp_path / "hf", rows, seed=11, row_group_rows=10))
    hub = Hub(tmp_path / "hf" / "hub", offline=True)

    def encoded(workers: int, after_the_plan=None) -> tuple[list, str]:
        with prepared(
            manifest, hub, Reporter.silent(), workers, "auto", Timings(), whole_source=True
        ) as inputs:
            inputs.stream.spill_into(spill)
            if after_the_plan is not None:
                after_the_plan(inputs.encoding)
            out = [c for run in inputs.stream for c in run]
            return out, inputs.encoding.settle().name

    def none_chose_yet(pool):
        asked = pool.ask

        def ask(positions, groups, encoded):
            if not gate.exists():
                # every row group kept, none chosen: fastokens may load now
                pool.wait_all(encoded)
                assert [(w.started, w.choice) for w in pool.workers] == [(True, None)] * 2
                gate.touch()
            asked(positions, groups, encoded)

        pool.ask = ask

    here, here_engine = encoded(1)
    there, there_engine = encoded(2, none_chose_yet)
    assert here_engine == there_engine == "fastokens"
    assert not list(tmp_path.glob("late-*")) + list(tmp_path.glob("gate-never-opened-*"))
    assert len(there) == len(here) == len(rows)
    assert [c.cross_checked for c in there] == [c.cross_checked for c in here]
    assert sum(c.cross_checked for c in here) >= 1
    for mine, theirs in zip(here, there, strict=True):
        assert theirs.index == mine.index
        assert np.array_equal(mine.ids, theirs.ids) and np.array_equal(mine.mask, theirs.mask)


def test_this_process_chooses_its_engine_once_its_encoder_is_made(monkeypatch, hub, tmp_path):
    """The choice's probes encode with the tokenizer the encoder sets up.

    A tokenizer cannot be set up while another thread encodes with it, so the choice in this
    process starts only once the build's encoder is made.
    """
    from builders.encode import encoder as encoder_module

    made, real_choose, order = encoder_module.ConversationEncoder.__init__, engines.choose, []

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        order.append("encoder")

    def choose(*args):
        order.append("choice")
        return real_choose(*args)

    monkeypatch.setattr(encoder_module.ConversationEncoder, "__init__", init)
    monkeypatch.setattr(engines, "choose", choose)
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    result = build(manifest, tmp_path / "out", hub, card=False, workers=1)
    assert result.verified and order == ["encoder", "choice"]


def test_this_process_plans_with_the_chosen_engine_unguarded(monkeypatch, hub, tmp_path):
    """The plan's sample is encoded by fastokens, not the reference, with the same estimate.

    Only the sample's lengths count; the estimate is the one the reference's lengths give.
    """
    from builders.encode.stream import Stream

    real_plan, planned = Stream.plan, []

    def plan(self, encoder):
        real_plan(self, encoder)
        planned.append((type(encoder.engine), self.stats.estimated_conversations))

    monkeypatch.setattr(Stream, "plan", plan)
    manifest = load_manifest(MANIFESTS / f"{SELF_CONTAINED}.yaml")
    for engine in ("fastokens", "tokenizers"):
        build(manifest, tmp_path / engine, hub, card=False, workers=1, engine=engine)
    (fast, fast_estimate), (reference, reference_estimate) = planned
    assert fast is engines.FastokensEngine and reference is engines.TokenizersEngine
    assert fast_estimate == reference_estimate
