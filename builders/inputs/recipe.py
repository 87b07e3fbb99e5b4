"""Recipe cards: the rows an OpenRecipes recipe publishes.

They are read as the fields of a manifest.

An OpenRecipes recipe is YAML with ``schema_version: 1``. The OpenRecipes schema
(``schema/recipe.schema.yaml``) was not available to this project, so the parser keeps to the
fields the seed card (``../shared/spec/recipe-glm47flash-h200-attune.txt``) shows:

- ``workload.row_tokens``;
- ``workload.dataset``: ``source`` (a Hub dataset), ``revision``, ``license``, ``rows_sha256``;
  or, for a mixture, ``sources``: a list of datasets, each with ``name``, ``source``,
  ``revision``, ``license`` and ``take`` (the manifest's ``datasets:``);
- ``workload.dataset.build``: ``name``, ``tokenizer`` (``NAME (revision <40 hex>; FILE sha256
  <64 hex>; ...)``), ``loss_mask``, ``rows``, ``row_tokens``, ``padding_tokens``, ``seed``,
  ``supervised_token_ratio``, ``parquet_sha256``, ``parquet_bytes`` (``packing`` and ``builder``
  are words, not figures);
- ``result.active_params.source``: the model's Hub address, which is the tokenizer's repo when
  the tokenizer line's NAME is that repo's name.

The card's other sections are known and not read; a field the parser does not know, at the
levels it reads, is reported once in a note. A card is untrusted input: it is read by the bounded
YAML loader (``builders/yamlfile.py``), and duplicate keys and merge keys are refused, each with
an error naming the card and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import yaml

from builders.errors import ManifestError
from builders.manifest import (
    PINNED_FIGURES,
    FieldChecker,
    Manifest,
    Ratio,
    parse_manifest,
)
from builders.yamlfile import YamlLoader, parse_yaml, read_text

# the tokenizer files a card's manifest pins (glm5's)
CARD_FILES = ("tokenizer.json", "chat_template.jinja")
# the card names no split: the Tulu 3 layout's only one
DEFAULT_SPLIT = "train"

# The mappings the parser reads, each with the keys it knows there.
SECTIONS = {
    "": (
        "schema_version",
        "model",
        "gpu",
        "author",
        "status",
        "stack",
        "workload",
        "layout",
        "result",
        "correctness",
        "env",
        "patches",
        "run",
        "notes",
    ),
    "workload": ("row_tokens", "rows", "global_batch", "precision", "dataset"),
    "workload.dataset": (
        "name",
        "source",
        "revision",
        "license",
        "sources",
        "rows_sha256",
        "build",
    ),
    "workload.dataset.build": (
        "name",
        "tokenizer",
        "loss_mask",
        "rows",
        "row_tokens",
        "padding_tokens",
        "seed",
        "packing",
        "supervised_token_ratio",
        "parquet_sha256",
        "parquet_bytes",
        "builder",
    ),
    "result": (
        "tokens_per_s_per_gpu",
        "usd_per_million_tokens",
        "step_time_cv_percent",
        "mfu",
        "mfu_note",
        "active_params",
        "measured",
        "steps_per_run",
        "window",
        "window_tokens",
        "runs",
        "profiler",
        "gpu_hours",
        "gpu_hours_note",
    ),
    "result.active_params": ("count", "source", "revision"),
}
DATASET, BUILD = "workload.dataset", "workload.dataset.build"
SOURCES = f"{DATASET}.sources"
# the keys of each of a mixture's sources (the seed card's dataset keys, and take)
SOURCE_KEYS = ("name", "source", "revision", "license", "take")
TOKENIZER_LINE = f"{BUILD}.tokenizer"
_LINE_FORM = (
    "'NAME (revision <40 hex>; tokenizer.json sha256 <64 hex>; "
    "chat_template.jinja sha256 <64 hex>)'"
)
_LINE = re.compile(r"(?P<name>[^()]*[^()\s]) \((?P<pins>[^()]*)\)")
_REVISION_PIN = re.compile(r"revision (?P<value>\S+)")
_FILE_PIN = re.compile(r"(?P<file>\S+) sha256 (?P<value>\S+)")
_HUB = "https://huggingface.co/"
# in a text or Markdown page: the card's first line, a fence, the end of a YAML document
_CARD_START = re.compile(r"schema_version\s*:")
_FENCE = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
_DOCUMENT_END = re.compile(r"(---|\.\.\.)\s*$")
# the fenced blocks a card may be in: no language given, or YAML
YAML_INFO = ("", "yaml", "yml")


@dataclass(frozen=True)
class Figure:
    """One manifest field as a card gives it."""

    # the manifest field: "expect.parquet_sha256"
    field: str
    # where the card gives it: "workload.dataset.build.parquet_sha256"
    where: str
    # None: the card does not give it
    value: object


@dataclass(frozen=True)
class Card:
    source: str
    figures: tuple[Figure, ...]
    notes: tuple[str, ...]
    # the datasets it lists: one (workload.dataset.source), or a mixture's (.sources)
    datasets: int = 1

    def value(self, field: str):
        """The card's value for a manifest field.

        None where the card does not give it.
        """
        return next(
            (f.value for f in self.figures if f.field == field and f.value is not None), None
        )

    @property
    def publishes_rows(self) -> bool:
        """Whether the card gives any figure of the rows at all."""
        return any(f.value is not None for f in self.figures)


@dataclass(frozen=True)
class FieldCheck:
    field: str
    where: str
    card: object
    manifest: object
    # "ok", "differs", "not on the card" or "not in the manifest"
    status: str

    def as_dict(self) -> dict:
        return {
            "field": self.field,
            "card_field": self.where,
            "card": _plain(self.card),
            "manifest": _plain(self.manifest),
            "status": self.status,
        }


@dataclass(frozen=True)
class ImpliedManifest:
    # YAML, with comments on what the card does not carry
    text: str
    manifest: Manifest
    notes: tuple[str, ...]


def read_card(path: str | Path) -> Card:
    """Read and check the recipe card at ``path``."""
    source = str(path)
    doc = _load(Path(path))
    check = FieldChecker(source)
    check.any_mapping(doc, "")
    if "schema_version" not in doc:
        check.fail("schema_version", "missing (an OpenRecipes recipe says schema_version: 1)")
    version = doc["schema_version"]
    if isinstance(version, bool) or version != 1:
        check.fail("schema_version", f"this parser reads schema_version 1, got {version!r}")
    sections = {path: _section(doc, path, check) for path in SECTIONS}
    sources = _sources(sections[DATASET], check)
    # each section with the keys known there, a mixture's sources too
    read = [(path, known, sections[path]) for path, known in SECTIONS.items()] + [
        (where, SOURCE_KEYS, source) for where, source in sources if where != DATASET
    ]
    unknown = [
        f"{path}.{key}" if path else str(key)
        for path, known, section in read
        for key in section
        if key not in known
    ]
    notes = [f"fields this parser does not know, not read: {', '.join(unknown)}"] if unknown else []
    line = _tokenizer_line(sections[BUILD].get("tokenizer"), check, notes)

    def figure(field, path, key, read) -> Figure:
        value = sections[path].get(key)
        return Figure(
            field, f"{path}.{key}", None if value is None else read(check, value, f"{path}.{key}")
        )

    figures = [
        figure("name", BUILD, "name", FieldChecker.plain_name),
        *(
            Figure(
                f"{_prefix(j, len(sources))}.{field}",
                f"{where}.{key}",
                None if source.get(key) is None else read(check, source[key], f"{where}.{key}"),
            )
            for j, (where, source) in enumerate(sources)
            for field, key, read in _DATASET_FIGURES
            if key != "take" or where != DATASET
        ),
        Figure(
            "tokenizer.repo",
            f"{TOKENIZER_LINE}: NAME, with result.active_params.source",
            _tokenizer_repo(line, sections["result.active_params"], check, notes),
        ),
        Figure("tokenizer.revision", f"{TOKENIZER_LINE}: revision", line and line.revision),
        *(
            Figure(
                f"tokenizer.sha256.{name}",
                f"{TOKENIZER_LINE}: {name} sha256",
                line and line.sha256.get(name),
            )
            for name in CARD_FILES
        ),
        figure("loss_mask", BUILD, "loss_mask", FieldChecker.string),
        figure("seed", BUILD, "seed", FieldChecker.non_negative_int),
        figure("row_tokens", "workload", "row_tokens", FieldChecker.positive_int),
        figure("row_tokens", BUILD, "row_tokens", FieldChecker.positive_int),
        figure("rows", BUILD, "rows", FieldChecker.positive_int),
        figure("expect.rows_sha256", DATASET, "rows_sha256", FieldChecker.sha256),
        figure("expect.parquet_sha256", BUILD, "parquet_sha256", FieldChecker.sha256),
        figure("expect.parquet_bytes", BUILD, "parquet_bytes", FieldChecker.positive_int),
        figure(
            "expect.supervised_token_ratio", BUILD, "supervised_token_ratio", FieldChecker.ratio
        ),
        figure("expect.padding_tokens", BUILD, "padding_tokens", FieldChecker.non_negative_int),
    ]
    return Card(source, tuple(figures), tuple(notes), len(sources))


def _sources(dataset: dict, check: FieldChecker) -> list[tuple[str, dict]]:
    """The card's datasets, each with where it is on the card.

    ``workload.dataset`` itself (its ``source``), or each of its ``sources`` (a mixture).
    """
    if "sources" not in dataset:
        return [(DATASET, dataset)]
    mixed = [key for key in ("source", "revision", "license") if key in dataset]
    if mixed:
        check.fail(
            SOURCES,
            f"give either source: (one dataset) or sources: (a mixture), not both (the card "
            f"gives {DATASET}.{mixed[0]} too)",
        )
    listed = dataset["sources"]
    if not isinstance(listed, list) or not listed:
        check.fail(SOURCES, f"expected a non-empty list of datasets, got {listed!r}")
    for j, item in enumerate(listed):
        check.any_mapping(item, f"{SOURCES}[{j}]")
    return [(f"{SOURCES}[{j}]", item) for j, item in enumerate(listed)]


def _prefix(j: int, count: int) -> str:
    """A dataset's manifest field prefix, as ``Manifest.recipe`` names it."""
    return "dataset" if count == 1 else f"datasets[{j}]"


def implied_manifest(card: Card) -> ImpliedManifest:
    """The manifest the card implies: YAML text and its parse.

    The text is loadable by ``load_manifest``. The card names no split (``train`` is assumed), no
    source row count or permutation hash, no writer and no reading of the row contract (ROWS.md's
    defaults): those are left out, and the text's opening comment says so. A field a manifest needs
    that the card lacks is an error.
    """
    check = FieldChecker(card.source)
    row_tokens = {
        f.where: f.value for f in card.figures if f.field == "row_tokens" and f.value is not None
    }
    if len(set(row_tokens.values())) > 1:
        check.fail(
            " and ".join(row_tokens),
            f"the card gives row_tokens twice, differently: "
            f"{', '.join(f'{k} {v}' for k, v in row_tokens.items())}",
        )
    needed = [f for f in card.figures if not _optional(f) and card.value(f.field) is None]
    if needed:
        check.fail(
            "",
            "the card does not give what a manifest needs: "
            + "; ".join(f"{f.field} (card: {f.where})" for f in needed),
        )
    g = card.value
    datasets = [
        {
            "repo": g(f"{prefix}.repo"),
            "revision": g(f"{prefix}.revision"),
            "split": DEFAULT_SPLIT,
            **{key: g(f"{prefix}.{key}") for key in ("license", "take") if g(f"{prefix}.{key}")},
        }
        for prefix in (_prefix(j, card.datasets) for j in range(card.datasets))
    ]
    doc = {
        "name": g("name"),
        **({"dataset": datasets[0]} if card.datasets == 1 else {"datasets": datasets}),
        "tokenizer": {
            "repo": g("tokenizer.repo"),
            "revision": g("tokenizer.revision"),
            "sha256": {name: g(f"tokenizer.sha256.{name}") for name in CARD_FILES},
        },
        "loss_mask": g("loss_mask"),
        "seed": g("seed"),
        "row_tokens": g("row_tokens"),
        "rows": g("rows"),
        "expect": {
            name: g(f"expect.{name}") for name in PINNED_FIGURES if g(f"expect.{name}") is not None
        },
    }
    absent = [
        f for f in card.figures if f.value is None and _optional(f) and not f.field.endswith("take")
    ]
    each = "dataset" if card.datasets == 1 else "datasets[*]"
    comments = [
        f"The manifest the recipe card {' '.join(Path(card.source).name.split())} implies "
        "(fixed-sft manifest --from-recipe).",
        "Not on the card, so:",
        f"  {each}.split: {DEFAULT_SPLIT}, assumed (the card names no split)",
        f"  {each}.rows{', dataset.permutation_sha256' if card.datasets == 1 else ''}: left out "
        "(optional checks of the source)",
        "  contract: left out, so the readings are ROWS.md's defaults",
        "  expect.writer: left out (the card does not say which pyarrow wrote its file: "
        "a rebuild whose",
        "    rows_sha256 matches has the card's rows even where parquet_sha256 and "
        "parquet_bytes differ)",
        "  expect.segments_sha256: left out (a card carries no figure of the rows' segments)",
        *(f"  {f.field}: left out, not verified ({f.where} is not on the card)" for f in absent),
    ]
    text = "".join(f"# {line}\n" for line in comments) + yaml.dump(
        doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16
    )
    manifest = parse_manifest(text, source=f"the manifest implied by {card.source}")
    notes = [
        *card.notes,
        *(
            f"{f.where} is not on the card: {f.field} is left out of the manifest, not verified"
            for f in absent
        ),
    ]
    return ImpliedManifest(text, manifest, tuple(notes))


def manifest_fields(manifest: Manifest) -> dict:
    """A manifest's values under the field names a card's figures use."""
    count = len(manifest.datasets)
    return {
        "name": manifest.name,
        **{
            f"{_prefix(j, count)}.{key}": getattr(pin, key)
            for j, pin in enumerate(manifest.datasets)
            for key in ("repo", "revision", "license", "take")
        },
        "tokenizer.repo": manifest.tokenizer.repo,
        "tokenizer.revision": manifest.tokenizer.revision,
        **{f"tokenizer.sha256.{name}": sha for name, sha in manifest.tokenizer.sha256.items()},
        "loss_mask": manifest.loss_mask,
        "seed": manifest.seed,
        "row_tokens": manifest.row_tokens,
        "rows": manifest.rows,
        **{f"expect.{name}": getattr(manifest.expect, name) for name in PINNED_FIGURES},
    }


def compare(card: Card, manifest: Manifest) -> list[FieldCheck]:
    """Each of the card's figures against the manifest's value of that field.

    Where the card lists another number of datasets than the manifest, that comes first.
    """
    pinned, checks = manifest_fields(manifest), []
    count = len(manifest.datasets)
    if card.datasets > 1 or count > 1:
        status = "ok" if card.datasets == count else "differs"
        checks.append(FieldCheck("datasets", f"{DATASET} (how many)", card.datasets, count, status))
    for figure in card.figures:
        theirs = pinned.get(figure.field)
        if figure.value is None:
            status = "not on the card"
        elif theirs is None:
            status = "not in the manifest"
        else:
            status = "ok" if _same(figure.value, theirs) else "differs"
        checks.append(FieldCheck(figure.field, figure.where, figure.value, theirs, status))
    return checks


@dataclass(frozen=True)
class _TokenizerLine:
    name: str
    revision: str | None
    sha256: dict[str, str]


def _tokenizer_line(value, check: FieldChecker, notes: list[str]) -> _TokenizerLine | None:
    """The tokenizer line, read; None where the card has none.

    The line reads ``NAME (revision <40 hex>; FILE sha256 <64 hex>; ...)``.
    """
    if value is None:
        return None
    text = " ".join(check.string(value, TOKENIZER_LINE).split())
    match = _LINE.fullmatch(text)
    if not match:
        check.fail(TOKENIZER_LINE, f"expected {_LINE_FORM}, got {text!r}")
    revision, sha256 = None, {}
    for pin in (p.strip() for p in match["pins"].split(";")):
        if found := _REVISION_PIN.fullmatch(pin):
            if revision is not None:
                check.fail(TOKENIZER_LINE, "names the revision twice")
            revision = check.commit(found["value"], f"{TOKENIZER_LINE} (revision)")
        elif found := _FILE_PIN.fullmatch(pin):
            name = found["file"]
            if name in sha256:
                check.fail(TOKENIZER_LINE, f"gives {name}'s sha256 twice")
            sha256[name] = check.sha256(found["value"], f"{TOKENIZER_LINE} ({name} sha256)")
        else:
            check.fail(
                TOKENIZER_LINE,
                f"cannot read {pin!r}: expected 'revision <40 hex>' or 'FILE sha256 <64 hex>' "
                f"(the line reads {_LINE_FORM})",
            )
    extra = [name for name in sha256 if name not in CARD_FILES]
    if extra:
        notes.append(
            f"{TOKENIZER_LINE} pins {', '.join(extra)}, which a manifest does not carry: "
            "not compared"
        )
    return _TokenizerLine(match["name"], revision, sha256)


def _tokenizer_repo(
    line: _TokenizerLine | None, params: dict, check: FieldChecker, notes: list[str]
) -> str | None:
    """The tokenizer's Hub repo.

    The line's NAME where it is a repo id, else the model repo of that name.
    """
    if line is None:
        return None
    if "/" in line.name:
        return check.repo_id(line.name, f"{TOKENIZER_LINE} (NAME)")
    if params.get("source") is None:
        notes.append(
            f"{TOKENIZER_LINE} names {line.name!r}, not a Hub repo, and "
            "result.active_params.source is not on the card: the tokenizer's repo is unknown"
        )
        return None
    model = _hub_repo(check, params["source"], "result.active_params.source", "")
    if model.split("/")[1] != line.name:
        notes.append(
            f"{TOKENIZER_LINE} names {line.name!r}, not a Hub repo, and "
            f"result.active_params.source is {model}, another repo: the tokenizer's repo is unknown"
        )
        return None
    return model


def _hub_repo(check: FieldChecker, value, field: str, kind: str) -> str:
    """A Hub repo id, given as ``owner/name`` or as its address.

    The address is ``https://huggingface.co/{kind}owner/name``.
    """
    text = check.string(value, field).strip()
    if text.startswith(_HUB + kind):
        text = text[len(_HUB + kind) :].removesuffix("/")
    return check.repo_id(text, field)


def _dataset_repo(check: FieldChecker, value, field: str) -> str:
    return _hub_repo(check, value, field, "datasets/")


# a dataset's figures: (manifest field under its prefix, the card's key, how it is read)
_DATASET_FIGURES = (
    ("repo", "source", _dataset_repo),
    ("revision", "revision", FieldChecker.commit),
    ("license", "license", FieldChecker.string),
    ("take", "take", FieldChecker.positive_int),
)


def _section(doc: dict, path: str, check: FieldChecker) -> dict:
    """The mapping at ``path`` (``{}`` where the card has none).

    Anything but a mapping is an error.
    """
    node = doc
    for depth, key in enumerate(path.split(".") if path else []):
        node = node.get(key)
        if node is None:
            return {}
        check.any_mapping(node, ".".join(path.split(".")[: depth + 1]))
    return node


class _CardLoader(YamlLoader):
    """The manifest loader, refusing duplicate keys and merge keys.

    Of duplicate keys, which one would count?
    """

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key.value!r}", key.start_mark
                    )
                seen.add(key.value)
        return super().construct_mapping(node, deep)

    def flatten_mapping(self, node):
        for key, _ in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys (<<) are not read in a recipe card", key.start_mark
                )
        super().flatten_mapping(node)


def _load(path: Path):
    """The card's YAML, within the bounds on size, nesting and node count."""
    return parse_yaml(
        _card_part(read_text(path, "recipe card"), path), str(path), "recipe card", _CardLoader
    )


def _card_part(text: str, path: Path) -> str:
    """The card's YAML: a .yaml file whole, else the card inside a text or Markdown page.

    In a page, the card is the fenced block (```` ``` ```` or ``~~~``, with no language or YAML)
    holding a line that starts with ``schema_version:``, else the YAML document that starts at such
    a line outside any fenced block and runs to the page's end or to a ``---`` or ``...`` line.
    The lines before it are kept, blank, so that an error's line number is the page's. A page with
    no card, or with two, is refused.
    """
    if path.suffix.lower() in (".yaml", ".yml"):
        return text
    lines = text.splitlines(keepends=True)
    starts = [k for k, line in enumerate(lines) if _CARD_START.match(line)]
    blocks = _fenced_blocks(lines)
    cards = [
        (a, b) for a, b, info in blocks if info in YAML_INFO and any(a <= k < b for k in starts)
    ] or [
        (k, next((e for e in range(k, len(lines)) if _DOCUMENT_END.match(lines[e])), len(lines)))
        for k in starts
        if not any(a <= k < b for a, b, _ in blocks)
    ]
    if not cards:
        raise ManifestError(
            f"{path}: no recipe card in this page: no line starts with schema_version: (a card's "
            "first field), in a fenced block or not"
        )
    if len(cards) > 1:
        raise ManifestError(
            f"{path}: {len(cards)} recipe cards in this page (from lines "
            f"{', '.join(str(a + 1) for a, _ in cards)}): give one"
        )
    ((first, end),) = cards
    return "\n" * first + "".join(lines[first:end])


def _fenced_blocks(lines: list[str]) -> list[tuple[int, int, str]]:
    """The Markdown fenced blocks of a page.

    Each is (its first line inside, the line of its closing fence, its language, lower case).
    """
    blocks, k = [], 0
    while k < len(lines):
        fence = _FENCE.match(lines[k])
        if fence is None:
            k += 1
            continue
        end = next(
            (e for e in range(k + 1, len(lines)) if lines[e].strip() == fence["fence"]),
            len(lines),
        )
        blocks.append((k + 1, end, fence["info"].lower()))
        k = end + 1
    return blocks


class _Dumper(yaml.SafeDumper):
    """Writes a ratio as it was written on the card.

    ``0.670`` keeps its three decimals.
    """


_Dumper.add_representer(
    Ratio, lambda dumper, ratio: dumper.represent_scalar("tag:yaml.org,2002:float", ratio.text)
)


def _optional(figure: Figure) -> bool:
    """A figure a manifest may leave out (its expect, a license, a take)."""
    return figure.field.startswith("expect.") or figure.field.endswith((".license", ".take"))


def _same(card, manifest) -> bool:
    if isinstance(card, Ratio) and isinstance(manifest, Ratio):
        return Decimal(card.text) == Decimal(manifest.text)
    return card == manifest


def _plain(value):
    return float(value.text) if isinstance(value, Ratio) else value
