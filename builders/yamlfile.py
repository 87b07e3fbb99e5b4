"""YAML from untrusted files, bounded: every YAML the tool reads goes through here.

Manifests, recipe cards and the front matter of a data card are read by one loader. Before
anything is built, the text's size, its nesting and its node count are bounded on the parser's
events, an alias counted as every node it repeats (so a "billion laughs" alias bomb is refused
at its first 50,000 nodes, in well under a second); then ``yaml.safe_load``'s loader builds it,
keeping each float's text. Every refusal is a ``ManifestError`` (exit 2) naming the file.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from builders.errors import ManifestError

MAX_BYTES = 1 << 20  # the recipe's manifest is 1 KB, the seed card 10 KB
MAX_DEPTH = 16
# nodes as built, each alias counted as the nodes it repeats
MAX_NODES = 50_000


class FloatText(float):
    """A YAML float that remembers how it was written.

    ``0.670`` stays three decimals.
    """

    text: str


class YamlLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, keeping each float's text."""


def _float_text(loader: YamlLoader, node: yaml.ScalarNode) -> FloatText:
    value = FloatText(loader.construct_yaml_float(node))
    value.text = node.value
    return value


YamlLoader.add_constructor("tag:yaml.org,2002:float", _float_text)


def read_yaml(path: Path, what: str, loader_class: type[YamlLoader] = YamlLoader):
    """The YAML document in file ``path``, a ``what`` ("manifest"), within the bounds."""
    return parse_yaml(read_text(path, what), str(path), what, loader_class)


def read_text(path: Path, what: str) -> str:
    """The text of file ``path``, a ``what`` ("manifest"), within the size bound."""
    if not path.is_file():
        raise ManifestError(
            f"{path}: no such file" if not path.exists() else f"{path}: not a regular file"
        )
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise ManifestError(f"{path}: cannot read the {what}: {err}") from err
    _check_size(len(data), str(path), what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManifestError(f"{path}: not UTF-8 text (byte {err.start})") from err
    return text


def parse_yaml(text: str, source: str, what: str, loader_class: type[YamlLoader] = YamlLoader):
    """The YAML document in ``text``, a ``what`` that ``source`` names, within the bounds."""
    _check_size(len(text.encode("utf-8", "surrogatepass")), source, what)
    try:
        _check_shape(text, source, what)
        loader = loader_class(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ManifestError(f"{source}: not valid YAML: {err}") from err


def _check_size(size: int, source: str, what: str) -> None:
    if size > MAX_BYTES:
        raise ManifestError(f"{source}: larger than {MAX_BYTES:,} bytes, too large for a {what}")


def _check_shape(text: str, source: str, what: str) -> None:
    """Bound nesting and node count on the parser's events, before anything is built.

    An alias counts as the nodes (and the nesting) of what its anchor names.
    """
    # the open collections: the node count before each, its height so far, its anchor
    opened: list[list] = []
    # an anchor's nodes and height (a scalar's 0, a collection's 1 + its children's highest)
    anchors: dict[str, tuple[int, int]] = {}
    nodes = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionEndEvent):
            before, height, anchor = opened.pop()
            if anchor is not None:
                anchors[anchor] = (nodes - before, height)
            if opened:
                opened[-1][1] = max(opened[-1][1], height + 1)
            continue
        if isinstance(event, yaml.AliasEvent):
            # an undefined alias is the loader's error, below
            size, height = anchors.get(event.anchor, (1, 0))
        elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            size, height = 1, int(isinstance(event, yaml.CollectionStartEvent))
        else:
            continue
        line = event.start_mark.line + 1
        if len(opened) + height > MAX_DEPTH:
            raise ManifestError(
                f"{source}: line {line}: nested deeper than {MAX_DEPTH} levels, too deep for a "
                f"{what}"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            opened.append([nodes, 1, event.anchor])
        elif opened:
            opened[-1][1] = max(opened[-1][1], height + 1)
        if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
            anchors[event.anchor] = (1, 0)
        nodes += size
        if nodes > MAX_NODES:
            raise ManifestError(
                f"{source}: line {line}: more than {MAX_NODES:,} YAML nodes, too many for a "
                f"{what} (an alias counts as the nodes it repeats)"
            )
