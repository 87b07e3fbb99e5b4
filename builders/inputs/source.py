"""A build's source: the conversations of its datasets.

They are readable by source index, a block at a time. Source index ``i`` counts from 0 over the
datasets in manifest order, each one's files in sorted path order, rows in file order. A block (a
parquet row group, a run of JSON rows: ``builders.inputs.files``) is read as an Arrow table with the
columns ``index`` (the source index), ``id`` (the layout's id field, or the source index where the
layout says ``id: null``), ``source`` (null where a file has none), ``messages`` (each
``{role, content, ...}`` as the chat template names them: the layout's ``keys`` and ``roles``
applied) and ``layout_error`` (null, or why the row cannot be read as its layout says, naming the
file, the row and the field; the encoder raises it when the stream reaches the row). Every block has
one schema (a message field one file lacks is null), so tables of several files concatenate as they
are. Only the rows a caller converts become Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from builders.inputs.files import Fields, open_file
from builders.manifest import DatasetPin
from builders.messages import ROLES


@dataclass(frozen=True)
class SourceFile:
    # which of the manifest's datasets
    dataset: int
    # its path in the dataset's snapshot
    name: str
    path: Path


class Source:
    """The concatenation of ``datasets``.

    Each is a pin and its files as ``(name in the snapshot, local path)``.
    """

    def __init__(self, datasets: list[tuple[DatasetPin, list[tuple[str, Path]]]]):
        self.pins = [pin for pin, _ in datasets]
        self.files = [
            SourceFile(j, name, path)
            for j, (_, files) in enumerate(datasets)
            for name, path in files
        ]
        self._readers = [
            open_file(f.path, f.name, _fields(self.pins[f.dataset])) for f in self.files
        ]
        groups = [
            (f, b, rows)
            for f, reader in enumerate(self._readers)
            for b, rows in enumerate(reader.block_rows)
        ]
        self._group_file = np.array([f for f, _, _ in groups], dtype=np.int64)
        self._group_block = np.array([b for _, b, _ in groups], dtype=np.int64)
        self._group_start = np.cumsum([0, *(rows for _, _, rows in groups)], dtype=np.int64)
        file_rows = [sum(reader.block_rows) for reader in self._readers]
        self._file_start = np.cumsum([0, *file_rows], dtype=np.int64)
        self.dataset_rows = [
            sum(rows for f, rows in zip(self.files, file_rows, strict=True) if f.dataset == j)
            for j in range(len(self.pins))
        ]
        self.dataset_start = np.cumsum([0, *self.dataset_rows], dtype=np.int64)
        self._message_bytes = sum(reader.message_bytes for reader in self._readers)
        self.num_rows = int(self._group_start[-1])
        self.num_groups = len(groups)
        self.message_type = _message_type(
            [
                _renamed(reader.message_type, self.pins[f.dataset])
                for f, reader in zip(self.files, self._readers, strict=True)
            ]
        )

    def bytes_per_row(self) -> float:
        """The mean size of a row's messages, from the files.

        The size is that of uncompressed parquet, or of JSON text.
        """
        return self._message_bytes / max(1, self.num_rows)

    def group_rows(self, group: int) -> tuple[int, int]:
        """The first source index of block ``group`` and its number of rows."""
        return int(self._group_start[group]), int(
            self._group_start[group + 1] - self._group_start[group]
        )

    def group_of(self, indices: np.ndarray) -> np.ndarray:
        """The block of each source index."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_rows):
            raise IndexError(f"source index out of range 0..{self.num_rows - 1}")
        return np.searchsorted(self._group_start, indices, side="right") - 1

    def dataset_of(self, indices) -> np.ndarray:
        """The dataset (its place in the manifest) of each source index."""
        return (
            np.searchsorted(self.dataset_start, np.asarray(indices, dtype=np.int64), side="right")
            - 1
        )

    def read_group(self, group: int) -> pa.Table:
        """Every row of block ``group``, decoded."""
        f = int(self._group_file[group])
        table = self._readers[f].read(int(self._group_block[group]))
        first, count = self.group_rows(group)
        pin = self.pins[self.files[f].dataset]
        index = pa.array(np.arange(first, first + count, dtype=np.int64))
        messages, errors = _messages(
            table.column(pin.messages).combine_chunks(),
            pin,
            self.message_type,
            self.files[f].name,
            first - int(self._file_start[f]),
        )
        source = (
            table.column("source")
            if "source" in table.column_names
            else pa.nulls(count, pa.string())
        )
        return pa.table(
            {
                "index": index,
                "id": table.column(pin.id).cast(pa.string()) if pin.id else index.cast(pa.string()),
                "source": source,
                "messages": messages,
                "layout_error": errors,
            }
        )

    def read(self, group: int, members: np.ndarray) -> pa.Table:
        """Rows ``members`` (source indices of block ``group``), in that order."""
        return self.read_group(group).take(pa.array(np.asarray(members) - self._group_start[group]))

    def take(self, indices) -> pa.Table:
        """The rows at ``indices``, in that order, each block decoded once.

        The indices may come in any order, with repeats.
        """
        indices = np.asarray(indices, dtype=np.int64)
        groups = self.group_of(indices)
        parts = [self.read(int(g), np.unique(indices[groups == g])) for g in np.unique(groups)]
        if not parts:
            return self.read_group(0).slice(0, 0)
        table = pa.concat_tables(parts)
        return table.take(pa.array(np.searchsorted(table.column("index").to_numpy(), indices)))


def _fields(pin: DatasetPin) -> Fields:
    return Fields(pin.messages, pin.keys[0], pin.keys[1], pin.id)


def _renamed(message: pa.StructType, pin: DatasetPin) -> pa.StructType:
    """A file's message type as the template names the fields.

    The layout's ``keys`` are renamed to role and content.
    """
    if pin.keys == ("role", "content"):
        return message
    fields = [message.field(i) for i in range(message.num_fields)]
    named = {pin.keys[0]: "role", pin.keys[1]: "content"}
    return pa.struct(
        [
            f.with_name(named[f.name]) if f.name in named else f
            for f in fields
            if f.name in named or f.name not in ("role", "content")
        ]
    )


def _message_type(types: list[pa.StructType]) -> pa.DataType:
    """One ``list<struct>`` type holding every file's message fields.

    The fields are in the order first seen.
    """
    fields: dict[str, pa.Field] = {}
    for struct in types:
        for field in struct:
            fields.setdefault(field.name, field)
    return pa.list_(pa.struct(list(fields.values())))


def _messages(messages: pa.Array, pin: DatasetPin, target: pa.DataType, name: str, first_row: int):
    """A block's conversations in the ``target`` type, and its layout errors.

    The conversations as the template names them, and each row's layout error (null where there is
    none).
    """
    offsets = np.asarray(messages.offsets, dtype=np.int64)
    values = messages.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    role, content = values.field(pin.keys[0]), values.field(pin.keys[1])
    if pin.roles is not None:
        role = pa.array([b for _, b in pin.roles], pa.string()).take(
            pc.index_in(role, value_set=pa.array([a for a, _ in pin.roles], pa.string()))
        )
    bad = _true(values.is_null()) | _true(role.is_null()) | _true(content.is_null())
    if pin.roles is None and pa.types.is_string(role.type):
        bad |= ~_true(pc.is_in(role, value_set=pa.array(ROLES)))
    bad_rows = _true(messages.is_null())
    bad_rows[np.repeat(np.arange(len(messages)), np.diff(offsets))[bad]] = True
    errors = [None] * len(messages)
    for row in np.flatnonzero(bad_rows).tolist():
        errors[row] = f"{name} row {first_row + row}: {_problem(messages[row].as_py(), pin)}"
    named = {pin.keys[0]: role, pin.keys[1]: content}
    children = {
        "role": role,
        "content": content,
        **{
            f.name: values.field(f.name)
            for f in values.type
            if f.name not in (*named, "role", "content")
        },
    }
    structs = pa.StructArray.from_arrays(
        [
            children[f.name].cast(f.type) if f.name in children else pa.nulls(len(values), f.type)
            for f in target.value_type
        ],
        fields=list(target.value_type),
        mask=values.is_null(),
    )
    conversations = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), structs, type=target, mask=messages.is_null()
    )
    return conversations, pa.array(errors, pa.string())


def _problem(messages, pin: DatasetPin) -> str:
    """Why a row's conversation cannot be read as ``pin``'s layout says."""
    if messages is None:
        return f"no conversation (field {pin.messages!r} is missing or null)"
    role_key, content_key = pin.keys
    for position, message in enumerate(messages):
        if message is None:
            return f"field {pin.messages!r}: message {position} is null"
        for key, what in ((role_key, "keys.role"), (content_key, "keys.content")):
            if message.get(key) is None:
                return (
                    f"field {pin.messages!r}: message {position} has no field {key!r} "
                    f"(the layout's {what})"
                )
        if pin.roles is None and message[role_key] not in ROLES:
            return (
                f"field {pin.messages!r}: message {position} has role {message[role_key]!r}, not "
                f"one of {', '.join(ROLES)}: a dataset that names its roles otherwise maps them "
                "with the layout's roles: (ShareGPT's: roles: {system: system, human: user, gpt: "
                "assistant}; docs/datasets.md)"
            )
        mapped = dict(pin.roles or {})
        if pin.roles is not None and message[role_key] not in mapped:
            return (
                f"field {pin.messages!r}: message {position} has role {message[role_key]!r}, which "
                f"the layout's roles do not map (they map {', '.join(repr(k) for k in mapped)})"
            )
    raise AssertionError("a row flagged without a problem")


def _true(mask: pa.Array) -> np.ndarray:
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool).copy()
