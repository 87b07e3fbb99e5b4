"""explain: which readings of the row contract reproduce a manifest.

A reading reproduces a manifest when it gives the manifest's pinned figures.

data/ROWS.md names the choices the recipe card leaves open (``builders.contract``). A build whose
``rows_sha256`` differs from the published one was made under some other reading; ``explain``
searches them, from the default outward (single deviations, then pairs, then the rest), and
names the readings that reproduce the pinned ``rows_sha256``, or, when none does, those whose
``supervised_token_ratio`` matches at the precision the manifest gives. After the default's
neighbours (one deviation) it tries the peer formats (``loss_mask: miles-qwen``, ``miles-qwen3``,
``hf-generation``: another tool's rows, ``builders.formats.peers``) that apply to the pinned
template, so rows another tool made are named too.

The search is cheap enough for the real recipe: every conversation is rendered and tokenized
once for the whole search (cached by source index, across orders), with what every mask rule
needs; a stream template per order and mask rule holds every token any reading may put in the
stream, so a reading's ids and mask are a table lookup away; the four ``hash`` layouts of its
rows are computed side by side.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from builders.build import build, check_source_rows, stream_order
from builders.contract import DEFAULT, KEYS, READINGS, SLIME_RULES, Contract
from builders.encode import engines
from builders.encode.encoder import ConversationEncoder
from builders.encode.stream import ENCODE_BATCH, HORIZON_MARGIN
from builders.errors import BuildError, PinnedInputError, UsageError
from builders.formats import PEER_FORMATS
from builders.formats.base import Annotated
from builders.inputs.layout import conversations
from builders.inputs.pinned import pinned_inputs
from builders.inputs.source import Source
from builders.manifest import Expect, Manifest
from builders.rows.figures import RowHash, differing_characters, mistyped_pin
from builders.rows.order import permutation_sha256, torch_available
from builders.rows.rowfile import writer_version
from builders.views.writers import VARIANTS as WRITER_VARIANTS
from builders.views.writers import Written, try_writers

# the readings that change the rows; hash only names them
ROW_KEYS = tuple(key for key in KEYS if key != "hash")
HASHES = (READINGS["hash"][0], *READINGS["hash"][1])
# the peer formats are tried once the readings with this many deviations are
PEERS_AFTER = 1


@dataclass
class Outcome:
    """A reading's figures.

    They are its rows' hash in every layout, and their supervised-token ratio.
    """

    contract: Contract  # with the default hash
    hashes: dict[str, str]
    ratio: float


@dataclass
class Explanation:
    """What the search found, and what it tried."""

    # the search's order: fewest deviations first
    matches: list[Contract] = field(default_factory=list)
    # closest first
    ratio_matches: list[tuple[Contract, float]] = field(default_factory=list)
    # (loss_mask, hash layout) of a peer's rows
    peer_matches: list[tuple[str, str]] = field(default_factory=list)
    # full contracts (row readings × hash layouts) compared
    tried: int = 0
    readings: int = 0  # full contracts there are to try
    notes: list[str] = field(default_factory=list)
    # the reading whose rows_sha256 is nearest the pin: (its name, that hash, characters differing)
    nearest: tuple[str, str, int] | None = None

    @property
    def reproduced(self) -> bool:
        return bool(self.matches or self.peer_matches)

    def compare(self, name: str, hashes: dict[str, str], pinned: str | None) -> None:
        """Keep the nearest of a reading's hashes (one per ``hash`` layout) to the pin."""
        for layout, digest in hashes.items() if pinned else ():
            differing = differing_characters(digest, pinned)
            if self.nearest is None or differing < self.nearest[2]:
                hashed = "" if layout == DEFAULT.hash else f", hash: {layout}"
                self.nearest = (f"{name}{hashed}", digest, differing)

    def as_dict(self) -> dict:
        return {
            "matches": [
                {"contract": c.as_dict(), "deviations": c.deviations()} for c in self.matches
            ],
            "peer_matches": [
                {"loss_mask": name, "hash": layout} for name, layout in self.peer_matches
            ],
            "ratio_matches": [
                {"contract": c.as_dict(), "deviations": c.deviations(), "supervised_token_ratio": r}
                for c, r in self.ratio_matches
            ],
            "tried": self.tried,
            "readings": self.readings,
            "notes": self.notes,
            "nearest": None
            if self.nearest is None
            else {
                "reading": self.nearest[0],
                "rows_sha256": self.nearest[1],
                "differing_characters": self.nearest[2],
            },
        }


def row_readings(orders: list[str], encodes: list[str], chat_format) -> list[Contract]:
    """Every reading that changes the rows and applies to ``chat_format``.

    They come from the default outward (by number of deviations).
    """
    choices = [
        orders
        if key == "order"
        else encodes
        if key == "encode"
        else [READINGS[key][0], *READINGS[key][1]]
        for key in ROW_KEYS
    ]
    readings = []
    for values in itertools.product(*choices):
        contract = Contract(**dict(zip(ROW_KEYS, values, strict=True)))
        if chat_format.refusal(contract) is None and not chat_format.redundant(contract):
            readings.append(contract)
    # stable: the table's order within each count
    return sorted(readings, key=lambda c: len(c.deviations()))


class Search:
    """The readings of one manifest, evaluated against its pinned figures."""

    def __init__(self, manifest: Manifest, source: Source, encoder: ConversationEncoder, reporter):
        self.manifest, self.source = manifest, source
        self.encoder, self.reporter = encoder, reporter
        self.cache: dict[int, Annotated] = {}
        self.orders: dict[str, np.ndarray] = {}
        self.notes: list[str] = []
        self._mean_tokens: float | None = None
        # conversations taken from each order
        self._counts: dict[str, int] = {}
        # the last one built, and its key
        self._template: tuple[tuple[str, str, int], Template] | None = None
        # encode: add-special's tokens, when tried
        self._wrap = (np.zeros(0, np.int32), np.zeros(0, np.int32))

    def run(self, stop_at_first: bool = True) -> Explanation:
        """Try the readings a level of deviations at a time.

        With ``stop_at_first``, stop after the level where some reading reproduces rows_sha256 (so
        equally close readings are all named).
        """
        expect = self.manifest.expect
        if expect.rows_sha256 is None and expect.supervised_token_ratio is None:
            raise UsageError(
                f"explain: {self.manifest.name} pins neither rows_sha256 "
                f"nor supervised_token_ratio: nothing to explain"
            )
        chat_format = self.encoder.format
        readings = row_readings(self._orders(), self._encodes(), chat_format)
        not_applying = [
            key
            for key in ROW_KEYS
            if any(
                chat_format.refusal(replace(DEFAULT, **{key: value})) for value in READINGS[key][1]
            )
        ]
        if not_applying:
            self.notes.append(
                f"loss_mask {chat_format.name}: {', '.join(not_applying)} "
                f"{'does' if len(not_applying) == 1 else 'do'} not apply in full "
                f"(only the readings that mean something for it were tried)"
            )
        peers = [name for name in PEER_FORMATS if name != chat_format.name]
        found = Explanation(notes=self.notes, readings=(len(readings) + len(peers)) * len(HASHES))
        with self.reporter.progress(
            "readings tried", total=len(readings), unit="readings"
        ) as progress:
            levels = itertools.groupby(readings, key=lambda c: len(c.deviations()))
            for deviations, level in levels:
                # within a level, readings that share an order and a mask rule
                # share a stream template
                for contract in sorted(level, key=lambda c: (c.order, c.mask_rule)):
                    outcome = self.evaluate(contract)
                    found.tried += len(HASHES)
                    found.compare(_named(contract), outcome.hashes, expect.rows_sha256)
                    progress.update(1)
                    ratio_matches = (
                        expect.supervised_token_ratio is None
                        or expect.supervised_token_ratio.matches(outcome.ratio)
                    )
                    # the same rows have the same ratio: a pinned ratio also rules out what the
                    # hash cannot see (hash: ids-u4 hashes no mask)
                    if ratio_matches:
                        found.matches += [
                            Contract(**{**contract.as_dict(), "hash": layout})
                            for layout, digest in outcome.hashes.items()
                            if digest == expect.rows_sha256
                        ]
                        if expect.supervised_token_ratio is not None:
                            found.ratio_matches.append((contract, outcome.ratio))
                if found.reproduced and stop_at_first:
                    break
                if deviations >= PEERS_AFTER and peers:
                    self.try_peers(peers, found)
                    peers = []
                    if found.reproduced and stop_at_first:
                        break
        if peers and not (found.reproduced and stop_at_first):
            self.try_peers(peers, found)
        rank = {contract: k for k, contract in enumerate(readings)}
        found.matches.sort(
            key=lambda c: (rank[replace(c, hash=DEFAULT.hash)], HASHES.index(c.hash))
        )
        if expect.supervised_token_ratio is not None:
            target = float(expect.supervised_token_ratio.text)
            found.ratio_matches.sort(key=lambda item: (abs(item[1] - target), rank[item[0]]))
        return found

    def try_peers(self, names: list[str], found: Explanation) -> None:
        """Try the default reading under each peer format in ``names``.

        Those that apply to the pinned template and source are tried; the others are noted.
        """
        expect = self.manifest.expect
        for name in names:
            try:
                spec = replace(self.encoder.spec, loss_mask=name, eos=self.encoder.format.eos)
                peer = Search(
                    replace(self.manifest, loss_mask=name),
                    self.source,
                    ConversationEncoder(self.encoder.tokenizer, spec, engine=self.encoder.engine),
                    self.reporter,
                )
                peer.orders = (
                    {DEFAULT.order: self.orders[DEFAULT.order]}
                    if DEFAULT.order in self.orders
                    else dict(itertools.islice(self.orders.items(), 1))
                )
                outcome = peer.evaluate(replace(DEFAULT, order=next(iter(peer.orders))))
            except BuildError as err:
                # the template is not the peer's, or the peer fails on a conversation
                self.notes.append(f"loss_mask {name} was not tried: {err}")
                # not a reading of these inputs
                found.readings -= len(HASHES)
                continue
            found.tried += len(HASHES)
            found.compare(f"loss_mask {name}", outcome.hashes, expect.rows_sha256)
            if expect.supervised_token_ratio is None or expect.supervised_token_ratio.matches(
                outcome.ratio
            ):
                found.peer_matches += [
                    (name, layout)
                    for layout, digest in outcome.hashes.items()
                    if digest == expect.rows_sha256
                ]

    def evaluate(self, contract: Contract) -> Outcome:
        """The figures of ``contract``'s rows (any hash).

        They are the rows' hash in every layout, and their supervised-token ratio.
        """
        order = self.orders[contract.order]
        count = self._counts.get(contract.order) or min(
            len(order), self._estimate(self.manifest.rows * self.manifest.row_tokens)
        )
        while (rows := self._rows(contract, self.template(contract, count))) is None:
            if count == len(order):
                raise PinnedInputError(
                    f"explain: under {contract.deviations() or 'the default reading'} the source "
                    f"runs out before {self.manifest.rows} rows"
                )
            count = min(len(order), 2 * count)
        # what one reading needed, the next ones of this order start from
        self._counts[contract.order] = count
        ids, mask = rows
        return Outcome(contract, hash_layouts(ids, mask), float(np.count_nonzero(mask)) / mask.size)

    def template(self, contract: Contract, count: int) -> Template:
        """The stream template of the first ``count`` conversations.

        They are taken in ``contract``'s order, under its mask rule.
        """
        key = (contract.order, contract.mask_rule, count)
        if self._template is None or self._template[0] != key:
            records = self._annotated(self.orders[contract.order][:count])
            self._template = key, Template.of(records, contract.mask_rule, self._wrap, self.encoder)
        return self._template[1]

    def _rows(self, contract: Contract, template: Template) -> tuple[np.ndarray, np.ndarray] | None:
        """The first ``manifest.rows`` rows of ``contract``'s stream.

        None if the template holds too few.
        """
        ids, mask = template.stream(contract, self.encoder.class_values(contract))
        width = self.manifest.row_tokens
        windows = len(ids) // width
        ids, mask = (
            ids[: windows * width].reshape(windows, width),
            mask[: windows * width].reshape(windows, width),
        )
        if not contract.keeps_unsupervised_windows:
            kept = mask.any(axis=1)
            ids, mask = ids[kept], mask[kept]
        if len(ids) < self.manifest.rows:
            return None
        return ids[: self.manifest.rows], mask[: self.manifest.rows]

    def _annotated(self, indices: np.ndarray) -> list[Annotated]:
        """The cached records of ``indices``.

        Those not yet seen are encoded, once.
        """
        missing = np.array(sorted(set(indices.tolist()) - self.cache.keys()), dtype=np.int64)
        if missing.size:
            groups = self.source.group_of(missing)
            for group in np.unique(groups).tolist():
                rows = conversations(self.source.read(group, missing[groups == group]))
                for first in range(0, len(rows), ENCODE_BATCH):
                    batch = rows[first : first + ENCODE_BATCH]
                    records = self.encoder.annotate(batch, SLIME_RULES)
                    for row, record in zip(batch, records, strict=True):
                        # the mask needs only the token classes:
                        # which tokens are message text is not kept
                        self.cache[row["index"]] = replace(record, message_text=None)
        return [self.cache[i] for i in indices.tolist()]

    def _estimate(self, needed_tokens: int) -> int:
        """Conversations to take first.

        The estimate comes from the mean length seen so far, with a margin.
        """
        if self._mean_tokens is None:
            order = next(iter(self.orders.values()))
            sample = self._annotated(order[: min(len(order), 4 * ENCODE_BATCH)])
            self._mean_tokens = max(1.0, sum(len(r.ids) + 1 for r in sample) / max(1, len(sample)))
        return math.ceil(HORIZON_MARGIN * needed_tokens / self._mean_tokens) + ENCODE_BATCH

    def _orders(self) -> list[str]:
        names = [READINGS["order"][0], *READINGS["order"][1]]
        if not torch_available():
            names.remove("torch")
            self.notes.append("order: torch was not tried: torch is not installed here")
        pin = None if self.manifest.mixture else self.manifest.dataset.permutation_sha256
        permutations = {}
        for name in names:
            permutations[name], self.orders[name] = stream_order(self.manifest, self.source, name)
        if pin is not None and permutation_sha256(permutations["numpy-generator"]) != pin:
            del self.orders["numpy-generator"]
            names.remove("numpy-generator")
            self.notes.append(
                f"order: numpy-generator was not tried: numpy {np.__version__} gives another "
                f"permutation than the manifest pins"
            )
        return names

    def _encodes(self) -> list[str]:
        try:
            self._wrap = self.encoder.vocab.post_processor_wrap()
        except PinnedInputError as err:
            self.notes.append(f"encode: add-special was not tried: {err}")
            return [READINGS["encode"][0]]
        if not any(len(w) for w in self._wrap):
            self.notes.append(
                "encode: add-special was not tried apart: the tokenizer's post-processor adds no "
                "tokens, so it reads as plain"
            )
            return [READINGS["encode"][0]]
        return [READINGS["encode"][0], *READINGS["encode"][1]]


# rows hashed at a time
HASH_BLOCK = 64


@dataclass(frozen=True)
class Template:
    """The stream of some conversations in one order under one mask rule.

    It holds every token any reading of the other choices may put in it (the
    ``encode: add-special`` wrap, the stop token ``final: append-stop`` appends, the EOS), each
    coded (``ConversationEncoder.stream_codes``) so that a reading's ids and mask are a table lookup
    (``Contract.table``) and a selection away.
    """

    ids: np.ndarray  # int32
    codes: np.ndarray  # uint8

    @classmethod
    def of(
        cls,
        records: list[Annotated],
        rule: str,
        wrap: tuple[np.ndarray, np.ndarray],
        encoder: ConversationEncoder,
    ) -> Template:
        coded = [
            c
            for record in records
            if (c := encoder.stream_codes(record, rule, wrap, eos=True)) is not None
        ]
        ids = np.concatenate([c[0] for c in coded]) if coded else np.zeros(0, np.int32)
        codes = np.concatenate([c[1] for c in coded]) if coded else np.zeros(0, np.uint8)
        return cls(ids.astype(np.int32, copy=False), codes.astype(np.uint8, copy=False))

    def stream(
        self, contract: Contract, class_values: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ids and mask of the stream under ``contract``.

        The mask rule of ``contract`` is this template's.
        """
        values, keep = contract.table(class_values)
        mask = values[self.codes]
        if keep.all():
            return self.ids, mask
        selected = keep[self.codes]
        return self.ids[selected], mask[selected]


def hash_layouts(ids: np.ndarray, mask: np.ndarray) -> dict[str, str]:
    """The rows' sha256 in every ``hash`` layout.

    The layouts are hashed side by side, a block of rows at a time.
    """

    def one(layout: str) -> tuple[str, str]:
        digest = RowHash(layout)
        for first in range(0, len(ids), HASH_BLOCK):
            digest.add(ids[first : first + HASH_BLOCK], mask[first : first + HASH_BLOCK])
        return layout, digest.hexdigest()

    # hashlib and numpy let go of the GIL
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(pool.map(one, HASHES))


def explain(
    manifest: Manifest, hub, reporter, everything: bool = False, engine: str = "auto"
) -> Explanation:
    """Find the readings that reproduce ``manifest``'s pinned figures.

    With ``everything``, all of them; else up to the first that reproduces rows_sha256.
    """
    if manifest.rows is None or manifest.leave_out_refused:
        raise UsageError(
            f"{manifest.path}: explain compares readings over a fixed number of rows with no "
            "conversation left out: pin rows: N (the report's figures.rows) and leave out "
            "leave_out_refused"
        )
    reporter.info(f"reading the pinned inputs of {manifest.name}")
    pinned, source = pinned_inputs(manifest, hub)
    check_source_rows(manifest, source)
    chosen = engines.choose(engine, pinned.tokenizer, pinned.tokenizer_json, pinned.chat_template)
    encoder = ConversationEncoder(pinned.tokenizer, pinned.spec, engine=chosen.engine)
    reporter.info(chosen.describe())
    explanation = Search(manifest, source, encoder, reporter).run(stop_at_first=not everything)
    # a disagreement found by the guard's cross-check is raised here
    encoder.engine.finish()
    return explanation


def writers(manifest: Manifest, contract: Contract, hub, folder: Path, reporter) -> list[Written]:
    """Build ``manifest``'s rows under ``contract``, and write them.

    They are written as every writer variant does.
    """
    built = build(
        replace(manifest, contract=contract, expect=Expect()), folder, hub, reporter, card=False
    )
    written = []
    with reporter.progress(
        "writer variants tried", total=len(WRITER_VARIANTS), unit="files"
    ) as progress:
        for file in try_writers(built.parquet, folder):
            written.append(file)
            progress.update(1)
    return written


def pin_lines(contract: Contract) -> str:
    """The manifest lines that select ``contract``."""
    deviations = contract.deviations()
    if not deviations:
        return "(the default reading: no contract: lines needed)"
    return "contract:\n" + "".join(f"  {key}: {value}\n" for key, value in deviations.items())


def describe(explanation: Explanation, manifest: Manifest) -> Iterator[str]:
    """The explanation for a reader."""
    expect = manifest.expect
    for note in explanation.notes:
        yield f"note: {note}"
    tried = f"{explanation.tried} of {explanation.readings} contracts tried"
    for name, layout in explanation.peer_matches:
        hashed = "" if layout == DEFAULT.hash else f" (hash: {layout})"
        yield (
            f"loss_mask {name} reproduces rows_sha256 {expect.rows_sha256}{hashed}: "
            f"the rows another tool makes (ROWS.md, Peer formats); pin it with:"
        )
        yield f"    loss_mask: {name}"
        yield "    (and in tokenizer: only eos, no stop or prefills)"
    if expect.rows_sha256 is None:
        yield (
            f"the manifest pins no rows_sha256: only supervised_token_ratio was compared ({tried})"
        )
        if not explanation.ratio_matches:
            yield (
                f"no reading gives supervised_token_ratio {expect.supervised_token_ratio.text}: "
                f"{CHECK_THE_PIN}"
            )
    elif explanation.matches:
        yield (
            f"{len(explanation.matches)} reading(s) reproduce rows_sha256 {expect.rows_sha256} "
            f"({tried}):"
        )
        for contract in explanation.matches:
            yield f"  {_named(contract)}; pin it with:"
            yield from (f"    {line}" for line in pin_lines(contract).splitlines())
        if len(explanation.matches) > 1:
            yield (
                "  (these readings make the same rows from this source: "
                "it holds no conversation on which they differ)"
            )
    elif not explanation.peer_matches:
        yield f"no reading reproduces rows_sha256 {expect.rows_sha256} ({tried})"
        yield from _nothing_reproduces(explanation, expect)
    if explanation.ratio_matches and not explanation.reproduced:
        yield (
            f"readings whose supervised_token_ratio matches {expect.supervised_token_ratio.text}, "
            f"closest first ({len(explanation.ratio_matches)}):"
        )
        for contract, ratio in explanation.ratio_matches[:20]:
            yield f"  {ratio:.6f}  {_named(contract)}"


CHECK_THE_PIN = (
    "check the pin itself before the row contract: copied whole, from the card or report of this "
    "very build (its name, rows and row_tokens), for the inputs this manifest pins"
)


def _nothing_reproduces(explanation: Explanation, expect: Expect) -> Iterator[str]:
    """Where to look when no reading reproduces the pinned rows_sha256.

    A hash a few characters from the pin is a mistyped pin; readings with the pinned ratio are
    near rows (a reading of the contract); with neither, nothing came near: the pin itself.
    """
    name, digest, differing = explanation.nearest or ("", "", 64)
    if explanation.nearest and (mistyped := mistyped_pin(digest, expect.rows_sha256)):
        yield f"{name} gives {mistyped}"
    elif not explanation.ratio_matches:
        ratio = (
            ""
            if expect.supervised_token_ratio is None
            else f", and none gives supervised_token_ratio {expect.supervised_token_ratio.text}"
        )
        yield (
            f"no reading comes near: the nearest rows_sha256 differs from the pin in {differing} "
            f"of its 64 characters{ratio}; {CHECK_THE_PIN}"
        )


def _named(contract: Contract) -> str:
    deviations = contract.deviations()
    return (
        "the default reading"
        if not deviations
        else ", ".join(f"{k}: {v}" for k, v in deviations.items())
    )


def describe_writers(written: list[Written] | None, manifest: Manifest) -> Iterator[str]:
    """What the writer variants say of the pinned file."""
    expect = manifest.expect
    if written is None:
        yield (
            "writers: not tried: no reading reproduces the pinned rows, "
            "and a file's bytes speak only of its rows"
        )
        return
    if expect.parquet_bytes is None:
        yield "writers: the manifest pins no parquet_bytes; the sizes each writer variant gives:"
        for w in written:
            yield f"  {w.bytes:>14,} bytes  {w.variant.name}"
        return
    same_size = [w for w in written if w.bytes == expect.parquet_bytes]
    if not same_size:
        closest = sorted(written, key=lambda w: abs(w.bytes - expect.parquet_bytes))[:3]
        yield (
            f"writers: none of the {len(written)} writer variants "
            f"gives parquet_bytes {expect.parquet_bytes:,}; "
            f"closest: " + "; ".join(f"{w.variant.name} ({w.bytes:,})" for w in closest)
        )
        return
    running = writer_version()
    for w in same_size:
        same_file = w.sha256 == expect.parquet_sha256
        yield f"writers: {w.variant.name} gives parquet_bytes {w.bytes:,}; parquet_sha256 " + (
            f"matches too with {running}: pin expect.writer: {running}"
            if same_file
            else f"differs with {running} "
            f"(the pinned file's pyarrow was another: expect.writer names it)"
        )
