"""The store's transaction primitives on a real state file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from emulator.store import Store


def test_reads_take_no_write_lock_and_writes_do(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    try:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        with store.read() as db:
            assert not db.in_transaction
            other.execute("BEGIN IMMEDIATE")  # the write lock is free during a read
            other.execute("ROLLBACK")
        with store.tx() as db:
            assert db.in_transaction
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                assert "locked" in str(exc)
            else:
                raise AssertionError("a write transaction must hold SQLite's write lock")
        other.close()
    finally:
        store.close()
