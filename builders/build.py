"""Build a manifest's rows end to end.

Pinned inputs → rows of its chat format → parquet → verified figures. Nothing is written before the
pinned inputs have been resolved and the tokenizer files checked; the source files' bytes are hashed
beside the build and checked before anything is put in place. Every output is written under a
temporary name in the output folder, and all are put in place together
(``builders.runtime.atomic``), the parquet last: at ``NAME.parquet`` when every pinned figure
matches, at ``NAME.unverified.parquet`` when one differs, so a file at the final path is always one
that verified. A build that fails leaves nothing of itself in the folder.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from builders.encode import engines
from builders.encode import pool as parallel
from builders.encode.encoder import ConversationEncoder, EncodedConversation
from builders.encode.spawn import worker_count
from builders.encode.stream import Stream
from builders.errors import BuildError, OutputError, PinnedInputError, SourceDataError
from builders.inputs.pinned import (
    FileHashes,
    Hub,
    PinnedTokenizer,
    hashed_files,
    names_tools,
    open_source,
    resolve,
    source_files,
    tokenizer_files_in,
)
from builders.inputs.source import Source
from builders.manifest import Manifest
from builders.rows.card import write_card
from builders.rows.figures import RowFigures, Verification, file_hash, verify
from builders.rows.order import kept_rows, permutation, permutation_sha256
from builders.rows.packing import Packer, Row
from builders.rows.rowfile import RowGroup, RowWriter
from builders.rows.stats import BuildStats
from builders.runtime import stopping
from builders.runtime.atomic import outputs, remove_stale_temporaries, spill_folder
from builders.runtime.progress import Reporter
from builders.runtime.timings import Timings
from builders.versions import toolchain


@dataclass(frozen=True)
class BuildResult:
    parquet: Path
    report: Path
    verification: Verification

    @property
    def verified(self) -> bool:
        return self.verification.verified


def build(
    manifest: Manifest,
    out_dir: Path,
    hub: Hub | None = None,
    reporter: Reporter | None = None,
    card: bool = True,
    workers: int | str = "auto",
    engine: str = "auto",
) -> BuildResult:
    """Build ``manifest`` into ``out_dir``: the parquet, its report, its card.

    The parquet, its JSON report and (with ``card``) its data card. ``workers`` processes decode,
    render and tokenize (1: this process; ``auto``: see ``spawn.worker_count``); ``engine`` encodes
    (``auto``: fastokens where it agrees with tokenizers, see ``builders.encode.engines``).
    The rows depend on neither. ``hub`` defaults to ``Hub()``, ``reporter`` to a silent one.
    """
    hub = Hub() if hub is None else hub
    reporter = Reporter.silent() if reporter is None else reporter
    requested, workers = str(workers), worker_count(workers, names_tools(manifest))
    timings = Timings()
    with (
        ExitStack() as after_the_workers,
        prepared(manifest, hub, reporter, workers, engine, timings) as inputs,
    ):
        source, encoding, stream = inputs.source, inputs.encoding, inputs.stream
        reference, source_hashes = inputs.reference, inputs.source_hashes
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(out_dir, manifest.name)
        except OSError as err:
            raise OutputError(
                f"{out_dir}: cannot write the build output here ({err.strerror or err})"
            ) from err
        # removed once the workers have ended and are reaped (as ``prepared`` ends), whatever
        # ends the build: none is still writing its held rows there
        stream.spill_into(after_the_workers.enter_context(spill_folder(out_dir, manifest.name)))
        with outputs(out_dir) as files:
            with files.writing(f"{manifest.name}.parquet") as parquet:
                with timings.stage("build_s"):
                    stats = build_stats(manifest, reference)
                    rows = packed(manifest, source, reference, stream, stats, manifest.rows)
                    figures = _write_rows(manifest, rows, parquet.temporary, stats, reporter)
                    _report_left_out(stream, stats, reporter)
                    # the engine each worker chose, and the last cross-checks, before anything is
                    # kept
                    chosen = encoding.settle()
                    encoding.finish()
                reporter.info(chosen.describe())
                with timings.stage("hash_s"):
                    computed = {**figures.as_dict(), **file_hash(parquet.temporary)}
                    hashed_sources = [
                        {**source.pins[f.dataset].where(), **hashed}
                        for f, hashed in zip(source.files, source_hashes.checked(), strict=True)
                    ]
            verification = verify(computed, manifest, built_from=manifest.recipe())
            parquet.final = (
                out_dir / f"{manifest.name}{'' if verification.verified else '.unverified'}.parquet"
            )
            document = _report(
                manifest,
                parquet.final,
                computed,
                verification,
                stats,
                (requested, workers),
                hashed_sources,
                chosen,
                stream,
                reference.format.describe(),
            )
            if card:
                reporter.info("writing the report and the data card (its plots)")
                with timings.stage("card_s"):
                    write_card(files, manifest, document, stats)
            document["timings"] = timings.as_dict()
            report = files.write(
                f"{manifest.name}.report.json",
                (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8"),
            )
            files.commit(last=parquet)
    return BuildResult(parquet.final, report.final, verification)


@dataclass(frozen=True)
class Prepared:
    """A manifest's inputs resolved and checked, and its stream planned.

    What a build and a plan share.
    """

    pinned: PinnedTokenizer
    source: Source
    # the source files' bytes, hashed beside the build
    source_hashes: FileHashes
    # the encoder of the contract's reference engine
    reference: ConversationEncoder
    encoding: parallel.Encoding
    # encoded with ``encoding``
    stream: Stream


@contextmanager
def prepared(
    manifest: Manifest,
    hub: Hub,
    reporter: Reporter,
    workers: int,
    engine: str,
    timings: Timings,
    whole_source: bool = False,
) -> Iterator[Prepared]:
    """Resolve and check the inputs, start the encoders, plan the stream.

    The stream reaches as far as the manifest's rows need, leaving out as many refused
    conversations as the manifest allows; with ``whole_source``, every conversation, leaving out
    any number. The workers and the hashing process end with the block.
    """
    reporter.info(
        f"reading the pinned inputs of {manifest.name}: "
        + ", ".join(pin.origin for pin in (manifest.tokenizer, *manifest.datasets))
    )
    needed_tokens = (
        None if whole_source or manifest.rows is None else manifest.rows * manifest.row_tokens
    )
    with ExitStack() as scope:
        with timings.stage("resolve_inputs_s"):
            # workers start while inputs open, and load what they encode with while the build
            # checks and plans (see builders.encode.pool)
            encoding = scope.enter_context(parallel.encoding(workers))
            snapshots = resolve(manifest, hub)
            encoding.load(
                snapshots.tokenizer / "tokenizer.json", manifest.tokenizer.sha256["tokenizer.json"]
            )
            # checked by sha256; parsed below, once the workers have all they need
            files = tokenizer_files_in(manifest, snapshots)
            try:
                source = open_source(manifest, snapshots)
                encoding.start(files, manifest.contract, engine, source)
                # every source file's bytes are hashed beside the build, and checked before
                # anything is put in place
                source_hashes = scope.enter_context(hashed_files(source_files(source)))
                order = _checked_order(manifest, source)
                leave_out = None if whole_source else manifest.leave_out_refused
                stream = Stream(source, order, needed_tokens, leave_out).encoded_with(encoding)
                # a pool's workers decode and encode it while this process parses the tokenizer
                # and checks the chat format
                stream.sample()
            except BuildError:
                # a tokenizer or template this process refuses is named first, as it was checked
                # first (before a worker's refusal of it, too)
                files.parsed()
                raise
            pinned = files.parsed()
            reporter.info(
                f"inputs resolved: {source.num_rows:,} source rows in {len(source.files)} files"
                + (
                    f" of {len(source.pins)} datasets, {len(order):,} kept"
                    if manifest.mixture
                    else ""
                )
                + " (their bytes are hashed and checked beside the build); preparing the "
                f"{manifest.loss_mask} chat format"
            )
            reference = ConversationEncoder(pinned.tokenizer, pinned.spec, manifest.contract)
            # in this process, the engine is chosen while the sample decodes; the plan waits for it
            encoding.begin(reference)
            reporter.info("sampling conversations to plan the stream")
            stream.plan(_sample_encoder(encoding, reference))

        reporter.detail(
            f"tokenizer snapshot {pinned.snapshot}; source files: "
            f"{', '.join(str(f.path) for f in source.files)}"
        )
        estimate = min(len(order), stream.stats.estimated_conversations)
        reporter.info(
            f"encoding {'all ' if needed_tokens is None else 'about '}{estimate:,} conversations "
            + ("(in this process)" if workers == 1 else f"({workers} worker processes)")
        )
        yield Prepared(pinned, source, source_hashes, reference, encoding, stream)


def _sample_encoder(
    encoding: parallel.Encoding, reference: ConversationEncoder
) -> ConversationEncoder:
    """What encodes the plan's sample in this process: the chosen engine, unguarded.

    Only the sample's lengths count, and the first batch waits for the choice anyway: fastokens
    encodes the sample for a fraction of the reference's CPU (about 0.5 s of a build's). With
    workers, they encode it, and ``reference`` is not used.
    """
    if encoding.decodes_groups:
        return reference
    return reference.with_engine(encoding.settle().engine.unguarded())


def check_source_rows(manifest: Manifest, source: Source) -> None:
    """Refuse a dataset whose row count is not the pinned one, or too small.

    Too small: it has fewer rows than the manifest takes from it.
    """
    for pin, rows in zip(manifest.datasets, source.dataset_rows, strict=True):
        if pin.rows is not None and pin.rows != rows:
            raise PinnedInputError(
                f"dataset {pin.origin} ({pin.pattern}): has {rows} rows, the "
                f"manifest pins rows: {pin.rows}"
            )
        if pin.take is not None and pin.take > rows:
            raise SourceDataError(
                f"dataset {pin.origin} ({pin.pattern}): take: {pin.take}, but it has {rows} rows"
            )


def stream_order(manifest: Manifest, source: Source, reading: str) -> tuple[np.ndarray, np.ndarray]:
    """The permutation ``P`` under an ``order`` reading, and the stream order.

    ``P`` is over the rows the datasets keep; the source indices in stream order are ``kept[P]``
    (the same as ``P`` where every row is kept).
    """
    kept = kept_rows(manifest.seed, source.dataset_rows, [pin.take for pin in manifest.datasets])
    order = permutation(manifest.seed, len(kept), reading)
    return order, kept[order]


def _checked_order(manifest: Manifest, source: Source) -> np.ndarray:
    check_source_rows(manifest, source)
    order, indices = stream_order(manifest, source, manifest.contract.order)
    pinned = None if manifest.mixture else manifest.dataset.permutation_sha256
    # the pinned sha256 is of the contract's own order; it says nothing of another reading's
    if (
        pinned is not None
        and manifest.contract.order == "numpy-generator"
        and permutation_sha256(order) != pinned
    ):
        raise PinnedInputError(
            f"permutation of {len(order)} rows with seed {manifest.seed}: sha256 is "
            f"{permutation_sha256(order)}, the manifest pins {pinned} "
            f"(numpy {np.__version__} gives another stream)"
        )
    return indices


def packed(
    manifest: Manifest,
    source: Source,
    encoder: ConversationEncoder,
    conversations: Iterable[list[EncodedConversation]],
    stats: BuildStats,
    limit: int | None,
) -> Iterator[Row]:
    """The stream's first ``limit`` rows, from runs of consecutive conversations.

    It counts what each conversation consumed (when a row is given, every conversation up to the
    one that completes it), and fails if the source has fewer rows. ``limit`` None: every full row;
    the remainder, a window the stream does not fill, is counted (``stats.remainder_tokens``), and
    a stream with no full row fails.
    """
    packer = Packer(manifest.row_tokens, encoder.eos_id, manifest.contract)
    rows = 0
    for run in conversations:
        # each part's place in the run
        placed = [k for k, c in enumerate(run) if not c.left_out]
        parts = packer.joined([run[k] for k in placed])
        consumed = stats.consumed(run, parts, source.dataset_of(parts.index))
        counted = 0
        for row, reached in packer.cut(parts):
            # up to the conversation that completes it
            reaches = placed[reached - 1] + 1
            stats.add(consumed, counted, reaches)
            counted = reaches
            stats.windows_skipped = packer.windows_skipped
            yield row
            rows += 1
            if rows == limit:
                return
        stats.add(consumed, counted)
    stats.windows_skipped = packer.windows_skipped
    if limit is None:
        stats.remainder_tokens = packer.filled
    if limit is not None or rows == 0:
        raise SourceDataError(
            f"the source ran out after {len(stats.sources)} conversations: "
            f"{rows} of {limit or 'at least 1'} rows of {manifest.row_tokens} tokens"
        )


def _write_rows(
    manifest: Manifest, rows: Iterable[Row], path: Path, stats: BuildStats, reporter: Reporter
) -> RowFigures:
    """Write ``rows`` to ``path``, computing their figures and counting them."""
    figures = RowFigures(manifest.row_tokens, manifest.contract.hash)
    with (
        RowWriter(path) as writer,
        reporter.progress("building rows", total=manifest.rows, unit="rows") as progress,
    ):
        for row in rows:
            stopping.check()
            # rows hashed and counted a row group at a time, as the writer stacks them
            _count_rows(writer.write(row), figures, stats)
            progress.update(1)
        _count_rows(writer.hand_over(), figures, stats)
    reporter.info(
        f"{figures.rows} rows from {len(stats.sources)} conversations ({stats.windows_skipped} "
        f"windows skipped: {manifest.row_tokens}-token stretches of the stream, cut as rows are, "
        "with no supervised token); conversations training only stop tokens (every answer empty): "
        f"{stats.only_stop_tokens}, nothing at all: {stats.unsupervised}"
    )
    return figures


def _count_rows(group: RowGroup | None, figures: RowFigures, stats: BuildStats) -> None:
    """Hash and count a row group's rows, if any."""
    if group is not None:
        figures.add(group.input_ids, group.loss_mask, group.segment_start)
        stats.add_rows(group.loss_mask)


def _report_left_out(stream: Stream, stats: BuildStats, reporter: Reporter) -> None:
    """Say what the rows left out: refused conversations, the remainder of ``rows: all``."""
    if stream.refused:
        first = stream.refused[0]
        reporter.info(
            f"{len(stream.refused)} refused conversations left out (leave_out_refused), each "
            f"listed in the report; the first: {first}"
        )
    if stats.remainder_tokens is not None:
        reporter.info(
            f"rows: all: the last {stats.remainder_tokens} tokens of the stream, less than a "
            "row, are dropped"
        )


def build_stats(manifest: Manifest, encoder: ConversationEncoder) -> BuildStats:
    """Empty counts of what the stream gives, by the manifest's datasets."""
    stop_ids = np.array(
        [encoder.vocab.token_id(t, encoder.format.name) for t in encoder.format.stop_tokens],
        np.int64,
    )
    names = [f"{pin.repo or pin.path} ({pin.pattern})" for pin in manifest.datasets]
    return BuildStats(
        manifest.row_tokens,
        names,
        stop_ids=stop_ids,
        tools_unread=[
            name for name, pin in zip(names, manifest.datasets, strict=True) if pin.tools_unused
        ],
    )


def _report(
    manifest: Manifest,
    final: Path,
    computed: dict,
    verification: Verification,
    stats: BuildStats,
    workers: tuple[str, int],
    source_files: list[dict],
    chosen: engines.Choice,
    stream: Stream,
    chat_format: dict,
) -> dict:
    """What the report records; the data card is made from it too.

    Its timings are added last.
    """
    return {
        "name": manifest.name,
        # absolute: the folder a manifest's relative paths resolve against
        "manifest": str(manifest.path.absolute()) if manifest.path else None,
        # read back by verify and inspect wherever the build's files are moved together
        "manifest_text": manifest.text,
        "parquet": final.name,
        "verified": verification.verified,
        "contract": manifest.contract.as_dict(),
        # what the rows were built from, checked against the manifest
        "recipe": manifest.recipe(),
        # the bounds on one conversation (they refuse, never change rows)
        "limits": manifest.limits.as_dict(),
        "chat_format": chat_format,
        "figures": computed,
        "checks": [asdict(check) for check in verification.checks],
        "notes": verification.notes,
        "source_files": source_files,
        "stats": stats.summary(),
        "source_reading": stream.stats.as_dict(),
        # refused conversations left out (leave_out_refused), in stream order
        "refused_left_out": [refused.as_dict() for refused in stream.refused],
        "versions": toolchain(),
        # the processes that encoded; what --workers asked, and the cores it could use:
        "workers": workers[1],
        "workers_requested": workers[0],
        "cores": len(os.sched_getaffinity(0)),
        "engine": {**chosen.as_dict(), "conversations_cross_checked": stats.cross_checked},
        "argv": sys.argv,
    }
