"""Load and validate a build manifest.

A manifest is the YAML format of the row contract. It names every pinned input and the figures a
build must reproduce. It is untrusted input: it is read by the bounded YAML loader
(``builders/yamlfile.py``) and every field is checked, with an error that names the field, before
anything else happens."""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

from builders.contract import DEFAULT, KEYS, Contract, valid
from builders.errors import ManifestError
from builders.formats import FORMATS, PEER_FORMATS, RENDER_ARGUMENTS, refusal
from builders.limits import DEFAULT_LIMITS, LIMIT_KEYS, Limits
from builders.messages import ARGUMENTS, DEFAULT_KEYS, KEY_NAMES
from builders.yamlfile import FloatText, LongInteger, parse_yaml, read_text

LOSS_MASKS = tuple(FORMATS)
# where the chat template may come from
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")
# the files a build may read from the tokenizer repo
TOKENIZER_FILES = ("tokenizer.json", *TEMPLATE_FILES)
# a Hub repo at a commit, or a local folder (path:, with sha256:)
ORIGIN_FIELDS = ("repo", "revision", "path")
# what a local folder's file is checked against, as the report says it
PINNED_BY_MANIFEST = "the manifest's sha256"
FORMAT_FIELDS = ("eos", "stop", "prefills", "template_vars", "render_date", "chat_template_name")

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SPLIT = re.compile(r"[A-Za-z0-9_]+")
_WRITER = re.compile(r"pyarrow [0-9]+\.[0-9]+\.[0-9]+")


@dataclass(frozen=True)
class Pin:
    """Where an input comes from.

    A Hub repo at a commit (``repo``, ``revision``), or a local folder pinned by the sha256 of each
    file the build reads (``path``, ``sha256``).
    """

    repo: str | None = None
    revision: str | None = None
    # the local folder (absolute), in place of repo and revision
    path: str | None = None

    @property
    def local(self) -> bool:
        return self.path is not None

    @property
    def origin(self) -> str:
        """How messages name it: ``owner/name@REVISION``, or its folder."""
        return self.path if self.local else f"{self.repo}@{self.revision}"

    def where(self) -> dict:
        """``repo`` and ``revision``, or ``path``, as the report records them."""
        return {"path": self.path} if self.local else {"repo": self.repo, "revision": self.revision}

    def provenance(self, prefix: str) -> dict:
        """``where``'s fields, named under ``prefix``."""
        return {f"{prefix}.{key}": value for key, value in self.where().items()}


@dataclass(frozen=True)
class DatasetPin(Pin):
    """One pinned dataset, and how its conversations are stored.

    See docs/datasets.md (layouts, mixtures).
    """

    # names the default files; not needed where ``files`` is given
    split: str | None = None
    license: str | None = None
    # its row count (before ``take``), verified
    rows: int | None = None
    permutation_sha256: str | None = None
    # a glob in the snapshot; None: data/{split}-*.parquet
    files: str | None = None
    # the column (field) holding the conversation
    messages: str = "messages"
    # the stored name of each message field, in ``KEY_NAMES`` order (role, content, reasoning,
    # tool_calls, tool_call_id, name)
    keys: tuple[str, ...] = DEFAULT_KEYS
    # (stored name, template's name); None: as stored
    roles: tuple[tuple[str, str], ...] | None = None
    # the provenance id's column; None: the source index is the id
    id: str | None = "id"
    # keep this many rows, chosen by the seed (mixtures)
    take: int | None = None
    # a local folder's files: path in the folder -> sha256, every file the build reads
    sha256: dict[str, str] | None = None
    # the row field holding the conversation's tools; None: no such field
    tools: str | None = None
    # ``tools: null``: a row's ``tools`` field is deliberately not read (the report says so)
    tools_unused: bool = False
    # ``object``: a string ``arguments`` is parsed as JSON; ``as-is``: passed unchanged
    arguments: str = "object"

    @property
    def fields(self) -> dict[str, str]:
        """Each message key (``KEY_NAMES``) and the stored field holding it."""
        return dict(zip(KEY_NAMES, self.keys, strict=True))

    @property
    def pattern(self) -> str:
        """The glob of the files a build reads from the snapshot."""
        return self.files if self.files is not None else f"data/{self.split}-*.parquet"

    def recipe(self, prefix: str) -> dict:
        """What of this pin the rows depend on, by field name under ``prefix``.

        The repo, revision and split, and each layout field, ``take`` included, where it is not the
        default.
        """
        layout = {
            "files": self.files,
            "messages": None if self.messages == "messages" else self.messages,
            "keys": None
            if self.keys == DEFAULT_KEYS
            else {
                key: stored
                for key, stored, default in zip(KEY_NAMES, self.keys, DEFAULT_KEYS, strict=True)
                if key in ("role", "content") or stored != default
            },
            "roles": None if self.roles is None else dict(self.roles),
            "take": self.take,
            "tools": self.tools,
            "arguments": None if self.arguments == "object" else self.arguments,
        }
        if self.id != "id":
            layout["id"] = self.id
        return {
            **self.provenance(prefix),
            **{
                f"{prefix}.sha256.{name}": digest
                for name, digest in sorted((self.sha256 or {}).items())
            },
            f"{prefix}.split": self.split,
            **{
                f"{prefix}.{key}": value
                for key, value in layout.items()
                if value is not None or key == "id"
            },
        }


@dataclass(frozen=True)
class TokenizerPin(Pin):
    """The tokenizer repo or folder, its pinned files, and the chat format's fields.

    The fields are what a chat format other than glm5 is told of the files.
    """

    # file name -> sha256: tokenizer.json, and chat_template.jinja and/or tokenizer_config.json
    sha256: dict[str, str] = field(default_factory=dict)
    # the token joined after every conversation
    eos: str | None = None
    # the tokens that end an answer
    stop: tuple[str, ...] = ()
    # template variables whose generation prompts can start an answer
    prefills: tuple[dict, ...] = ({},)
    # variables every render gets
    template_vars: dict = field(default_factory=dict)
    # what strftime_now sees (ISO date)
    render_date: str | None = None
    # which of tokenizer_config.json's named templates
    chat_template_name: str | None = None

    @property
    def files(self) -> tuple[str, ...]:
        """The pinned files, in a fixed order."""
        return tuple(name for name in TOKENIZER_FILES if name in self.sha256)


@dataclass(frozen=True)
class Ratio:
    """A ratio pinned at the number of decimals it was written with.

    ``0.674`` → 3.
    """

    text: str

    @property
    def decimals(self) -> int:
        return max(0, -Decimal(self.text).as_tuple().exponent)

    def matches(self, value: float) -> bool:
        return round(value, self.decimals) == float(self.text)


@dataclass(frozen=True)
class Expect:
    rows_sha256: str | None = None
    segments_sha256: str | None = None
    parquet_sha256: str | None = None
    parquet_bytes: int | None = None
    supervised_token_ratio: Ratio | None = None
    padding_tokens: int | None = None
    writer: str | None = None


# the figures of a file a manifest may pin (``expect.*`` but the writer)
PINNED_FIGURES = (
    "rows_sha256",
    "segments_sha256",
    "parquet_sha256",
    "parquet_bytes",
    "supervised_token_ratio",
    "padding_tokens",
)


@dataclass(frozen=True)
class Manifest:
    name: str
    # one, or the sources of a mixture in manifest order
    datasets: tuple[DatasetPin, ...]
    tokenizer: TokenizerPin
    loss_mask: str
    seed: int
    row_tokens: int
    # None: ``rows: all``, every full window the stream gives
    rows: int | None
    expect: Expect = field(default_factory=Expect)
    contract: Contract = DEFAULT
    path: Path | None = None
    # refused conversations left out (each recorded); one more stops the build; 0: the first
    leave_out_refused: int = 0
    # bounds on one conversation; they refuse, never change rows (not in the recipe)
    limits: Limits = DEFAULT_LIMITS
    # the YAML it was read from, as written (a build's report records it)
    text: str | None = field(default=None, compare=False, repr=False)

    def recipe(self) -> dict:
        """Everything the manifest says that the rows depend on, by field name.

        The names are ``dataset.revision`` and the like. A build records it in its report, so that a
        file's rows can be told from its inputs later.
        """
        return {
            **{
                field: value
                for j, pin in enumerate(self.datasets)
                for field, value in pin.recipe(
                    "dataset" if not self.mixture else f"datasets[{j}]"
                ).items()
            },
            **self.tokenizer.provenance("tokenizer"),
            **{
                f"tokenizer.sha256.{name}": digest
                for name, digest in sorted(self.tokenizer.sha256.items())
            },
            "loss_mask": self.loss_mask,
            "seed": self.seed,
            "row_tokens": self.row_tokens,
            "rows": "all" if self.rows is None else self.rows,
            **({"leave_out_refused": self.leave_out_refused} if self.leave_out_refused else {}),
            **{f"contract.{key}": value for key, value in self.contract.as_dict().items()},
        }

    @property
    def dataset(self) -> DatasetPin:
        """The pin of a manifest with one dataset (``dataset:``).

        A mixture has several (``datasets``).
        """
        if len(self.datasets) != 1:
            raise ValueError(
                f"{self.name} is a mixture of {len(self.datasets)} datasets: use .datasets"
            )
        return self.datasets[0]

    @property
    def mixture(self) -> bool:
        return len(self.datasets) > 1


def cli_command(command: str, manifest: Manifest, portable: bool = False) -> str:
    """This project's command line for ``command`` on ``manifest``.

    As it runs in this environment (this Python), or, ``portable``, as it runs wherever fixed-sft is
    installed (``fixed-sft``).
    """
    which = (
        f"--build {manifest.name}"
        if is_shipped(manifest)
        else f"--manifest {shlex.quote(str(manifest.path))}"
    )
    program = "fixed-sft" if portable else f"{shlex.quote(sys.executable)} -m builders"
    return f"{program} {command} {which}"


def is_shipped(manifest: Manifest) -> bool:
    """Whether ``manifest`` is one that comes with this install.

    A manifest with no file counts as one.
    """
    return manifest.path is None or manifest.path.parent.resolve() == shipped_manifests().resolve()


def shipped_manifests() -> Path:
    """The folder of the manifests that come with this install.

    ``builders/manifests`` in a wheel, the checkout's ``manifests/`` (beside ``builders/``)
    otherwise.
    """
    package = Path(__file__).resolve().parent
    inside = package / "manifests"
    return inside if inside.is_dir() else package.parent / "manifests"


def shipped_manifest(name: str, folder: str | Path | None = None) -> Manifest:
    """The manifest called ``name`` among the shipped ones, or in ``folder``.

    The file is ``NAME.yaml`` among those shipped with fixed-sft, or in ``folder``. Works the same
    from a checkout and from an installed wheel, whatever the working directory:
    ``RowReader(path, shipped_manifest("glm47flash-tulu3-fixed8192-v1"), verify=True)``.
    """
    if (
        not isinstance(name, str)
        or Path(name).name != name
        or name in ("", ".", "..")
        or name.endswith(".yaml")
    ):
        raise ManifestError(
            f"a manifest name is a plain name such as 'fixture-synthetic-v1', not {name!r} "
            f"(load a manifest file with load_manifest(path))"
        )
    folder = Path(folder) if folder is not None else shipped_manifests()
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ManifestError(f"no manifest {path} (known: {', '.join(known) or 'none'})")
    return load_manifest(path)


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate the manifest at ``path``."""
    path = Path(path)
    return parse_manifest(read_text(path, "manifest"), source=str(path), path=path)


def parse_manifest(text: str, source: str = "<manifest>", path: Path | None = None) -> Manifest:
    """Validate manifest YAML text; ``source`` names it in error messages."""
    return _validate(parse_yaml(text, source, "manifest"), source, path, text)


def _validate(doc, source: str, path: Path | None, text: str) -> Manifest:
    """The manifest ``doc`` (its YAML, loaded) describes; ``source`` names it."""
    check = FieldChecker(source, path.parent if path is not None else Path.cwd())
    top = check.mapping(
        doc,
        "",
        required=("name", "tokenizer", "loss_mask", "seed", "row_tokens", "rows"),
        optional=("dataset", "datasets", "expect", "contract", "limits", "leave_out_refused"),
    )
    datasets = check.datasets(top)
    tok = check.mapping(
        top["tokenizer"],
        "tokenizer",
        required=("sha256",),
        optional=(*ORIGIN_FIELDS, *FORMAT_FIELDS),
    )
    sha = check.mapping(
        tok["sha256"], "tokenizer.sha256", required=("tokenizer.json",), optional=TEMPLATE_FILES
    )
    if not any(name in sha for name in TEMPLATE_FILES):
        check.fail(
            "tokenizer.sha256.chat_template.jinja",
            "missing: pin chat_template.jinja, or tokenizer_config.json "
            "(whose chat_template is then the template)",
        )
    exp = check.mapping(
        top.get("expect") or {},
        "expect",
        optional=(*PINNED_FIGURES, "writer"),
    )
    loss_mask = check.string(top["loss_mask"], "loss_mask")
    if loss_mask not in LOSS_MASKS:
        check.fail("loss_mask", f"unknown loss mask {loss_mask!r} (known: {', '.join(LOSS_MASKS)})")
    contract = check.contract(top.get("contract"))
    if (refused := refusal(loss_mask, contract)) is not None:
        check.fail(*refused)
    return Manifest(
        name=check.plain_name(top["name"], "name"),
        datasets=datasets,
        tokenizer=TokenizerPin(
            **check.origin(tok, "tokenizer"),
            sha256={
                name: check.sha256(sha[name], f"tokenizer.sha256.{name}")
                for name in TOKENIZER_FILES
                if name in sha
            },
            **check.format_fields(tok, loss_mask),
        ),
        loss_mask=loss_mask,
        seed=check.non_negative_int(top["seed"], "seed"),
        row_tokens=check.positive_int(top["row_tokens"], "row_tokens"),
        rows=check.row_count(top["rows"]),
        expect=Expect(
            rows_sha256=check.optional(exp, "rows_sha256", "expect.rows_sha256", check.sha256),
            segments_sha256=check.optional(
                exp, "segments_sha256", "expect.segments_sha256", check.sha256
            ),
            parquet_sha256=check.optional(
                exp, "parquet_sha256", "expect.parquet_sha256", check.sha256
            ),
            parquet_bytes=check.optional(
                exp, "parquet_bytes", "expect.parquet_bytes", check.positive_int
            ),
            supervised_token_ratio=check.optional(
                exp, "supervised_token_ratio", "expect.supervised_token_ratio", check.ratio
            ),
            padding_tokens=check.optional(
                exp, "padding_tokens", "expect.padding_tokens", check.non_negative_int
            ),
            writer=check.optional(
                exp,
                "writer",
                "expect.writer",
                lambda v, f: check.pattern(v, f, _WRITER, "'pyarrow X.Y.Z'"),
            ),
        ),
        contract=contract,
        path=path,
        leave_out_refused=check.non_negative_int(
            top.get("leave_out_refused", 0), "leave_out_refused"
        ),
        limits=check.limits(top.get("limits")),
        text=text,
    )


class FieldChecker:
    """Type and form checks whose errors name the file and the field.

    The file is a manifest or a recipe card.
    """

    def __init__(self, source: str, folder: Path | None = None):
        self.source = source
        # what a relative path: resolves against (the manifest's folder)
        self.folder = Path.cwd() if folder is None else folder

    def fail(self, field_name: str, problem: str):
        raise ManifestError(f"{self.source}: {field_name or 'top level'}: {problem}")

    def any_mapping(self, value, name: str) -> dict:
        """A mapping, whatever its keys."""
        if not isinstance(value, dict):
            self.fail(name, f"expected a mapping, got {_kind(value)}")
        return value

    def mapping(self, value, name: str, required=(), optional=()) -> dict:
        for key in self.any_mapping(value, name):
            if key not in required and key not in optional:
                self.fail(
                    _join(name, str(key)),
                    f"unknown field (known: {', '.join((*required, *optional))})",
                )
        for key in required:
            if key not in value:
                self.fail(_join(name, key), "missing")
        return value

    def datasets(self, top: dict) -> tuple[DatasetPin, ...]:
        """``dataset:`` (one pin) or ``datasets:`` (a mixture), exactly one.

        A mixture's ``datasets:`` is a list of pins.
        """
        if ("dataset" in top) == ("datasets" in top):
            self.fail(
                "dataset",
                "give either dataset: (one pin) or datasets: (a list of pins, a mixture), not both"
                if "dataset" in top
                else "missing (or datasets: for a mixture)",
            )
        if "dataset" in top:
            return (self.dataset_pin(top["dataset"], "dataset", mixture=False),)
        pins = top["datasets"]
        if not isinstance(pins, list) or not pins:
            self.fail("datasets", f"expected a non-empty list of dataset pins, got {pins!r}")
        mixture = tuple(
            self.dataset_pin(pin, f"datasets[{j}]", mixture=True) for j, pin in enumerate(pins)
        )
        first: dict[tuple[str, str, str], int] = {}
        for j, pin in enumerate(mixture):
            k = first.setdefault((pin.repo, pin.revision, pin.pattern), j)
            if k != j:
                self.fail(
                    f"datasets[{j}]",
                    f"the same files as datasets[{k}] ({pin.repo} at {pin.revision}, "
                    f"{pin.pattern}): a mixture names each dataset once (its take: keeps fewer "
                    "rows)",
                )
        return mixture

    def dataset_pin(self, value, name: str, mixture: bool) -> DatasetPin:
        # a mixture's permutation is of all its sources
        optional = (
            "split",
            "license",
            "rows",
            "files",
            "messages",
            "keys",
            "roles",
            "id",
            "take",
            "tools",
            "arguments",
            *(() if mixture else ("permutation_sha256",)),
        )
        ds = self.mapping(value, name, optional=(*ORIGIN_FIELDS, "sha256", *optional))
        origin = self.origin(ds, name)
        if "sha256" in ds and "path" not in ds:
            self.fail(
                f"{name}.sha256",
                "pins a local folder's files: give it with path: (a Hub dataset's files are "
                "checked against their LFS object ids)",
            )
        files = self.optional(ds, "files", f"{name}.files", self.glob)
        if files is None and ds.get("split") is None:
            self.fail(
                f"{name}.split",
                "missing (it names the files data/{split}-*.parquet; or give files:)",
            )
        keys = {
            **dict(zip(KEY_NAMES, DEFAULT_KEYS, strict=True)),
            **self.mapping(
                ds.get("keys") or {"role": "role", "content": "content"},
                f"{name}.keys",
                required=("role", "content"),
                optional=KEY_NAMES[2:],
            ),
        }
        stored = [self.field_name(keys[key], f"{name}.keys.{key}") for key in KEY_NAMES]
        for key, field_name in zip(KEY_NAMES, stored, strict=True):
            if stored.count(field_name) > 1:
                self.fail(f"{name}.keys.{key}", f"{field_name!r} names two message keys")
        arguments = ds.get("arguments", "object")
        if arguments not in ARGUMENTS:
            self.fail(
                f"{name}.arguments",
                f"expected one of {', '.join(ARGUMENTS)}, got {arguments!r}",
            )
        roles = self.optional(ds, "roles", f"{name}.roles", self.role_names)
        take = self.optional(ds, "take", f"{name}.take", self.positive_int)
        rows = self.optional(ds, "rows", f"{name}.rows", self.positive_int)
        if take is not None and rows is not None and take > rows:
            self.fail(f"{name}.take", f"{take} is more than the dataset's rows: {rows}")
        return DatasetPin(
            **origin,
            sha256=self.file_digests(ds["sha256"], f"{name}.sha256") if "path" in ds else None,
            split=self.optional(
                ds,
                "split",
                f"{name}.split",
                lambda v, f: self.pattern(v, f, _SPLIT, "a split name such as 'train'"),
            ),
            license=self.optional(ds, "license", f"{name}.license", self.string),
            rows=rows,
            permutation_sha256=self.optional(
                ds, "permutation_sha256", f"{name}.permutation_sha256", self.sha256
            ),
            files=files,
            messages=self.field_name(ds.get("messages", "messages"), f"{name}.messages"),
            keys=tuple(stored),
            roles=roles,
            # id: null (written out) means the source index is the id; absent means the column 'id'
            id=None
            if "id" in ds and ds["id"] is None
            else self.field_name(ds.get("id", "id"), f"{name}.id"),
            take=take,
            tools=self.optional(ds, "tools", f"{name}.tools", self.field_name),
            # tools: null (written out): a row's tools field is deliberately not read
            tools_unused="tools" in ds and ds["tools"] is None,
            arguments=arguments,
        )

    def origin(self, pin: dict, name: str) -> dict:
        """``repo`` and ``revision`` (a Hub repo at a commit), or ``path`` (a local folder).

        A relative ``path`` resolves against the manifest's folder; a folder needs ``sha256``.
        """
        if "path" not in pin:
            for key in ("repo", "revision"):
                if key not in pin:
                    self.fail(
                        f"{name}.{key}",
                        "missing (or path: for a local folder, pinned by sha256:)",
                    )
            return {
                "repo": self.repo_id(pin["repo"], f"{name}.repo"),
                "revision": self.commit(pin["revision"], f"{name}.revision"),
            }
        if "repo" in pin or "revision" in pin:
            self.fail(
                f"{name}.path",
                "give path: (a local folder) or repo: and revision: (a Hub repo at a commit), "
                "not both",
            )
        if "sha256" not in pin:
            self.fail(
                f"{name}.sha256",
                "missing: a local folder is pinned by the sha256 of each file the build reads "
                "(fixed-sft pin --dataset or --tokenizer FOLDER writes them)",
            )
        text = self.field_name(pin["path"], f"{name}.path")
        return {"path": os.path.abspath(self.folder / text)}

    def file_digests(self, value, name: str) -> dict[str, str]:
        """A local folder's ``sha256:``: each file's path in it → its sha256."""
        if not isinstance(value, dict) or not value:
            self.fail(name, f"expected a mapping of file paths to sha256, got {_kind(value)}")
        return {
            self.relative_file(k, f"{name} (a file path)"): self.sha256(v, f"{name}.{k}")
            for k, v in value.items()
        }

    def relative_file(self, value, name: str) -> str:
        value = self.string(value, name)
        parts = value.split("/")
        if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
            self.fail(name, f"expected a file's path inside the folder, got {value!r}")
        return value

    def glob(self, value, name: str) -> str:
        value = self.string(value, name)
        if not value or value.startswith("/") or "\\" in value or ".." in value.split("/"):
            self.fail(
                name,
                "expected a glob of files inside the snapshot (such as 'data/*.jsonl'), "
                f"got {value!r}",
            )
        return value

    def field_name(self, value, name: str) -> str:
        value = self.string(value, name)
        if not value:
            self.fail(name, "expected a field name, got an empty string")
        return value

    def role_names(self, value, name: str) -> tuple[tuple[str, str], ...]:
        """``roles:``: stored role name → the template's role name."""
        if not isinstance(value, dict) or not value:
            self.fail(
                name,
                f"expected a mapping of stored role names to the template's, got {_kind(value)}",
            )
        return tuple(
            (self.field_name(k, f"{name} (a stored role name)"), self.field_name(v, f"{name}.{k}"))
            for k, v in value.items()
        )

    def optional(self, mapping: dict, key: str, name: str, check):
        return None if mapping.get(key) is None else check(mapping[key], name)

    def string(self, value, name: str) -> str:
        if not isinstance(value, str):
            self.fail(name, f"expected a string, got {_kind(value)} (quote it in YAML)")
        return value

    def pattern(self, value, name: str, regex: re.Pattern, what: str) -> str:
        value = self.string(value, name)
        if not regex.fullmatch(value) or ".." in value:
            self.fail(name, f"expected {what}, got {value!r}")
        return value

    def plain_name(self, value, name: str) -> str:
        return self.pattern(
            value, name, _PLAIN_NAME, "a plain file name (letters, digits, '.', '_', '-')"
        )

    def repo_id(self, value, name: str) -> str:
        return self.pattern(value, name, _REPO_ID, "a Hub repo id 'owner/name'")

    def commit(self, value, name: str) -> str:
        return self.pattern(value, name, _COMMIT, "a 40-hex commit")

    def sha256(self, value, name: str) -> str:
        return self.pattern(value, name, _SHA256, "a 64-hex sha256 (lower case)")

    def non_negative_int(self, value, name: str) -> int:
        return self.whole_number(value, name, ">= 0", 0)

    def row_count(self, value) -> int | None:
        """``rows:``, a whole number > 0, or ``all`` (None)."""
        if value == "all":
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(
                "rows",
                f"expected a whole number > 0, or all (every full row the stream gives), "
                f"got {value!r}",
            )
        return value

    def positive_int(self, value, name: str) -> int:
        return self.whole_number(value, name, "> 0", 1)

    def whole_number(self, value, name: str, bound: str, least: int) -> int:
        """An int (not a bool) of at least ``least``; ``bound`` says so in the error."""
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            self.fail(name, f"expected a whole number {bound}, got {value!r}")
        return value

    def contract(self, value) -> Contract:
        """The ``contract:`` mapping.

        Keys and values exactly as data/ROWS.md names them; absent keys take the default.
        """
        if value is None:
            return DEFAULT
        readings = self.mapping(value, "contract", optional=KEYS)
        for key, reading in readings.items():
            if reading not in valid(key):
                self.fail(
                    f"contract.{key}",
                    f"unknown reading {reading!r} (valid: {', '.join(valid(key))})",
                )
        return Contract(**readings)

    def limits(self, value) -> Limits:
        """The ``limits:`` mapping; absent keys take the default."""
        if value is None:
            return DEFAULT_LIMITS
        given = self.mapping(value, "limits", optional=LIMIT_KEYS)
        return Limits(
            **{key: self.positive_int(number, f"limits.{key}") for key, number in given.items()}
        )

    def format_fields(self, tok: dict, loss_mask: str) -> dict:
        """The chat-format fields of ``tokenizer:``.

        None for glm5 (it fixes its tokens and renders with no variables); ``eos`` and ``stop``
        required for the others.
        """
        given = [key for key in FORMAT_FIELDS if key in tok]
        if loss_mask == "glm5":
            if given:
                self.fail(
                    f"tokenizer.{given[0]}",
                    "loss_mask glm5 fixes its tokens and renders with no variables; "
                    "this field is for the other chat formats (loss_mask: turns)",
                )
            return {}
        peer = loss_mask in PEER_FORMATS
        if peer and (unused := [key for key in ("stop", "prefills") if key in tok]):
            self.fail(
                f"tokenizer.{unused[0]}",
                f"does not apply to loss_mask {loss_mask}: a peer format supervises "
                f"what the peer does, and only tokenizer.eos is joined after each "
                f"conversation (unsupervised)",
            )
        for key in ("eos",) if peer else ("eos", "stop"):
            if key not in tok:
                self.fail(f"tokenizer.{key}", f"missing (loss_mask {loss_mask} needs it)")
        fields = {"eos": self.string(tok["eos"], "tokenizer.eos")}
        if not peer:
            fields["stop"] = self.strings(tok["stop"], "tokenizer.stop")
        if "prefills" in tok:
            prefills = tok["prefills"]
            if not isinstance(prefills, list) or not prefills:
                self.fail(
                    "tokenizer.prefills",
                    f"expected a non-empty list of mappings, got {_kind(prefills)}",
                )
            fields["prefills"] = tuple(
                self.variables(v, f"tokenizer.prefills[{k}]") for k, v in enumerate(prefills)
            )
        if "template_vars" in tok:
            fields["template_vars"] = self.variables(
                tok["template_vars"], "tokenizer.template_vars"
            )
        if tok.get("render_date") is not None:
            fields["render_date"] = self.date(tok["render_date"], "tokenizer.render_date")
        if tok.get("chat_template_name") is not None:
            fields["chat_template_name"] = self.string(
                tok["chat_template_name"], "tokenizer.chat_template_name"
            )
        return fields

    def strings(self, value, name: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            self.fail(name, f"expected a non-empty list of strings, got {_kind(value)}")
        return tuple(self.string(v, f"{name}[{k}]") for k, v in enumerate(value))

    def variables(self, value, name: str) -> dict:
        """Template variables: a mapping of names to YAML data.

        A YAML date (``2024-07-26`` unquoted) becomes its ISO text, since a template sees plain JSON
        data only.
        """
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            self.fail(name, f"expected a mapping of variable names to values, got {_kind(value)}")
        for reserved in RENDER_ARGUMENTS:
            if reserved in value:
                self.fail(
                    f"{name}.{reserved}",
                    f"the builder passes {reserved} to the chat template itself "
                    f"(as apply_chat_template does); a variable cannot set it",
                )

        def plain(item):
            if isinstance(item, (date, datetime)):
                return item.isoformat()
            if isinstance(item, dict):
                return {k: plain(v) for k, v in item.items()}
            return [plain(v) for v in item] if isinstance(item, list) else item

        return plain(dict(value))

    def date(self, value, name: str) -> str:
        if isinstance(value, (date, datetime)):
            return value.isoformat()
        text = self.string(value, name)
        for parse in (date.fromisoformat, datetime.fromisoformat):
            try:
                return parse(text).isoformat()
            except ValueError:
                pass
        self.fail(name, f"expected a date (YYYY-MM-DD) or date and time (ISO 8601), got {value!r}")

    def ratio(self, value, name: str) -> Ratio:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            self.fail(name, f"expected a number, got {_kind(value)}")
        text = (
            value.text
            if isinstance(value, FloatText)
            else value
            if isinstance(value, str)
            else repr(value)
        )
        try:
            number = Decimal(text)
        except InvalidOperation:
            self.fail(name, f"expected a number, got {value!r}")
        if not number.is_finite() or not 0 <= number <= 1:
            self.fail(name, f"expected a number between 0 and 1, got {value!r}")
        return Ratio(text)


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _kind(value) -> str:
    if isinstance(value, LongInteger):
        return repr(value)
    return "nothing" if value is None else type(value).__name__
