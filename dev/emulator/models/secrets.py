"""Secrets: named key/value sets scoped to an environment.

Values are stored but never leave the emulator through the gRPC surface or the state dump:
responses carry key names only, like Modal's.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from emulator.errors import AlreadyExists, InvalidArgument, NotFound
from emulator.ids import check_id, check_name, new_id
from emulator.models.common import Creation, page_bounds
from emulator.models.environments import Environment, Environments
from emulator.store import Store


@dataclass(frozen=True)
class Secret:
    id: str
    env_name: str
    name: str | None
    keys: list[str]
    created_at: float
    updated_at: float


class Secrets:
    def __init__(self, store: Store, environments: Environments) -> None:
        self.store = store
        self.environments = environments

    def _load(self, db: sqlite3.Connection, row: sqlite3.Row) -> Secret:
        env = self.environments.get_by_id(row["env_id"], db)
        return Secret(
            id=row["id"],
            env_name=env.name,
            name=row["name"],
            keys=sorted(json.loads(row["data"])),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    @staticmethod
    def _check_values(values: dict[str, str]) -> None:
        for key in values:
            if not key or "=" in key or "\0" in key:
                raise InvalidArgument(f"Invalid secret key {key!r}: must be non-empty without '='.")

    def get_or_create(
        self,
        name: str,
        environment: str,
        creation: Creation,
        values: dict[str, str],
        required_keys: list[str] | None = None,
    ) -> Secret:
        self._check_values(values)
        with self.store.tx() as db:
            env = self.environments.resolve(environment, db)
            if creation is Creation.ANONYMOUS:
                return self._insert(db, env, None, values)
            check_name("Secret", name)
            row = db.execute(
                "SELECT * FROM secrets WHERE env_id = ? AND name = ?", (env.id, name)
            ).fetchone()
            if row is None:
                if creation is Creation.LOOKUP:
                    raise NotFound(f"Secret {name!r} not found in environment {env.name!r}.")
                return self._insert(db, env, name, values)
            if creation is Creation.FAIL_IF_EXISTS:
                raise AlreadyExists(
                    f"Secret {name!r} already exists in environment {env.name!r}; use "
                    "`--force` / allow_existing=True to overwrite, or pick another name."
                )
            if creation is Creation.OVERWRITE:
                db.execute(
                    "UPDATE secrets SET data = ?, updated_at = ? WHERE id = ?",
                    (json.dumps(values), self.store.now(), row["id"]),
                )
                row = db.execute("SELECT * FROM secrets WHERE id = ?", (row["id"],)).fetchone()
            secret = self._load(db, row)
        missing = sorted(set(required_keys or []) - set(secret.keys))
        if missing:
            raise NotFound(
                f"Secret {name!r} in environment {secret.env_name!r} is missing required "
                f"key(s): {', '.join(missing)}."
            )
        return secret

    def _insert(
        self, db: sqlite3.Connection, env: Environment, name: str | None, values: dict[str, str]
    ) -> Secret:
        now = self.store.now()
        secret_id = new_id("secret")
        db.execute(
            "INSERT INTO secrets (id, env_id, name, data, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (secret_id, env.id, name, json.dumps(values), now, now),
        )
        row = db.execute("SELECT * FROM secrets WHERE id = ?", (secret_id,)).fetchone()
        return self._load(db, row)

    def get(self, secret_id: str) -> Secret:
        check_id("secret", secret_id)
        with self.store.read() as db:
            row = db.execute("SELECT * FROM secrets WHERE id = ?", (secret_id,)).fetchone()
            if row is None:
                raise NotFound(f"Secret with id {secret_id!r} not found.")
            return self._load(db, row)

    def values_for_container(self, secret_id: str) -> dict[str, str]:
        """The key/value pairs, for a container's environment only (never logged or dumped)."""
        check_id("secret", secret_id)
        with self.store.read() as db:
            row = db.execute("SELECT data FROM secrets WHERE id = ?", (secret_id,)).fetchone()
        if row is None:
            raise NotFound(f"Secret with id {secret_id!r} not found.")
        values: dict[str, str] = json.loads(row["data"])
        return values

    def update(self, secret_id: str, updates: dict[str, str | None]) -> Secret:
        """Merge `updates` into the secret; a key whose value is None is removed."""
        check_id("secret", secret_id)
        self._check_values({k: v for k, v in updates.items() if v is not None})
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM secrets WHERE id = ?", (secret_id,)).fetchone()
            if row is None:
                raise NotFound(f"Secret with id {secret_id!r} not found.")
            data = json.loads(row["data"])
            for key, value in updates.items():
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
            db.execute(
                "UPDATE secrets SET data = ?, updated_at = ? WHERE id = ?",
                (json.dumps(data), self.store.now(), secret_id),
            )
            row = db.execute("SELECT * FROM secrets WHERE id = ?", (secret_id,)).fetchone()
            return self._load(db, row)

    def list(
        self, environment: str, max_objects: int = 0, created_before: float = 0.0
    ) -> tuple[Environment, list[Secret]]:
        limit, bound = page_bounds(max_objects, created_before)
        with self.store.read() as db:
            env = self.environments.resolve(environment, db)
            rows = db.execute(
                "SELECT * FROM secrets WHERE env_id = ? AND name IS NOT NULL AND created_at < ?"
                " ORDER BY created_at DESC LIMIT ?",
                (env.id, bound, limit),
            ).fetchall()
            return env, [self._load(db, r) for r in rows]

    def delete(self, secret_id: str) -> None:
        check_id("secret", secret_id)
        with self.store.tx() as db:
            cur = db.execute("DELETE FROM secrets WHERE id = ?", (secret_id,))
            if cur.rowcount == 0:
                raise NotFound(f"Secret with id {secret_id!r} not found (already deleted?).")
