"""Every raw Modal RPC the providers make, in one place (issue 9 item 4).

Each function takes a `modal.client._Client` (the providers get one from `ModalProvider.run`)
and speaks the request shapes the `modal` 1.6.4 SDK/CLI send; the resource modules hold only
their lifecycle. Nothing here imports pulumi, so the App's deploy runner (a fresh process per
deploy) can use it cheaply.

Creates that must happen once are sent with `retry=None` (modal's own three quick retries of
INTERNAL/UNAVAILABLE/timeouts would repeat a create that Modal may have applied: modal
1.6.4 `_grpc_client.UnaryUnaryWrapper.__call__` → `grpc_utils._retry_transient_errors`) and
with an explicit `x-idempotency-key` that the caller keeps the same across its own retries.
The modal client sends that header itself, one uuid4 per logical call kept across its
retries (`_retry_transient_errors`: `idempotency_key = str(uuid.uuid4())`, sent as
`x-idempotency-key` on every attempt), which only makes sense if the server executes a key
once; that the real server does so is an inference from that client code (no public
server source). The emulator honours it (same key: executed once, first answer replayed).
Where a server might not, the callers also resolve what an earlier attempt applied
(see `create_once` and ProxyAuthToken's orphan sweep).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

IDEMPOTENCY_HEADER = "x-idempotency-key"


def idempotency_key() -> str:
    """A fresh key for one logical create (keep it across the retries of that create)."""
    return str(uuid.uuid4())


def _once(key: str) -> dict[str, Any]:
    """Call options for a create sent exactly as asked: no modal-internal retries, our key."""
    return {"retry": None, "metadata": [(IDEMPOTENCY_HEADER, key)]}


async def _call(
    client: Any,
    method: str,
    request: str = "",
    *,
    key: str = "",
    missing_ok: bool = False,
    **fields: Any,
) -> Any:
    """`client._stub.<method>(<request>Request(**fields))` (`request`: the message's name when
    it is not the method's). With `key`: sent once as asked (`_once`). With `missing_ok`: a
    NotFoundError answers None (the object is gone: fine for a delete or a read)."""
    from modal import exception as mexc
    from modal_proto import api_pb2

    message = getattr(api_pb2, f"{request or method}Request")(**fields)
    stub = getattr(client._stub, method)
    try:
        return await (stub(message, **_once(key)) if key else stub(message))
    except mexc.NotFoundError:
        if not missing_ok:
            raise
        return None


async def create_once(
    memo: dict[str, Any],
    create: Callable[[], Awaitable[T]],
    lookup: Callable[[], Awaitable[T | None]],
) -> T:
    """Run a keyed create inside a retried attempt, resolving what an earlier attempt did.

    `memo` lives across the attempts of one provider call. The first attempt's "already
    exists" is genuine (the object existed before: the caller reports it). A later
    attempt's "already exists" after an earlier one was sent means the earlier attempt was
    applied and its answer lost (a server that did not replay the idempotency key): the
    object found by `lookup` is the one this create made.
    """
    from modal import exception as mexc

    sent_before = bool(memo.get("sent"))
    memo["sent"] = True
    try:
        return await create()
    except mexc.AlreadyExistsError:
        if sent_before:
            found = await lookup()
            if found is not None:
                return found
        raise


# ---- environments --------------------------------------------------------------------------


async def environment_list(client: Any) -> list[Any]:
    from google.protobuf.empty_pb2 import Empty

    return list((await client._stub.EnvironmentList(Empty())).items)


async def environment_find(client: Any, field: str, value: str) -> Any:
    """The listed environment whose `field` ("name"/"environment_id") is `value`, or None."""
    for item in await environment_list(client):
        if getattr(item, field) == value:
            return item
    return None


async def environment_create(client: Any, name: str, key: str) -> None:
    await _call(client, "EnvironmentCreate", key=key, name=name)


async def environment_set_suffix(client: Any, current_name: str, suffix: str) -> None:
    from google.protobuf.wrappers_pb2 import StringValue

    suffix_value = StringValue(value=suffix)
    await _call(client, "EnvironmentUpdate", current_name=current_name, web_suffix=suffix_value)


async def environment_delete(client: Any, name: str) -> None:
    await _call(client, "EnvironmentDelete", name=name)


async def environment_id(client: Any, name: str) -> str:
    """Id of an existing environment by name (NotFoundError if missing): a GetOrCreate with
    no creation type, as `_Environment.from_name(...).hydrate()` sends it."""
    return str((await _call(client, "EnvironmentGetOrCreate", deployment_name=name)).environment_id)


async def environment_get_budget(client: Any, env_id: str) -> Any:
    """`EnvironmentGetBudgetResponse` of the environment with that id."""
    return await _call(client, "EnvironmentGetBudget", environment_id=env_id)


async def environment_set_budget(client: Any, env_id: str, budget: float | None) -> None:
    """Set the environment's cycle budget in dollars; None clears it."""
    change = {"clear_budget": True} if budget is None else {"cycle_budget_dollars": budget}
    await _call(client, "EnvironmentSetBudget", environment_id=env_id, **change)


async def deployed_apps(client: Any, environment: str) -> list[str]:
    """Names of the apps deployed in an environment."""
    from modal_proto import api_pb2

    apps = await _call(client, "AppList", environment_name=environment)
    return [
        a.description or a.name or a.app_id
        for a in apps.apps
        if a.state == api_pb2.APP_STATE_DEPLOYED
    ]


# ---- secrets -------------------------------------------------------------------------------


async def _get_or_create(
    client: Any,
    kind: str,
    name: str,
    environment: str,
    key: str | None,
    **create: Any,
) -> str | None:
    """`<kind>GetOrCreate` (kind: Secret or Volume) of `name` in the environment, as the
    SDK's `from_name` sends it: with `key`, a create that fails if it exists (the `create`
    fields sent with it), sent once (`_once`); without, a lookup: the id, or None (also: no
    such environment). Returns `<kind>_id`."""
    from modal_proto import api_pb2

    resp = await _call(
        client,
        f"{kind}GetOrCreate",
        key=key or "",
        missing_ok=key is None,
        deployment_name=name,
        environment_name=environment,
        object_creation_type=(
            api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED
            if key is None
            else api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS
        ),
        **create,
    )
    return None if resp is None else str(getattr(resp, f"{kind.lower()}_id"))


async def secret_create(
    client: Any, name: str, environment: str, values: dict[str, str], key: str
) -> str:
    return str(await _get_or_create(client, "Secret", name, environment, key, env_dict=values))


async def secret_lookup(client: Any, name: str, environment: str) -> str | None:
    """Id of the secret of that name in the environment (as `Secret.from_name` hydrates)."""
    return await _get_or_create(client, "Secret", name, environment, None)


async def secret_info(client: Any, secret_id: str) -> Any:
    """`SecretGetInfoResponse.metadata` (name, environment, key names), or None if gone."""
    resp = await _call(client, "SecretGetInfo", missing_ok=True, secret_id=secret_id)
    return None if resp is None else resp.metadata


async def secret_set_values(client: Any, secret_id: str, values: dict[str, str]) -> None:
    """Make the secret hold exactly `values`, by id: set each, unset every other live key
    (an Update without `value`: api.proto "If not set, the key is removed")."""
    from modal_proto import api_pb2

    update = api_pb2.SecretUpdateRequest.Update
    info = await _call(client, "SecretGetInfo", secret_id=secret_id)
    removed = sorted(set(info.metadata.keys) - set(values))
    updates = [update(key=k, value=v) for k, v in values.items()]
    updates += [update(key=k) for k in removed]
    await _call(client, "SecretUpdate", secret_id=secret_id, updates=updates)


async def secret_delete(client: Any, secret_id: str) -> None:
    """Delete by id; already gone is fine."""
    await _call(client, "SecretDelete", missing_ok=True, secret_id=secret_id)


async def secret_list(client: Any, environment: str) -> list[Any]:
    """The environment's `SecretListItem`s (label, secret_id, metadata)."""
    return list((await _call(client, "SecretList", environment_name=environment)).items)


# ---- volumes -------------------------------------------------------------------------------


async def volume_create(client: Any, name: str, environment: str, key: str) -> str:
    from modal_proto import api_pb2

    version = api_pb2.VOLUME_FS_VERSION_UNSPECIFIED
    return str(await _get_or_create(client, "Volume", name, environment, key, version=version))


async def volume_lookup(client: Any, name: str, environment: str) -> str | None:
    """Id of the volume of that name in the environment, or None (also: no such env)."""
    return await _get_or_create(client, "Volume", name, environment, None)


async def volume_get(client: Any, volume_id: str) -> Any:
    """`VolumeGetByIdResponse` (metadata.name), or None if gone."""
    return await _call(client, "VolumeGetById", missing_ok=True, volume_id=volume_id)


async def volume_rename(client: Any, volume_id: str, name: str) -> None:
    await _call(client, "VolumeRename", volume_id=volume_id, name=name)


async def volume_delete(client: Any, volume_id: str) -> None:
    await _call(client, "VolumeDelete", missing_ok=True, volume_id=volume_id)


async def volume_list(client: Any, environment: str) -> list[tuple[str, str]]:
    """(name, volume id) of every volume in the environment (NotFoundError: no such env)."""
    resp = await _call(client, "VolumeList", environment_name=environment)
    return sorted((item.label, item.volume_id) for item in resp.items)


# ---- proxy-auth tokens ---------------------------------------------------------------------


async def token_create(client: Any, name: str, key: str) -> tuple[str, str]:
    """(token id, token secret): the secret is returned only here, never again."""
    resp = await _call(client, "WebhookTokenCreate", key=key, name=name)
    return str(resp.token_id), str(resp.token_secret)


async def token_list(client: Any) -> list[Any]:
    from google.protobuf.empty_pb2 import Empty

    return list((await client._stub.WebhookTokenList(Empty())).tokens)


async def token_delete(client: Any, token_id: str) -> None:
    await _call(client, "WebhookTokenDelete", "TokenDelete", missing_ok=True, token_id=token_id)


async def token_rename(client: Any, token_id: str, name: str) -> None:
    await _call(client, "WebhookTokenUpdate", token_id=token_id, name=name)


async def token_allow(client: Any, token_id: str, environment: str, allowed: bool) -> None:
    """Add the environment to the token's allowlist (`allowed=False`: remove it)."""
    method = "WebhookTokenEnvironmentAdd" if allowed else "WebhookTokenEnvironmentRemove"
    env_id = await environment_id(client, environment)
    await _call(client, method, token_id=token_id, environment_id=env_id)


async def token_environment_ids(client: Any, token_id: str) -> list[str]:
    """Environment ids in the token's allowlist (UNIMPLEMENTED on older servers)."""
    resp = await _call(client, "WebhookTokenEnvironmentList", token_id=token_id)
    return list(resp.environment_ids)


async def tokens_of_environment(client: Any, environment: str) -> list[str]:
    """Ids of the tokens allowed in an environment (the fallback of the read above)."""
    listed = await _call(client, "WebhookTokenListForEnvironment", environment_name=environment)
    return [t.token_id for t in listed.tokens]


# ---- apps ----------------------------------------------------------------------------------


async def app_id_by_name(client: Any, name: str, environment: str) -> str | None:
    """Id of the app deployed under that name ("" when none; None when the environment
    itself does not exist: `AppGetByDeploymentName` answers NotFound)."""
    resp = await _call(
        client, "AppGetByDeploymentName", missing_ok=True, name=name, environment_name=environment
    )
    return None if resp is None else str(resp.app_id)


async def app_stop_by_name(client: Any, name: str, environment: str) -> str:
    """Stop whatever app is deployed under the name; its id ("" when none, or no such
    environment: the app went with it)."""
    app_id = await app_id_by_name(client, name, environment)
    if app_id:
        await app_stop(client, app_id)
    return app_id or ""


async def app_version(client: Any, app_id: str) -> int:
    """Highest version in the app's deployment history (0 when it has none)."""
    rows = await app_deployments(client, app_id)
    return rows[-1].version if rows else 0


async def app_web_url(client: Any, app_id: str, name: str, environment: str) -> str:
    """The app's URL as Modal reports it: the first `@app.server` flash URL by function tag,
    else the first web endpoint URL (what `Server/Function.from_name(...)` see)."""
    layout = await _call(client, "AppGetLayout", app_id=app_id)
    flash: list[str] = []
    web: list[str] = []
    for tag in sorted(layout.app_layout.function_ids):
        fn = await _call(
            client,
            "FunctionGet",
            missing_ok=True,
            app_name=name,
            object_tag=tag,
            environment_name=environment,
        )
        if fn is None:
            continue
        flash.extend(fn.handle_metadata._experimental_flash_urls)
        if fn.handle_metadata.web_url:
            web.append(fn.handle_metadata.web_url)
    return (flash or web or [""])[0]


async def app_stop(client: Any, app_id: str) -> None:
    """Stop an app by id; already gone is fine."""
    await _call(client, "AppStop", missing_ok=True, app_id=app_id)


async def _fetch_logs(
    client: Any, app_id: str, since: float, until: float, limit: int, function_id: str = ""
) -> list[Any]:
    """The `TaskLogsBatch`es of one `AppFetchLogs` over [since, until] (epoch seconds): the
    request `modal app logs` sends (modal 1.6.4 `_logs._fetch_logs_interval`), of one
    function when `function_id` is given."""
    from google.protobuf.timestamp_pb2 import Timestamp

    lo, hi = Timestamp(), Timestamp()
    lo.FromNanoseconds(int(since * 1e9))
    hi.FromNanoseconds(int(until * 1e9))
    resp = await _call(
        client,
        "AppFetchLogs",
        app_id=app_id,
        since=lo,
        until=hi,
        limit=limit,
        function_id=function_id,
    )
    return list(resp.batches)


async def app_log_lines(
    client: Any, app_id: str, function_id: str, since: float, until: float
) -> list[tuple[float, str]]:
    """(timestamp, line) of one function's log in [since, until], oldest first."""
    out = [
        (float(item.timestamp), line.rstrip())
        for batch in await _fetch_logs(client, app_id, since, until, 1000, function_id)
        for item in batch.items
        for line in item.data.splitlines()
        if line.strip()
    ]
    return sorted(out, key=lambda entry: entry[0])


async def autoscaler_settings(client: Any, app_name: str, tag: str, environment: str) -> Any:
    """`AutoscalerConfiguration` of a deployed function or `@app.server` (by its tag):
    `settings` (effective), `static_settings` (the decorator's), `override_settings` (what
    `update_autoscaler` set since the last deploy; empty when none). For drift reports: an
    override that differs from the static settings is a runtime change a deploy would undo.
    The request `Function/Server.autoscaler.settings()` sends (modal 1.6.4)."""
    fn = await _call(
        client, "FunctionGet", app_name=app_name, object_tag=tag, environment_name=environment
    )
    resp = await _call(client, "FunctionGetSchedulingParams", function_id=fn.function_id)
    return resp.autoscaler_configuration


async def autoscaler_overrides(client: Any, app_id: str) -> dict[str, dict[str, Any]]:
    """Live runtime autoscaler overrides of a deployed app's functions and `@app.server`s, by
    tag: {tag: {"override": {field: value}, "static": {field: deployed value}}}, only for
    those with an override (`update_autoscaler` since the last deploy); {} when none, or
    when the app has no function at all. A function gone between the layout and the read is
    skipped. Same request as `autoscaler_settings`, by the layout's function ids
    (`Function.autoscaler.settings()` sends the function's object id, modal 1.6.4)."""
    layout = await _call(client, "AppGetLayout", app_id=app_id)
    out: dict[str, dict[str, Any]] = {}
    for tag, function_id in sorted(layout.app_layout.function_ids.items()):
        resp = await _call(
            client, "FunctionGetSchedulingParams", missing_ok=True, function_id=function_id
        )
        if resp is None:
            continue
        conf = resp.autoscaler_configuration
        override = {f.name: v for f, v in conf.override_settings.ListFields()}
        if override:
            st = conf.static_settings
            static = {k: getattr(st, k) if st.HasField(k) else None for k in override}
            out[tag] = {"override": override, "static": static}
    return out


async def hello(client: Any) -> None:
    """`ClientHello`: the cheapest round trip (the probe before a create)."""
    from google.protobuf.empty_pb2 import Empty

    await client._stub.ClientHello(Empty())


# ---- releases (issue 21): deployments, app tags, rollback, containers, logs -----------------


@dataclass(frozen=True)
class Deployment:
    """One row of an app's deployment history (`AppDeploymentHistory`, what `modal app
    history` shows: modal 1.6.4 cli/app.py `history`)."""

    version: int
    deployed_at: float
    #: The deployment tag (`modal deploy --tag`, <= 50 chars: modal/runner.py `deploy_app`).
    tag: str
    #: The version this one rolled back to (0: a deploy, not a rollback).
    rollback_version: int
    #: The git commit modal recorded (runner.py `deploy_app` sends `get_git_commit_info()`).
    commit: str


async def app_deployments(client: Any, app_id: str) -> list[Deployment]:
    """Every deployment of the app, oldest first."""
    hist = await _call(client, "AppDeploymentHistory", app_id=app_id)
    rows = [
        Deployment(
            version=int(h.version),
            deployed_at=float(h.deployed_at),
            tag=str(h.tag),
            rollback_version=int(h.rollback_version),
            commit=str(h.commit_info.commit_hash),
        )
        for h in hist.app_deployment_histories
    ]
    return sorted(rows, key=lambda d: d.version)


async def app_tags(client: Any, app_id: str) -> dict[str, str]:
    """The app's tags (`AppGetTags`, modal 1.6.4 `App.get_tags`)."""
    return dict((await _call(client, "AppGetTags", app_id=app_id)).tags)


async def app_set_tags(client: Any, app_id: str, tags: dict[str, str]) -> None:
    """Replace the app's whole tag set (`AppSetTags`, modal 1.6.4 `App.set_tags`: "Any tags
    set on the App before calling this method will be removed if they are not included")."""
    await _call(client, "AppSetTags", app_id=app_id, tags=tags)


async def app_log_tasks(client: Any, app_id: str, since: float) -> dict[str, float]:
    """{task id: time of its first log line} for every container that logged since `since`
    (one `AppFetchLogs`; each `TaskLogsBatch` names its `task_id`)."""
    import time

    first: dict[str, float] = {}
    for batch in await _fetch_logs(client, app_id, since, time.time() + 60, 1000):
        if not batch.task_id:
            continue
        for item in batch.items:
            t = float(item.timestamp)
            if batch.task_id not in first or t < first[batch.task_id]:
                first[batch.task_id] = t
    return first


async def app_rollback(client: Any, app_id: str, version: int) -> float:
    """Roll the app back to `version` as `modal app rollback APP vN` does (modal 1.6.4
    cli/app.py: `AppRollbackRequest(app_id=..., version=N)`; -1 = the previous one). Modal
    publishes the old layout as a new version; returns its `deployed_at`."""
    resp = await _call(client, "AppRollback", app_id=app_id, version=version)
    return float(resp.deployed_at)


async def app_containers(client: Any, app_id: str, environment: str) -> list[tuple[str, float]]:
    """(task id, enqueued_at) of the app's live containers (`TaskList`, the request modal
    1.6.4 runner.py `_stop_and_wait_for_containers` sends to find a deploy's old containers:
    those enqueued before the new version's `deployed_at`)."""
    resp = await _call(client, "TaskList", environment_name=environment, app_id=app_id)
    return [(str(t.task_id), float(t.enqueued_at)) for t in resp.tasks]


async def app_log_tail(client: Any, app_id: str, since: float, n: int) -> list[str]:
    """The app's last `n` log lines since `since` (epoch seconds), oldest first: one
    `AppFetchLogs` with a hard floor, as modal 1.6.4 `_logs.tail_logs(..., since=...)` sends
    it for `modal app logs APP --since ...`."""
    import time

    lines: list[str] = []
    for batch in await _fetch_logs(client, app_id, since, time.time() + 60, n):
        for item in batch.items:
            lines.extend(part for part in item.data.splitlines() if part.strip())
    return lines[-n:]


async def function_call_cancel(client: Any, call_id: str) -> None:
    """Cancel a spawned call and end the containers running it: the request
    `FunctionCall.cancel(terminate_containers=True)` sends (modal 1.6.4 `modal/_functions.py`,
    `_FunctionCall.cancel`). A call already gone is fine."""
    await _call(
        client,
        "FunctionCallCancel",
        missing_ok=True,
        function_call_id=call_id,
        terminate_containers=True,
    )


# ---- service users and environment roles (modal 1.6.4 `modal/_workspace.py`
# `_WorkspaceServiceUserManager`, `modal workspace service-users` in `modal/cli/workspace.py`) --


async def service_user_create(
    client: Any, name: str, expires_in_s: int, key: str, *, scoped: bool = True
) -> tuple[str, str, str]:
    """(service user id, token id, token secret): the secret is returned only here. Sent as
    `service_users.create` sends it, plus `scoped` (a field of `ServiceUserCreateRequest` the
    1.6.4 SDK leaves unset; a scoped service user gets access only through environment roles,
    which is what the access stack grants), once, under the caller's idempotency key."""
    expiry: dict[str, Any] = {"expires_in_seconds": expires_in_s} if expires_in_s else {}
    resp = await _call(client, "ServiceUserCreate", key=key, name=name, scoped=scoped, **expiry)
    return str(resp.service_user_id), str(resp.token_id), str(resp.token_secret)


async def service_user_info(client: Any, name: str) -> Any:
    """The `ServiceUser` message of that name (`service_users.info`), or None when it is gone:
    `service_user_id`, `token_id`, `created_at`, `last_used_at` (0: never), `expires_at`,
    `environment_roles` ({environment_name, role_str} per environment it has a role in)."""
    resp = await _call(client, "ServiceUserInfo", missing_ok=True, service_user_name=name)
    return None if resp is None else resp.service_user


async def service_user_delete(client: Any, name: str) -> None:
    """Delete by name (`service_users.delete`); already gone is fine."""
    await _call(client, "ServiceUserDelete", missing_ok=True, service_user_name=name)


async def environment_role_set(client: Any, service_user: str, environment: str, role: str) -> None:
    """Set a service user's role in one environment, as `service_users.set_role` does: the
    environment's id first (`_Environment.from_name(...).hydrate()` = EnvironmentGetOrCreate
    without creation), then `EnvironmentRoleSet{service_user_name, environment_id, role_str}`;
    role "no-access" revokes."""
    env_id = await environment_id(client, environment)
    await _call(
        client,
        "EnvironmentRoleSet",
        service_user_name=service_user,
        environment_id=env_id,
        role_str=role,
    )


# ---- ownership marks (issue 32 item 10; `_base.owner_mark` makes them in the program) ---------

#: `<stack digest>_<resource digest>`: 12 hex each.
OWNER_RE = re.compile(r"^[0-9a-f]{12}_[0-9a-f]{12}$")
#: A Secret's env-dict key naming its owner (`MODAL_LLM_OWNER_<owner>`): Modal returns a
#: secret's key names (`SecretGetInfo` / `SecretList` metadata.keys, modal 1.6.4
#: `_Secret._hydrate_metadata`), never its values, so the mark is in the key's name.
OWNER_KEY_PREFIX = "MODAL_LLM_OWNER_"


def owner_key(owner: str) -> str:
    return OWNER_KEY_PREFIX + owner


def owners_in(keys: Iterable[str]) -> list[str]:
    """The marks named by a secret's key names."""
    return [
        key[len(OWNER_KEY_PREFIX) :]
        for key in keys
        if key.startswith(OWNER_KEY_PREFIX) and OWNER_RE.match(key[len(OWNER_KEY_PREFIX) :])
    ]


def stack_of(owner: str) -> str:
    """The stack part of a mark."""
    return owner.split("_", 1)[0] if owner else ""


# ---- pending creates (issue 32 item 10: a create whose answer was lost) ---------------------
#
# Volumes, environments, proxy-auth tokens and service users carry no tag or label Modal would
# return (modal_proto 1.6.4: VolumeGetOrCreateRequest, EnvironmentCreateRequest,
# WebhookTokenCreateRequest, ServiceUserCreateRequest have no such field; a Secret's env dict
# does, see `_base.OWNER_KEY_PREFIX`). So before such a create is sent, a *pending record* is
# written: a Secret `modal-llm-pending-<owner>` whose key NAMES (all Modal returns of a secret:
# `SecretGetInfo` metadata.keys) say which resource (the owner key), what object (kind and
# hex of its name) and since when (epoch seconds). Once the create answered, the record is
# deleted. If the answer was lost (engine, emulator or network killed), the next create of
# the same resource finds the record: an object of that name created at or after the record
# (created_at, minus PENDING_CLOCK_MARGIN_S for clock skew) is the one it made, and is taken
# as its own; anything else of that name is a stranger's and refused.

PENDING_PREFIX = "modal-llm-pending-"
PENDING_SINCE = "MODAL_LLM_PENDING_SINCE_"
PENDING_OBJECT = "MODAL_LLM_PENDING_OBJ_"
#: Modal's clock against ours: an object created this much before the record still counts.
PENDING_CLOCK_MARGIN_S = 60.0


@dataclass(frozen=True)
class Pending:
    """A pending record: `owner` was about to create `kind` `name` at `since`; `notes`: the
    record's other key names (what the create needs to know again, e.g. SpendAlert's budget
    before it)."""

    owner: str
    kind: str
    name: str
    since: float
    secret_id: str
    notes: tuple[str, ...] = ()


def pending_secret_name(owner: str) -> str:
    return PENDING_PREFIX + owner.replace("_", "-")


def _pending_keys(
    owner: str, kind: str, name: str, since: float, notes: tuple[str, ...] = ()
) -> dict[str, str]:
    return {
        owner_key(owner): "1",
        f"{PENDING_SINCE}{int(since)}": "1",
        f"{PENDING_OBJECT}{kind}_{name.encode().hex()}": "1",
        **dict.fromkeys(notes, "1"),
    }


def parse_pending(owner: str, secret_id: str, keys: list[str]) -> Pending | None:
    """The record a pending secret's key names hold (None: not one)."""
    since = next((k[len(PENDING_SINCE) :] for k in keys if k.startswith(PENDING_SINCE)), "")
    obj = next((k[len(PENDING_OBJECT) :] for k in keys if k.startswith(PENDING_OBJECT)), "")
    if not since.isdigit() or "_" not in obj:
        return None
    kind, hexname = obj.rsplit("_", 1)  # the name is hex: the last "_" ends the kind
    try:
        name = bytes.fromhex(hexname).decode()
    except ValueError:
        return None
    notes = tuple(
        sorted(
            k for k in keys if not k.startswith((PENDING_SINCE, PENDING_OBJECT, OWNER_KEY_PREFIX))
        )
    )
    return Pending(owner, kind, name, float(since), secret_id, notes)


async def pending_begin(
    client: Any,
    owner: str,
    environment: str,
    kind: str,
    name: str,
    notes: tuple[str, ...] = (),
) -> bool:
    """Record that `owner` is about to create `kind` `name`: the pending secret is written
    whole (`CREATE_OVERWRITE_IF_EXISTS`, what modal 1.6.4 `_Secret._create_deployed(...,
    overwrite=True)` sends for `modal secret create --force`), so a repeat is harmless.
    False when this identity may not write secrets there (a scoped service user without a
    role in the default environment): the create goes on without a record, as before marks
    existed (a lost answer is then refused as a stranger's on the next create)."""
    import time

    from modal import exception as mexc
    from modal_proto import api_pb2

    try:
        await _call(
            client,
            "SecretGetOrCreate",
            deployment_name=pending_secret_name(owner),
            environment_name=environment,
            object_creation_type=api_pb2.OBJECT_CREATION_TYPE_CREATE_OVERWRITE_IF_EXISTS,
            env_dict=_pending_keys(owner, kind, name, time.time(), notes),
        )
    except mexc.PermissionDeniedError:
        return False
    return True


async def _pending_id(client: Any, owner: str, environment: str) -> str | None:
    """The id of `owner`'s pending secret in `environment`, or None: no owner (a resource
    without a mark writes no record), none there, no such environment, or no right to read
    secrets there (then this identity cannot have written one either)."""
    from modal import exception as mexc

    if not owner:
        return None
    try:
        return await secret_lookup(client, pending_secret_name(owner), environment)
    except (mexc.NotFoundError, mexc.PermissionDeniedError):
        return None


async def pending_get(client: Any, owner: str, environment: str) -> Pending | None:
    """The pending record of `owner` in `environment`, or None (see `_pending_id`)."""
    secret_id = await _pending_id(client, owner, environment)
    md = await secret_info(client, secret_id) if secret_id is not None else None
    return None if md is None else parse_pending(owner, str(secret_id), list(md.keys))


async def pending_end(client: Any, owner: str, environment: str) -> None:
    """Drop `owner`'s pending record (none there, see `_pending_id`: fine)."""
    secret_id = await _pending_id(client, owner, environment)
    if secret_id is not None:
        await secret_delete(client, secret_id)


def pending_claims(
    pending: Pending | None,
    kind: str,
    name: str,
    created_at: float,
    margin: float = PENDING_CLOCK_MARGIN_S,
) -> bool:
    """The record says this object (created at `created_at`) is the one its create made.
    `margin`: how far Modal's clock may lag ours (0 where a wrong claim deletes a live
    credential: ProxyAuthToken)."""
    return (
        pending is not None
        and pending.kind == kind
        and pending.name == name
        and created_at >= pending.since - margin
    )


async def stack_leftovers(
    client: Any, environment: str, stack: str
) -> tuple[list[tuple[str, str]], list[Pending]]:
    """What this stack left in an environment that no state records: ([(secret name, id)]
    of every secret marked by this stack: lost creates and pending records), [the pending
    records among them]."""
    secrets: list[tuple[str, str]] = []
    pendings: list[Pending] = []
    for item in await secret_list(client, environment):
        keys = list(item.metadata.keys)
        if not keys:  # a server that lists without metadata: ask for it
            md = await secret_info(client, item.secret_id)
            keys = list(md.keys) if md is not None else []
        mine = [o for o in owners_in(keys) if stack_of(o) == stack]
        if not mine:
            continue
        secrets.append((item.label, item.secret_id))
        if item.label == pending_secret_name(mine[0]):
            record = parse_pending(mine[0], item.secret_id, keys)
            if record is not None:
                pendings.append(record)
    return secrets, pendings
