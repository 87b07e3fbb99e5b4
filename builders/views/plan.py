"""``plan``: what a build of a manifest will give, streamed as the build streams, nothing written.

The plan runs the build's own pipeline (``builders.build.prepared`` and ``packed``): the same
pinned inputs and checks, the same stream, order and refusals. It counts the rows instead of
writing them: conversations, tokens, the supervised ratio, ``rows_sha256`` against the pin, and
how many rows the source can give. ``--all`` reads every source row, leaving out and listing
every refused conversation, where a build stops at the first (or past ``leave_out_refused``).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from builders.build import build_stats, packed, prepared
from builders.encode.spawn import worker_count
from builders.errors import SourceDataError
from builders.inputs.pinned import Hub, names_tools
from builders.manifest import Manifest
from builders.rows.figures import RowFigures
from builders.runtime import stopping
from builders.runtime.progress import Reporter
from builders.runtime.timings import Timings


@dataclass
class Plan:
    name: str
    # the rows the manifest asks for (None: all)
    rows_wanted: int | None
    row_tokens: int
    # the source rows in the stream's order (what a mixture keeps)
    source_conversations: int
    # what the build's rows take: rows, conversations, tokens, figures
    rows: int = 0
    conversations: int = 0
    stream_tokens: int = 0
    windows_skipped: int = 0
    supervised_token_ratio: float = 0.0
    rows_sha256: str | None = None
    # the manifest's expect.rows_sha256, where it pins one
    pinned_rows_sha256: str | None = None
    # refused conversations met (source_index, id, reason), in stream order
    refused: list[dict] = field(default_factory=list)
    # of them, those before the build's rows are complete
    refused_by_the_build: int = 0
    # every source row was read (--all)
    read_all: bool = False
    # rows the whole source gives: counted with --all, else estimated from what was read
    source_rows: int = 0
    # why the build would fail, or None
    stops: str | None = None

    @property
    def ok(self) -> bool:
        return self.stops is None

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def plan(
    manifest: Manifest,
    hub: Hub,
    reporter: Reporter,
    everything: bool = False,
    workers: int | str = "auto",
    engine: str = "auto",
) -> Plan:
    """Stream ``manifest`` as its build would, counting instead of writing.

    With ``everything``, to the end of the source, refused conversations left out and listed.
    """
    workers = worker_count(workers, names_tools(manifest))
    timings = Timings()
    with (
        # removed once the workers have ended and are reaped (as ``prepared`` ends): none is
        # still writing its held rows there, even after the stop the plan reports
        tempfile.TemporaryDirectory(prefix="fixed-sft-spill-") as spill,
        prepared(
            manifest, hub, reporter, workers, engine, timings, whole_source=everything
        ) as inputs,
    ):
        stream = inputs.stream
        stream.spill_into(Path(spill))
        result = Plan(manifest.name, manifest.rows, manifest.row_tokens, len(stream.order))
        result.pinned_rows_sha256 = manifest.expect.rows_sha256
        stats = build_stats(manifest, inputs.reference)
        figures = RowFigures(manifest.row_tokens, manifest.contract.hash)
        rows = packed(
            manifest,
            inputs.source,
            inputs.reference,
            stream,
            stats,
            None if everything else manifest.rows,
        )
        total = 0
        try:
            wanted = None if everything else manifest.rows
            with reporter.progress("planning rows", total=wanted, unit="rows") as bar:
                for row in rows:
                    stopping.check()
                    total += 1
                    bar.update(1)
                    if manifest.rows is None or total <= manifest.rows:
                        figures.add(row.input_ids, row.loss_mask, [row.segment_start])
                        _take_stock(result, stats, len(stream.refused))
        except SourceDataError as err:
            result.stops = str(err)
        # the engine each worker chose, and its last cross-checks
        inputs.encoding.settle()
        inputs.encoding.finish()
        # the same checks as a build: the source files' bytes against their pins
        inputs.source_hashes.checked()
    counted = figures.as_dict()
    result.rows, result.rows_sha256 = counted["rows"], counted["rows_sha256"]
    result.supervised_token_ratio = counted["supervised_token_ratio"]
    result.refused = [refused.as_dict() for refused in stream.refused]
    result.read_all = everything
    result.source_rows = total if everything else _estimate(result, total, stats)
    if result.stops is None and manifest.rows is not None and total < manifest.rows:
        result.stops = (
            f"the source gives {total:,} rows of {manifest.row_tokens:,} tokens, fewer than "
            f"rows: {manifest.rows:,}"
        )
    if result.stops is None and result.refused_by_the_build > manifest.leave_out_refused:
        result.stops = (
            f"{result.refused_by_the_build} refused conversations before the rows are complete, "
            f"more than leave_out_refused: {manifest.leave_out_refused}"
        )
    return result


def _take_stock(result: Plan, stats, refused: int) -> None:
    """Record what the build has consumed when it has made the rows so far."""
    result.conversations = len(stats.conversation_tokens)
    result.stream_tokens = int(sum(stats.conversation_tokens))
    result.windows_skipped = stats.windows_skipped
    result.refused_by_the_build = refused


def _estimate(result: Plan, rows: int, stats) -> int:
    """The rows the whole source would give, at the rate of the conversations read."""
    consumed = len(stats.conversation_tokens) + len(result.refused)
    if consumed == 0:
        return 0
    return int(rows * result.source_conversations / consumed)


def describe(result: Plan) -> list[str]:
    """The plan as lines for the terminal."""
    wanted = "all" if result.rows_wanted is None else f"{result.rows_wanted:,}"
    lines = [
        f"plan of {result.name} (nothing written):",
        f"  rows: {result.rows:,} of {result.row_tokens:,} tokens (the manifest asks for {wanted})",
        f"  conversations: {result.conversations:,} of the {result.source_conversations:,} in "
        f"the stream's order, {result.stream_tokens:,} tokens with their EOS",
        f"  supervised token ratio: {result.supervised_token_ratio:.4f}",
        f"  windows skipped (no supervised token): {result.windows_skipped:,}",
    ]
    if result.rows_sha256 is not None and result.rows:
        match = (
            ""
            if result.pinned_rows_sha256 is None
            else " (the pinned one)"
            if result.rows_sha256 == result.pinned_rows_sha256
            else f" (the manifest pins {result.pinned_rows_sha256})"
        )
        lines.append(f"  rows_sha256: {result.rows_sha256}{match}")
    lines.append(
        f"  refused conversations: {len(result.refused):,}"
        + ("" if result.read_all else " met so far (--all reads every source row)")
    )
    lines += [
        f"    source row {r['source_index']} (id {r['id']!r}): {r['reason']}"
        for r in result.refused
    ]
    lines.append(
        f"  the source gives {result.source_rows:,} rows"
        if result.read_all
        else f"  the source gives about {result.source_rows:,} rows (at the rate so far; --all "
        "counts them)"
    )
    lines.append(
        "the build will make its rows"
        if result.ok
        else f"the build will stop (exit {SourceDataError.exit_code}): {result.stops}"
    )
    return lines
