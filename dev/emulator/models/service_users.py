"""Service users and their per-environment roles.

modal 1.6.4 (`modal/_workspace.py`, `_WorkspaceServiceUserManager`; `modal/cli/workspace.py`
`service-users`): `ServiceUserCreate{name, expires_in_seconds}` answers a token id and secret
shown once; `EnvironmentRoleSet{service_user_name, environment_id, role_str}` sets the role in
one environment ("viewer", "contributor", or "no-access" to revoke, the CLI's examples);
`ServiceUserInfo`/`ServiceUserList` report `environment_roles` by environment name;
`ServiceUserDelete` by id or name.

Scoped and unscoped service users (`ServiceUser.scoped`). Modal's service-users guide
(modal.com/docs/guide/service-users, "Permissions") says service users "have the same
permissions as workspace members" and "cannot do actions that are only permitted for a
workspace owner or manager"; the RBAC guide (modal.com/docs/guide/rbac) gives a Member "deploy
and manage Apps" in every environment that is not restricted, and roles in restricted ones.
That is an *unscoped* service user. The pinned client documents the other kind: "A newly
created Service User has no permissions by default. In order to interact with a specific
Environment, Service Users must be granted explicit permissions" (`modal/cli/workspace.py`,
SERVICE_USERS_HELP_TEXT and `service-users create`): a *scoped* one, acting only where it has
a role. `ServiceUserCreateRequest.scoped` is a proto3 bool without presence and the 1.6.4
client never sets it (it sends `ServiceUserCreateRequest(name=...)`), so "unset" and "false"
look the same on the wire: every service user created over the API here is scoped (the pinned
client's documented behaviour, and the stricter reading). Unscoped ones (Modal's older
service users) exist only when made in code (`create(..., scoped=False)`); see `role_in`.

What each RPC needs is one table: dev/emulator/models/rbac.py.

Service users, their roles and every token id ever issued live in the state file (schema 4),
so a restart (a `kill -9` included) keeps who is who: before, they lived in memory, and a
restarted emulator in any-token mode took a service user's token for the workspace Owner's
(issue 32 item 3). Token secrets are kept as sha256 only. A deleted service user's token (a
rotation retires the old user by deleting it: components/modal/service_user.py) stays in
`issued_tokens`, so it is refused as what it is, never taken for another identity.

Token ids carry a short MAC under a key kept in the state file's `meta` (`minted_here`): a
token id this emulator minted but no longer knows (its state was reset) is refused too, in
every auth mode.

A container is not a service user, but it is checked like one: `container_identity` gives
it the role of the identity that deployed its app, in its app's environment only (issue 32
item 2; dev/emulator/handlers/base.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

from emulator.errors import AlreadyExists, InvalidArgument, NotFound
from emulator.ids import new_id
from emulator.models.environments import Environments
from emulator.store import Store

ROLES = ("viewer", "contributor", "no-access")
#: Roles that may read an environment's resources; only the last may also write.
READ_ROLES = ("viewer", "contributor")
WRITE_ROLES = ("contributor",)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class ServiceUser:
    id: str
    name: str
    token_id: str
    secret_sha256: str
    created_at: float
    expires_at: float  # 0 = never
    roles: dict[str, str] = field(default_factory=dict)  # environment id -> role
    last_used_at: float = 0.0
    scoped: bool = True  # acts only where it has a role (see the module docstring)
    #: Set for a container's identity (`container_identity`): its task id. Never stored.
    container_task: str = ""
    #: For a container: the identity its app was deployed by ("" = the Owner).
    acts_for: str = ""

    @property
    def identity_id(self) -> str:
        """What `App.created_by` records for what this identity creates or deploys."""
        return self.acts_for if self.container_task else self.id

    @property
    def label(self) -> str:
        """How refusals name this identity."""
        if self.container_task:
            return f"Container {self.container_task} ({self.name})"
        return f"Service user {self.name!r}"


#: Length of the MAC at the end of a minted token id (base64url characters).
_MAC_CHARS = 8
_BODY_CHARS = 16


def environment_restricted(env_id: str) -> bool:
    """Whether the environment is RBAC-restricted (`EnvironmentCreateRequest.is_managed`,
    `modal environment create --restricted`).

    The emulator does not record it (EnvironmentCreate ignores `is_managed`; the state file
    has no column for it), so every environment counts as restricted: an unscoped service user
    then acts only where it has a role, like a scoped one. This is the stricter reading: never
    treat as open an environment that may have been created restricted.
    """
    return True


class ServiceUsers:
    """Service users in the store, mirrored in memory (every call checks a token)."""

    def __init__(self, store: Store, environments: Environments) -> None:
        self.store = store
        self.environments = environments
        self._lock = threading.Lock()
        self._by_name: dict[str, ServiceUser] = {}
        self._key = self._token_key()
        self._load()

    # ---- the store -----------------------------------------------------------------------
    def _token_key(self) -> bytes:
        """The key that marks token ids minted here; kept in `meta`, so it survives restarts
        and resets (a reset empties the tables, not `meta`)."""
        with self.store.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('token_key', ?)",
                (secrets.token_hex(32),),
            )
            row = db.execute("SELECT value FROM meta WHERE key = 'token_key'").fetchone()
        return bytes.fromhex(str(row[0]))

    def _load(self) -> None:
        with self.store.read() as db:
            rows = db.execute("SELECT * FROM service_users").fetchall()
            roles = db.execute("SELECT * FROM service_user_roles").fetchall()
        by_id: dict[str, ServiceUser] = {}
        for row in rows:
            by_id[str(row["id"])] = ServiceUser(
                id=str(row["id"]),
                name=str(row["name"]),
                token_id=str(row["token_id"]),
                secret_sha256=str(row["secret_sha256"]),
                created_at=float(row["created_at"]),
                expires_at=float(row["expires_at"]),
                scoped=bool(row["scoped"]),
            )
        for row in roles:
            su = by_id.get(str(row["service_user_id"]))
            if su is not None:
                su.roles[str(row["env_id"])] = str(row["role"])
        with self._lock:
            self._by_name = {su.name: su for su in by_id.values()}

    def _mint_token_id(self) -> str:
        body = secrets.token_urlsafe(12)[:_BODY_CHARS]
        return f"ak-{body}{self._mac(body)}"

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode()[:_MAC_CHARS]

    def minted_here(self, token_id: str) -> bool:
        """Whether this emulator minted `token_id` for a service user (known or not)."""
        if not token_id.startswith("ak-") or len(token_id) != 3 + _BODY_CHARS + _MAC_CHARS:
            return False
        body, mac = token_id[3 : 3 + _BODY_CHARS], token_id[3 + _BODY_CHARS :]
        return hmac.compare_digest(mac, self._mac(body))

    def retired(self, token_id: str) -> str | None:
        """The name of the deleted service user whose token this was, if it was one."""
        with self.store.read() as db:
            row = db.execute(
                "SELECT service_user_name FROM issued_tokens"
                " WHERE token_id = ? AND retired_at IS NOT NULL",
                (token_id,),
            ).fetchone()
        return str(row[0]) if row is not None else None

    # ---- the API ---------------------------------------------------------------------------
    def create(
        self, name: str, expires_in_s: int, *, scoped: bool = True
    ) -> tuple[ServiceUser, str]:
        """A new service user and its token secret (returned once)."""
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise InvalidArgument(
                f"Service user name {name!r} is invalid: use letters, digits, '-' or '_'."
            )
        if expires_in_s < 0:
            raise InvalidArgument("expires_in_seconds must not be negative.")
        secret = "as-" + secrets.token_urlsafe(16)
        now = time.time()
        su = ServiceUser(
            id=new_id("service_user"),
            name=name,
            token_id=self._mint_token_id(),
            secret_sha256=_digest(secret),
            created_at=now,
            expires_at=now + expires_in_s if expires_in_s else 0.0,
            scoped=scoped,
        )
        with self._lock:
            if name in self._by_name:
                raise AlreadyExists(f"Service user {name!r} already exists; pick another name.")
            with self.store.tx() as db:
                db.execute(
                    "INSERT INTO service_users (id, name, token_id, secret_sha256, created_at,"
                    " expires_at, scoped) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (su.id, name, su.token_id, su.secret_sha256, now, su.expires_at, int(scoped)),
                )
                db.execute(
                    "INSERT INTO issued_tokens (token_id, service_user_name, issued_at)"
                    " VALUES (?, ?, ?)",
                    (su.token_id, name, now),
                )
            self._by_name[name] = su
        return su, secret

    def get(self, name: str) -> ServiceUser:
        with self._lock:
            su = self._by_name.get(name)
        if su is None:
            raise NotFound(f"Service user {name!r} not found.")
        return su

    def by_id(self, su_id: str) -> ServiceUser | None:
        with self._lock:
            return next((s for s in self._by_name.values() if s.id == su_id), None)

    def list(self) -> list[ServiceUser]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda s: s.created_at)

    def delete(self, name: str, su_id: str) -> None:
        """Delete the service user; its token id stays known as retired (refused)."""
        with self._lock:
            found = self._by_name.get(name) if name else None
            if found is None and su_id:
                found = next((s for s in self._by_name.values() if s.id == su_id), None)
            if found is None:
                raise NotFound(f"Service user {name or su_id!r} not found.")
            with self.store.tx() as db:
                db.execute("DELETE FROM service_users WHERE id = ?", (found.id,))
                db.execute("DELETE FROM service_user_roles WHERE service_user_id = ?", (found.id,))
                db.execute(
                    "UPDATE issued_tokens SET retired_at = ? WHERE token_id = ?",
                    (time.time(), found.token_id),
                )
            del self._by_name[found.name]

    def set_role(self, name: str, env_id: str, role: str) -> None:
        if role not in ROLES:
            raise InvalidArgument(f"Unknown role {role!r}: use one of {', '.join(ROLES)}.")
        self.environments.get(env_id)  # NOT_FOUND for an unknown environment
        su = self.get(name)
        with self._lock, self.store.tx() as db:
            if role == "no-access":
                db.execute(
                    "DELETE FROM service_user_roles WHERE service_user_id = ? AND env_id = ?",
                    (su.id, env_id),
                )
                su.roles.pop(env_id, None)
            else:
                db.execute(
                    "INSERT OR REPLACE INTO service_user_roles (service_user_id, env_id, role)"
                    " VALUES (?, ?, ?)",
                    (su.id, env_id, role),
                )
                su.roles[env_id] = role

    def role_in(self, su: ServiceUser, env_id: str) -> str | None:
        """The service user's role in the environment: "viewer", "contributor" or None.

        Scoped: only the role set with EnvironmentRoleSet. Unscoped (a workspace Member,
        modal.com/docs/guide/service-users "Permissions"): its role there if one was set, else
        contributor where the environment is not restricted (modal.com/docs/guide/rbac:
        Member "can deploy and manage Apps"); see `environment_restricted`. A container's
        identity has the one role it was given, in its app's environment.
        """
        with self._lock:
            role = su.roles.get(env_id)
        if role is not None:
            return role
        if not su.scoped and not environment_restricted(env_id):
            return "contributor"
        return None

    def roles_by_name(self, su: ServiceUser) -> dict[str, str]:
        out: dict[str, str] = {}
        for env_id, role in list(su.roles.items()):
            try:
                out[self.environments.get(env_id).name] = role
            except NotFound:
                continue  # the environment was deleted
        return out

    def holds_token(self, token_id: str) -> ServiceUser | None:
        """The service user whose token id this is (secret not checked), if any."""
        with self._lock:
            return next((s for s in self._by_name.values() if s.token_id == token_id), None)

    def authenticate(self, token_id: str, token_secret: str) -> ServiceUser | None:
        """The service user holding this token, if any (expired tokens are refused)."""
        su = self.holds_token(token_id)
        if su is None:
            return None
        if not hmac.compare_digest(_digest(token_secret), su.secret_sha256) or (
            su.expires_at and time.time() >= su.expires_at
        ):
            return None
        su.last_used_at = time.time()
        return su

    def container_identity(
        self, task_id: str, app_name: str, env_id: str, deployer_id: str
    ) -> ServiceUser:
        """Who a container's own calls act as: the identity that created or last deployed
        its app, in the app's environment only, and never more than a contributor (the
        Owner's deployments included: a container never manages the workspace). A deployer
        that is gone or lost its role there leaves the container no role (its own lifecycle
        calls still work: rbac.Need.CONTAINER)."""
        role: str | None = "contributor"
        if deployer_id:
            deployer = self.by_id(deployer_id)
            role = self.role_in(deployer, env_id) if deployer is not None else None
        return ServiceUser(
            id=f"container:{task_id}",
            name=f"app {app_name!r}",
            token_id="",
            secret_sha256="",
            created_at=0.0,
            expires_at=0.0,
            roles={env_id: role} if role else {},
            scoped=True,
            container_task=task_id,
            acts_for=deployer_id,
        )

    def reset(self) -> None:
        """Forget the in-memory mirror (the store's reset emptied the tables)."""
        self._load()
