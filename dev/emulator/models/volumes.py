"""Volumes: named storage scoped to an environment (metadata only; no file contents).

Each volume has a VolumeFS version (1 or 2), fixed at creation: a request that names no
version gets DEFAULT_VERSION; one that names a version must match an existing volume's
(INVALID_ARGUMENT otherwise). Volumes have no content to overwrite, so
CREATE_OVERWRITE_IF_EXISTS is refused (the client never sends it for volumes).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from emulator.errors import AlreadyExists, InvalidArgument, NotFound
from emulator.ids import check_id, check_name, new_id
from emulator.models.common import Creation, page_bounds
from emulator.models.environments import Environment, Environments
from emulator.store import Store


@dataclass(frozen=True)
class Volume:
    id: str
    env_name: str
    name: str | None
    created_at: float
    version: int = 2


#: VolumeFS version given to volumes created without one.
DEFAULT_VERSION = 2
VERSIONS = (1, 2)


class Volumes:
    def __init__(self, store: Store, environments: Environments) -> None:
        self.store = store
        self.environments = environments

    def _load(self, db: sqlite3.Connection, row: sqlite3.Row) -> Volume:
        env = self.environments.get_by_id(row["env_id"], db)
        return Volume(
            id=row["id"],
            env_name=env.name,
            name=row["name"],
            created_at=row["created_at"],
            version=row["version"],
        )

    def get_or_create(
        self, name: str, environment: str, creation: Creation, version: int = 0
    ) -> Volume:
        """Look up / create per `creation`; `version` 0 means 'not specified'."""
        if version and version not in VERSIONS:
            raise InvalidArgument(f"Volume {name!r}: unknown VolumeFS version {version}.")
        if creation is Creation.OVERWRITE:
            raise InvalidArgument(
                f"Volume {name!r}: CREATE_OVERWRITE_IF_EXISTS is not supported for volumes; "
                "use create-if-missing, or delete the volume first."
            )
        with self.store.tx() as db:
            env = self.environments.resolve(environment, db)
            if creation is Creation.ANONYMOUS:
                return self._insert(db, env, None, version or DEFAULT_VERSION)
            check_name("Volume", name)
            row = db.execute(
                "SELECT * FROM volumes WHERE env_id = ? AND name = ?", (env.id, name)
            ).fetchone()
            if row is None:
                if creation is Creation.LOOKUP:
                    raise NotFound(f"Volume {name!r} not found in environment {env.name!r}.")
                return self._insert(db, env, name, version or DEFAULT_VERSION)
            if creation is Creation.FAIL_IF_EXISTS:
                raise AlreadyExists(
                    f"Volume {name!r} already exists in environment {env.name!r}; pick another "
                    "name or look it up with create_if_missing=True."
                )
            if version and version != row["version"]:
                raise InvalidArgument(
                    f"Volume {name!r} exists but has version v{row['version']}, not v{version} "
                    "as requested; omit the version or ask for the volume's own."
                )
            return self._load(db, row)

    def _insert(
        self, db: sqlite3.Connection, env: Environment, name: str | None, version: int
    ) -> Volume:
        volume_id = new_id("volume")
        db.execute(
            "INSERT INTO volumes (id, env_id, name, created_at, version) VALUES (?, ?, ?, ?, ?)",
            (volume_id, env.id, name, self.store.now(), version),
        )
        row = db.execute("SELECT * FROM volumes WHERE id = ?", (volume_id,)).fetchone()
        return self._load(db, row)

    def get(self, volume_id: str) -> Volume:
        check_id("volume", volume_id)
        with self.store.read() as db:
            row = db.execute("SELECT * FROM volumes WHERE id = ?", (volume_id,)).fetchone()
            if row is None:
                raise NotFound(f"Volume with id {volume_id!r} not found.")
            return self._load(db, row)

    def list(
        self, environment: str, max_objects: int = 0, created_before: float = 0.0
    ) -> tuple[Environment, list[Volume]]:
        limit, bound = page_bounds(max_objects, created_before)
        with self.store.read() as db:
            env = self.environments.resolve(environment, db)
            rows = db.execute(
                "SELECT * FROM volumes WHERE env_id = ? AND name IS NOT NULL AND created_at < ?"
                " ORDER BY created_at DESC LIMIT ?",
                (env.id, bound, limit),
            ).fetchall()
            return env, [self._load(db, r) for r in rows]

    def rename(self, volume_id: str, new_name: str) -> Volume:
        check_id("volume", volume_id)
        check_name("Volume", new_name)
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM volumes WHERE id = ?", (volume_id,)).fetchone()
            if row is None:
                raise NotFound(f"Volume with id {volume_id!r} not found.")
            clash = db.execute(
                "SELECT id FROM volumes WHERE env_id = ? AND name = ? AND id != ?",
                (row["env_id"], new_name, volume_id),
            ).fetchone()
            if clash is not None:
                raise AlreadyExists(
                    f"Cannot rename volume {row['name']!r} to {new_name!r}: a volume with that "
                    "name already exists in this environment."
                )
            db.execute("UPDATE volumes SET name = ? WHERE id = ?", (new_name, volume_id))
            row = db.execute("SELECT * FROM volumes WHERE id = ?", (volume_id,)).fetchone()
            return self._load(db, row)

    def delete(self, volume_id: str) -> None:
        check_id("volume", volume_id)
        with self.store.tx() as db:
            cur = db.execute("DELETE FROM volumes WHERE id = ?", (volume_id,))
            if cur.rowcount == 0:
                raise NotFound(f"Volume with id {volume_id!r} not found (already deleted?).")
