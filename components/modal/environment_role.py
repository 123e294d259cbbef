"""`EnvironmentRole`: the role a service user holds in one environment (`contributor`|`viewer`).

What Modal offers (modal 1.6.4 `service_users.set_role`, `modal workspace service-users
set-role NAME ENV ROLE`): `EnvironmentRoleSet{service_user_name, environment_id, role_str}`
with the environment's id looked up by name first; "no-access" revokes. A service user's roles
are read back with `ServiceUserInfo.environment_roles` (environment name, role). Setting roles
needs an Owner or Manager of the workspace.

- Inputs: `service_user` (the identity: a `ServiceUser`'s name), `environment` (name), `role`,
  and `service_users`: every Modal service user that holds the role, the current one first
  (feed it a `ServiceUser`'s `names` output). During a rotation the previous service user keeps
  the role next to the new one, until the ServiceUser retires it; then the list shrinks and
  the role is revoked from the name that left it (already deleted: nothing to do).
- Create sets the role for each name. A changed `role` or list updates in place; a changed
  `environment` or `service_user` replaces (the new grant first, then the old one is revoked).
- Read (refresh): each name's roles from `ServiceUserInfo`. Names that are gone drop out of
  `service_users`; the current one gone → gone. A role changed or revoked by hand shows as
  drift in `role` (revoked: "no-access"), which the next `up` sets back.
- Delete sets "no-access" for every name (a service user or environment already gone: fine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import ModalProvider, environment_problems, is_unknown
from ._schema import Schema, SchemaResource, output, replaces, updates
from .service_user import MODAL_NAME_RE, NAME_RE

#: Roles this resource grants (modal 1.6.4 CLI examples: viewer, contributor; "no-access"
#: revokes and is what delete sets).
ROLES = ("contributor", "viewer")
NO_ACCESS = "no-access"


def _names(props: Mapping[str, Any]) -> list[str]:
    names = [str(n) for n in (props.get("service_users") or []) if n]
    return list(dict.fromkeys(names)) or [str(props.get("service_user"))]


def _user_problems(value: Any) -> list[str]:
    if isinstance(value, str) and NAME_RE.match(value):
        return []
    return [
        f"service user name {value!r} is invalid: 1-56 characters from a-z A-Z 0-9 - _ (the"
        " name of a ServiceUser of this stack)"
    ]


def _users_problems(users: Any) -> list[str]:
    if not isinstance(users, list):
        return [
            f"service_users {users!r} must be a list of service user names (a ServiceUser's"
            " `names` output)"
        ]
    return [
        f"service user name {u!r} in service_users is invalid: 1-64 characters from a-z A-Z"
        " 0-9 - _ (a ServiceUser's `names` output)"
        for u in users
        if not is_unknown(u) and not (isinstance(u, str) and MODAL_NAME_RE.match(u))
    ]


def _role_problems(role: Any) -> list[str]:
    choices = ", ".join(ROLES)
    no_role = "no role at all: declare no EnvironmentRole for that service user"
    return [] if role in ROLES else [f"role {role!r} is not one of {choices} ({no_role})"]


class EnvironmentRoleArgs(Schema):
    """Inputs of an `EnvironmentRole` (keywords), then what it outputs."""

    environment: pulumi.Input[str] = replaces(check=environment_problems)
    service_user: pulumi.Input[str] = replaces(check=_user_problems)  # the identity
    role: pulumi.Input[str] = updates(check=_role_problems)
    #: Every Modal service user holding the role, current first (a ServiceUser's `names`);
    #: empty = just `service_user`.
    service_users: pulumi.Input[Sequence[pulumi.Input[str]]] = updates(
        default_factory=list, view=_names, check=_users_problems
    )
    granted: dict[str, str] = output()  # {service user: role}, as last set or read


class EnvironmentRoleProvider(ModalProvider):
    SCHEMA = EnvironmentRoleArgs.SCHEMA

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        return (
            f"'{props.get('service_user')}' as {props.get('role')} in environment"
            f" '{props.get('environment')}'"
        )

    @classmethod
    def _outputs(
        cls,
        props: Mapping[str, Any],
        names: list[str],
        role: str,
        granted: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        return cls.SCHEMA.outputs(
            props,
            role=role,
            service_users=names,
            granted=dict.fromkeys(names, role) if granted is None else granted,
        )

    def _hints(self, props: Mapping[str, Any]) -> dict[type[BaseException], str]:
        from modal import exception as mexc

        return {
            mexc.NotFoundError: (
                f"The environment '{props.get('environment')}' or one of the service users"
                f" {_names(props)} does not exist: create them first (this stack's"
                " Environment and ServiceUser resources), or run `pulumi refresh`."
            ),
            mexc.PermissionDeniedError: (
                "Environment roles are set by a workspace Owner or Manager: run this stack (the"
                " access stack) with your own token (`modal token new`), not with a service"
                " user's token, then rerun."
            ),
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        env, role, names = str(props["environment"]), str(props["role"]), _names(props)

        async def go(client: Any) -> None:
            for name in names:
                await _rpc.environment_role_set(client, name, env, role)

        self.run("create", self._target(props), go, hints=self._hints(props))
        return CreateResult(f"{env}/{props['service_user']}", self._outputs(props, names, role))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        env, role = str(news["environment"]), str(news["role"])
        names, old_names = _names(news), _names(olds)
        regrant = names if role != olds.get("role") else [n for n in names if n not in old_names]
        revoke = [n for n in old_names if n not in names]

        async def go(client: Any) -> None:
            for name in regrant:
                await _rpc.environment_role_set(client, name, env, role)
            await _revoke(client, revoke, env)  # from the service users retired since

        self.run("update", f"{self._target(news)} ({id_})", go, hints=self._hints(news))
        return UpdateResult(self._outputs(news, names, role))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        env, names = str(props.get("environment")), _names(props)

        async def go(client: Any) -> dict[str, str]:
            live: dict[str, str] = {}
            for name in names:
                info = await _rpc.service_user_info(client, name)
                if info is None:
                    continue
                roles = {str(r.environment_name): str(r.role_str) for r in info.environment_roles}
                live[name] = roles.get(env, NO_ACCESS)
            return live

        live = self.run("read", f"{self._target(props)} ({id_})", go)
        if not live or names[0] not in live:
            return ReadResult("", {})  # the service user holding it is gone
        role = live[names[0]]
        kept = [n for n in names if n in live]
        outs = self._outputs(props, kept, role, {n: live[n] for n in kept})
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        env, names = str(props.get("environment")), _names(props)
        self.run(
            "revoke",
            f"{self._target(props)} ({id_})",
            lambda client: _revoke(client, names, env),
            hints=self._hints(props),
        )


async def _revoke(client: Any, names: list[str], env: str) -> None:
    """Set "no-access" for each service user in `env`; one that is gone (deleted, retired),
    or a gone environment, holds no role any more: nothing to revoke."""
    from modal import exception as mexc

    for name in names:
        try:
            await _rpc.environment_role_set(client, name, env, NO_ACCESS)
        except mexc.NotFoundError:
            continue


class EnvironmentRole(SchemaResource[EnvironmentRoleArgs], module="modal", name="EnvironmentRole"):
    """A service user's role in one environment. Outputs: every field of
    `EnvironmentRoleArgs` (`granted`: {service user: role})."""

    PROVIDER = EnvironmentRoleProvider


__all__ = ["EnvironmentRole", "EnvironmentRoleArgs", "EnvironmentRoleProvider"]
