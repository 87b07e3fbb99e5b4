"""The files a dataset may be stored in, each read a block at a time.

They are parquet, JSON Lines, or one JSON list. A reader knows, once opened, how many rows each of
its blocks holds (``block_rows``), and reads one block as a table of ``ROW_SCHEMA``
(``builders.inputs.layout``): each row's id, ``source``, messages and tools as the layout reads
them, or the problem that keeps it from being read. A parquet block is a row group: rows whose
messages hold only text fields are renamed column by column, the others (tool calls, a field the
layout does not read, a role it does not map, ...) go through the layout's row check in Python.
JSON is read with the strict ``builders.strictjson`` (duplicate keys, NaN refused), a row at a
time, a block of whole rows (about ``BLOCK_BYTES``) at a time, so memory stays bounded: JSON Lines
is cut at line ends; a single JSON list is scanned once (vectorized, a chunk at a time) for the
commas between its top-level objects. A row longer than the layout's limit is refused unread. A
row's problem (not JSON, not UTF-8, not an object, a field the layout refuses) is reported when the
build reaches the row; a file that is not what its extension says, at once.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from builders.errors import ConversationError, PinnedInputError, SourceDataError
from builders.inputs.layout import MESSAGE_TYPE, ROW_SCHEMA, Layout, problem_row, rows_table
from builders.messages import MESSAGE_KEYS, READ_ROLES, STEP_LOSS_MASK
from builders.strictjson import kind, loads

# JSON read at a time
BLOCK_BYTES = 4 << 20
# a JSON list scanned at a time for its top-level commas
SCAN_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"


def open_file(path: Path, name: str, layout: Layout):
    """The reader of ``path``, by its extension.

    ``name`` is its path in the snapshot.
    """
    if name.endswith(".parquet"):
        return ParquetFile(path, name, layout)
    if name.endswith(".jsonl"):
        return JsonLinesFile(path, name, layout)
    if name.endswith(".json"):
        return JsonListFile(path, name, layout)
    raise PinnedInputError(
        f"{name}: matched the dataset's files glob, but is not .parquet, .jsonl or .json; "
        f"narrow the glob (dataset files:)"
    )


class ParquetFile:
    """A parquet file: a block is a row group."""

    def __init__(self, path: Path, name: str, layout: Layout):
        self.path, self.name, self.layout = path, name, layout
        try:
            metadata = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:
            raise PinnedInputError(f"{name}: not a readable parquet file: {err}") from err
        schema = metadata.schema_arrow
        _check_schema(name, schema, layout)
        self.columns = [c for c in (*layout.row_fields, "source") if c in schema.names]
        self.structs = _structs(schema, layout)
        md = metadata.metadata
        # the footer, parsed once: each read's own file handle reuses it
        self.metadata = md
        self.block_rows = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        self.message_bytes = sum(
            md.row_group(g).column(c).total_uncompressed_size
            for g in range(md.num_row_groups)
            for c in range(md.num_columns)
            if md.row_group(g).column(c).path_in_schema.split(".")[0] == layout.messages
        )

    def read(self, block: int, rows: np.ndarray | None = None) -> pa.Table:
        """Block ``block``'s rows ``rows`` (None: all), in that order, as ``ROW_SCHEMA``.

        The whole row group is decoded and checked; only those rows are converted.
        """
        try:
            # a file handle of its own: reads of one ParquetFile from several threads are not
            # safe; no threads of its own: the caller decodes several blocks at once (nested
            # threads cost twice the CPU)
            table = pq.ParquetFile(self.path, metadata=self.metadata).read_row_group(
                block, columns=self.columns, use_threads=False
            )
            table.validate(full=True)
        except (pa.ArrowException, OSError) as err:
            raise PinnedInputError(f"{self.name}: cannot read row group {block}: {err}") from err
        if rows is not None:
            table = table.take(pa.array(rows, pa.int64()))
        return _parquet_rows(table, self.layout, self.structs)


def _parquet_rows(table: pa.Table, layout: Layout, structs: frozenset[str]) -> pa.Table:
    """A row group's rows as ``ROW_SCHEMA``.

    Rows whose messages hold text fields only are renamed column by column; the rest go through
    the layout's row check (``Layout.row``); rows longer than the limit are refused unconverted.
    """
    lists = table.column(layout.messages).combine_chunks()
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    values = lists.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    rows = len(lists)
    owner = np.repeat(np.arange(rows), np.diff(offsets))
    stored = {values.type.field(i).name: values.field(i) for i in range(values.type.num_fields)}
    # the UTF-8 bytes of each row's strings
    sizes = np.zeros(rows, dtype=np.int64)
    for child in stored.values():
        if _is_text(child.type):
            total = np.zeros(len(child) + 1, dtype=np.int64)
            np.cumsum(_numpy(pc.binary_length(child).fill_null(0), np.int64), out=total[1:])
            sizes += total[offsets[1:]] - total[offsets[:-1]]
    tools_field = layout.tools or layout.unread_tools
    if tools_field in table.column_names and _is_text(table.schema.field(tools_field).type):
        sizes += _numpy(pc.binary_length(table.column(tools_field)).fill_null(0), np.int64)
    long = sizes > layout.limit
    slow = _slow_rows(table, layout, lists, values, owner, stored) & ~long
    fast = _renamed(layout, lists, values, offsets, stored)
    ids = (
        table.column(layout.id).combine_chunks()
        if layout.id is not None and layout.id in table.column_names
        else pa.nulls(rows, pa.string())
    )
    sources = (
        table.column("source").combine_chunks()
        if "source" in table.column_names
        else pa.nulls(rows, pa.string())
    )
    kept = np.flatnonzero(~slow & ~long)
    special = np.flatnonzero(slow | long)
    take = pa.array(kept) if special.size else None
    parts = [
        pa.table(
            {
                "id": _taken(ids, take),
                "source": _taken(sources, take),
                "messages": _taken(fast, take),
                "tools": pa.nulls(len(kept), pa.string()),
                "string_arguments": pa.nulls(len(kept), pa.int32()),
                "problem": pa.nulls(len(kept), pa.string()),
            },
            schema=ROW_SCHEMA,
        )
    ]
    if special.size:
        raw = table.take(pa.array(special)).to_pylist() if slow.any() else None
        checked = []
        for k, row in enumerate(special.tolist()):
            if long[row]:
                checked.append(
                    problem_row(
                        layout.too_long(int(sizes[row]), "its strings"),
                        ids[row].as_py(),
                        sources[row].as_py(),
                    )
                )
            else:
                checked.append(_checked(layout, raw[k], structs))
        parts.append(rows_table(checked))
    if not special.size:
        return parts[0]
    order = np.argsort(np.concatenate([kept, special]), kind="stable")
    return pa.concat_tables(parts).combine_chunks().take(pa.array(order))


def _taken(array: pa.Array, indices: pa.Array | None) -> pa.Array:
    return array if indices is None else array.take(indices)


def _slow_rows(table, layout: Layout, lists, values, owner, stored) -> np.ndarray:
    """Rows the column-wise renaming cannot take: the layout's row check reads them."""
    odd = np.zeros(len(values), dtype=bool)
    odd |= _true(values.is_null())
    keys = layout.stored
    text_keys = {keys[k] for k in ("role", "content", "reasoning_content")}
    for name, child in stored.items():
        if name in text_keys and _is_text(child.type):
            continue
        if name == STEP_LOSS_MASK and _plain_mask(child.type):
            continue
        # a field the layout does not read, a tool field, a text field of another type
        odd |= _true(child.is_valid())
    role = stored[keys["role"]]
    if _is_text(role.type):
        allowed = [a for a, _ in layout.roles] if layout.roles is not None else list(READ_ROLES)
        odd |= ~_true(pc.is_in(role, value_set=pa.array(allowed, role.type)).fill_null(False))
        reasoning = stored.get(keys["reasoning_content"])
        if reasoning is not None:
            mapped = _mapped_roles(layout, role)
            odd |= _true(reasoning.is_valid()) & ~_true(
                pc.equal(mapped, "assistant").fill_null(False)
            )
    content = stored[keys["content"]]
    odd |= _true(content.is_null())
    slow = _true(lists.is_null()) | (np.diff(np.asarray(lists.offsets, dtype=np.int64)) == 0)
    slow[owner[odd]] = True
    for field in (layout.tools, layout.unread_tools):
        if field is not None and field in table.column_names:
            column = table.column(field).combine_chunks()
            present = _true(column.is_valid())
            if _is_text(column.type):
                present &= _numpy(pc.binary_length(column).fill_null(0), np.int64) > 0
            slow |= present
    return slow


def _renamed(layout: Layout, lists, values, offsets, stored) -> pa.Array:
    """Every row's messages in ``MESSAGE_TYPE``, renamed column by column.

    Only the rows ``_slow_rows`` leaves are right; the others are replaced.
    """
    keys = layout.stored
    count = len(values)
    children = {}
    for key in MESSAGE_KEYS:
        child = stored.get(keys[key])
        children[key] = (
            child.cast(pa.string())
            if child is not None and _is_text(child.type)
            else pa.nulls(count, pa.string())
        )
    children["role"] = _mapped_roles(layout, children["role"])
    mask = stored.get(STEP_LOSS_MASK)
    children[STEP_LOSS_MASK] = (
        mask.cast(pa.string()).fill_null("null")
        if mask is not None and _plain_mask(mask.type)
        else pa.nulls(count, pa.string())
    )
    structs = pa.StructArray.from_arrays(
        [children[f.name] for f in MESSAGE_TYPE.value_type],
        fields=list(MESSAGE_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), structs, type=MESSAGE_TYPE)


def _mapped_roles(layout: Layout, role: pa.Array) -> pa.Array:
    if layout.roles is None:
        return role
    return pa.array([b for _, b in layout.roles], pa.string()).take(
        pc.index_in(role, value_set=pa.array([a for a, _ in layout.roles], pa.string()))
    )


def _checked(layout: Layout, raw: dict, structs: frozenset[str] = frozenset()) -> dict:
    """``Layout.row`` of ``raw``, or the row of its problem."""
    try:
        return layout.row(raw, structs)
    except ConversationError as err:
        identity = raw.get(layout.id) if layout.id is not None else None
        if isinstance(identity, int) and not isinstance(identity, bool):
            identity = str(identity)
        return problem_row(
            str(err),
            identity if isinstance(identity, str) else None,
            raw.get("source") if isinstance(raw.get("source"), str) else None,
        )


class _JsonFile:
    """What both JSON readers share: a row's text read, checked, parsed."""

    # JSON Lines say so where a row is not JSON
    hint = ""

    def __init__(self, path: Path, name: str, layout: Layout):
        self.path, self.name, self.layout = path, name, layout
        self.message_bytes = path.stat().st_size

    def _rows(self, texts: list[bytes], rows: np.ndarray | None) -> pa.Table:
        """The rows ``rows`` of a block's ``texts`` (None: all), in that order."""
        if rows is not None:
            texts = [texts[row] for row in rows.tolist()]
        return rows_table([self._row(text) for text in texts])

    def _row(self, data: bytes) -> dict:
        if len(data) > self.layout.limit:
            return problem_row(self.layout.too_long(len(data), "its text"))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            return problem_row(
                f"not UTF-8 text (byte {err.start} of the row: {data[err.start : err.start + 4]!r})"
            )
        try:
            value = loads(text)
        except ValueError as err:
            return problem_row(f"{err}{self.hint}")
        if not isinstance(value, dict):
            return problem_row(f"{kind(value)}, not a JSON object")
        return _checked(self.layout, value)


class JsonLinesFile(_JsonFile):
    """JSON Lines: one object per line; a block is a run of whole lines.

    Blank lines are skipped; a leading UTF-8 byte order mark is skipped.
    """

    hint = " (JSON Lines hold one object per line)"

    def __init__(self, path: Path, name: str, layout: Layout):
        super().__init__(path, name, layout)
        self.block_rows = []
        with open(path, "rb") as file:
            at = _skip_bom(file)
            self.block_start, pending = [at], []
            while chunk := file.read(BLOCK_BYTES):
                end = chunk.rfind(b"\n") + 1
                if end == 0:
                    # a line longer than a block: read on
                    pending.append(chunk)
                    continue
                data = b"".join([*pending, chunk[:end]])
                self._add_block(data, at)
                at, pending = at + len(data), [chunk[end:]]
            rest = b"".join(pending)
            if rest:
                self._add_block(rest, at)

    def _add_block(self, data: bytes, at: int) -> None:
        lines = [line for line in data.split(b"\n") if line and not line.isspace()]
        if not self.block_rows and lines and lines[0].lstrip().startswith(b"["):
            raise SourceDataError(
                f"{self.name}: row 0 is not JSON Lines: a JSON list: name the file .json"
            )
        if lines:
            self.block_start.append(at + len(data))
            self.block_rows.append(len(lines))
        else:
            self.block_start[-1] = at + len(data)

    def read(self, block: int, rows: np.ndarray | None = None) -> pa.Table:
        with open(self.path, "rb") as file:
            file.seek(self.block_start[block])
            data = file.read(self.block_start[block + 1] - self.block_start[block])
        lines = [line for line in data.split(b"\n") if line and not line.isspace()]
        return self._rows(lines, rows)


class JsonListFile(_JsonFile):
    """One JSON list of objects; a block is a run of its objects.

    The list is ``[{...}, {...}]``, pretty-printed or not, after a UTF-8 byte order mark or not.
    """

    def __init__(self, path: Path, name: str, layout: Layout):
        super().__init__(path, name, layout)
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

    def read(self, block: int, rows: np.ndarray | None = None) -> pa.Table:
        first, end = self.first[block], self.first[block + 1]
        start = int(self.bounds[first])
        with open(self.path, "rb") as file:
            file.seek(start)
            data = file.read(int(self.bounds[end]) - start)
        cuts = [int(b) - start for b in self.bounds[first : end + 1]]
        texts = [data[a + 1 : b].strip() or b"" for a, b in itertools.pairwise(cuts)]
        return self._rows(texts, rows)


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
        raise SourceDataError(
            f"{name}: not one JSON list of objects ({problem}); JSON Lines are named .jsonl"
        )

    marks, in_string, backslashes, depth, opened, closed = [], 0, 0, 0, False, False
    with open(path, "rb") as file:
        offset = _skip_bom(file)
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


def _check_schema(name: str, schema: pa.Schema, layout: Layout) -> None:
    """A parquet file's columns as the layout names them."""
    keys = layout.stored
    expected = (
        f"expected {layout.id or '(no id)'}: string, "
        f"{layout.messages}: list<struct<{keys['role']}: string, "
        f"{keys['content']}: string, ...>>, source: string (optional)"
    )

    def fail(problem: str):
        raise PinnedInputError(f"{name}: {problem}; {expected}")

    for column in (layout.messages, layout.id):
        if column is not None and column not in schema.names:
            fail(f"no column {column!r}")
    if layout.id is not None and not _is_text(schema.field(layout.id).type):
        fail(f"column {layout.id!r} has type {schema.field(layout.id).type}")
    if "source" in schema.names and not _is_text(schema.field("source").type):
        fail(f"column 'source' has type {schema.field('source').type}")
    messages = schema.field(layout.messages).type
    if not (
        pa.types.is_list(messages) or pa.types.is_large_list(messages)
    ) or not pa.types.is_struct(messages.value_type):
        fail(f"column {layout.messages!r} has type {messages}")
    names = {messages.value_type.field(i).name for i in range(messages.value_type.num_fields)}
    for key in ("role", "content"):
        if keys[key] not in names:
            fail(f"column {layout.messages!r} has type {messages}")


def _structs(schema: pa.Schema, layout: Layout) -> frozenset[str]:
    """What a parquet file stores as structs of the tool data: ``arguments``, ``tools``.

    A struct column reads back every row's keys, absent ones as null.
    """
    out = set()
    message = schema.field(layout.messages).type.value_type
    index = message.get_field_index(layout.stored["tool_calls"])
    call = _item(message.field(index).type) if index >= 0 else None
    if call is not None:
        holders = [call]
        if call.get_field_index("function") >= 0 and pa.types.is_struct(
            call.field("function").type
        ):
            holders.append(call.field("function").type)
        if any(
            h.get_field_index("arguments") >= 0 and pa.types.is_struct(h.field("arguments").type)
            for h in holders
        ):
            out.add("arguments")
    tools = layout.tools or layout.unread_tools
    if tools in schema.names and _item(schema.field(tools).type) is not None:
        out.add("tools")
    return frozenset(out)


def _item(data_type: pa.DataType) -> pa.StructType | None:
    """The struct a list type holds (None: not a list of structs)."""
    if not (pa.types.is_list(data_type) or pa.types.is_large_list(data_type)):
        return None
    return data_type.value_type if pa.types.is_struct(data_type.value_type) else None


def _skip_bom(file) -> int:
    """Past a leading UTF-8 byte order mark, if any: the offset reading starts at."""
    at = 3 if file.read(3) == BOM else 0
    file.seek(at)
    return at


def _is_text(data_type: pa.DataType) -> bool:
    return pa.types.is_string(data_type) or pa.types.is_large_string(data_type)


def _plain_mask(data_type: pa.DataType) -> bool:
    """Whether a ``step_loss_mask`` column's values cast to their JSON text."""
    return pa.types.is_integer(data_type) or pa.types.is_boolean(data_type)


def _true(mask: pa.Array) -> np.ndarray:
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool).copy()


def _numpy(array: pa.Array, dtype) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)
