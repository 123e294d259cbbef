"""App lifecycle RPCs: create, look up, publish (deploy), list, stop, history, rollback, tags."""

from __future__ import annotations

import hashlib

from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.errors import InvalidArgument
from emulator.handlers.base import Context, rpc
from emulator.handlers.convert import app_state_to_model, app_state_to_proto, create_if_missing
from emulator.models.apps import App, PublishRequest


def lifecycle(ctx: Context, app: App) -> api_pb2.AppLifecycle:
    return api_pb2.AppLifecycle(
        app_state=app_state_to_proto(app.state),  # type: ignore[arg-type]
        created_at=app.created_at,
        created_by=ctx.config.workspace,
        deployed_at=app.deployed_at or 0.0,
        deployed_by=ctx.config.workspace if app.deployed_at else "",
        version=app.version,
        stopped_at=app.stopped_at or 0.0,
    )


def _page_url(ctx: Context, app: App) -> str:
    return f"https://modal.com/apps/{ctx.config.workspace}/{app.env_name}/{app.id}"


def _deployed_url(ctx: Context, app: App) -> str:
    return f"https://modal.com/apps/{ctx.config.workspace}/{app.env_name}/deployed/{app.name}"


@rpc
def AppCreate(ctx: Context, req: api_pb2.AppCreateRequest) -> api_pb2.AppCreateResponse:
    state = (
        app_state_to_model(req.app_state)
        if req.app_state != api_pb2.APP_STATE_UNSPECIFIED
        else "ephemeral"
    )
    app = ctx.state.apps.create(
        req.environment_name, req.description, state, dict(req.tags), created_by=ctx.identity_id
    )
    return api_pb2.AppCreateResponse(
        app_id=app.id,
        app_page_url=_page_url(ctx, app),
        app_logs_url=f"https://modal.com/logs/{app.id}",
    )


@rpc
def AppGetByDeploymentName(
    ctx: Context, req: api_pb2.AppGetByDeploymentNameRequest
) -> api_pb2.AppGetByDeploymentNameResponse:
    if not req.name:
        raise InvalidArgument("AppGetByDeploymentName needs an app name.")
    env, current, previous = ctx.state.apps.by_deployment_name(req.name, req.environment_name)
    resp = api_pb2.AppGetByDeploymentNameResponse(environment_name=env.name)
    if current is not None:
        resp.app_id = current.id
        resp.lifecycle.CopyFrom(lifecycle(ctx, current))
    elif previous is not None:
        resp.previous_app_id = previous.id
        resp.lifecycle.CopyFrom(lifecycle(ctx, previous))
    return resp


@rpc
def AppGetOrCreate(
    ctx: Context, req: api_pb2.AppGetOrCreateRequest
) -> api_pb2.AppGetOrCreateResponse:
    app = ctx.state.apps.get_or_create(
        req.app_name,
        req.environment_name,
        create_if_missing("AppGetOrCreate", req.object_creation_type),
        ctx.client_version,
        ctx.config.workspace,
        created_by=ctx.identity_id,
    )
    return api_pb2.AppGetOrCreateResponse(
        app_id=app.id,
        handle_metadata=api_pb2.AppHandleMetadata(
            description=app.description,
            app_id=app.id,
            environment_name=app.env_name,
            lifecycle=lifecycle(ctx, app),
        ),
    )


@rpc
def AppGetLifecycle(
    ctx: Context, req: api_pb2.AppGetLifecycleRequest
) -> api_pb2.AppGetLifecycleResponse:
    return api_pb2.AppGetLifecycleResponse(lifecycle=lifecycle(ctx, ctx.state.apps.get(req.app_id)))


@rpc
def AppGetLayout(ctx: Context, req: api_pb2.AppGetLayoutRequest) -> api_pb2.AppGetLayoutResponse:
    version = ctx.state.apps.current_version(req.app_id)
    layout = api_pb2.AppLayout()
    if version is not None:
        layout.function_ids.update(version.function_ids)
        layout.class_ids.update(version.class_ids)
    return api_pb2.AppGetLayoutResponse(app_layout=layout)


@rpc
def AppHeartbeat(ctx: Context, req: api_pb2.AppHeartbeatRequest) -> Empty:
    ctx.state.apps.heartbeat(req.app_id)
    return Empty()


@rpc
def AppClientDisconnect(ctx: Context, req: api_pb2.AppClientDisconnectRequest) -> Empty:
    ctx.state.apps.disconnect(req.app_id)
    return Empty()


def _normalized(data: bytes) -> bytes:
    fd = api_pb2.FunctionData.FromString(data)
    for ranked in fd.ranked_functions:
        ids = sorted(ranked.function.mount_ids)
        del ranked.function.mount_ids[:]
        ranked.function.mount_ids.extend(ids)
    return fd.SerializeToString(deterministic=True)


def _inputs_fingerprint(ctx: Context, definition_ids: dict[str, str]) -> str:
    """The secrets the definitions use, with their update times (never their values).

    A container reads its secrets when it starts, so a deploy after a secret changed must
    restart the containers even when the definitions are byte-identical: the project rotates
    API keys this way, and a warm container would otherwise keep accepting a revoked key.
    """
    seen: dict[str, float] = {}
    for def_id in definition_ids.values():
        try:
            data = ctx.state.apps.get_definition(def_id).data
        except Exception:  # noqa: S112 (publish reports unknown definitions itself)
            continue
        for ranked in api_pb2.FunctionData.FromString(data).ranked_functions:
            for secret_id in ranked.function.secret_ids:
                if secret_id not in seen:
                    try:
                        seen[secret_id] = ctx.state.secrets.get(secret_id).updated_at
                    except Exception:  # noqa: S112
                        continue
    text = "\n".join(f"{k}@{v!r}" for k, v in sorted(seen.items()))
    return hashlib.sha256(text.encode()).hexdigest() if seen else ""


def _same_definition(a: bytes, b: bytes) -> bool:
    """Equal definitions, whatever order the client listed the mounts in (it varies)."""
    return a == b or _normalized(a) == _normalized(b)


@rpc
def AppPublish(ctx: Context, req: api_pb2.AppPublishRequest) -> api_pb2.AppPublishResponse:
    publish = PublishRequest(
        name=req.name,
        state=app_state_to_model(req.app_state),
        function_ids=dict(req.function_ids),
        class_ids=dict(req.class_ids),
        definition_ids=dict(req.definition_ids),
        tag=req.deployment_tag,
        client_version=req.client_version or ctx.client_version,
        deployed_by=ctx.config.workspace,
        commit_hash=req.commit_info.commit_hash,
        commit_dirty=req.commit_info.dirty,
        inputs_fingerprint=_inputs_fingerprint(ctx, dict(req.definition_ids)),
        tags=dict(req.tags),  # replaces the app's tag set (stricter reading: models/apps.py)
    )
    if ctx.state.apps.unchanged(req.app_id, publish, _same_definition):
        # A no-op redeploy: no new version, containers kept, and deployed_at == 0 (the
        # client's "Deployment skipped: no changes detected"); its tags still apply.
        app = ctx.state.apps.publish_skipped(req.app_id, publish)
        ctx.state.apps.set_created_by(req.app_id, ctx.identity_id)
        return api_pb2.AppPublishResponse(url=_deployed_url(ctx, app), deployed_at=0.0)
    app, _version = ctx.state.apps.publish(req.app_id, publish)
    # Its containers act as whoever deployed it last (dev/emulator/handlers/base.py `_container`).
    ctx.state.apps.set_created_by(req.app_id, ctx.identity_id)
    url = _deployed_url(ctx, app) if app.deployed else _page_url(ctx, app)
    if ctx.runtime is not None:
        ctx.runtime.deployments_changed()  # the new version's containers start (rolling)
    return api_pb2.AppPublishResponse(url=url, deployed_at=app.deployed_at or 0.0)


@rpc
def AppList(ctx: Context, req: api_pb2.AppListRequest) -> api_pb2.AppListResponse:
    _env, apps = ctx.state.apps.list(req.environment_name)
    return api_pb2.AppListResponse(
        apps=[
            api_pb2.AppListResponse.AppListItem(
                app_id=app.id,
                description=app.description,
                state=app_state_to_proto(app.state),  # type: ignore[arg-type]
                created_at=app.created_at,
                stopped_at=app.stopped_at or 0.0,
                n_running_tasks=(
                    len(ctx.runtime.tasks_of_app(app.id)) if ctx.runtime is not None else 0
                ),
                name=app.name or "",
            )
            for app in apps
        ]
    )


@rpc
def AppStop(ctx: Context, req: api_pb2.AppStopRequest) -> Empty:
    ctx.state.apps.stop(req.app_id)
    if ctx.runtime is not None:
        ctx.runtime.deployments_changed()  # its containers stop now, its URLs stop answering
    return Empty()


@rpc
def AppSetTags(ctx: Context, req: api_pb2.AppSetTagsRequest) -> Empty:
    ctx.state.apps.set_tags(req.app_id, dict(req.tags))
    return Empty()


@rpc
def AppGetTags(ctx: Context, req: api_pb2.AppGetTagsRequest) -> api_pb2.AppGetTagsResponse:
    return api_pb2.AppGetTagsResponse(tags=ctx.state.apps.get_tags(req.app_id))


@rpc
def AppDeploymentHistory(
    ctx: Context, req: api_pb2.AppDeploymentHistoryRequest
) -> api_pb2.AppDeploymentHistoryResponse:
    """Every version, newest first, with what `modal app history` shows (modal/cli/app.py
    `history`: version, deployed_at, client_version, deployed_by, commit_info, tag).

    `production_app_version`: the version serving traffic. The 1.6.4 client never reads it;
    the name (and the `staged` deploys / `AppPromote` of the same proto) says it is the live
    version, which may differ from the newest on Modal once a version is staged. The emulator
    does not stage (every deploy goes live), so it is the app's current version, 0 for an app
    that is not deployed (stopped: nothing serves).
    """
    app = ctx.state.apps.get(req.app_id)
    versions = ctx.state.apps.history(req.app_id)
    return api_pb2.AppDeploymentHistoryResponse(
        app_deployment_histories=[
            api_pb2.AppDeploymentHistory(
                app_id=v.app_id,
                version=v.version,
                client_version=v.client_version,
                deployed_at=v.deployed_at,
                deployed_by=v.deployed_by,
                tag=v.tag,
                rollback_version=v.rollback_version,
                rollback_allowed=app.deployed and v.version != app.version,
                commit_info=api_pb2.CommitInfo(commit_hash=v.commit_hash, dirty=v.commit_dirty),
                deployment_type=(
                    api_pb2.DEPLOYMENT_TYPE_ROLLBACK
                    if v.rollback_version
                    else api_pb2.DEPLOYMENT_TYPE_STANDARD
                ),
            )
            for v in versions
        ],
        production_app_version=app.version if app.deployed else 0,
    )


@rpc
def AppRollback(ctx: Context, req: api_pb2.AppRollbackRequest) -> api_pb2.AppRollbackResponse:
    app, _version = ctx.state.apps.rollback(
        req.app_id, req.version, ctx.client_version, ctx.config.workspace
    )
    if ctx.runtime is not None:
        # the rolled-back version's containers replace the current ones
        ctx.runtime.deployments_changed()
    return api_pb2.AppRollbackResponse(
        url=_deployed_url(ctx, app), deployed_at=app.deployed_at or 0.0
    )
