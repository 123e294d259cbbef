"""Environments: names, web suffixes, the default environment, budgets and usage.

The workspace always has one default environment ("main" unless configured otherwise); an
empty environment name in any request means that default. Budgets are per environment:
`current_cycle_usage` comes from a usage figure tests set over the control surface, and the
spend limit is reached when usage >= budget (so a budget of $0 is reached at once: nothing may
be spent).

Names follow the client's environment rule (`ids.check_environment_name`); wherever a request
takes an environment name it also takes an environment id (`en-...`), as Modal resolves both.
A new environment's web suffix is derived from its name; suffixes are unique, and at most one
environment (the default, at first) has no suffix, since two would share every web URL.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from emulator.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from emulator.ids import check_environment_name, looks_like_id, new_id
from emulator.store import Store

_SUFFIX_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
MAX_SUFFIX_LEN = 32
#: Image builder versions the 1.6.4 client knows (modal._image.ImageBuilderVersion).
IMAGE_BUILDER_VERSIONS = ("2023.12", "2024.04", "2024.10", "2025.06", "2026.10", "PREVIEW")
DEFAULT_IMAGE_BUILDER_VERSION = "2025.06"


@dataclass(frozen=True)
class Environment:
    id: str
    name: str
    webhook_suffix: str
    is_default: bool
    created_at: float
    budget_usd: float | None
    usage_usd: float
    image_builder_version: str = DEFAULT_IMAGE_BUILDER_VERSION

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
        image_builder_version=row["image_builder_version"],
    )


def _check_suffix(suffix: str) -> str:
    if len(suffix) > MAX_SUFFIX_LEN or not _SUFFIX_RE.fullmatch(suffix):
        raise InvalidArgument(
            f"Invalid web suffix {suffix!r}: use 1-{MAX_SUFFIX_LEN} lowercase letters, digits "
            "and inner '-'."
        )
    return suffix


def derived_suffix(name: str) -> str:
    """The web suffix a new environment gets from its (valid) name: `My_Env` -> `my-env`."""
    text = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return text[:MAX_SUFFIX_LEN].rstrip("-")


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

    def lookup(self, name: str) -> Environment:
        """`resolve()` in its own read: for callers outside a transaction."""
        with self.store.read() as db:
            return self.resolve(name, db)

    def get(self, env_id: str) -> Environment:
        """`get_by_id()` in its own read: for callers outside a transaction."""
        with self.store.read() as db:
            return self.get_by_id(env_id, db)

    def resolve(self, name: str, db: sqlite3.Connection) -> Environment:
        """The environment called `name` (or with id `name`), the default one for ""."""
        if not name:
            row = db.execute("SELECT * FROM environments WHERE is_default = 1").fetchone()
        elif looks_like_id("environment", name):  # an environment id where a name is expected
            row = db.execute("SELECT * FROM environments WHERE id = ?", (name,)).fetchone()
        else:
            row = db.execute("SELECT * FROM environments WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(
                f"Environment {name!r} not found. Create it with `modal environment create "
                f"{name}` or pick one from `modal environment list`."
            )
        return _row(row)

    def get_by_id(self, env_id: str, db: sqlite3.Connection) -> Environment:
        row = db.execute("SELECT * FROM environments WHERE id = ?", (env_id,)).fetchone()
        if row is None:
            raise NotFound(f"Environment with id {env_id!r} not found.")
        return _row(row)

    def create(self, name: str, web_suffix: str | None = None) -> Environment:
        check_environment_name(name)
        suffix = _check_suffix(web_suffix if web_suffix else derived_suffix(name))
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
        if name and not looks_like_id("environment", name):
            check_environment_name(name, allow_periods=not create_if_missing)
        try:
            return self.lookup(name)
        except NotFound:
            if not create_if_missing:
                raise
        try:
            return self.create(name)
        except AlreadyExists:  # created concurrently
            return self.lookup(name)

    def list(self) -> list[Environment]:
        with self.store.read() as db:
            rows = db.execute(
                "SELECT * FROM environments ORDER BY is_default DESC, created_at"
            ).fetchall()
        return [_row(r) for r in rows]

    def update(
        self,
        current_name: str,
        new_name: str | None,
        web_suffix: str | None,
        image_builder_version: str | None = None,
    ) -> Environment:
        if image_builder_version is not None and image_builder_version not in (
            IMAGE_BUILDER_VERSIONS
        ):
            raise InvalidArgument(
                f"Unknown image builder version {image_builder_version!r}; use one of "
                f"{', '.join(IMAGE_BUILDER_VERSIONS)}."
            )
        with self.store.tx() as db:
            env = self.resolve(current_name, db)
            if new_name is not None and new_name != env.name:
                check_environment_name(new_name)
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
            if image_builder_version is not None:
                db.execute(
                    "UPDATE environments SET image_builder_version = ? WHERE id = ?",
                    (image_builder_version, env.id),
                )
            return self.get_by_id(env.id, db)

    def delete(self, name: str) -> Environment:
        """Delete an environment and everything scoped to it.

        Secrets, volumes, apps with their versions, functions, definitions, classes and web
        URL claims, and the environment's proxy-token allowlist entries.
        """
        if not name:
            raise InvalidArgument("EnvironmentDelete needs an environment name.")
        with self.store.tx() as db:
            env = self.resolve(name, db)
            if env.is_default:
                raise FailedPrecondition(
                    f"Environment {name!r} is the workspace's default environment and cannot be "
                    "deleted."
                )
            apps = "SELECT id FROM apps WHERE env_id = ?"
            db.execute(
                "DELETE FROM function_definitions WHERE function_id IN (SELECT id FROM"
                " functions WHERE app_id IN (SELECT id FROM apps WHERE env_id = ?))",
                (env.id,),
            )
            for table in ("functions", "classes", "app_versions", "web_urls"):
                db.execute(f"DELETE FROM {table} WHERE app_id IN ({apps})", (env.id,))  # noqa: S608
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
            what = f"Web suffix {suffix!r} is" if suffix else "No web suffix (empty) is"
            raise AlreadyExists(
                f"{what} already used by environment {row['name']!r}: two environments with "
                "the same suffix would share web URLs. Pick another suffix."
            )
