"""Random bytes and random JSON to the readers: never a traceback.

Whatever a dataset file holds, opening it and reading every row ends in rows, in rows that carry
the problem that keeps them from being read (named by file and row), or in one of the builder's
errors with its documented exit code (issue 25: "a property test that feeds random bytes, random
JSON ... to the readers and asserts no traceback").
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders.errors import BuildError
from builders.inputs.layout import conversations
from builders.inputs.source import Source
from builders.manifest import DatasetPin

# exit codes a reader may end with: inputs (3), data (4)
READER_CODES = {3, 4}
NAMES = ("x.jsonl", "x.json", "x.parquet")


def read_all(path: Path, **fields) -> None:
    """Open ``path`` and read every row as a build would; only the builder's errors escape."""
    pin = DatasetPin(repo="o/d", revision="0" * 40, files=path.name, **fields)
    try:
        source = Source([(pin, [(path.name, path)])], 2000)
        for group in range(source.num_groups):
            for row in conversations(source.read_group(group)):
                error = row["layout_error"]
                assert error is None or error.startswith(f"{path.name} row "), error
                assert (row["messages"] is None) == (error is not None)
    except BuildError as err:
        assert err.exit_code in READER_CODES, err
        assert path.name in str(err) or "dataset o/d" in str(err), err


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "messages",
                    "id",
                    "tools",
                    "tool_calls",
                    "function",
                    "name",
                    "arguments",
                    "tool_call_id",
                    "reasoning_content",
                    "step_loss_mask",
                    "source",
                    "x",
                ]
            )
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "bot", ""])},
    optional={
        "content": json_values,
        "tool_calls": json_values,
        "tool_call_id": json_values,
        "name": json_values,
        "reasoning_content": json_values,
        "step_loss_mask": json_values,
    },
)
row = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "messages": st.lists(message, max_size=4) | json_values,
        "tools": json_values,
        "source": json_values,
    },
)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(data=st.binary(max_size=300), name=st.sampled_from(NAMES))
def test_random_bytes(tmp_path, data, name):
    path = tmp_path / name
    path.write_bytes(data)
    read_all(path)


@SETTINGS
@given(
    rows=st.lists(row | json_values, max_size=5),
    name=st.sampled_from(NAMES[:2]),
    tools=st.booleans(),
)
def test_random_json(tmp_path, rows, name, tools):
    path = tmp_path / name
    text = (
        "".join(json.dumps(r) + "\n" for r in rows) if name.endswith(".jsonl") else json.dumps(rows)
    )
    path.write_text(text, encoding="utf-8")
    read_all(path, **({"tools": "tools"} if tools else {}))


@SETTINGS
@given(rows=st.lists(row, min_size=1, max_size=5), tools=st.booleans())
def test_random_parquet(tmp_path, rows, tools):
    columns = dict.fromkeys(k for r in rows for k in r)
    path = tmp_path / "x.parquet"
    try:
        pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in columns}), path)
    except (pa.ArrowException, OverflowError):
        # values pyarrow cannot put in one column, or cannot write
        return
    read_all(path, **({"tools": "tools"} if tools else {}))
