"""The emulator's SQLite store: schema, transactions, reset and a JSON dump.

One connection guarded by a re-entrant lock, so gRPC handlers (event loop) and anything else
(threads) serialize cleanly; every `tx()` is one `BEGIN IMMEDIATE ... COMMIT`. With a file path
the database runs in WAL mode and each committed transaction survives a `kill -9`; with
`path=None` it lives in memory and dies with the process.

Rules that keep this safe:
- Never `await` inside a transaction: handlers run on one event loop, and a transaction held
  across an await would block (or interleave with) every other RPC. Models open and close
  their transactions in plain synchronous code.
- Helpers that run inside a caller's transaction take its connection (`db`) explicitly;
  `read()` is for read-only work and takes no SQLite write lock.
- One process per state file: the state file itself is held with an exclusive `flock` for
  the store's lifetime, so a second emulator on the same file, also through a symlink or a
  hard link (a lock is on the inode, not the name), is refused at once (StateLocked) instead
  of stalling every RPC on SQLite's busy timeout. (SQLite's own locks are POSIX `fcntl`
  locks, which Linux keeps apart from `flock`; the descriptor stays open until after the
  connection is closed, so closing it never drops SQLite's locks.)
- Nothing is written to a file before it is known to be an emulator state file of this
  schema: an empty file (or none) becomes a fresh state; anything else must be SQLite, have
  `meta` with this schema version, every table and index of SCHEMA with SCHEMA's columns
  (names, order, types, NOT NULL, defaults, keys: a renamed column is refused at start, not
  met by the first request that reads it), and pass `PRAGMA quick_check`. Otherwise
  StoreError says what is wrong and what to do, and the file is left untouched (no
  emulator table is added to an unrelated database, a dropped table is not re-created
  empty). The one exception: a file of an older version that UPGRADES covers and
  that passes the same checks is upgraded in place, in one transaction, when it is opened.
"""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 4

#: Tables added by schema version 4 (also in SCHEMA). `service_users.secret_sha256`: token
#: secrets are kept as digests only. `issued_tokens`: every token id ever issued to a service
#: user, never deleted, so that a deleted user's (or a rotation's retired) token is refused
#: as such, in every auth mode, and never mistaken for the workspace's own.
_SERVICE_USERS = """CREATE TABLE IF NOT EXISTS service_users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    token_id TEXT NOT NULL UNIQUE,
    secret_sha256 TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL DEFAULT 0,
    scoped INTEGER NOT NULL DEFAULT 1
);"""
_SERVICE_USER_ROLES = """CREATE TABLE IF NOT EXISTS service_user_roles (
    service_user_id TEXT NOT NULL,
    env_id TEXT NOT NULL,
    role TEXT NOT NULL,
    PRIMARY KEY (service_user_id, env_id)
);"""
_ISSUED_TOKENS = """CREATE TABLE IF NOT EXISTS issued_tokens (
    token_id TEXT PRIMARY KEY,
    service_user_name TEXT NOT NULL,
    issued_at REAL NOT NULL,
    retired_at REAL
);"""


#: In-place upgrades of an older state file: the statements that take schema version N to
#: N + 1, run in one transaction after the file passed every check of its own version. Each
#: step may only add columns (`ALTER TABLE t ADD COLUMN c ...`, appended last, as SCHEMA lists
#: them) or whole tables (`CREATE TABLE IF NOT EXISTS t ...`, as SCHEMA has it): the structure
#: check expects SCHEMA without the columns and tables added after N.
UPGRADES: dict[int, tuple[str, ...]] = {
    # 2 -> 3: App tags (AppSetTags/AppGetTags, AppCreate/AppPublish `tags`) and the tag set
    # each version was published with. Apps and versions recorded before had none.
    2: (
        "ALTER TABLE apps ADD COLUMN tags TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE app_versions ADD COLUMN tags TEXT NOT NULL DEFAULT '{}'",
    ),
    # 3 -> 4 (issue 32): service users, their roles and every token ever issued survive a
    # restart (before, they lived in memory and a restarted emulator in any-token mode took a
    # service user's token for the Owner's); who created or last deployed each app (its
    # containers act as that identity).
    3: (
        "ALTER TABLE apps ADD COLUMN created_by TEXT NOT NULL DEFAULT ''",
        _SERVICE_USERS,
        _SERVICE_USER_ROLES,
        _ISSUED_TOKENS,
    ),
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS environments (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    webhook_suffix TEXT NOT NULL DEFAULT '',
    is_default INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    budget_usd REAL,
    usage_usd REAL NOT NULL DEFAULT 0,
    image_builder_version TEXT NOT NULL DEFAULT '2025.06'
);
CREATE TABLE IF NOT EXISTS secrets (
    id TEXT PRIMARY KEY,
    env_id TEXT NOT NULL,
    name TEXT,
    data TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (env_id, name)
);
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    env_id TEXT NOT NULL,
    name TEXT,
    created_at REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 2,
    UNIQUE (env_id, name)
);
CREATE TABLE IF NOT EXISTS proxy_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,
    created_at REAL NOT NULL,
    scoped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS proxy_token_envs (
    token_id TEXT NOT NULL,
    env_id TEXT NOT NULL,
    PRIMARY KEY (token_id, env_id)
);
CREATE TABLE IF NOT EXISTS apps (
    id TEXT PRIMARY KEY,
    env_id TEXT NOT NULL,
    name TEXT,
    deployed_name TEXT,
    description TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    deployed_at REAL,
    stopped_at REAL,
    version INTEGER NOT NULL DEFAULT 0,
    last_heartbeat REAL,
    tags TEXT NOT NULL DEFAULT '{}',
    created_by TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS apps_deployed_name ON apps (env_id, deployed_name);
CREATE TABLE IF NOT EXISTS app_versions (
    app_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    deployed_at REAL NOT NULL,
    client_version TEXT NOT NULL DEFAULT '',
    deployed_by TEXT NOT NULL DEFAULT '',
    tag TEXT NOT NULL DEFAULT '',
    commit_hash TEXT NOT NULL DEFAULT '',
    commit_dirty INTEGER NOT NULL DEFAULT 0,
    rollback_version INTEGER NOT NULL DEFAULT 0,
    layout TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (app_id, version)
);
CREATE TABLE IF NOT EXISTS functions (
    id TEXT PRIMARY KEY,
    app_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (app_id, tag)
);
CREATE TABLE IF NOT EXISTS function_definitions (
    id TEXT PRIMARY KEY,
    function_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL,
    handle BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS classes (
    id TEXT PRIMARY KEY,
    app_id TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS images (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    built INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    built_at REAL,
    python_version TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS mounts (
    id TEXT PRIMARY KEY,
    name TEXT,
    namespace TEXT NOT NULL DEFAULT '',
    files TEXT NOT NULL,
    checksum TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS files (
    sha256 TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB,
    blob_id TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    id TEXT PRIMARY KEY,
    content_md5_b64 TEXT NOT NULL,
    content_sha256_b64 TEXT NOT NULL,
    content_length INTEGER NOT NULL,
    data BLOB,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS web_urls (
    url TEXT PRIMARY KEY,
    app_id TEXT NOT NULL,
    function_id TEXT NOT NULL
);
"""
SCHEMA += "\n".join((_SERVICE_USERS, _SERVICE_USER_ROLES, _ISSUED_TOKENS)) + "\n"

#: Tables in dependency-free order, for reset and dump.
TABLES = (
    "environments",
    "secrets",
    "volumes",
    "proxy_tokens",
    "proxy_token_envs",
    "apps",
    "app_versions",
    "functions",
    "function_definitions",
    "classes",
    "images",
    "mounts",
    "files",
    "blobs",
    "web_urls",
    "service_users",
    "service_user_roles",
    "issued_tokens",
)

#: Columns never shown by `dump()`: secret values, token secrets, file and blob bytes.
_HIDDEN_COLUMNS = {
    "secrets": {"data"},
    "proxy_tokens": {"secret_sha256"},
    "service_users": {"secret_sha256"},
    "function_definitions": {"data", "handle"},
    "files": {"data"},
    "blobs": {"data"},
}


class StoreError(Exception):
    """The state file cannot be used; the message says why and what to do."""


class StateLocked(StoreError):
    """Another process holds the state file."""


class SchemaMismatch(StoreError):
    """The state file was written by an emulator with another schema version."""


class StateDamaged(StoreError):
    """The state file is not SQLite, not an emulator state file, or is damaged."""


def _expected_objects() -> set[tuple[str, str]]:
    """(type, name) of every table and index SCHEMA creates."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(SCHEMA)
        return {
            (str(row[0]), str(row[1]))
            for row in db.execute(
                "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            )
        }
    finally:
        db.close()


#: One table's columns as SQLite reports them (`PRAGMA table_info`: name, declared type,
#: NOT NULL, default, primary-key position), or one index's columns (`PRAGMA index_info`).
Structure = dict[str, tuple[tuple[Any, ...], ...]]

_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", re.IGNORECASE)
_ADD_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)", re.IGNORECASE)


def _tables_added_after(version: int) -> set[str]:
    """Tables that UPGRADES creates after schema `version` (a file of that version lacks them)."""
    return {
        match.group(1)
        for step in range(version, SCHEMA_VERSION)
        for statement in UPGRADES.get(step, ())
        if (match := _ADD_TABLE.match(statement)) is not None
    }


def _structure(db: sqlite3.Connection) -> Structure:
    """Every table's and index's columns, keyed `table NAME` / `index NAME`."""
    out: Structure = {}
    for kind, name in db.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index')"
        " AND name NOT LIKE 'sqlite_%'"
    ).fetchall():
        pragma = "table_info" if kind == "table" else "index_info"
        rows = db.execute(f"PRAGMA {pragma}({_quote(str(name))})").fetchall()
        cols: tuple[tuple[Any, ...], ...]
        if kind == "table":  # (name, type, notnull, default, pk)
            cols = tuple((r[1], str(r[2]).upper(), r[3], r[4], r[5]) for r in rows)
        else:  # (column name) in index order
            cols = tuple((r[2],) for r in rows)
        out[f"{kind} {name}"] = cols
    return out


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _expected_structure(version: int) -> Structure:
    """The structure SCHEMA makes, without the columns UPGRADES added after `version`."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(SCHEMA)
        expected = _structure(db)
    finally:
        db.close()
    for table in _tables_added_after(version):
        expected.pop(f"table {table}", None)
    for step in range(version, SCHEMA_VERSION):
        for statement in UPGRADES.get(step, ()):
            match = _ADD_COLUMN.search(statement)
            if match is not None:
                key = f"table {match.group(1)}"
                expected[key] = tuple(c for c in expected[key] if c[0] != match.group(2))
    return expected


def _structure_differences(found: Structure, expected: Structure) -> list[str]:
    """What differs, one short phrase per table or index (objects of its own are allowed)."""
    out: list[str] = []
    for key, cols in sorted(expected.items()):
        have = found.get(key)
        if have is None or have == cols:
            continue  # a missing object is reported by the caller
        names, want = [c[0] for c in have], [c[0] for c in cols]
        lost = [n for n in want if n not in names]
        extra = [n for n in names if n not in want]
        if lost or extra:
            parts = []
            if lost:
                parts.append(f"column(s) {', '.join(lost)} missing")
            if extra:
                parts.append(f"unexpected column(s) {', '.join(extra)}")
            out.append(f"{key}: {' and '.join(parts)}")
        elif names != want:
            out.append(f"{key}: columns in another order ({', '.join(names)})")
        else:
            changed = [h[0] for h, w in zip(have, cols, strict=True) if h != w]
            out.append(
                f"{key}: column(s) {', '.join(changed)} changed (type, NOT NULL, default or key)"
            )
    return out


_WHAT_TO_DO = (
    "Restore it from a backup, or move it away (the emulator then starts with an empty "
    "state), or start with another --state FILE or --memory."
)


def _lock_holder(fd: int) -> str:
    """Who holds the flock on the file open as `fd`: its pid from /proc/locks (Linux)."""
    st = os.fstat(fd)
    identity = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                if "FLOCK" in fields and identity in fields:
                    pid = fields[fields.index(identity) - 1]
                    return f"emulator pid {pid}" if pid.isdigit() else "another process"
    except OSError:
        pass
    return "another process"


class Store:
    """SQLite database behind one lock. `path=None` keeps everything in memory."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock_file: Any = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._acquire_file_lock(self.path)
        # SQLite names its -wal/-shm files after the path it opens: open the resolved path so
        # a symlink and its target share them.
        target = str(self.path.resolve()) if self.path is not None else ":memory:"
        self._conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._last_ts = 0.0
        try:
            with self._lock:
                found = self._check_existing()
                if self.path is not None:
                    self._conn.execute("PRAGMA journal_mode=WAL")
                    self._conn.execute("PRAGMA synchronous=NORMAL")
                self._conn.execute("PRAGMA busy_timeout=5000")
                if found == 0:
                    self._conn.executescript(SCHEMA)
                    self._conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
                elif found < SCHEMA_VERSION:
                    self._upgrade(found)
        except sqlite3.Error as exc:
            self.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise StateLocked(
                    f"State file {self.path} is locked by another program (SQLite says {exc}). "
                    "Close it there, or start with another --state FILE or --memory."
                ) from None
            if "not a database" in str(exc):
                raise StateDamaged(
                    f"State file {self.path} is not a SQLite database (SQLite says {exc}), so "
                    "not an emulator state file. Pass another --state FILE (a new path is "
                    "created) or --memory."
                ) from None
            raise StateDamaged(
                f"State file {self.path} is damaged: SQLite says {exc}. {_WHAT_TO_DO}"
            ) from None
        except BaseException:
            self.close()
            raise

    def _acquire_file_lock(self, path: Path) -> None:
        # The lock is taken on the state file itself (created empty if missing): flock locks
        # the inode, so every name of the file (symlink, hard link) contends for one lock.
        try:
            # 0600 (issue 32 item 6): it holds secret values. SQLite creates its -wal/-shm
            # files with the database file's mode (os_unix.c, findCreateFileMode), so they
            # follow; a file made before with a wider mode is narrowed here.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            os.fchmod(fd, 0o600)
            handle = os.fdopen(fd, "ab")
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    side.chmod(0o600)
        except OSError as exc:
            raise StoreError(
                f"State file {path} cannot be opened ({exc.strerror}). Pass another --state "
                "FILE or --memory."
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _lock_holder(handle.fileno())
            handle.close()
            raise StateLocked(
                f"State file {path} is in use by {holder}. Stop that emulator first, or start "
                "this one with another --state FILE or --memory."
            ) from None
        self._lock_file = handle

    def _check_existing(self) -> int:
        """The file's schema version, 0 for a fresh (empty) database; StoreError unless it is
        a usable state file of this version or of one UPGRADES can bring to it."""
        tables = {
            str(row[0])
            for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            return 0
        if "meta" not in tables:
            if tables & set(TABLES):  # ours, with its meta table dropped
                raise StateDamaged(
                    f"State file {self.path} is damaged: its table meta is missing. {_WHAT_TO_DO}"
                )
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise StateDamaged(
                f"State file {self.path} is a SQLite database but not a Modal emulator state "
                f"file (it has the tables {shown} and no meta); the emulator will not add its "
                "tables to it. Pass another --state FILE (a new path is created) or --memory."
            )
        version = self._check_schema_version()
        present = {
            (str(row[0]), str(row[1]))
            for row in self._conn.execute(
                "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            )
        }
        added_later = {("table", name) for name in _tables_added_after(version)}
        missing = sorted(
            f"{kind} {name}" for kind, name in _expected_objects() - present - added_later
        )
        if missing:
            raise StateDamaged(
                f"State file {self.path} is damaged: {', '.join(missing)} missing (an emptied "
                f"table is not the same state). {_WHAT_TO_DO}"
            )
        differences = _structure_differences(_structure(self._conn), _expected_structure(version))
        if differences:
            raise StateDamaged(
                f"State file {self.path} is damaged: its structure is not the emulator's schema "
                f"version {version} ({'; '.join(differences[:4])}"
                f"{'; ...' if len(differences) > 4 else ''}). {_WHAT_TO_DO}"
            )
        problems = [str(row[0]) for row in self._conn.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise StateDamaged(
                f"State file {self.path} is damaged: SQLite's quick_check says "
                f"{'; '.join(problems)}. {_WHAT_TO_DO}"
            )
        return version

    def _check_schema_version(self) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            raise StateDamaged(
                f"State file {self.path} is damaged: its meta table has no schema_version. "
                f"{_WHAT_TO_DO}"
            )
        value = str(row["value"])
        if value == str(SCHEMA_VERSION):
            return SCHEMA_VERSION
        if (
            value.isdigit()
            and int(value) < SCHEMA_VERSION
            and all(v in UPGRADES for v in range(int(value), SCHEMA_VERSION))
        ):
            return int(value)  # upgraded in place once the file has passed every check
        raise SchemaMismatch(
            f"State file {self.path} has schema version {value}, this emulator "
            f"uses {SCHEMA_VERSION}. Move or delete the file (its state cannot be "
            "migrated), or start with another --state FILE or --memory."
        )

    def _upgrade(self, version: int) -> None:
        """Bring a checked state file of an older schema `version` to SCHEMA_VERSION, in one
        transaction (all of it or nothing)."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for step in range(version, SCHEMA_VERSION):
                for statement in UPGRADES[step]:
                    self._conn.execute(statement)
            self._conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
            )
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: commits on success, rolls back on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read-only view: consistent within the emulator's one connection, no write lock."""
        with self._lock:
            yield self._conn

    def now(self) -> float:
        """Wall-clock seconds, strictly increasing across calls (keeps pagination exact)."""
        with self._lock:
            ts = max(time.time(), self._last_ts + 1e-6)
            self._last_ts = ts
            return ts

    def reset(self) -> None:
        """Delete every row of every table (the caller re-seeds defaults)."""
        with self.tx() as db:
            for table in TABLES:
                db.execute(f"DELETE FROM {table}")  # noqa: S608 (fixed table names)

    def dump(self) -> dict[str, list[dict[str, Any]]]:
        """Every table as a list of dicts, without secret values or file/blob bytes."""
        out: dict[str, list[dict[str, Any]]] = {}
        with self._lock:
            for table in TABLES:
                hidden = _HIDDEN_COLUMNS.get(table, set())
                rows = self._conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()  # noqa: S608
                out[table] = [
                    {k: row[k] for k in row.keys() if k not in hidden}  # noqa: SIM118
                    for row in rows
                ]
        return out

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None
