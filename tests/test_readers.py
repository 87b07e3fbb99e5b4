"""The readers: every message field read or refused, the same in every file type.

data/ROWS.md ("Tool calls", "Reading a dataset"): a message field the layout does not name is
refused, naming the file, the row, the id, the message and the field, from parquet, JSON Lines and
one JSON list alike; tool calls and tools are normalised as the contract says; a file that cannot
be read ends in one message and exit 4, never a traceback. Expected values are written out here by
hand from data/ROWS.md, not computed by the readers.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_layouts import lay_out

from builders.build import build
from builders.encode.encoder import EncodedConversation
from builders.errors import SourceDataError
from builders.fixture.make import synthetic_rows
from builders.inputs.layout import LIMIT_KEY, conversations, tool_counts
from builders.inputs.pinned import Hub
from builders.inputs.source import Source
from builders.manifest import DatasetPin, load_manifest
from builders.rows.packing import Packer
from builders.rows.stats import BuildStats
from helpers import run_cli

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# a bare tool, as xLAM and others store them
BARE = {"name": "add", "description": "Add", "parameters": {"type": "object", "properties": {}}}


def rows_as_users_store_them() -> list[dict]:
    """Conversations with tool calls, and some the contract refuses.

    Arguments and tools are JSON strings, as parquet (and most JSON Lines) store them.
    """
    user = {"role": "user", "content": "Weather in Paris and 2+3?"}
    return [
        {
            "id": "plain",
            "messages": [
                {"role": "system", "content": "Be brief."},
                user,
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."},
            ],
        },
        {
            "id": "openai",
            "tools": json.dumps([WEATHER, BARE]),
            "messages": [
                user,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "content": "18C", "tool_call_id": "call_1", "name": "get_weather"},
                {"role": "assistant", "content": "18C in Paris."},
            ],
        },
        {
            "id": "flat",
            "tools": json.dumps([BARE]),
            "messages": [
                user,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"name": "add", "arguments": '{"a": 2, "b": 3.5, "n": null}'},
                        {"name": "add", "arguments": '{"b": 1, "a": "é"}'},
                    ],
                },
                {"role": "tool", "content": "5.5"},
                {"role": "tool", "content": "2"},
                {"role": "assistant", "content": "5.5 and 2.", "name": "bot"},
            ],
        },
        {"id": "developer", "messages": [{"role": "developer", "content": "d"}, user]},
        {
            "id": "unknown-field",
            "messages": [user, {"role": "assistant", "content": "a", "weight": 2}],
        },
        {
            "id": "duplicate-key",
            "messages": [
                user,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"name": "add", "arguments": '{"a": 1, "a": 2}'}],
                },
            ],
        },
        {
            "id": "call-id-on-user",
            "messages": [{"role": "user", "content": "q", "tool_call_id": "x"}],
        },
        {
            "id": "no-name",
            "messages": [
                user,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"name": "", "arguments": "{}"}],
                },
            ],
        },
        {"id": "tool-without-content", "messages": [user, {"role": "tool", "name": "add"}]},
        {"id": "bad-tools", "tools": "[{", "messages": [user]},
        {
            "id": "nan",
            "messages": [
                user,
                {"role": "assistant", "tool_calls": [{"name": "add", "arguments": '{"a": NaN}'}]},
            ],
        },
    ]


# each good row as the chat formats get it, written out from data/ROWS.md
EXPECTED = {
    "plain": (
        None,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris and 2+3?"},
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."},
        ],
        None,
    ),
    "openai": (
        [WEATHER, {"type": "function", "function": BARE}],
        [
            {"role": "user", "content": "Weather in Paris and 2+3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "content": "18C", "tool_call_id": "call_1", "name": "get_weather"},
            {"role": "assistant", "content": "18C in Paris."},
        ],
        1,
    ),
    "flat": (
        [{"type": "function", "function": BARE}],
        [
            {"role": "user", "content": "Weather in Paris and 2+3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "add", "arguments": {"a": 2, "b": 3.5, "n": None}},
                    },
                    {
                        "type": "function",
                        "function": {"name": "add", "arguments": {"b": 1, "a": "é"}},
                    },
                ],
            },
            {"role": "tool", "content": "5.5"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "5.5 and 2.", "name": "bot"},
        ],
        2,
    ),
    "developer": (
        None,
        [
            {"role": "developer", "content": "d"},
            {"role": "user", "content": "Weather in Paris and 2+3?"},
        ],
        None,
    ),
}
# each refused row: the words its message must hold (after "FILE row N (id 'X'): ")
REFUSED = {
    "unknown-field": "field 'messages': message 1 has field 'weight', which the layout does not "
    "read",
    "duplicate-key": "field 'messages': message 1 (assistant)'s tool_calls[0].arguments (a JSON "
    "string) is not readable JSON (duplicate key 'a' in one object)",
    "call-id-on-user": "field 'messages': message 0 (user) has tool_call_id, which only a tool "
    "message may have",
    "no-name": "field 'messages': message 1 (assistant)'s tool_calls[0].name is empty",
    "tool-without-content": "field 'messages': message 1 has no field 'content'",
    "bad-tools": "field 'tools' (a JSON string) is not valid JSON",
    "nan": "tool_calls[0].arguments (a JSON string) is not readable JSON (NaN is not a JSON "
    "number)",
}


def write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / name
    if name.endswith(".parquet"):
        # every row's fields (from_pylist would take the first row's); nested structs are the
        # union of the rows' keys, absent ones null
        columns = dict.fromkeys(k for r in rows for k in r)
        table = pa.table({k: [r.get(k) for r in rows] for k in columns})
        pq.write_table(table, path, row_group_size=3)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path


def read(path: Path, limit: int | None = None, **fields) -> list[dict]:
    """Every row of one file as the chat formats get it, with its ``layout_error``."""
    pin = DatasetPin(repo="o/d", revision="0" * 40, files=path.name, **fields)
    source = Source([(pin, [(path.name, path)])], *([limit] if limit else []))
    return [
        row for group in range(source.num_groups) for row in conversations(source.read_group(group))
    ]


def outcome(row: dict, name: str) -> tuple:
    """What a row became: its fields, or its refusal with the file's name taken out."""
    error = row["layout_error"]
    if error is not None:
        assert error.startswith(f"{name} row {row['index']} (id {row['id']!r}): "), error
        return ("refused", row["id"], error.split(": ", 1)[1])
    return (row["id"], row["tools"], row["messages"], row["string_arguments"])


@pytest.mark.parametrize("name", ["x.parquet", "x.jsonl", "x.json"])
def test_each_file_type_reads_the_rows_as_the_contract_says(tmp_path, name):
    rows = read(write(tmp_path, name, rows_as_users_store_them()), tools="tools")
    got = {row["id"]: outcome(row, name) for row in rows}
    assert {k: v[1:] for k, v in got.items() if v[0] != "refused"} == {
        k: (tools, messages, strings) for k, (tools, messages, strings) in EXPECTED.items()
    }
    refused = {v[1]: v[2] for v in got.values() if v[0] == "refused"}
    assert set(refused) == set(REFUSED)
    for key, words in REFUSED.items():
        assert words in refused[key], (key, refused[key])


def test_the_three_file_types_give_the_same_outcome_field_by_field(tmp_path):
    outcomes = [
        [
            outcome(row, name)
            for row in read(write(tmp_path, name, rows_as_users_store_them()), tools="tools")
        ]
        for name in ("x.parquet", "x.jsonl", "x.json")
    ]
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_arguments_stored_as_objects_read_as_those_stored_as_strings(tmp_path):
    """JSON with object arguments and a tools list gives the rows of JSON strings.

    The count of string-stored calls is what differs.
    """
    as_strings = rows_as_users_store_them()[:3]
    as_objects = copy.deepcopy(as_strings)
    for row in as_objects:
        if "tools" in row:
            row["tools"] = json.loads(row["tools"])
        for m in row["messages"]:
            for call in m.get("tool_calls", []):
                holder = call.get("function", call)
                holder["arguments"] = json.loads(holder["arguments"])
    strings = read(write(tmp_path, "s.parquet", as_strings), tools="tools")
    objects = read(write(tmp_path, "o.json", as_objects), tools="tools")
    assert [r["messages"] for r in strings] == [r["messages"] for r in objects]
    assert [r["tools"] for r in strings] == [r["tools"] for r in objects]
    assert [r["string_arguments"] for r in strings] == [None, 1, 2]
    assert [r["string_arguments"] for r in objects] == [None, None, None]


def test_arguments_as_is_are_passed_unchanged(tmp_path):
    rows = read(
        write(tmp_path, "x.jsonl", rows_as_users_store_them()[1:3]),
        tools="tools",
        arguments="as-is",
    )
    calls = [
        c["function"]["arguments"]
        for r in rows
        for m in r["messages"]
        for c in m.get("tool_calls", [])
    ]
    assert calls == ['{"city": "Paris"}', '{"a": 2, "b": 3.5, "n": null}', '{"b": 1, "a": "é"}']


def test_step_loss_mask_null_is_kept_apart_from_absent(tmp_path):
    """miles reads a null ``step_loss_mask`` as not 1; the readers keep it, absent stays absent.

    In parquet every message of a file with the field has it (null where not given), as pandas
    and datasets read it for miles.
    """
    rows = [
        {
            "id": "a",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "x", "step_loss_mask": None},
                {"role": "assistant", "content": "y", "step_loss_mask": 0},
                {"role": "assistant", "content": "z"},
            ],
        }
    ]
    (jsonl,) = read(write(tmp_path, "x.jsonl", rows))
    (parquet,) = read(write(tmp_path, "x.parquet", rows))
    assert [m.get("step_loss_mask", "absent") for m in jsonl["messages"]] == [
        "absent",
        None,
        0,
        "absent",
    ]
    assert [m.get("step_loss_mask", "absent") for m in parquet["messages"]] == [None, None, 0, None]


def test_a_tools_field_the_pin_does_not_name_is_refused_unless_it_says_null(tmp_path):
    rows = [
        {"id": "t", "tools": [WEATHER], "messages": [{"role": "user", "content": "q"}]},
        {"id": "e", "tools": [], "messages": [{"role": "user", "content": "q"}]},
    ]
    for name in ("x.jsonl", "x.parquet"):
        path = write(tmp_path, name, [{**r, "tools": json.dumps(r["tools"])} for r in rows])
        first, empty = read(path)
        assert (
            "field 'tools' holds tools, but the dataset names no tools field"
            in (first["layout_error"])
        )
        assert empty["layout_error"] is None and empty["tools"] is None
        # tools: null in the pin: deliberately unread
        assert [r["layout_error"] for r in read(path, tools_unused=True)] == [None, None]


def test_parquet_struct_arguments_are_refused_with_the_reason(tmp_path):
    rows = [
        {
            "id": "s",
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {"city": "Paris"}}}],
                },
            ],
        }
    ]
    (row,) = read(write(tmp_path, "x.parquet", rows))
    assert row["layout_error"] == (
        "x.parquet row 0 (id 's'): field 'messages': message 1 has tool_calls[0] arguments "
        "stored as a parquet struct: absent keys read back as null; store arguments as JSON strings"
    )


def test_list_content_in_json_lines_says_what_to_do(tmp_path):
    rows = [
        {
            "id": "X",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
            ],
        }
    ]
    (row,) = read(write(tmp_path, "x.jsonl", rows))
    assert row["layout_error"] == (
        "x.jsonl row 0 (id 'X'): field 'messages': message 1's content is a list (parts such as "
        "{type: text, text: ...}), not a string: fixed-sft reads text content only; join the "
        "parts into one string in the source"
    )


@pytest.mark.parametrize(
    "name, data, problem",
    [
        ("x.jsonl", b'{"id": "a", "messages": []}\n\xff\xfe\n', "x.jsonl row 1: not UTF-8 text"),
        (
            "x.json",
            b'[{"id": "a", "messages": [{"role": "user", "content": "\xc3"}]}]',
            "x.json row 0: not UTF-8",
        ),
        (
            "x.jsonl",
            b'{"id": "a", "id": "b", "messages": []}\n',
            "x.jsonl row 0: not readable JSON (duplicate key 'id'",
        ),
        ("x.jsonl", b"[1]\n", "row 0 is not JSON Lines: a JSON list: name the file .json"),
        ("x.jsonl", b'{"messages": []}\n"text"\n', "x.jsonl row 1: a string, not a JSON object"),
        ("x.json", b'[{"messages": []}, null]', "x.json row 1: null, not a JSON object"),
        (
            "x.jsonl",
            b'{"a": 1e999}\n',
            "x.jsonl row 0: not readable JSON (the number 1e999 is out of range)",
        ),
        (
            "x.jsonl",
            b'{"a": Infinity}\n',
            "x.jsonl row 0: not readable JSON (Infinity is not a JSON number)",
        ),
        (
            "x.jsonl",
            b'{"id": "a", "messages": [{"role": "user", "content": "\\ud800"}]}\n',
            "x.jsonl row 0 (id 'a'): a string holds half of a surrogate pair",
        ),
        ("x.jsonl", b"[" * 100000 + b"\n", "row 0 is not JSON Lines"),
        (
            "x.jsonl",
            b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}\n",
            "x.jsonl row 0: not readable JSON (nested too deeply)",
        ),
    ],
)
def test_a_row_that_cannot_be_read_is_named(tmp_path, name, data, problem):
    path = tmp_path / name
    path.write_bytes(data)
    try:
        rows = read(path)
    except SourceDataError as err:
        assert problem in str(err)
        return
    errors = [r["layout_error"] for r in rows if r["layout_error"]]
    assert any(problem in error for error in errors), errors


@pytest.mark.parametrize(
    "name, data",
    [("x.jsonl", b""), ("x.jsonl", b"\n \n"), ("x.json", b"[]"), ("x.json", b" [ \n ] ")],
)
def test_no_rows_is_exit_4(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(SourceDataError, match=r"dataset o/d\S*: no rows \(x\.json") as err:
        read(path)
    assert err.value.exit_code == 4


@pytest.mark.parametrize("name", ["x.jsonl", "x.json"])
def test_a_leading_byte_order_mark_is_read_past(tmp_path, name):
    rows = rows_as_users_store_them()[:1]
    path = write(tmp_path, name, rows)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    (row,) = read(path)
    assert row["layout_error"] is None and row["messages"] == EXPECTED["plain"][1]


@pytest.mark.parametrize("name", ["x.parquet", "x.jsonl", "x.json"])
def test_a_row_longer_than_the_limit_is_refused_unread(tmp_path, name):
    rows = [
        {"id": "short", "messages": [{"role": "user", "content": "q" * 100}]},
        {"id": "long", "messages": [{"role": "user", "content": "q" * 5000}]},
    ]
    short, long = read(write(tmp_path, name, rows), limit=1000)
    assert short["layout_error"] is None
    assert long["messages"] is None
    assert f"longer than {LIMIT_KEY} (1,000); refused unread" in long["layout_error"]
    assert long["layout_error"].startswith(f"{name} row 1")


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "no rows"),
        (
            b'{"id": "a", "messages": [{"role": "user", "content": "\xff"}]}\n',
            "row 0: not UTF-8 text",
        ),
        (b'{"id": "a", "id": "b", "messages": []}\n', "duplicate key 'id'"),
    ],
)
def test_unreadable_json_through_the_command_line_is_exit_4(tmp_path, data, words):
    manifest = lay_out(tmp_path, [({"d.jsonl": data}, {"files": "d.jsonl"})], rows=5)
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path)
    assert done.returncode == 4, done.stderr
    assert words in done.stderr and "d.jsonl" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "layout.parquet").exists()


def test_parquet_struct_tools_are_refused_with_the_reason(tmp_path):
    rows = [
        {"id": "s", "tools": [WEATHER], "messages": [{"role": "user", "content": "q"}]},
        {"id": "b", "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"}]},
    ]
    for row in read(write(tmp_path, "x.parquet", rows), tools="tools"):
        assert row["layout_error"] == (
            f"x.parquet row {row['index']} (id {row['id']!r}): field 'tools' is stored as a "
            "parquet list of structs: absent keys read back as null; store the tools as a JSON "
            "string"
        )


def test_the_manifest_limit_reaches_the_readers(tmp_path):
    rows = [{"id": "long", "messages": [{"role": "user", "content": "q" * 3000}]}]
    manifest = lay_out(
        tmp_path,
        [({"d.jsonl": write(tmp_path, "d.jsonl", rows).read_bytes()}, {"files": "d.jsonl"})],
        rows=5,
    )
    doc = yaml.safe_load(manifest.read_text())
    doc["limits"] = {"conversation_chars": 1000}
    manifest.write_text(yaml.safe_dump(doc))
    done = run_cli("--manifest", str(manifest), "--out", str(tmp_path / "out"), hf_home=tmp_path)
    assert done.returncode == 4, done.stderr
    assert "d.jsonl row 0: its text is 3,0" in done.stderr, done.stderr
    assert f"longer than {LIMIT_KEY} (1,000)" in done.stderr


def test_the_report_and_card_count_tool_use(tmp_path):
    """Tool messages counted over what the stream consumed; a tools field left unread, named.

    The expected count comes from the rows written here and the consumed source indices in the
    built file's metadata; a build with worker processes counts the same. (Tools and calls are
    counted by ``test_build_stats_count_calls_by_stored_form`` and ``test_tool_counts_of_a_row``:
    the fixture template prints no tools.)
    """
    rows = synthetic_rows(seed=21, count=60)
    for k, row in enumerate(rows):
        row["tools"] = [BARE] if k % 3 else None
        if k % 2 == 0:
            row["messages"] = [
                *row["messages"][:2],
                {"role": "tool", "content": "r"},
                *row["messages"][2:],
            ]
    manifest = lay_out(
        tmp_path,
        [
            (
                {"d.jsonl": write(tmp_path, "d.jsonl", rows).read_bytes()},
                {"files": "d.jsonl", "tools": None},
            )
        ],
        rows=20,
        row_tokens=128,
    )
    counted = []
    for workers in (1, 2):
        result = build(
            load_manifest(manifest),
            tmp_path / f"out{workers}",
            Hub(tmp_path / "hub", offline=True),
            workers=workers,
        )
        counted.append(json.loads(result.report.read_text())["stats"]["tool_calls"])
    consumed = dict.fromkeys(
        i
        for m in pq.read_table(result.parquet).column("metadata").to_pylist()
        for i in m["source_index"]
    )
    unread = ["someone/layout-data-0 (d.jsonl)"]
    expected = {
        "conversations_with_tools": 0,
        "conversations_with_calls": 0,
        "calls": 0,
        "calls_string_arguments": 0,
        "calls_object_arguments": 0,
        "tool_messages": sum(m["role"] == "tool" for i in consumed for m in rows[i]["messages"]),
        # no calls: nothing supervised inside one
        "supervised_in_calls": 0,
        "supervised_share_in_calls": 0.0,
        "tools_field_unread": unread,
    }
    assert expected["tool_messages"]
    assert counted == [expected, expected]
    card = (tmp_path / "out2" / "layout.md").read_text()
    assert "### Tool calls" in card
    assert f"| 0 | 0 | 0 | 0 | 0 | {expected['tool_messages']:,} | 0 (0.0%) |" in card
    assert "A `tools` field is deliberately not read (`tools: null`) in: `someone/" in card


def test_build_stats_count_calls_by_stored_form():
    stats = BuildStats(8, ["d"], tools_unread=["d"])
    run = [
        EncodedConversation(
            k, f"c{k}", None, np.zeros(2, np.int32), np.ones(2, np.uint8), True, tool_counts=counts
        )
        for k, counts in enumerate([(1, 2, 1, 3, 2), (0, 0, 0, 0, 0), (0, 0, 2, 1, 1)])
    ]
    # each with its EOS: 3 tokens, all supervised
    stats.add(stats.consumed(run, Packer(8, 0).joined(run), np.zeros(3, np.int64)))
    assert stats.summary()["tool_calls"] == {
        "conversations_with_tools": 1,
        "conversations_with_calls": 2,
        "calls": 5,
        "calls_string_arguments": 2,
        "calls_object_arguments": 3,
        "tool_messages": 4,
        # 2 + 1 of the 3 × 3 supervised tokens
        "supervised_in_calls": 3,
        "supervised_share_in_calls": round(3 / 9, 4),
        "tools_field_unread": ["d"],
    }


def test_tool_counts_of_a_row(tmp_path):
    openai, flat = read(write(tmp_path, "x.jsonl", rows_as_users_store_them()[1:3]), tools="tools")
    assert tool_counts(openai) == (1, 1, 0, 1)
    assert tool_counts(flat) == (1, 2, 0, 2)


@pytest.mark.parametrize("name", ["x.parquet", "x.jsonl", "x.json"])
def test_rows_read_by_place_are_those_of_the_whole_block(tmp_path, name):
    """Converting only some rows of a block changes none of them, nor where a refusal points."""
    path = write(tmp_path, name, rows_as_users_store_them())
    pin = DatasetPin(repo="o/d", revision="0" * 40, files=path.name, tools="tools")
    source = Source([(pin, [(path.name, path)])])
    whole = {row["index"]: row for row in read(path, tools="tools")}
    assert any(row["layout_error"] for row in whole.values())
    picked = np.array([source.num_rows - 1, 0, 2, 2, source.num_rows // 2, 1])
    got = conversations(source.take(picked))
    assert got == [whole[int(i)] for i in picked]
    for row in got:
        outcome(row, name)
    for group in range(source.num_groups):
        first, count = source.group_rows(group)
        places = np.arange(count)[::-2]
        rows = conversations(source.read_group(group, places))
        assert rows == [whole[first + int(p)] for p in places]
