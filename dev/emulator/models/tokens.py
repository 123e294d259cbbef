"""Proxy-auth tokens (Modal "webhook tokens"): id `wk-…`, secret `ws-…`, env allowlists.

The secret is generated at creation, returned once, and only its sha256 is stored; `verify()`
checks a `Modal-Key`/`Modal-Secret` pair against an environment, the way Modal's edge does.

Scoping follows Modal's CLI help ("On workspaces with RBAC enabled, tokens are scoped to
specific environments"): a token created in an RBAC workspace (emulator `--rbac`) is `scoped`
and valid only in the environments of its allowlist; without RBAC a token is workspace-wide,
valid in every environment, and the allowlist is only recorded (and listed, by environment
or, with `environment_ids()`, by token).
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import sqlite3
from dataclasses import dataclass

from emulator.errors import InvalidArgument, NotFound
from emulator.ids import check_id, new_id
from emulator.models.environments import Environments
from emulator.store import Store

MAX_TOKEN_NAME_LEN = 64


@dataclass(frozen=True)
class ProxyToken:
    id: str
    name: str
    created_at: float
    environment_ids: list[str]
    scoped: bool = False


@dataclass(frozen=True)
class CreatedToken:
    token: ProxyToken
    secret: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ProxyTokens:
    def __init__(self, store: Store, environments: Environments) -> None:
        self.store = store
        self.environments = environments

    @staticmethod
    def _check_name(name: str) -> str:
        if len(name) > MAX_TOKEN_NAME_LEN or any(ord(c) < 32 for c in name):
            raise InvalidArgument(
                f"Invalid proxy token name {name[:80]!r}: at most {MAX_TOKEN_NAME_LEN} "
                "printable characters."
            )
        return name

    def _load(self, db: sqlite3.Connection, row: sqlite3.Row) -> ProxyToken:
        envs = [
            r["env_id"]
            for r in db.execute(
                "SELECT env_id FROM proxy_token_envs WHERE token_id = ? ORDER BY env_id",
                (row["id"],),
            ).fetchall()
        ]
        return ProxyToken(
            id=row["id"],
            name=row["name"],
            created_at=row["created_at"],
            environment_ids=envs,
            scoped=bool(row["scoped"]),
        )

    def _row(self, db: sqlite3.Connection, token_id: str) -> sqlite3.Row:
        check_id("proxy_token", token_id)
        row = db.execute("SELECT * FROM proxy_tokens WHERE id = ?", (token_id,)).fetchone()
        if row is None:
            raise NotFound(f"Proxy token {token_id!r} not found (deleted, or never created).")
        return row

    def create(self, name: str, scoped: bool = False) -> CreatedToken:
        """A new token; `scoped` (RBAC workspaces) limits it to its environment allowlist."""
        self._check_name(name)
        token_id = new_id("proxy_token")
        secret = new_id("proxy_token_secret")
        with self.store.tx() as db:
            db.execute(
                "INSERT INTO proxy_tokens (id, name, secret_sha256, created_at, scoped)"
                " VALUES (?, ?, ?, ?, ?)",
                (token_id, name, _digest(secret), self.store.now(), int(scoped)),
            )
            token = self._load(db, self._row(db, token_id))
        return CreatedToken(token=token, secret=secret)

    def list(self) -> builtins.list[ProxyToken]:
        with self.store.read() as db:
            rows = db.execute("SELECT * FROM proxy_tokens ORDER BY created_at").fetchall()
            return [self._load(db, r) for r in rows]

    def list_for_environment(self, environment: str) -> builtins.list[ProxyToken]:
        with self.store.read() as db:
            env = self.environments.resolve(environment, db)
            rows = db.execute(
                "SELECT t.* FROM proxy_tokens t JOIN proxy_token_envs e ON e.token_id = t.id"
                " WHERE e.env_id = ? ORDER BY t.created_at",
                (env.id,),
            ).fetchall()
            return [self._load(db, r) for r in rows]

    def environment_ids(self, token_id: str) -> builtins.list[str]:
        """Ids (`en-…`) of the environments on the token's allowlist, sorted.

        INVALID_ARGUMENT for a malformed token id, NOT_FOUND for an unknown (or deleted) one.
        Entries of a deleted environment are gone with it (see `Environments.delete`).
        """
        with self.store.read() as db:
            return self._load(db, self._row(db, token_id)).environment_ids

    def rename(self, token_id: str, name: str) -> ProxyToken:
        self._check_name(name)
        with self.store.tx() as db:
            self._row(db, token_id)
            db.execute("UPDATE proxy_tokens SET name = ? WHERE id = ?", (name, token_id))
            return self._load(db, self._row(db, token_id))

    def allow(self, token_id: str, environment_id: str) -> ProxyToken:
        with self.store.tx() as db:
            self._row(db, token_id)
            self.environments.get_by_id(environment_id, db)
            db.execute(
                "INSERT OR IGNORE INTO proxy_token_envs (token_id, env_id) VALUES (?, ?)",
                (token_id, environment_id),
            )
            return self._load(db, self._row(db, token_id))

    def revoke(self, token_id: str, environment_id: str) -> ProxyToken:
        with self.store.tx() as db:
            self._row(db, token_id)
            self.environments.get_by_id(environment_id, db)
            db.execute(
                "DELETE FROM proxy_token_envs WHERE token_id = ? AND env_id = ?",
                (token_id, environment_id),
            )
            return self._load(db, self._row(db, token_id))

    def delete(self, token_id: str) -> None:
        with self.store.tx() as db:
            self._row(db, token_id)
            db.execute("DELETE FROM proxy_token_envs WHERE token_id = ?", (token_id,))
            db.execute("DELETE FROM proxy_tokens WHERE id = ?", (token_id,))

    def verify(self, token_id: str, secret: str, environment: str) -> bool:
        """True when the id/secret pair is valid and allowed in `environment`.

        An unscoped token (no RBAC) is allowed in every environment; a scoped one only in
        the environments of its allowlist.
        """
        with self.store.read() as db:
            row = db.execute("SELECT * FROM proxy_tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None or not hmac.compare_digest(row["secret_sha256"], _digest(secret)):
                return False
            env = self.environments.resolve(environment, db)
            if not row["scoped"]:
                return True
            allowed = db.execute(
                "SELECT 1 FROM proxy_token_envs WHERE token_id = ? AND env_id = ?",
                (token_id, env.id),
            ).fetchone()
            return allowed is not None
