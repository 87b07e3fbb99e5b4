"""The output folder as a Hugging Face dataset: its ``README.md``.

``datasets.load_dataset(OUT)`` and the Hub read the front matter: ``configs`` name each build's
row file (one config per build in the folder, the latest the default), ``dataset_info`` their
features, written from the row file's schema so that ``datasets`` casts nothing. Without
``configs``, ``datasets`` would load the folder's most common file type: the plots. The text is
the latest build's card.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import yaml

from builders.errors import ManifestError
from builders.rows.rowfile import SCHEMA
from builders.runtime.atomic import Outputs, remove_stale_temporaries
from builders.yamlfile import parse_yaml

README = "README.md"


def write_readme(outputs: Outputs, meta: dict, report: dict, card_body: str) -> None:
    """Stage ``README.md`` among a build's outputs.

    A killed build's temporary of it is removed first (the folder's, not one build's).
    """
    remove_stale_temporaries(outputs.folder, README.removesuffix(".md"))
    text = readme_text(outputs.folder, meta, report, card_body)
    outputs.write(README, text.encode("utf-8"))


def readme_text(folder: Path, meta: dict, report: dict, card_body: str) -> str:
    """``README.md`` of ``folder`` after the build of ``report``.

    ``meta`` is that build's card metadata, ``card_body`` its card after the front matter.
    """
    builds = {**other_builds(folder, report["name"]), report["name"]: report["parquet"]}
    licenses = {_card_license(folder, name) for name in builds if name != report["name"]}
    licenses.discard(None)
    front = dict(meta)
    if licenses - {meta["license"]}:
        front["license"] = "other"
        front["license_name"] = "each build's own: see its card, NAME.md"
    front["configs"] = [
        {
            "config_name": name,
            "data_files": [{"split": "train", "path": parquet}],
            **({"default": True} if name == report["name"] else {}),
        }
        for name, parquet in sorted(builds.items())
    ]
    front["dataset_info"] = [
        {"config_name": name, "features": features(SCHEMA)} for name in sorted(builds)
    ]
    return (
        "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n" + card_body
    )


def other_builds(folder: Path, latest: str) -> dict[str, str]:
    """The other builds in ``folder``: name → row file name.

    Only those whose row file is there. A build is known by its report, ``NAME.report.json``.
    """
    builds = {}
    for report in sorted(folder.glob("*.report.json")):
        try:
            document = json.loads(report.read_text(encoding="utf-8"))
            name, parquet = document["name"], document["parquet"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        plain = isinstance(parquet, str) and Path(parquet).name == parquet
        if name != latest and plain and (folder / parquet).is_file():
            builds[name] = parquet
    return builds


def _card_license(folder: Path, name: str) -> str | None:
    try:
        text = (folder / f"{name}.md").read_text(encoding="utf-8")
        return parse_yaml(text.split("---\n", 2)[1], f"{name}.md", "data card").get("license")
    except (OSError, IndexError, AttributeError, ManifestError):
        return None


def features(schema: pa.Schema) -> list[dict]:
    """A schema as ``datasets`` writes features in a card's ``dataset_info``."""
    return [{"name": field.name, **_feature(field.type)} for field in schema]


def _feature(kind: pa.DataType) -> dict:
    if pa.types.is_list(kind):
        inner = _feature(kind.value_type)
        return {"list": inner["dtype"] if set(inner) == {"dtype"} else inner}
    if pa.types.is_struct(kind):
        return {"struct": [{"name": field.name, **_feature(field.type)} for field in kind]}
    return {"dtype": "string" if pa.types.is_string(kind) else str(kind)}
