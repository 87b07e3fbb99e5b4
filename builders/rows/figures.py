"""The figures that name a build, and their check against a manifest.

They are compared with the manifest's ``expect``. ``rows_sha256`` follows the row contract: per row,
its token ids as little-endian uint32 bytes, then its mask as uint8 bytes (the contract reading
``hash: u4-u1``; ``RowHash`` also computes the other layouts a builder might have hashed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from builders.errors import VerificationError
from builders.inputs.digest import file_digest
from builders.manifest import PINNED_FIGURES, Manifest, cli_command, parse_manifest
from builders.rows.rowfile import ROW_GROUP_ROWS, iter_row_batches, writer_version
from builders.rows.segments import SegmentHash, supervised_segment_starts


class RowHash:
    """SHA-256 of rows given in order, laid out as a ``hash`` reading says."""

    def __init__(self, layout: str = "u4-u1"):
        self.layout = layout
        self._sha = hashlib.sha256()
        # u4-all-u1-all: every mask after every row's ids
        self._masks: list[bytes] = []

    def add(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """Add a batch of rows (2-D arrays)."""
        rows = len(ids)
        if self.layout == "u4-u1":
            data = np.concatenate(
                [ids.astype("<u4").view(np.uint8).reshape(rows, -1), mask.astype(np.uint8)], axis=1
            )
        elif self.layout == "i8-i8":
            data = np.concatenate([ids.astype("<i8"), mask.astype("<i8")], axis=1)
        elif self.layout == "ids-u4":
            data = ids.astype("<u4")
        elif self.layout == "u4-all-u1-all":
            data = ids.astype("<u4")
            self._masks.append(mask.astype(np.uint8).tobytes())
        else:
            raise ValueError(f"unknown hash layout {self.layout!r}")
        self._sha.update(np.ascontiguousarray(data))

    def hexdigest(self) -> str:
        sha = self._sha.copy()
        for masks in self._masks:
            sha.update(masks)
        return sha.hexdigest()


class RowFigures:
    """Accumulates the row figures of rows given in order.

    ``rows_sha256`` is in the ``hash`` layout given. The segment figures (``segments_sha256``,
    ``supervised_segment_starts``) are None unless every batch came with its segment starts.
    """

    def __init__(self, row_tokens: int, hash_layout: str = "u4-u1"):
        self.row_tokens = row_tokens
        self.rows = 0
        self.supervised_tokens = 0
        self.trained_tokens = 0
        self.supervised_segment_starts: int | None = 0
        self._hash = RowHash(hash_layout)
        self._segments: SegmentHash | None = SegmentHash()

    def add(self, input_ids: np.ndarray, loss_mask: np.ndarray, segment_starts=None) -> None:
        """Add a batch of rows (2-D) or one row (1-D).

        ``segment_starts`` holds each row's ``segment_start``.
        """
        ids, mask = np.atleast_2d(input_ids), np.atleast_2d(loss_mask)
        self._hash.add(ids, mask)
        self.rows += len(ids)
        self.supervised_tokens += int(np.count_nonzero(mask == 1))
        self.trained_tokens += int(np.count_nonzero(mask[:, 1:] == 1))
        if segment_starts is None or self._segments is None:
            self._segments = self.supervised_segment_starts = None
        else:
            self._segments.add(segment_starts)
            self.supervised_segment_starts += supervised_segment_starts(mask, segment_starts)

    def _ratio(self, tokens: int) -> float:
        return tokens / (self.rows * self.row_tokens) if self.rows else 0.0

    def as_dict(self) -> dict:
        return {
            "rows": self.rows,
            "row_tokens": self.row_tokens,
            "rows_sha256": self._hash.hexdigest(),
            "supervised_token_ratio": self._ratio(self.supervised_tokens),
            # what a next-token loss trains: token 0 of a row has no token before it to be
            # predicted from
            "trained_token_ratio": self._ratio(self.trained_tokens),
            "padding_tokens": 0,
            # data/ROWS.md, "Segments"
            "segments_sha256": self._segments.hexdigest() if self._segments else None,
            "supervised_segment_starts": self.supervised_segment_starts,
        }


def file_figures(path: Path, row_tokens: int | None, hash_layout: str = "u4-u1") -> dict:
    """Re-read a row file and compute all its figures.

    ``row_tokens`` None: as long as the file's first rows are.
    """
    figures, row_groups = None, []
    for ids, mask, starts in iter_row_batches(path):
        if figures is None:
            row_tokens = row_tokens or ids.shape[1]
            figures = RowFigures(row_tokens, hash_layout)
        if ids.shape[1] != row_tokens:
            raise VerificationError(
                f"{path}: rows hold {ids.shape[1]} tokens, the manifest says {row_tokens}"
            )
        if ((mask != 0) & (mask != 1)).any():
            raise VerificationError(f"{path}: loss_mask holds values other than 0 and 1")
        figures.add(ids, mask, starts)
        row_groups.append(len(ids))
    figures = figures or RowFigures(row_tokens or 0, hash_layout)
    return {**figures.as_dict(), **file_hash(path), "row_group_rows": row_groups}


def file_hash(path: Path) -> dict:
    """A built file's ``parquet_sha256`` and ``parquet_bytes``."""
    sha256, size = file_digest(path)
    return {"parquet_sha256": sha256, "parquet_bytes": size}


@dataclass(frozen=True)
class Check:
    figure: str
    expected: object
    got: object
    status: str  # "ok", "differs" or "not pinned"


# the outcome of a build whose manifest pins no figure: the command line's and the card's words
NOTHING_PINNED = "built, nothing pinned to verify"
# a rows_sha256 that differs from the pin in at most this many of its 64 hex characters is near
# it: the pin is likely mistyped (the hashes of other rows share about 4 characters by chance)
NEAR_CHARACTERS = 16


def differing_characters(digest: str, pinned: str) -> int:
    """In how many places two hex digests differ."""
    return sum(a != b for a, b in zip(digest, pinned, strict=True))


def mistyped_pin(digest: str, pinned: str) -> str | None:
    """What to say of a pinned hash ``digest`` is near; None where it is not near."""
    differing = differing_characters(digest, pinned)
    if differing > NEAR_CHARACTERS:
        return None
    return (
        f"rows_sha256 {digest}, which differs from the pin in only {differing} of its 64 "
        "characters (the hashes of other rows share about 4): the pin is likely mistyped; copy "
        "it again from where it was published"
    )


@dataclass(frozen=True)
class Verification:
    """The figures of a file checked against a manifest.

    Each check, and what a reader should know.
    """

    checks: list[Check]
    notes: list[str]

    @property
    def verified(self) -> bool:
        """Every pinned figure matched.

        Figures that are not pinned do not count.
        """
        return not self.differing

    @property
    def differing(self) -> list[Check]:
        return [check for check in self.checks if check.status == "differs"]

    @property
    def nothing_pinned(self) -> bool:
        """The manifest's ``expect`` pins no figure.

        Only the row count was checked.
        """
        return all(check.status == "not pinned" for check in self.checks if check.figure != "rows")

    def summary(self) -> str:
        """One line naming each differing figure, or ``matches``."""
        return (
            "; ".join(f"{c.figure} expected {c.expected}, got {c.got}" for c in self.differing)
            or "matches"
        )


def verify(figures: dict, manifest: Manifest, built_from: dict | None = None) -> Verification:
    """Compare computed figures with the manifest's ``rows`` and ``expect``.

    ``built_from`` is the recipe (``Manifest.recipe``) the rows were built from, where it is known:
    a build's own, or the one the report beside a verified file records. The notes then say whether
    rows that differ come from other inputs (which) or, from the pinned inputs, from a reading.
    """
    expect = manifest.expect
    checks = [
        Check(
            "rows",
            manifest.rows,
            figures["rows"],
            "not pinned"
            if manifest.rows is None
            else "ok"
            if figures["rows"] == manifest.rows
            else "differs",
        )
    ]
    for name in PINNED_FIGURES:
        expected, got = getattr(expect, name), figures[name]
        if expected is None:
            checks.append(Check(name, None, got, "not pinned"))
        elif name == "supervised_token_ratio":
            checks.append(
                Check(
                    name,
                    float(expected.text),
                    round(got, expected.decimals),
                    "ok" if expected.matches(got) else "differs",
                )
            )
        else:
            checks.append(Check(name, expected, got, "ok" if expected == got else "differs"))
    return Verification(checks, _notes(checks, manifest, built_from, figures.get("row_group_rows")))


def report_beside(path: Path) -> Path:
    """The build report of a row file: ``NAME.report.json`` beside ``NAME[.unverified].parquet``."""
    name = path.name.removesuffix(".parquet").removesuffix(".unverified")
    return path.with_name(f"{name}.report.json")


def _report_of(path: Path) -> dict | None:
    """The build report beside a row file, read; None where there is none, or not one of ours."""
    try:
        document = json.loads(report_beside(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def recorded_recipe(path: Path, parquet_sha256: str) -> dict | None:
    """The recipe that the build report beside a row file records.

    None unless that report is of this very file.
    """
    try:
        document = _report_of(path)
        return (
            document["recipe"] if document["figures"]["parquet_sha256"] == parquet_sha256 else None
        )
    except (KeyError, TypeError):
        return None


def recorded_manifest(path: Path) -> Manifest | None:
    """The manifest that the build report beside a row file records, whole.

    None where there is no report, or it records no manifest text (older reports do not), or
    that text is not what the rows were built from (its recipe is not the report's). It is read as
    from its file, so relative paths in it resolve as they did; its ``path`` is that file where it
    still holds the same text, else None.
    """
    document = _report_of(path)
    text = document.get("manifest_text") if document else None
    if not isinstance(text, str):
        return None
    original = Path(document["manifest"]) if isinstance(document.get("manifest"), str) else None
    source = f"{report_beside(path)} (the manifest its build recorded)"
    manifest = parse_manifest(text, source=source, path=original)
    if manifest.recipe() != document.get("recipe"):
        return None
    try:
        same = original is not None and original.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        same = False
    return replace(manifest, path=original if same else None)


def verify_rows_sha256(figures: dict, rows_sha256: str) -> Verification:
    """Compare a file's figures with a ``rows_sha256`` alone (as a recipe card publishes it)."""
    checks = [
        Check(
            name,
            rows_sha256 if name == "rows_sha256" else None,
            figures[name],
            ("ok" if figures[name] == rows_sha256 else "differs")
            if name == "rows_sha256"
            else "not pinned",
        )
        for name in ("rows", *PINNED_FIGURES)
    ]
    notes = []
    if checks[1].status == "differs":
        notes.append(
            f"the rows are not the rows {rows_sha256} names (hashed as data/ROWS.md's default "
            "`hash: u4-u1` reading: token ids as little-endian uint32, then the mask as uint8, row "
            "by row): other rows, or a card whose build hashed them under another `hash` reading"
        )
    return Verification(checks, notes)


def _row_groups_note(row_groups: list[int] | None) -> str:
    """What a file's row groups say of its writer.

    Nothing where they are the ones fixed-sft's writer writes.
    """
    if row_groups is None or (
        all(rows == ROW_GROUP_ROWS for rows in row_groups[:-1])
        and all(rows <= ROW_GROUP_ROWS for rows in row_groups[-1:])
    ):
        return ""
    sizes = sorted(set(row_groups))
    return (
        f" Its {len(row_groups)} row groups hold {', '.join(map(str, sizes[:4]))}"
        f"{', ...' if len(sizes) > 4 else ''} rows, where fixed-sft's writer writes "
        f"{ROW_GROUP_ROWS}: the same rows, written otherwise."
    )


def _notes(
    checks: list[Check], manifest: Manifest, built_from: dict | None, row_groups=None
) -> list[str]:
    """What to make of a difference.

    The writer's version, rows that match in a file that does not, and for rows that differ, a
    mistyped pin, the inputs they were built from or the reading of the row contract.
    """
    expect, out = manifest.expect, []
    running = writer_version()
    if expect.writer is not None and expect.writer != running:
        out.append(
            f"the manifest's parquet_sha256 and parquet_bytes were made with {expect.writer}, this "
            f"is {running}: the file's bytes may differ while its rows (rows_sha256) are the same"
        )
    status = {check.figure: check.status for check in checks}
    explain = cli_command("explain", manifest)
    file_figures = [
        name for name in ("parquet_sha256", "parquet_bytes") if status.get(name) == "differs"
    ]
    if status.get("rows_sha256") == "ok" and file_figures:
        out.append(
            "the rows are exactly the pinned rows (rows_sha256 matches); only the file differs "
            f"({' and '.join(file_figures)}): its bytes, not its rows."
            + _row_groups_note(row_groups)
            + f" fixed-sft's writer (builders/rows/rowfile.py: zstd level 3, {ROW_GROUP_ROWS} "
            f"rows per row group) runs here with {running}; to find how the pinned file was "
            f"written, run `{explain} --writer`"
        )
    elif status.get("rows_sha256") == "differs":
        got = next(check.got for check in checks if check.figure == "rows_sha256")
        mistyped = mistyped_pin(got, expect.rows_sha256)
        out.append(
            f"these rows have {mistyped}"
            if mistyped
            else _rows_differ(manifest, built_from, explain)
        )
    if status.get("rows_sha256") == "ok" and status.get("segments_sha256") == "differs":
        out.append(
            "the tokens and masks are the pinned ones, but the rows' segments "
            "(metadata.segment_start, data/ROWS.md) are not: a file written without the builder's "
            "metadata, or with it changed"
        )
    return out


def _rows_differ(manifest: Manifest, built_from: dict | None, explain: str) -> str:
    """Why the rows may not be the pinned rows.

    Other inputs (named), or, from the pinned inputs, a reading.
    """
    build = cli_command("build", manifest)
    if built_from is None:
        return (
            "the rows are not the pinned rows, and what this file was built from is not known here "
            "(no build report of it beside it): rows built from other inputs than the manifest "
            f"pins differ for that reason alone. `{build}` builds from the pinned inputs, checked; "
            f"if its rows differ too, run `{explain}` to find which reading of the row contract "
            "(data/ROWS.md) makes the pinned rows"
        )
    pinned = manifest.recipe()
    other = [
        f"{key} {built_from.get(key)!r} (the manifest: {value!r})"
        for key, value in pinned.items()
        if built_from.get(key) != value
    ]
    if other:
        return (
            "the rows are not the pinned rows because they were built from something else than the "
            f"manifest pins: {'; '.join(other)}. Build from the pinned inputs: `{build}`"
        )
    return (
        "the rows are not the pinned rows, though they were built from exactly what the manifest "
        "pins (the inputs resolved at their commits and checked, the same seed, row length and "
        "contract): a reading of the row contract (data/ROWS.md) differs. To find which makes the "
        f"pinned rows, run `{explain}` with the same input options (it searches the readings the "
        "recipe card leaves open, nearest first)"
    )
