"""Recipe cards: the rows an OpenRecipes recipe publishes.

They are read as the fields of a manifest.

An OpenRecipes recipe is YAML with ``schema_version: 1``. The OpenRecipes schema
(``schema/recipe.schema.yaml``) was not available to this project, so the parser keeps to the
fields the seed card (``../shared/spec/recipe-glm47flash-h200-attune.txt``) shows:

- ``workload.row_tokens``;
- ``workload.dataset``: ``source`` (a Hub dataset), ``revision``, ``license``, ``rows_sha256``;
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
from builders.yamlfile import YamlLoader, read_yaml

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
    "workload.dataset": ("name", "source", "revision", "license", "rows_sha256", "build"),
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
TOKENIZER_LINE = f"{BUILD}.tokenizer"
_LINE_FORM = (
    "'NAME (revision <40 hex>; tokenizer.json sha256 <64 hex>; "
    "chat_template.jinja sha256 <64 hex>)'"
)
_LINE = re.compile(r"(?P<name>[^()]*[^()\s]) \((?P<pins>[^()]*)\)")
_REVISION_PIN = re.compile(r"revision (?P<value>\S+)")
_FILE_PIN = re.compile(r"(?P<file>\S+) sha256 (?P<value>\S+)")
_HUB = "https://huggingface.co/"


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
    unknown = [
        f"{path}.{key}" if path else str(key)
        for path, known in SECTIONS.items()
        for key in sections[path]
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
        figure("dataset.repo", DATASET, "source", _dataset_repo),
        figure("dataset.revision", DATASET, "revision", FieldChecker.commit),
        figure("dataset.license", DATASET, "license", FieldChecker.string),
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
    return Card(source, tuple(figures), tuple(notes))


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
    dataset = {"repo": g("dataset.repo"), "revision": g("dataset.revision"), "split": DEFAULT_SPLIT}
    if g("dataset.license") is not None:
        dataset["license"] = g("dataset.license")
    doc = {
        "name": g("name"),
        "dataset": dataset,
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
    absent = [f for f in card.figures if f.value is None and _optional(f)]
    comments = [
        f"The manifest the recipe card {' '.join(Path(card.source).name.split())} implies "
        "(fixed-sft manifest --from-recipe).",
        "Not on the card, so:",
        f"  dataset.split: {DEFAULT_SPLIT}, assumed (the card names no split)",
        "  dataset.rows, dataset.permutation_sha256: left out (optional checks of the source)",
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
    if manifest.mixture:
        raise ManifestError(
            f"{manifest.name} is a mixture of {len(manifest.datasets)} datasets; a recipe card "
            f"names one (workload.dataset)"
        )
    return {
        "name": manifest.name,
        "dataset.repo": manifest.dataset.repo,
        "dataset.revision": manifest.dataset.revision,
        "dataset.license": manifest.dataset.license,
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
    """Each of the card's figures against the manifest's value of that field."""
    pinned, checks = manifest_fields(manifest), []
    for figure in card.figures:
        theirs = pinned[figure.field]
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
    return read_yaml(path, "recipe card", _CardLoader)


class _Dumper(yaml.SafeDumper):
    """Writes a ratio as it was written on the card.

    ``0.670`` keeps its three decimals.
    """


_Dumper.add_representer(
    Ratio, lambda dumper, ratio: dumper.represent_scalar("tag:yaml.org,2002:float", ratio.text)
)


def _optional(figure: Figure) -> bool:
    """A figure a manifest may leave out (its expect, the license)."""
    return figure.field.startswith("expect.") or figure.field == "dataset.license"


def _same(card, manifest) -> bool:
    if isinstance(card, Ratio) and isinstance(manifest, Ratio):
        return Decimal(card.text) == Decimal(manifest.text)
    return card == manifest


def _plain(value):
    return float(value.text) if isinstance(value, Ratio) else value
