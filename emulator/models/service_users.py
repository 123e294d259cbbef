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

What each RPC needs is one table: emulator/models/rbac.py.

Like Dicts, service users live in memory (no state-file schema change): a reset or a restart
forgets them. Token secrets are kept as sha256 only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

from emulator.errors import AlreadyExists, InvalidArgument, NotFound
from emulator.ids import new_id
from emulator.models.environments import Environments

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
    def __init__(self, environments: Environments) -> None:
        self.environments = environments
        self._lock = threading.Lock()
        self._by_name: dict[str, ServiceUser] = {}

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
            token_id="ak-" + secrets.token_urlsafe(16),
            secret_sha256=_digest(secret),
            created_at=now,
            expires_at=now + expires_in_s if expires_in_s else 0.0,
            scoped=scoped,
        )
        with self._lock:
            if name in self._by_name:
                raise AlreadyExists(f"Service user {name!r} already exists; pick another name.")
            self._by_name[name] = su
        return su, secret

    def get(self, name: str) -> ServiceUser:
        with self._lock:
            su = self._by_name.get(name)
        if su is None:
            raise NotFound(f"Service user {name!r} not found.")
        return su

    def list(self) -> list[ServiceUser]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda s: s.created_at)

    def delete(self, name: str, su_id: str) -> None:
        with self._lock:
            found = self._by_name.get(name) if name else None
            if found is None and su_id:
                found = next((s for s in self._by_name.values() if s.id == su_id), None)
            if found is None:
                raise NotFound(f"Service user {name or su_id!r} not found.")
            del self._by_name[found.name]

    def set_role(self, name: str, env_id: str, role: str) -> None:
        if role not in ROLES:
            raise InvalidArgument(f"Unknown role {role!r}: use one of {', '.join(ROLES)}.")
        self.environments.get(env_id)  # NOT_FOUND for an unknown environment
        su = self.get(name)
        with self._lock:
            if role == "no-access":
                su.roles.pop(env_id, None)
            else:
                su.roles[env_id] = role

    def role_in(self, su: ServiceUser, env_id: str) -> str | None:
        """The service user's role in the environment: "viewer", "contributor" or None.

        Scoped: only the role set with EnvironmentRoleSet. Unscoped (a workspace Member,
        modal.com/docs/guide/service-users "Permissions"): its role there if one was set, else
        contributor where the environment is not restricted (modal.com/docs/guide/rbac:
        Member "can deploy and manage Apps"); see `environment_restricted`.
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

    def reset(self) -> None:
        with self._lock:
            self._by_name.clear()
