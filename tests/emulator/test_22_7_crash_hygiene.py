"""Issue 22 item 7: what an emulator crash leaves behind, and a state file whose structure
was changed by hand.

- A state file with a renamed column used to pass the start-up check (it compared table and
  index names only) and then failed every request touching that column (every edge request,
  for `web_urls`). The check now compares each table's and index's columns with the schema
  and refuses the file in one line, untouched.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.emulator.test_14_12_state_file import _assert_refused, _serve, _valid_state


@pytest.mark.parametrize(
    ("statement", "needle"),
    [
        ("ALTER TABLE web_urls RENAME COLUMN function_id TO fn_id", "table web_urls"),
        ("ALTER TABLE apps RENAME COLUMN state TO app_state", "table apps"),
        ("ALTER TABLE secrets ADD COLUMN note TEXT", "unexpected column(s) note"),
    ],
)
def test_22_7_a_renamed_column_is_refused_at_start(
    tmp_path: Path, statement: str, needle: str
) -> None:
    state = tmp_path / "state.sqlite3"
    _valid_state(state)
    with sqlite3.connect(state) as db:
        db.execute(statement)
    db.close()
    before = state.read_bytes()
    line = _assert_refused(_serve(state, tmp_path), state, "damaged", "backup", needle)
    assert "structure" in line
    assert state.read_bytes() == before
