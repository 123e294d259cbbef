"""Workspace-level RPCs: hello/auth, environments, budgets and proxy-auth tokens."""

from __future__ import annotations

import base64
import json
import time

from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.errors import InvalidArgument
from emulator.handlers.base import Context, rpc
from emulator.handlers.convert import create_if_missing
from emulator.models.environments import Environment
from emulator.models.tokens import ProxyToken


@rpc
def ClientHello(ctx: Context, req: Empty) -> api_pb2.ClientHelloResponse:
    return api_pb2.ClientHelloResponse()


@rpc
def AuthTokenGet(ctx: Context, req: api_pb2.AuthTokenGetRequest) -> api_pb2.AuthTokenGetResponse:
    def b64(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    claims = {"sub": ctx.config.workspace, "exp": int(time.time()) + 3600, "iss": "emulator"}
    token = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}.emulator"
    return api_pb2.AuthTokenGetResponse(token=token)


@rpc
def WorkspaceNameLookup(ctx: Context, req: Empty) -> api_pb2.WorkspaceNameLookupResponse:
    return api_pb2.WorkspaceNameLookupResponse(
        workspace_name=ctx.config.workspace, username=ctx.config.workspace
    )


# ---- environments -------------------------------------------------------------------------
def _env_item(env: Environment) -> api_pb2.EnvironmentListItem:
    item = api_pb2.EnvironmentListItem(
        name=env.name,
        webhook_suffix=env.webhook_suffix,
        created_at=env.created_at,
        default=env.is_default,
        environment_id=env.id,
        current_cycle_usage=env.usage_usd,
        spend_limit_reached=env.spend_limit_reached,
        image_builder_version=env.image_builder_version,
    )
    if env.budget_usd is not None:
        item.cycle_budget_dollars = env.budget_usd
        item.effective_cycle_spend_limit = env.budget_usd
    return item


@rpc
def EnvironmentGetOrCreate(
    ctx: Context, req: api_pb2.EnvironmentGetOrCreateRequest
) -> api_pb2.EnvironmentGetOrCreateResponse:
    create = create_if_missing("EnvironmentGetOrCreate", req.object_creation_type)
    env = ctx.state.environments.get_or_create(req.deployment_name, create)
    return api_pb2.EnvironmentGetOrCreateResponse(
        environment_id=env.id,
        metadata=api_pb2.EnvironmentMetadata(
            name=env.name,
            settings=api_pb2.EnvironmentSettings(
                image_builder_version=env.image_builder_version,
                webhook_suffix=env.webhook_suffix,
            ),
        ),
    )


@rpc
def EnvironmentCreate(ctx: Context, req: api_pb2.EnvironmentCreateRequest) -> Empty:
    ctx.state.environments.create(req.name, req.settings.webhook_suffix or None)
    return Empty()


@rpc
def EnvironmentList(ctx: Context, req: Empty) -> api_pb2.EnvironmentListResponse:
    return api_pb2.EnvironmentListResponse(
        items=[_env_item(env) for env in ctx.state.environments.list()]
    )


@rpc
def EnvironmentUpdate(
    ctx: Context, req: api_pb2.EnvironmentUpdateRequest
) -> api_pb2.EnvironmentListItem:
    if not req.current_name:
        raise InvalidArgument("EnvironmentUpdate needs current_name.")
    env = ctx.state.environments.update(
        req.current_name,
        req.name.value if req.HasField("name") else None,
        req.web_suffix.value if req.HasField("web_suffix") else None,
        req.image_builder_version if req.HasField("image_builder_version") else None,
    )
    return _env_item(env)


@rpc
def EnvironmentDelete(ctx: Context, req: api_pb2.EnvironmentDeleteRequest) -> Empty:
    ctx.state.environments.delete(req.name)
    if ctx.runtime is not None:
        ctx.runtime.deployments_changed()  # the environment's apps stop with it
    return Empty()


@rpc
def EnvironmentSetBudget(ctx: Context, req: api_pb2.EnvironmentSetBudgetRequest) -> Empty:
    if req.clear_budget:
        ctx.state.environments.set_budget(req.environment_id, None)
    elif req.HasField("cycle_budget_dollars"):
        ctx.state.environments.set_budget(req.environment_id, req.cycle_budget_dollars)
    else:
        raise InvalidArgument(
            "EnvironmentSetBudget needs cycle_budget_dollars or clear_budget=true."
        )
    return Empty()


@rpc
def EnvironmentGetBudget(
    ctx: Context, req: api_pb2.EnvironmentGetBudgetRequest
) -> api_pb2.EnvironmentGetBudgetResponse:
    env = ctx.state.environments.get(req.environment_id)
    resp = api_pb2.EnvironmentGetBudgetResponse(
        current_cycle_usage=env.usage_usd, spend_limit_reached=env.spend_limit_reached
    )
    if env.budget_usd is not None:
        resp.cycle_budget_dollars = env.budget_usd
        resp.effective_cycle_spend_limit = env.budget_usd
    return resp


# ---- proxy-auth tokens --------------------------------------------------------------------
def _token(ctx: Context, token: ProxyToken) -> api_pb2.WebhookToken:
    return api_pb2.WebhookToken(
        token_id=token.id,
        created_at=token.created_at,
        name=token.name,
        scoped=token.scoped,
        created_by=api_pb2.UserIdentity(username=ctx.config.workspace),
    )


@rpc
def WebhookTokenCreate(
    ctx: Context, req: api_pb2.WebhookTokenCreateRequest
) -> api_pb2.TokenCreateResponse:
    created = ctx.state.tokens.create(req.name, scoped=ctx.config.rbac or req.scoped)
    return api_pb2.TokenCreateResponse(token_id=created.token.id, token_secret=created.secret)


@rpc
def WebhookTokenList(ctx: Context, req: Empty) -> api_pb2.WebhookTokenListResponse:
    return api_pb2.WebhookTokenListResponse(
        tokens=[_token(ctx, t) for t in ctx.state.tokens.list()]
    )


@rpc
def WebhookTokenListForEnvironment(
    ctx: Context, req: api_pb2.WebhookTokenListForEnvironmentRequest
) -> api_pb2.WebhookTokenListResponse:
    tokens = ctx.state.tokens.list_for_environment(req.environment_name)
    return api_pb2.WebhookTokenListResponse(tokens=[_token(ctx, t) for t in tokens])


@rpc
def WebhookTokenUpdate(
    ctx: Context, req: api_pb2.WebhookTokenUpdateRequest
) -> api_pb2.WebhookToken:
    token = ctx.state.tokens.rename(req.token_id, req.name)
    return _token(ctx, token)


@rpc
def WebhookTokenEnvironmentAdd(
    ctx: Context, req: api_pb2.WebhookTokenEnvironmentAddRequest
) -> Empty:
    ctx.state.tokens.allow(req.token_id, req.environment_id)
    return Empty()


@rpc
def WebhookTokenEnvironmentRemove(
    ctx: Context, req: api_pb2.WebhookTokenEnvironmentRemoveRequest
) -> Empty:
    ctx.state.tokens.revoke(req.token_id, req.environment_id)
    return Empty()


@rpc
def WebhookTokenEnvironmentList(
    ctx: Context, req: api_pb2.WebhookTokenEnvironmentListRequest
) -> api_pb2.WebhookTokenEnvironmentListResponse:
    """The token's allowlist as environment ids (the ids EnvironmentList/GetOrCreate give)."""
    ids = ctx.state.tokens.environment_ids(req.token_id)
    return api_pb2.WebhookTokenEnvironmentListResponse(environment_ids=ids)


@rpc
def WebhookTokenDelete(ctx: Context, req: api_pb2.TokenDeleteRequest) -> Empty:
    ctx.state.tokens.delete(req.token_id)
    return Empty()
