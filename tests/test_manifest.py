import pytest
import yaml

from builders.errors import ManifestError
from builders.manifest import load_manifest, parse_manifest, shipped_manifest
from helpers import MANIFESTS


def base() -> dict:
    return yaml.safe_load((MANIFESTS / "fixture-synthetic-v1.yaml").read_text())


def test_shipped_manifests_load():
    real = load_manifest(MANIFESTS / "glm47flash-tulu3-fixed8192-v1.yaml")
    assert (real.rows, real.row_tokens, real.seed, real.loss_mask) == (6400, 8192, 42, "glm5")
    assert real.dataset.revision == "b14afda60f1bbebe55d5d2fa1e4df5042f97f8be"
    assert real.tokenizer.revision == "7dd20894a642a0aa287e9827cb1a1f7f91386b67"
    assert real.dataset.rows == 939343
    assert (
        real.expect.rows_sha256
        == "79bfe4b7e20e66ec85c12caf4995ea9574bbf6d316772e4d69193a01efe01914"
    )
    assert real.expect.supervised_token_ratio.decimals == 3
    for path in MANIFESTS.glob("*.yaml"):
        assert load_manifest(path).name == path.stem


def test_a_shipped_manifest_loads_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real = shipped_manifest("glm47flash-tulu3-fixed8192-v1")
    assert real == load_manifest(MANIFESTS / "glm47flash-tulu3-fixed8192-v1.yaml")
    with pytest.raises(
        ManifestError, match=r"no manifest .*/glm47\.yaml \(known: .*fixture-synthetic-v1"
    ):
        shipped_manifest("glm47")
    for not_a_name in ("manifests/fixture-synthetic-v1.yaml", "fixture-synthetic-v1.yaml", ".."):
        with pytest.raises(ManifestError, match="load_manifest"):
            shipped_manifest(not_a_name)


def mutate(path: str, value):
    doc = base()
    *parents, last = path.split("/")
    node = doc
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return yaml.safe_dump(doc)


@pytest.mark.parametrize(
    "path, value, named",
    [
        ("dataset/revision", "main", "dataset.revision"),
        ("dataset/revision", "12752A532A62A853F065908C4405B853F8821484", "dataset.revision"),
        ("tokenizer/revision", 1234, "tokenizer.revision"),
        ("tokenizer/sha256/tokenizer.json", "abc", "tokenizer.sha256.tokenizer.json"),
        ("tokenizer/sha256/chat_template.jinja", KeyError, "tokenizer.sha256.chat_template.jinja"),
        ("loss_mask", "glm4", "loss_mask"),
        ("name", "../escape", "name"),
        ("name", "a/b", "name"),
        ("rows", 0, "rows"),
        ("rows", True, "rows"),
        ("row_tokens", 8.5, "row_tokens"),
        ("seed", -1, "seed"),
        ("dataset/repo", "no-owner", "dataset.repo"),
        ("dataset/rows", "many", "dataset.rows"),
        ("expect/supervised_token_ratio", 1.5, "expect.supervised_token_ratio"),
        ("expect/writer", "arrow 1", "expect.writer"),
        ("expect/rows_sha256", "0" * 63, "expect.rows_sha256"),
        ("expect/surprise", 1, "expect.surprise"),
        ("dataset", KeyError, "dataset"),
    ],
)
def test_bad_field_is_named(path, value, named):
    with pytest.raises(ManifestError) as err:
        parse_manifest(mutate(path, value), source="m.yaml")
    assert f"m.yaml: {named}:" in str(err.value)


@pytest.mark.parametrize(
    "text", ["", "- a list", "name: [unclosed", "!!python/object:os.system {}"]
)
def test_not_a_manifest(text):
    with pytest.raises(ManifestError):
        parse_manifest(text)


@pytest.mark.parametrize("written", ["0.670", "'0.670'", '"0.670"'])
def test_ratio_is_compared_at_the_precision_written(written):
    """YAML reads 0.670 as the float 0.67.

    The manifest keeps the three decimals it was written with.
    """
    text = (
        (MANIFESTS / "fixture-synthetic-v1.yaml")
        .read_text()
        .replace("supervised_token_ratio: 0.5342", f"supervised_token_ratio: {written}")
    )
    ratio = parse_manifest(text).expect.supervised_token_ratio
    assert ratio.decimals == 3 and ratio.matches(0.6704) and not ratio.matches(0.6706)
    # at two decimals this would round to 0.67 and match
    assert not ratio.matches(0.6749)


@pytest.mark.parametrize(
    "contract, named, listed",
    [
        (
            {"ordr": "source"},
            "contract.ordr: unknown field",
            "known: order, encode, mask_rule, eos, final, prefill, stop, skip, hash",
        ),
        (
            {"eos": "sometimes"},
            "contract.eos: unknown reading 'sometimes'",
            "valid: after-answer, unsupervised, supervised, none",
        ),
        (
            {"mask_rule": "slime-pr1845"},
            "contract.mask_rule: unknown reading",
            "valid: structure, slime-pr1844, slime-pr1824",
        ),
        ("source", "contract: expected a mapping", ""),
    ],
)
def test_a_bad_contract_reading_is_named_with_the_valid_ones(contract, named, listed):
    doc = base()
    doc["contract"] = contract
    with pytest.raises(ManifestError) as err:
        parse_manifest(yaml.safe_dump(doc), source="m.yaml")
    assert f"m.yaml: {named}" in str(err.value) and listed in str(err.value)


def test_absent_contract_keys_take_the_defaults():
    doc = base()
    doc["contract"] = {"order": "source", "hash": "ids-u4"}
    contract = parse_manifest(yaml.safe_dump(doc)).contract
    assert contract.deviations() == {"order": "source", "hash": "ids-u4"}
    assert contract.mask_rule == "structure" and contract.eos == "after-answer"
    assert (
        load_manifest(MANIFESTS / "glm47flash-tulu3-fixed8192-v1.yaml").contract.deviations() == {}
    )
