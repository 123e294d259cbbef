"""Issue 14 item 12: a state file that cannot be used is refused in one line, never "repaired".

Each refusal is checked on the real process (`python -m emulator serve --state FILE`): exit 1,
exactly one `error:` line on stderr naming the file and what to do, no traceback, no ready
line, and the file left byte for byte as it was.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.store import Store
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess


def _serve(state: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m emulator serve --state STATE`, expected to refuse to start."""
    return subprocess.run(
        [sys.executable, "-m", "emulator", "serve", "--port", "0", "--state", str(state)],
        cwd=cwd,
        env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _assert_refused(proc: subprocess.CompletedProcess[str], state: Path, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stdout == ""  # no ready line
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # ONE line, no traceback, no log noise
    (line,) = lines
    assert line.startswith("error: ") and "Traceback" not in line, line
    assert str(state) in line, line
    assert "--memory" in line, line  # what to do instead
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def _valid_state(path: Path, secrets: int = 0) -> None:
    """A real emulator state file (schema + default rows), closed cleanly (WAL checkpointed)."""
    store = Store(path)
    try:
        with store.tx() as db:
            for i in range(secrets):
                db.execute(
                    "INSERT INTO secrets (id, env_id, name, data, created_at, updated_at) "
                    "VALUES (?, 'en-x', ?, ?, 0, 0)",
                    (f"st-{i}", f"s{i}", "x" * 2000),
                )
    finally:
        store.close()
    assert not Path(str(path) + "-wal").exists()  # everything is in the main file


def test_14_12_random_bytes_are_refused_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "junk.sqlite3"
    state.write_bytes(os.urandom(8192))
    before = state.read_bytes()
    _assert_refused(_serve(state, tmp_path), state, "not a SQLite database")
    assert state.read_bytes() == before


def test_14_12_text_file_is_refused_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "notes.txt"
    state.write_text("these are my notes, not a database\n" * 10)
    before = state.read_bytes()
    _assert_refused(_serve(state, tmp_path), state, "not a SQLite database")
    assert state.read_bytes() == before


def test_14_12_truncated_state_file_is_refused_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state.sqlite3"
    _valid_state(state, secrets=200)  # ~100 pages
    data = state.read_bytes()
    assert len(data) > 64 * 4096, len(data)
    state.write_bytes(data[: len(data) // 2])
    before = state.read_bytes()
    _assert_refused(_serve(state, tmp_path), state, "damaged", "backup")
    assert state.read_bytes() == before


def test_14_12_unrelated_sqlite_database_is_refused_not_extended(tmp_path: Path) -> None:
    state = tmp_path / "app.db"
    with sqlite3.connect(state) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        db.execute("INSERT INTO users (email) VALUES ('a@example.com')")
    db.close()
    before = state.read_bytes()
    line = _assert_refused(_serve(state, tmp_path), state, "not a Modal emulator state file")
    assert "users" in line  # says what it found
    assert state.read_bytes() == before  # no emulator table added, journal mode unchanged
    tables = sqlite3.connect(state).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("users",)]


@pytest.mark.parametrize("table", ["secrets", "meta", "web_urls"])
def test_14_12_dropped_table_is_corruption_not_an_empty_table(tmp_path: Path, table: str) -> None:
    state = tmp_path / "state.sqlite3"
    _valid_state(state)
    with sqlite3.connect(state) as db:
        db.execute(f"DROP TABLE {table}")
    db.close()
    before = state.read_bytes()
    line = _assert_refused(_serve(state, tmp_path), state, "damaged", "backup")
    assert table in line
    assert state.read_bytes() == before  # the table was not silently re-created empty


def test_14_12_dropped_index_is_corruption(tmp_path: Path) -> None:
    state = tmp_path / "state.sqlite3"
    _valid_state(state)
    with sqlite3.connect(state) as db:
        db.execute("DROP INDEX apps_deployed_name")  # the one-deployed-name-per-env rule
    db.close()
    _assert_refused(_serve(state, tmp_path), state, "damaged", "apps_deployed_name")


def test_14_12_empty_file_and_valid_file_still_start(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite3"
    empty.touch()  # an empty file is an empty SQLite database: a fresh state
    with EmulatorProcess(state_path=empty) as emu:
        emu.set_usage("main", 2.0)
    valid = tmp_path / "valid.sqlite3"
    _valid_state(valid, secrets=3)
    with EmulatorProcess(state_path=valid) as emu:
        assert len(emu.state()["secrets"]) == 3


def test_14_12_lock_holds_for_a_symlink(tmp_path: Path) -> None:
    state = tmp_path / "real" / "state.sqlite3"
    link = tmp_path / "link.sqlite3"
    link.symlink_to(state)
    with EmulatorProcess(state_path=state) as first:
        proc = _serve(link, tmp_path)
        _assert_refused(proc, link, f"is in use by emulator pid {first.pid}")
        assert first.state()["environments"]  # the first one still answers
    # And the other way round: first through the link, then the real path.
    with EmulatorProcess(state_path=link) as first:
        proc = _serve(state, tmp_path)
        _assert_refused(proc, state, f"is in use by emulator pid {first.pid}")


def test_14_12_lock_holds_for_a_hard_link(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state.sqlite3"
    _valid_state(state)  # a hard link needs an existing file
    other = tmp_path / "b" / "other-name.sqlite3"
    other.parent.mkdir()
    os.link(state, other)
    with EmulatorProcess(state_path=state) as first:
        proc = _serve(other, tmp_path)
        _assert_refused(proc, other, f"is in use by emulator pid {first.pid}")
        assert first.state()["environments"]
    # Once the holder stops, the other name starts fine (the lock died with it).
    with EmulatorProcess(state_path=other) as second:
        assert second.state()["environments"][0]["name"] == "main"
