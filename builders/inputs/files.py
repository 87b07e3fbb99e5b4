"""The files a dataset may be stored in, each read a block at a time.

They are parquet, JSON Lines, or one JSON list, each read a block of rows at a time. A reader knows,
once opened, how many rows each of its blocks holds (``block_rows``), and reads one block as an
Arrow table of the fields a layout names (``Fields``): the conversation, the id and ``source`` where
the file has them. A parquet block is a row group. JSON is read by pyarrow's own JSON reader, a
block of whole rows (about ``BLOCK_BYTES``) at a time, so memory stays bounded for every format:
JSON Lines is cut at line ends; a single JSON list is scanned once (vectorized, a chunk at a time)
for the commas between its top-level objects, and a block of objects is handed to the reader as
concatenated objects. A JSON reader reads only the named fields (a field whose type varies from row
to row has no Arrow type); a JSON block that does not parse is read again with Python's ``json`` to
name the row and the field at fault.
"""

from __future__ import annotations

import io
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from builders.errors import PinnedInputError
from builders.messages import OPTIONAL_TEXT_FIELDS

# JSON read at a time
BLOCK_BYTES = 4 << 20
# a JSON list scanned at a time for its top-level commas
SCAN_BYTES = 1 << 20


@dataclass(frozen=True)
class Fields:
    """What a layout reads from a row.

    The conversation's field, a message's role and content fields, the id's field (None: none).
    """

    messages: str
    role: str
    content: str
    id: str | None

    def message_type(self) -> pa.DataType:
        return pa.struct(
            [(name, pa.string()) for name in (self.role, self.content, *OPTIONAL_TEXT_FIELDS)]
        )


def open_file(path: Path, name: str, fields: Fields):
    """The reader of ``path``, by its extension.

    ``name`` is its path in the snapshot.
    """
    if name.endswith(".parquet"):
        return ParquetFile(path, name, fields)
    if name.endswith(".jsonl"):
        return JsonLinesFile(path, name, fields)
    if name.endswith(".json"):
        return JsonListFile(path, name, fields)
    raise PinnedInputError(
        f"{name}: matched the dataset's files glob, but is not .parquet, .jsonl or .json; "
        f"narrow the glob (dataset files:)"
    )


class ParquetFile:
    """A parquet file: a block is a row group."""

    def __init__(self, path: Path, name: str, fields: Fields):
        self.path, self.name, self.fields = path, name, fields
        try:
            metadata = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:
            raise PinnedInputError(f"{name}: not a readable parquet file: {err}") from err
        schema = metadata.schema_arrow
        _check_schema(name, schema, fields)
        self.columns = [
            c for c in (fields.messages, fields.id, "source") if c is not None and c in schema.names
        ]
        self.message_type = schema.field(fields.messages).type.value_type
        md = metadata.metadata
        self.block_rows = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        self.message_bytes = sum(
            md.row_group(g).column(c).total_uncompressed_size
            for g in range(md.num_row_groups)
            for c in range(md.num_columns)
            if md.row_group(g).column(c).path_in_schema.split(".")[0] == fields.messages
        )

    def read(self, block: int) -> pa.Table:
        try:
            # a file handle of its own: reads of one ParquetFile from several threads are not
            # safe; no threads of its own: the caller decodes several blocks at once (nested
            # threads cost twice the CPU)
            return pq.ParquetFile(self.path).read_row_group(
                block, columns=self.columns, use_threads=False
            )
        except (pa.ArrowException, OSError) as err:
            raise PinnedInputError(f"{self.name}: cannot read row group {block}: {err}") from err


class _JsonFile:
    """What both JSON readers share.

    The schema of the named fields, a block's parse, its diagnosis.
    """

    def __init__(self, path: Path, name: str, fields: Fields):
        self.path, self.name, self.fields = path, name, fields
        self.message_type = fields.message_type()
        self.message_bytes = path.stat().st_size

    def _schema(self, id_type: pa.DataType) -> pa.Schema:
        columns = [(self.fields.messages, pa.list_(self.message_type)), ("source", pa.string())]
        if self.fields.id is not None:
            columns.append((self.fields.id, id_type))
        return pa.schema(columns)

    def _parse(self, data: bytes, rows: int, first_row: int, multiline: bool) -> pa.Table:
        """The named fields of ``rows`` JSON objects in ``data``.

        They are rows ``first_row``… of the file.
        """
        error: pa.ArrowInvalid | None = None
        # ids are strings, or whole numbers (read as their text)
        for id_type in (pa.string(), pa.int64()):
            options = pj.ParseOptions(
                explicit_schema=self._schema(id_type),
                unexpected_field_behavior="ignore",
                newlines_in_values=multiline,
            )
            try:
                table = pj.read_json(
                    io.BytesIO(data),
                    parse_options=options,
                    read_options=pj.ReadOptions(
                        use_threads=False, block_size=max(1 << 20, len(data))
                    ),
                )
            except pa.ArrowInvalid as err:
                error = err
                if self.fields.id is None or f"Column(/{self.fields.id})" not in str(err):
                    break
                continue
            if table.num_rows != rows:
                break
            if self.fields.id is not None:
                table = table.set_column(
                    table.schema.get_field_index(self.fields.id),
                    self.fields.id,
                    table.column(self.fields.id).cast(pa.string()),
                )
            return table
        problem = (
            self._diagnose(data, first_row, multiline)
            or error
            or f"{rows} objects counted from row {first_row}, but the JSON reader read another "
            "number (a stray comma?)"
        )
        raise PinnedInputError(f"{self.name}: {problem}") from error

    def _diagnose(self, data: bytes, first_row: int, multiline: bool) -> str | None:
        """The first row of ``data`` that the layout cannot read.

        That is, the first that is not a JSON object with the named fields in their types.
        """
        decoder, at, row = json.JSONDecoder(), 0, first_row
        text = data.decode("utf-8", errors="replace")
        while True:
            while at < len(text) and text[at] in " \t\r\n":
                at += 1
            if at >= len(text):
                return None
            try:
                value, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError as err:
                return (
                    f"row {row} is not valid JSON ({err.msg})"
                    f"{'' if multiline else ': not JSON Lines'}"
                )
            problem = self._problem(value)
            if problem:
                return f"row {row}: {problem}"
            row += 1

    def _problem(self, value) -> str | None:
        f = self.fields
        if not isinstance(value, dict):
            return f"a {_json_kind(value)}, not a JSON object"
        if value.get("source") is not None and not isinstance(value["source"], str):
            return f"field 'source' is a {_json_kind(value['source'])}, not a string"
        if (
            f.id is not None
            and value.get(f.id) is not None
            and (isinstance(value[f.id], bool) or not isinstance(value[f.id], (str, int)))
        ):
            return (
                f"field {f.id!r} (the id) is a {_json_kind(value[f.id])}, not a string or a "
                "whole number"
            )
        messages = value.get(f.messages)
        if messages is not None and not isinstance(messages, list):
            return f"field {f.messages!r} is a {_json_kind(messages)}, not a list of messages"
        for position, message in enumerate(messages or []):
            if message is not None and not isinstance(message, dict):
                return (
                    f"field {f.messages!r}: message {position} is a {_json_kind(message)}, "
                    "not an object"
                )
            for key in (f.role, f.content, *OPTIONAL_TEXT_FIELDS):
                if (
                    message is not None
                    and message.get(key) is not None
                    and not isinstance(message[key], str)
                ):
                    return (
                        f"field {f.messages!r}: message {position}: field {key!r} is a "
                        f"{_json_kind(message[key])}, not a string"
                    )
        return None


class JsonLinesFile(_JsonFile):
    """JSON Lines: one object per line; a block is a run of whole lines.

    Blank lines are skipped.
    """

    def __init__(self, path: Path, name: str, fields: Fields):
        super().__init__(path, name, fields)
        self.block_start, self.block_rows = [0], []
        with open(path, "rb") as file:
            rest, at, row = b"", 0, 0
            while chunk := file.read(BLOCK_BYTES):
                data = rest + chunk
                end = data.rfind(b"\n") + 1
                if end == 0:
                    # a line longer than a block: read on
                    rest = data
                    continue
                row = self._add_block(data[:end], at, row)
                at, rest = at + end, data[end:]
            if rest:
                self._add_block(rest, at, row)

    def _add_block(self, data: bytes, at: int, row: int) -> int:
        rows = 0
        for line in data.split(b"\n"):
            line = line.strip()
            if line and not line.startswith(b"{"):
                what = (
                    "a JSON list: name the file .json"
                    if row + rows == 0 and line.startswith(b"[")
                    else f"not a JSON object on a line of its own ({line[:40]!r}…)"
                )
                raise PinnedInputError(f"{self.name}: row {row + rows} is not JSON Lines: {what}")
            rows += bool(line)
        if rows:
            self.block_start.append(at + len(data))
            self.block_rows.append(rows)
        else:
            self.block_start[-1] = at + len(data)
        return row + rows

    def read(self, block: int) -> pa.Table:
        with open(self.path, "rb") as file:
            file.seek(self.block_start[block])
            data = file.read(self.block_start[block + 1] - self.block_start[block])
        return self._parse(
            data, self.block_rows[block], sum(self.block_rows[:block]), multiline=False
        )


class JsonListFile(_JsonFile):
    """One JSON list of objects; a block is a run of its objects.

    The list is ``[{...}, {...}]``, pretty-printed or not.
    """

    def __init__(self, path: Path, name: str, fields: Fields):
        super().__init__(path, name, fields)
        # the '[', the commas between objects, the ']'
        self.bounds = _top_level_commas(path, name)
        rows = len(self.bounds) - 1
        # the first object of each block, and the end
        self.first = [0]
        for k in range(1, rows):
            if self.bounds[k] - self.bounds[self.first[-1]] >= BLOCK_BYTES:
                self.first.append(k)
        self.first = [*self.first, rows] if rows else []
        self.block_rows = [b - a for a, b in itertools.pairwise(self.first)]

    def read(self, block: int) -> pa.Table:
        first, end = self.first[block], self.first[block + 1]
        start = int(self.bounds[first]) + 1
        with open(self.path, "rb") as file:
            file.seek(start)
            data = bytearray(file.read(int(self.bounds[end]) - start))
        for comma in self.bounds[first + 1 : end]:
            # the objects, concatenated
            data[int(comma) - start] = ord(" ")
        return self._parse(bytes(data), end - first, first, multiline=True)


def _top_level_commas(path: Path, name: str) -> np.ndarray:
    """Byte offsets of a JSON list's brackets and top-level commas.

    They are the offsets of its opening ``[``, the commas between its elements and its closing
    ``]``.

    The scan is vectorized over chunks: a quote counts unless an odd run of backslashes precedes
    it; characters between an odd and an even quote are inside a string; depth counts brackets
    and braces outside strings. Carried between chunks: inside a string or not, the run of
    backslashes at the chunk's end, the depth.
    """

    def fail(problem: str):
        raise PinnedInputError(
            f"{name}: not one JSON list of objects ({problem}); JSON Lines are named .jsonl"
        )

    marks, in_string, backslashes, depth, offset, opened, closed = [], 0, 0, 0, 0, False, False
    with open(path, "rb") as file:
        while chunk := file.read(SCAN_BYTES):
            b = np.frombuffer(chunk, dtype=np.uint8)
            real = _real_quotes(b, backslashes)
            candidates = np.flatnonzero(_STRUCTURAL[b])
            # outside a string: an even number of real quotes before it (with the one carried in)
            where = candidates[(np.searchsorted(real, candidates) + in_string) % 2 == 0]
            chars = b[where]
            depth_after = depth + np.cumsum(
                np.where(
                    (chars == 91) | (chars == 123),
                    1,
                    np.where((chars == 93) | (chars == 125), -1, 0),
                )
            )
            if (len(where) and closed) or (not len(where) and closed and chunk.strip()):
                fail(
                    "more after the list's closing ']' "
                    f"(byte {offset + (int(where[0]) if len(where) else 0)})"
                )
            top = (chars == 44) & (depth_after == 1)
            if len(where) and not opened:
                if chars[0] != 91 or chunk[: where[0]].strip():
                    fail("it does not start with '['")
                opened, top[0] = True, True
            elif not opened and chunk.strip():
                fail("it does not start with '['")
            if (depth_after < 0).any():
                fail(
                    "an unmatched closing bracket at byte "
                    f"{offset + int(where[np.argmax(depth_after < 0)])}"
                )
            closing = np.flatnonzero(depth_after == 0)
            if closing.size:
                k = int(closing[0])
                if k != len(where) - 1 or chunk[where[k] + 1 :].strip():
                    fail(f"more after the list's closing ']' (byte {offset + int(where[k])})")
                closed, top[k] = True, True
            marks.append(offset + where[top])
            depth = int(depth_after[-1]) if len(where) else depth
            in_string = (in_string + len(real)) % 2
            # the run of backslashes it ends with
            tail = len(chunk) - len(chunk.rstrip(b"\\"))
            backslashes = backslashes + tail if tail == len(chunk) else tail
            offset += len(b)
    if not closed:
        fail("it ends before its closing ']'" if opened else "it is empty")
    bounds = np.concatenate(marks)
    if len(bounds) == 2 and _blank_between(path, int(bounds[0]), int(bounds[1])):
        # [] : no rows
        return bounds[:1]
    return bounds


_STRUCTURAL = np.zeros(256, dtype=bool)
_STRUCTURAL[[ord(c) for c in "[]{},"]] = True


def _real_quotes(b: np.ndarray, carried: int) -> np.ndarray:
    """Positions of the quotes in ``b`` that are not escaped.

    A quote is escaped after an odd run of backslashes (``carried``: the run that ended the previous
    chunk).
    """
    quotes = np.flatnonzero(b == 34)
    slashes = np.flatnonzero(b == 92)
    if not slashes.size and not (carried % 2 and quotes.size and quotes[0] == 0):
        return quotes
    run_start = (
        slashes[np.concatenate([[True], np.diff(slashes) != 1])] if slashes.size else slashes
    )
    run_end = slashes[np.concatenate([np.diff(slashes) != 1, [True]])] if slashes.size else slashes
    length = run_end - run_start + 1 + np.where(run_start == 0, carried, 0)
    escaped = run_end[length % 2 == 1] + 1
    is_escaped = np.zeros(len(b) + 1, dtype=bool)
    is_escaped[escaped] = True
    # a chunk that starts with the escaped character
    is_escaped[0] |= carried % 2 == 1
    return quotes[~is_escaped[quotes]]


def _blank_between(path: Path, start: int, end: int) -> bool:
    """Whether the bytes between ``start`` and ``end`` are all whitespace.

    Both ends excluded.
    """
    with open(path, "rb") as file:
        file.seek(start + 1)
        while start + 1 < end:
            chunk = file.read(min(SCAN_BYTES, end - start - 1))
            if chunk.strip():
                return False
            start += len(chunk)
    return True


def _check_schema(name: str, schema: pa.Schema, fields: Fields) -> None:
    """A parquet file's columns as the layout names them."""
    expected = (
        f"expected {fields.id or '(no id)'}: string, "
        f"{fields.messages}: list<struct<{fields.role}: string, "
        f"{fields.content}: string, ...>>, source: string (optional)"
    )

    def fail(problem: str):
        raise PinnedInputError(f"{name}: {problem}; {expected}")

    for column in (fields.messages, fields.id):
        if column is not None and column not in schema.names:
            fail(f"no column {column!r}")
    if fields.id is not None and not (
        pa.types.is_string(schema.field(fields.id).type)
        or pa.types.is_large_string(schema.field(fields.id).type)
    ):
        fail(f"column {fields.id!r} has type {schema.field(fields.id).type}")
    if "source" in schema.names and not pa.types.is_string(schema.field("source").type):
        fail(f"column 'source' has type {schema.field('source').type}")
    messages = schema.field(fields.messages).type
    if not (
        pa.types.is_list(messages) or pa.types.is_large_list(messages)
    ) or not pa.types.is_struct(messages.value_type):
        fail(f"column {fields.messages!r} has type {messages}")
    types = {
        messages.value_type.field(i).name: messages.value_type.field(i).type
        for i in range(messages.value_type.num_fields)
    }
    for key in (fields.role, fields.content):
        if key not in types or not pa.types.is_string(types[key]):
            fail(f"column {fields.messages!r} has type {messages}")


def _json_kind(value) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )
