"""explain: which readings of the row contract reproduce a manifest's pinned figures.

ROWS.md names the choices the recipe card leaves open (``builders.contract``). A build whose
``rows_sha256`` differs from the published one was made under some other reading; ``explain``
searches them, from the default outward (single deviations, then pairs, then the rest), and
names the readings that reproduce the pinned ``rows_sha256``, or, when none does, those whose
``supervised_token_ratio`` matches at the precision the manifest gives.

The search is cheap enough for the real recipe: every conversation is rendered and tokenized
once for the whole search (cached by source index, across orders), with what every mask rule
needs; a reading's stream is assembled from the cache, its mask by a table of token classes;
the four ``hash`` layouts of a row stream are computed in one pass over its rows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from builders import glm5
from builders.contract import KEYS, READINGS, SLIME_RULES, Contract
from builders.encode import Annotated, ConversationEncoder
from builders.errors import PinnedInputError, UsageError
from builders.figures import RowHash
from builders.manifest import Manifest
from builders.order import permutation, permutation_sha256, torch_available
from builders.source import ParquetSource

ROW_KEYS = tuple(key for key in KEYS if key != "hash")  # the readings that change the rows; hash only names them
HASHES = (READINGS["hash"][0], *READINGS["hash"][1])
STRUCTURE_ONLY = ("prefill", "stop", "final")  # do not apply under the slime rules
ENCODE_BATCH = 256
MARGIN = 1.3  # conversations cached past the estimate of what a reading consumes


@dataclass
class Outcome:
    """A reading's figures: its rows' hash in every layout, and their supervised-token ratio."""

    contract: Contract  # with the default hash
    hashes: dict[str, str]
    ratio: float


@dataclass
class Explanation:
    matches: list[Contract] = field(default_factory=list)
    ratio_matches: list[tuple[Contract, float]] = field(default_factory=list)  # closest first
    tried: int = 0  # full contracts (rows × hash layouts) compared
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"matches": [{"contract": c.as_dict(), "deviations": c.deviations()} for c in self.matches],
                "ratio_matches": [{"contract": c.as_dict(), "deviations": c.deviations(), "supervised_token_ratio": r}
                                  for c, r in self.ratio_matches],
                "tried": self.tried, "notes": self.notes}


def row_readings(orders: list[str], encodes: list[str]) -> list[Contract]:
    """Every reading that changes the rows, from the default outward (by number of deviations)."""
    choices = [orders if key == "order" else encodes if key == "encode" else
               [READINGS[key][0], *READINGS[key][1]] for key in ROW_KEYS]
    readings = []
    for values in itertools.product(*choices):
        contract = Contract(**dict(zip(ROW_KEYS, values)))
        if not contract.structure_rule and any(getattr(contract, key) != READINGS[key][0] for key in STRUCTURE_ONLY):
            continue  # the same rows as the slime rule's own reading
        readings.append(contract)
    return sorted(readings, key=lambda c: len(c.deviations()))  # stable: the table's order within each count


class Search:
    """The readings of one manifest, evaluated against its pinned figures."""

    def __init__(self, manifest: Manifest, source: ParquetSource, encoder: ConversationEncoder, reporter):
        self.manifest, self.source, self.encoder, self.reporter = manifest, source, encoder, reporter
        self.cache: dict[int, Annotated] = {}
        self.orders: dict[str, np.ndarray] = {}
        self.notes: list[str] = []
        self._mean_tokens: float | None = None

    def run(self, stop_at_first: bool = True) -> Explanation:
        expect = self.manifest.expect
        if expect.rows_sha256 is None and expect.supervised_token_ratio is None:
            raise UsageError(f"explain: {self.manifest.name} pins neither rows_sha256 nor supervised_token_ratio: "
                             f"nothing to explain")
        found = Explanation(notes=self.notes)
        readings = row_readings(self._orders(), self._encodes())
        with self.reporter.progress("readings tried", total=len(readings), unit="readings") as progress:
            for contract in readings:
                outcome = self.evaluate(contract)
                found.tried += len(HASHES)
                progress.update(1)
                for layout, digest in outcome.hashes.items():
                    if digest == expect.rows_sha256:
                        found.matches.append(Contract(**{**contract.as_dict(), "hash": layout}))
                if expect.supervised_token_ratio is not None and expect.supervised_token_ratio.matches(outcome.ratio):
                    found.ratio_matches.append((contract, outcome.ratio))
                if found.matches and stop_at_first:
                    break
        if expect.supervised_token_ratio is not None:
            target = float(expect.supervised_token_ratio.text)
            found.ratio_matches.sort(key=lambda item: (abs(item[1] - target), len(item[0].deviations())))
        return found

    def evaluate(self, contract: Contract) -> Outcome:
        """The rows of ``contract`` (any hash): their hash in every layout and their ratio."""
        order = self.orders[contract.order]
        needed = self.manifest.rows * self.manifest.row_tokens
        count = self._estimate(needed)
        while True:
            rows = self._rows(contract, order, count)
            if rows is not None or count >= len(order):
                break
            count = min(len(order), 2 * count)
        if rows is None:
            raise PinnedInputError(f"explain: under {contract.deviations() or 'the default reading'} the source runs "
                                   f"out before {self.manifest.rows} rows")
        ids, mask = rows
        hashes = {}
        for layout in HASHES:
            digest = RowHash(layout)
            digest.add(ids, mask)
            hashes[layout] = digest.hexdigest()
        return Outcome(contract, hashes, float(np.count_nonzero(mask)) / mask.size)

    def _rows(self, contract: Contract, order: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The first ``manifest.rows`` rows of the stream of ``order[:count]``, or None if too few."""
        parts_ids, parts_mask = [], []
        eos = np.array([self.encoder.eos_id], dtype=np.int32)
        for record in self._annotated(order[:count]):
            materialized = self.encoder.materialize(record, contract)
            if materialized is None:
                continue
            ids, mask, ends_with_answer = materialized
            parts_ids.append(ids)
            parts_mask.append(mask)
            value = contract.eos_mask(ends_with_answer)
            if value is not None:
                parts_ids.append(eos)
                parts_mask.append(_ONE if value else _ZERO)
        ids, mask = np.concatenate(parts_ids), np.concatenate(parts_mask)
        width = self.manifest.row_tokens
        windows = len(ids) // width
        ids, mask = ids[:windows * width].reshape(windows, width), mask[:windows * width].reshape(windows, width)
        if contract.skip != "keep-all":
            kept = mask.any(axis=1)
            ids, mask = ids[kept], mask[kept]
        if len(ids) < self.manifest.rows:
            return None
        return ids[:self.manifest.rows], mask[:self.manifest.rows]

    def _annotated(self, indices: np.ndarray) -> list[Annotated]:
        """The cached records of ``indices``, encoding (once) those not yet seen."""
        missing = np.array(sorted(set(indices.tolist()) - self.cache.keys()), dtype=np.int64)
        if missing.size:
            groups = self.source.group_of(missing)
            for group in np.unique(groups).tolist():
                rows = self.source.read(group, missing[groups == group]).to_pylist()
                for first in range(0, len(rows), ENCODE_BATCH):
                    batch = rows[first:first + ENCODE_BATCH]
                    for row, record in zip(batch, self.encoder.annotate(batch, SLIME_RULES)):
                        # the mask needs only the token classes: the rest of the placement is not kept
                        self.cache[row["index"]] = Annotated(record.ids, glm5.Placement(record.placement.classes,
                                                                                        None),
                                                             record.ends_with_answer, slime=record.slime)
        return [self.cache[i] for i in indices.tolist()]

    def _estimate(self, needed_tokens: int) -> int:
        """Conversations to take first: the estimate from the mean length seen so far, with a margin."""
        if self._mean_tokens is None:
            order = next(iter(self.orders.values()))
            sample = self._annotated(order[:min(len(order), 4 * ENCODE_BATCH)])
            self._mean_tokens = max(1.0, sum(len(r.ids) + 1 for r in sample) / max(1, len(sample)))
        return math.ceil(MARGIN * needed_tokens / self._mean_tokens) + ENCODE_BATCH

    def _orders(self) -> list[str]:
        names = [READINGS["order"][0], *READINGS["order"][1]]
        if not torch_available():
            names.remove("torch")
            self.notes.append("order: torch was not tried: torch is not installed here")
        n, pin = self.source.num_rows, self.manifest.dataset.permutation_sha256
        for name in names:
            self.orders[name] = permutation(self.manifest.seed, n, name)
        if pin is not None and permutation_sha256(self.orders["numpy-generator"]) != pin:
            del self.orders["numpy-generator"]
            names.remove("numpy-generator")
            self.notes.append(f"order: numpy-generator was not tried: numpy {np.__version__} gives another "
                              f"permutation than the manifest pins")
        return names

    def _encodes(self) -> list[str]:
        try:
            self.encoder.vocab.post_processor_wrap()
        except PinnedInputError as err:
            self.notes.append(f"encode: add-special was not tried: {err}")
            return [READINGS["encode"][0]]
        return [READINGS["encode"][0], *READINGS["encode"][1]]


_ONE, _ZERO = np.ones(1, dtype=np.uint8), np.zeros(1, dtype=np.uint8)


def pin_lines(contract: Contract) -> str:
    """The manifest lines that select ``contract``."""
    deviations = contract.deviations()
    if not deviations:
        return "(the default reading: no contract: lines needed)"
    return "contract:\n" + "".join(f"  {key}: {value}\n" for key, value in deviations.items())


def describe(explanation: Explanation, manifest: Manifest) -> Iterator[str]:
    """The explanation for a reader."""
    for note in explanation.notes:
        yield f"note: {note}"
    if explanation.matches:
        yield f"{len(explanation.matches)} reading(s) reproduce rows_sha256 {manifest.expect.rows_sha256} " \
              f"({explanation.tried} contracts tried):"
        for contract in explanation.matches:
            yield f"  {_named(contract)}; pin it with:\n" + "".join(f"    {line}\n" for line in
                                                                 pin_lines(contract).splitlines())
    else:
        yield f"no reading reproduces rows_sha256 {manifest.expect.rows_sha256} ({explanation.tried} contracts tried)"
    if explanation.ratio_matches and not explanation.matches:
        yield f"readings whose supervised_token_ratio matches {manifest.expect.supervised_token_ratio.text} " \
              f"(closest first):"
        for contract, ratio in explanation.ratio_matches[:20]:
            yield f"  {ratio:.6f}  {_named(contract)}"


def _named(contract: Contract) -> str:
    deviations = contract.deviations()
    return "the default reading" if not deviations else ", ".join(f"{k}: {v}" for k, v in deviations.items())
