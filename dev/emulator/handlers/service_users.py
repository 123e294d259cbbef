"""Service-user RPCs (modal 1.6.4 `modal/_workspace.py` `service_users`, `modal workspace
service-users` CLI): create, set a role in an environment, info, list, delete. The model is
dev/emulator/models/service_users.py; what a service-user token may call,
dev/emulator/models/rbac.py.
Only the workspace Owner (the emulator's own token) may call these (rbac.py: Need.OWNER)."""

from __future__ import annotations

from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.handlers.base import Context, rpc
from emulator.models.service_users import ServiceUser


def _proto(ctx: Context, su: ServiceUser) -> api_pb2.ServiceUser:
    return api_pb2.ServiceUser(
        service_user_id=su.id,
        name=su.name,
        token_id=su.token_id,
        created_by=ctx.config.workspace,
        created_at=su.created_at,
        last_used_at=su.last_used_at,
        expires_at=su.expires_at,
        scoped=su.scoped,
        environment_roles=[
            api_pb2.ServiceUser.EnvironmentRoleEntry(environment_name=env, role_str=role)
            for env, role in sorted(ctx.state.service_users.roles_by_name(su).items())
        ],
    )


@rpc
def ServiceUserCreate(
    ctx: Context, req: api_pb2.ServiceUserCreateRequest
) -> api_pb2.ServiceUserCreateResponse:
    # Always scoped: `scoped` has no presence on the wire and the 1.6.4 client never sets it,
    # while documenting that a new service user has no permissions until granted a role
    # (dev/emulator/models/service_users.py explains the reading).
    su, secret = ctx.state.service_users.create(req.name, int(req.expires_in_seconds), scoped=True)
    resp = api_pb2.ServiceUserCreateResponse(
        token_id=su.token_id, token_secret=secret, service_user_id=su.id
    )
    if su.expires_at:
        resp.expires_at.FromSeconds(int(su.expires_at))
    return resp


@rpc
def EnvironmentRoleSet(ctx: Context, req: api_pb2.EnvironmentRoleSetRequest) -> Empty:
    ctx.state.service_users.set_role(req.service_user_name, req.environment_id, req.role_str)
    return Empty()


@rpc
def ServiceUserInfo(
    ctx: Context, req: api_pb2.ServiceUserInfoRequest
) -> api_pb2.ServiceUserInfoResponse:
    su = ctx.state.service_users.get(req.service_user_name)
    return api_pb2.ServiceUserInfoResponse(service_user=_proto(ctx, su))


@rpc
def ServiceUserList(ctx: Context, req: Empty) -> api_pb2.ServiceUserListResponse:
    return api_pb2.ServiceUserListResponse(
        service_users=[_proto(ctx, su) for su in ctx.state.service_users.list()]
    )


@rpc
def ServiceUserDelete(ctx: Context, req: api_pb2.ServiceUserDeleteRequest) -> Empty:
    ctx.state.service_users.delete(req.service_user_name, req.service_user_id)
    return Empty()
