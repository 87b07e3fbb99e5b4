"""Build a manifest's rows end to end: pinned inputs → glm5 rows → parquet → verified figures.

Nothing is written before every pinned input has been resolved and checked. The parquet is
written under a temporary name in the output folder and renamed last, after its report and
data card: to ``NAME.parquet`` when every pinned figure matches, to ``NAME.unverified.parquet``
when one differs, so a file at the final path is always one that verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa

from builders.atomic import write_atomic
from builders.card import write_card
from builders.encode import ConversationEncoder, EncodedConversation
from builders.errors import OutputError, PinnedInputError, SourceDataError
from builders.figures import Check, RowFigures, all_match, check_notes, compare, file_hash
from builders.manifest import Manifest
from builders.packing import RowPacker
from builders.parallel import encode_batches
from builders.pinned import Hub, dataset_files, load_pinned_tokenizer
from builders.progress import Reporter
from builders.rowfile import RowWriter
from builders.source import ParquetSource
from builders.stats import BuildStats

READ_CHUNK = 65536  # source rows fetched per read; the real build needs ~50k conversations
ENCODE_BATCH = 256  # conversations rendered and tokenized together
LIBRARIES = ("numpy", "pyarrow", "tokenizers", "transformers", "huggingface_hub", "jinja2", "datasets", "PyYAML",
             "matplotlib")


@dataclass(frozen=True)
class BuildResult:
    parquet: Path
    report: Path
    verified: bool
    checks: list[Check]
    notes: list[str]


def permutation(seed: int, n: int) -> np.ndarray:
    """The row contract's order: ``numpy.random.default_rng(seed).permutation(n)``."""
    return np.random.default_rng(seed).permutation(n)


def permutation_sha256(order: np.ndarray) -> str:
    return hashlib.sha256(order.astype("<i8", copy=False).tobytes()).hexdigest()


def build(manifest: Manifest, out_dir: Path, hub: Hub = Hub(), reporter: Reporter = Reporter.silent(),
          card: bool = True, workers: int = 1) -> BuildResult:
    """Build ``manifest`` into ``out_dir``: the parquet, its JSON report and (with ``card``) its data card.

    ``workers`` processes render and tokenize (1: this process); the rows do not depend on it.
    """
    timings = {}
    started = time.perf_counter()
    pinned = load_pinned_tokenizer(manifest.tokenizer, hub)
    source = ParquetSource(dataset_files(manifest.dataset, hub))
    order = _checked_order(manifest, source)
    encoder = ConversationEncoder(pinned)  # fails on a tokenizer without the mask's tokens, before any output
    timings["resolve_inputs_s"] = time.perf_counter() - started
    reporter.info(f"inputs resolved and checked: {source.num_rows:,} source rows in {len(source.files)} files")
    reporter.detail(f"tokenizer snapshot {pinned.snapshot}; source files: {', '.join(map(str, source.files))}")

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(out_dir, manifest.name)
    except OSError as err:
        raise OutputError(f"{out_dir}: cannot prepare the output folder: {err.strerror or err}") from None
    temporary = out_dir / f".{manifest.name}.parquet.{os.getpid()}.tmp"
    try:
        started = time.perf_counter()
        stream = encode_batches(encoder, _batches(source, order), workers)
        try:
            figures, stats = _write_rows(manifest, stream, temporary, reporter)
        finally:
            stream.close()  # stops the workers as soon as the rows are there
        timings["build_s"] = time.perf_counter() - started
        started = time.perf_counter()
        computed = {**figures.as_dict(), **file_hash(temporary)}
        timings["hash_s"] = time.perf_counter() - started
        checks = compare(computed, manifest.expect, manifest.rows)
        verified = all_match(checks)
        notes = check_notes(checks, manifest.expect)
        final = out_dir / (f"{manifest.name}.parquet" if verified else f"{manifest.name}.unverified.parquet")
        versions = toolchain()
        if card:
            started = time.perf_counter()
            write_card(out_dir, manifest, computed, checks, verified, stats, versions)
            timings["card_s"] = time.perf_counter() - started
        report = out_dir / f"{manifest.name}.report.json"
        document = _report(manifest, final, computed, checks, verified, notes, stats, timings, versions, workers)
        write_atomic(report, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8"))
        os.replace(temporary, final)
    except OSError as err:
        raise OutputError(f"{out_dir}: cannot write the build output ({err.strerror or err}); nothing was "
                          f"left at the final path") from None
    finally:
        temporary.unlink(missing_ok=True)
    return BuildResult(final, report, verified, checks, notes)


def _remove_stale_temporaries(out_dir: Path, name: str) -> None:
    """Remove temporary files that builds of ``name`` killed before they could clean up left behind."""
    for path in list(out_dir.glob(f".{name}.parquet.*.tmp")) + list(out_dir.glob(f".{name}.report.json.*.tmp")):
        pid = path.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _checked_order(manifest: Manifest, source: ParquetSource) -> np.ndarray:
    pin = manifest.dataset
    if pin.rows is not None and pin.rows != source.num_rows:
        raise PinnedInputError(f"dataset {pin.repo}@{pin.revision}: the split has {source.num_rows} rows, "
                               f"the manifest pins dataset.rows {pin.rows}")
    order = permutation(manifest.seed, source.num_rows)
    if pin.permutation_sha256 is not None and permutation_sha256(order) != pin.permutation_sha256:
        raise PinnedInputError(f"permutation of {source.num_rows} rows with seed {manifest.seed}: sha256 is "
                               f"{permutation_sha256(order)}, the manifest pins {pin.permutation_sha256} "
                               f"(numpy {np.__version__} gives another stream)")
    return order


def _batches(source: ParquetSource, order: np.ndarray) -> Iterator[pa.Table]:
    """Source rows in permutation order, in batches (still Arrow data), read only as far as consumed."""
    for start in range(0, len(order), READ_CHUNK):
        yield from source.take_batches(order[start:start + READ_CHUNK], ENCODE_BATCH)


def _write_rows(manifest: Manifest, stream: Iterator[EncodedConversation], path: Path,
                reporter: Reporter) -> tuple[RowFigures, BuildStats]:
    packer = RowPacker(manifest.row_tokens)
    figures = RowFigures(manifest.row_tokens)
    stats = BuildStats(manifest.row_tokens)
    writer = RowWriter(path)
    try:
        with reporter.progress("building rows", total=manifest.rows, unit="rows") as progress:
            for conversation in stream:
                stats.add_conversation(conversation)
                for row in packer.add(conversation):
                    writer.write(row)
                    figures.add(row.input_ids, row.loss_mask)
                    stats.add_row(row)
                    progress.update(1)
                    if figures.rows == manifest.rows:
                        break
                if figures.rows == manifest.rows:
                    break
            else:
                raise SourceDataError(f"the source ran out after {len(stats.sources)} conversations: "
                                      f"{figures.rows} of {manifest.rows} rows of {manifest.row_tokens} tokens")
    finally:
        writer.close()
    stats.windows_skipped = packer.windows_skipped
    reporter.info(f"{figures.rows} rows from {len(stats.sources)} conversations "
                  f"({packer.windows_skipped} windows skipped)")
    return figures, stats


def _report(manifest, final, computed, checks, verified, notes, stats, timings, versions, workers) -> dict:
    return {
        "name": manifest.name,
        "manifest": str(manifest.path) if manifest.path else None,
        "parquet": final.name,
        "verified": verified,
        "figures": computed,
        "checks": [asdict(check) for check in checks],
        "notes": notes,
        "stats": stats.summary(),
        "timings": {key: round(value, 3) for key, value in timings.items()},
        "versions": versions,
        "workers": workers,
        "argv": sys.argv,
    }


def toolchain() -> dict:
    """Python's and the libraries' versions, as the report and the card record them."""
    return {"python": platform.python_version(), **{lib: _version(lib) for lib in LIBRARIES}}


def _version(library: str) -> str | None:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None
