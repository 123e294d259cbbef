"""Environments: names, web suffixes, the default environment, budgets and usage.

The workspace always has one default environment ("main" unless configured otherwise); an
empty environment name in any request means that default. Budgets are per environment:
`current_cycle_usage` comes from a usage figure tests set over the control surface, and the
spend limit is reached when usage >= budget.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from emulator.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from emulator.ids import check_name, new_id
from emulator.store import Store

_SUFFIX_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


@dataclass(frozen=True)
class Environment:
    id: str
    name: str
    webhook_suffix: str
    is_default: bool
    created_at: float
    budget_usd: float | None
    usage_usd: float

    @property
    def spend_limit_reached(self) -> bool:
        return self.budget_usd is not None and self.usage_usd >= self.budget_usd


def _row(row: sqlite3.Row) -> Environment:
    return Environment(
        id=row["id"],
        name=row["name"],
        webhook_suffix=row["webhook_suffix"],
        is_default=bool(row["is_default"]),
        created_at=row["created_at"],
        budget_usd=row["budget_usd"],
        usage_usd=row["usage_usd"],
    )


def _check_suffix(suffix: str) -> str:
    if len(suffix) > 32 or not _SUFFIX_RE.match(suffix):
        raise InvalidArgument(
            f"Invalid web suffix {suffix!r}: use 1-32 lowercase letters, digits and inner '-'."
        )
    return suffix


class Environments:
    """Environment rows; `resolve()` is what every environment-scoped request goes through."""

    def __init__(self, store: Store, default_name: str = "main") -> None:
        self.store = store
        self.default_name = default_name

    def ensure_default(self) -> Environment:
        """Create the default environment if the store has none (fresh store or after reset)."""
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM environments WHERE is_default = 1").fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO environments (id, name, webhook_suffix, is_default, created_at)"
                    " VALUES (?, ?, '', 1, ?)",
                    (new_id("environment"), self.default_name, self.store.now()),
                )
                row = db.execute("SELECT * FROM environments WHERE is_default = 1").fetchone()
        return _row(row)

    def resolve(self, name: str, db: sqlite3.Connection | None = None) -> Environment:
        """The environment called `name`, or the default one for an empty name."""
        if db is None:
            with self.store.tx() as conn:
                return self.resolve(name, conn)
        if not name:
            row = db.execute("SELECT * FROM environments WHERE is_default = 1").fetchone()
        else:
            row = db.execute("SELECT * FROM environments WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(
                f"Environment {name!r} not found. Create it with `modal environment create "
                f"{name}` or pick one from `modal environment list`."
            )
        return _row(row)

    def get_by_id(self, env_id: str, db: sqlite3.Connection | None = None) -> Environment:
        if db is None:
            with self.store.tx() as conn:
                return self.get_by_id(env_id, conn)
        row = db.execute("SELECT * FROM environments WHERE id = ?", (env_id,)).fetchone()
        if row is None:
            raise NotFound(f"Environment with id {env_id!r} not found.")
        return _row(row)

    def create(self, name: str, web_suffix: str | None = None) -> Environment:
        check_name("Environment", name)
        suffix = _check_suffix(web_suffix if web_suffix else name.lower().replace("_", "-"))
        with self.store.tx() as db:
            if db.execute("SELECT 1 FROM environments WHERE name = ?", (name,)).fetchone():
                raise AlreadyExists(f"Environment {name!r} already exists.")
            self._check_suffix_free(db, suffix, None)
            env_id = new_id("environment")
            db.execute(
                "INSERT INTO environments (id, name, webhook_suffix, is_default, created_at)"
                " VALUES (?, ?, ?, 0, ?)",
                (env_id, name, suffix, self.store.now()),
            )
            return self.get_by_id(env_id, db)

    def get_or_create(self, name: str, create_if_missing: bool) -> Environment:
        if name:
            check_name("Environment", name)
        try:
            return self.resolve(name)
        except NotFound:
            if not create_if_missing:
                raise
        try:
            return self.create(name)
        except AlreadyExists:  # created concurrently
            return self.resolve(name)

    def list(self) -> list[Environment]:
        with self.store.tx() as db:
            rows = db.execute(
                "SELECT * FROM environments ORDER BY is_default DESC, created_at"
            ).fetchall()
        return [_row(r) for r in rows]

    def update(
        self, current_name: str, new_name: str | None, web_suffix: str | None
    ) -> Environment:
        with self.store.tx() as db:
            env = self.resolve(current_name, db)
            if new_name is not None and new_name != env.name:
                check_name("Environment", new_name)
                if db.execute("SELECT 1 FROM environments WHERE name = ?", (new_name,)).fetchone():
                    raise AlreadyExists(
                        f"Cannot rename environment {env.name!r} to {new_name!r}: "
                        f"an environment named {new_name!r} already exists."
                    )
                db.execute("UPDATE environments SET name = ? WHERE id = ?", (new_name, env.id))
            if web_suffix is not None:
                if web_suffix:  # empty means "no suffix", as `modal environment update` says
                    _check_suffix(web_suffix)
                    self._check_suffix_free(db, web_suffix, env.id)
                db.execute(
                    "UPDATE environments SET webhook_suffix = ? WHERE id = ?", (web_suffix, env.id)
                )
            return self.get_by_id(env.id, db)

    def delete(self, name: str) -> Environment:
        """Delete an environment and everything scoped to it (secrets, volumes, apps)."""
        if not name:
            raise InvalidArgument("EnvironmentDelete needs an environment name.")
        with self.store.tx() as db:
            env = self.resolve(name, db)
            if env.is_default:
                raise FailedPrecondition(
                    f"Environment {name!r} is the workspace's default environment and cannot be "
                    "deleted."
                )
            for table in ("secrets", "volumes", "apps"):
                db.execute(f"DELETE FROM {table} WHERE env_id = ?", (env.id,))  # noqa: S608
            db.execute("DELETE FROM proxy_token_envs WHERE env_id = ?", (env.id,))
            db.execute("DELETE FROM environments WHERE id = ?", (env.id,))
        return env

    def set_budget(self, env_id: str, budget_usd: float | None) -> Environment:
        if budget_usd is not None and (budget_usd < 0 or budget_usd != budget_usd):
            raise InvalidArgument(
                f"Invalid budget {budget_usd!r} USD for environment {env_id}: must be >= 0."
            )
        with self.store.tx() as db:
            env = self.get_by_id(env_id, db)
            db.execute("UPDATE environments SET budget_usd = ? WHERE id = ?", (budget_usd, env.id))
            return self.get_by_id(env.id, db)

    def set_usage(self, name: str, usage_usd: float) -> Environment:
        if usage_usd < 0 or usage_usd != usage_usd:
            raise InvalidArgument(f"Invalid usage {usage_usd!r} USD: must be >= 0.")
        with self.store.tx() as db:
            env = self.resolve(name, db)
            db.execute("UPDATE environments SET usage_usd = ? WHERE id = ?", (usage_usd, env.id))
            return self.get_by_id(env.id, db)

    @staticmethod
    def _check_suffix_free(db: sqlite3.Connection, suffix: str, own_id: str | None) -> None:
        row = db.execute(
            "SELECT name FROM environments WHERE webhook_suffix = ? AND id IS NOT ?",
            (suffix, own_id),
        ).fetchone()
        if row is not None:
            raise AlreadyExists(
                f"Web suffix {suffix!r} is already used by environment {row['name']!r}."
            )
