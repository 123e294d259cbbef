"""Service users and their per-environment roles: the least a spend watcher needs.

modal 1.6.4 (`modal/_workspace.py`, `_WorkspaceServiceUserManager`; `modal/cli/workspace.py`
`service-users`): `ServiceUserCreate{name, expires_in_seconds}` answers a token id and secret
shown once; `EnvironmentRoleSet{service_user_name, environment_id, role_str}` sets the role in
one environment ("viewer", "contributor", or "no-access" to revoke, the CLI's examples); a new
service user has access to no environment (`modal workspace service-users info` warns "does
not have access to any Environments"); `ServiceUserInfo`/`ServiceUserList` report
`environment_roles` by environment name; `ServiceUserDelete` by id or name.

What a service-user token may call here (`check_call`): ClientHello, and
`EnvironmentGetBudget` of an environment where it is viewer or contributor (**inferred**:
Modal does not document which role may read the budget; a viewer reading usage is the
natural reading of "viewer"). Every other RPC is PERMISSION_DENIED: the emulator does not
model the rest of Modal's role matrix, so it refuses rather than guessing allow.

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
from typing import Any

from emulator.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from emulator.ids import new_id
from emulator.models.environments import Environments

ROLES = ("viewer", "contributor", "no-access")
READ_BUDGET_ROLES = ("viewer", "contributor")


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


class ServiceUsers:
    def __init__(self, environments: Environments) -> None:
        self.environments = environments
        self._lock = threading.Lock()
        self._by_name: dict[str, ServiceUser] = {}

    def create(self, name: str, expires_in_s: int) -> tuple[ServiceUser, str]:
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

    def roles_by_name(self, su: ServiceUser) -> dict[str, str]:
        out: dict[str, str] = {}
        for env_id, role in list(su.roles.items()):
            try:
                out[self.environments.get(env_id).name] = role
            except NotFound:
                continue  # the environment was deleted
        return out

    def authenticate(self, token_id: str, token_secret: str) -> ServiceUser | None:
        """The service user holding this token, if any (expired tokens are refused)."""
        with self._lock:
            su = next((s for s in self._by_name.values() if s.token_id == token_id), None)
        if su is None:
            return None
        if not hmac.compare_digest(_digest(token_secret), su.secret_sha256) or (
            su.expires_at and time.time() >= su.expires_at
        ):
            return None
        su.last_used_at = time.time()
        return su

    def check_call(self, su: ServiceUser, method: str, request: Any) -> None:
        """PERMISSION_DENIED unless the service user's roles allow `method` (see above)."""
        if method == "ClientHello":
            return
        if method == "EnvironmentGetBudget":
            role = su.roles.get(str(request.environment_id), "no-access")
            if role in READ_BUDGET_ROLES:
                return
            raise PermissionDenied(
                f"Service user {su.name!r} has no access to environment"
                f" {request.environment_id}: grant it the viewer role there"
                " (`modal workspace service-users set-role NAME ENV viewer`)."
            )
        raise PermissionDenied(
            f"Service user {su.name!r} may not call {method} in the Modal emulator: only"
            " EnvironmentGetBudget (viewer or contributor) is modelled for service users"
            " (docs/emulator.md)."
        )

    def reset(self) -> None:
        with self._lock:
            self._by_name.clear()
