"""What a service-user token may call: one table, every RPC the emulator serves.

Who is who (modal.com/docs/guide/rbac, "Workspace Roles" and "Environment Roles"):

- the emulator's own workspace token (`--token-id/--token-secret`, or any token when none is
  set) is the workspace **Owner**: "Full read-write access to everything in the Workspace,
  including billing, Workspace management, and all Environments". It is never checked here,
  nor are a container's own calls (its unix socket, no token: Context.task_id).
- a service user acts like a workspace **Member** at most (modal.com/docs/guide/service-users,
  "Permissions": service users "have the same permissions as workspace members. They cannot
  do actions that are only permitted for a workspace owner or manager"); a Member "can deploy
  and manage Apps, but cannot access billing, Workspace management, or other Workspace
  settings". Where it may act is its environment roles (dev/emulator/models/service_users.py,
  `ServiceUsers.role_in`): **viewer** = "Read-only access to resources in the Environment,
  including dashboards, logs, metrics, app and function configuration"; **contributor** =
  "Full read and write access to the Environment".

Each RPC is one `Rule` in `RULES`: what it needs (`Need`), where the request names its
environment (`env`: its `environment_name`, "" meaning the workspace's default environment as
everywhere in the emulator, or the environment of the object whose id it carries: app,
function, secret, volume, dict, function call, container), what it needs when it creates the
object (`creating`, for the get-or-create RPCs), and what applies when it names no environment
(`fallback`). An RPC that is not in the table is refused (deny by default), so a new handler
cannot open a hole unnoticed; tests/emulator/test_rbac_roles.py checks that every registered
RPC has a rule. Where Modal's documentation does not say which role an RPC needs, the rule is
the stricter reading and says so (`stricter=True`, and docs/emulator.md "Roles").

Every refusal is PERMISSION_DENIED naming the service user, the RPC, the environment, the
service user's role there, the role needed and the command that grants it; never a secret.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modal_proto import api_pb2

from emulator.errors import EmulatorError, NotFound, PermissionDenied
from emulator.models.service_users import READ_ROLES, WRITE_ROLES, ServiceUser

GRANT = "modal workspace service-users set-role {name} {env} {role}"


class Need(enum.Enum):
    """What the caller must hold for an RPC."""

    ANYONE = "any authenticated identity"
    OWNER = "the workspace Owner or Manager role"
    CONTAINER = "a container's own identity"
    READ = "viewer or contributor in the request's environment"
    WRITE = "contributor in the request's environment"
    READ_SOMEWHERE = "viewer or contributor in at least one environment"
    WRITE_SOMEWHERE = "contributor in at least one environment"


#: Where a request field points: an environment by name, or an object whose environment counts.
NAME, ENV_ID, APP, FUNCTION, SECRET, VOLUME, DICT, CALL, TASK = (
    "environment",
    "environment id",
    "app",
    "function",
    "secret",
    "volume",
    "dict",
    "function call",
    "container",
)
Field = tuple[str, str]  # (request field, what it names)
ENV_NAME: Field = ("environment_name", NAME)


@dataclass(frozen=True)
class Rule:
    need: Need
    #: Request fields naming the environment(s). An id field counts when set; a NAME field
    #: always counts ("" = the default environment), unless `first` is set: then only the
    #: first field that is set counts (a NAME field last stands for "" = default).
    env: tuple[Field, ...] = ()
    first: bool = False
    #: Need when `object_creation_type` asks to create (get-or-create RPCs); else `need`.
    creating: Need | None = None
    #: Need when the request names no environment (no env field set); None: refused.
    fallback: Need | None = None
    #: Filters a unary answer for a service user (e.g. EnvironmentList: its environments).
    answer: Callable[[Any, ServiceUser, Any], Any] | None = None
    stricter: bool = False  # a stricter reading where Modal's documentation is silent
    source: str = ""
    #: The objects the request attaches by id, (kind, id) each: each is checked where it
    #: lives (`_check_references`).
    refs: Callable[[Any], list[tuple[str, str]]] | None = None


_RBAC = "modal.com/docs/guide/rbac"
_VIEWER = f"{_RBAC}: viewer = read-only access to resources, logs, app and function config"
_CONTRIB = f"{_RBAC}: contributor = full read and write access; Member deploys and manages Apps"
_ADMIN = f"{_RBAC}: Member cannot access billing, Workspace management or Workspace settings"
_SU_ADMIN = "modal 1.6.4 modal/cli/workspace.py: service users 'Must be workspace manager or owner'"
_PROXY = (
    "modal.com/docs/guide/webhook-proxy-auth: proxy auth tokens are created in workspace "
    "settings (/settings/proxy-auth-tokens)"
)
_CONTAINER = "only a container makes it, over its own socket with no token (modal 1.6.4 client)"
_UPLOAD = "no environment on the request: deploy-time upload/build step"


def _filter_environment_list(state: Any, su: ServiceUser, answer: Any) -> Any:
    """Only the environments where the service user has a role, with that role."""
    roles = {
        "viewer": api_pb2.ENVIRONMENT_ROLE_VIEWER,
        "contributor": api_pb2.ENVIRONMENT_ROLE_CONTRIBUTOR,
    }
    kept = []
    for item in answer.items:
        role = state.service_users.role_in(su, item.environment_id)
        if role in roles:
            item.effective_role = roles[role]
            kept.append(item)
    return api_pb2.EnvironmentListResponse(items=kept)


def _function_refs(request: Any) -> list[tuple[str, str]]:
    """The Secrets and Volumes a FunctionCreate attaches by id: `Function.secret_ids`,
    `volume_mounts[].volume_id` and cloud bucket mounts' `credentials_secret_id` (modal 1.6.4
    `_functions.py` fills them from `secrets=` and `volumes=`; `FunctionData` has none of
    these fields in the pinned modal_proto)."""
    fn = request.function
    refs = [(SECRET, sid) for sid in fn.secret_ids]
    refs += [(VOLUME, vm.volume_id) for vm in fn.volume_mounts if vm.volume_id]
    refs += [
        (SECRET, m.credentials_secret_id) for m in fn.cloud_bucket_mounts if m.credentials_secret_id
    ]
    return list(dict.fromkeys(refs))


def _rules() -> dict[str, Rule]:
    read, write = Need.READ, Need.WRITE
    app: Field = ("app_id", APP)
    fn: Field = ("function_id", FUNCTION)
    call: Field = ("function_call_id", CALL)
    task: Field = ("task_id", TASK)
    secret: Field = ("secret_id", SECRET)
    volume: Field = ("volume_id", VOLUME)
    dict_: Field = ("dict_id", DICT)

    def owner(source: str, stricter: bool = False) -> Rule:
        return Rule(Need.OWNER, source=source, stricter=stricter)

    def container() -> Rule:
        return Rule(Need.CONTAINER, source=_CONTAINER, stricter=True)

    def on(need: Need, *env: Field, source: str, **kw: Any) -> Rule:
        return Rule(need, env=env, source=source, **kw)

    calling = f"{_CONTRIB}; a viewer may not run code (stricter: viewer is read-only)"
    rules = {
        # ---- workspace -----------------------------------------------------------------
        "ClientHello": Rule(Need.ANYONE, source="the client's handshake; names nothing"),
        "AuthTokenGet": Rule(
            Need.READ_SOMEWHERE, stricter=True, source="names no environment: any role"
        ),
        "WorkspaceNameLookup": Rule(
            Need.READ_SOMEWHERE, stricter=True, source="names no environment: any role"
        ),
        "EnvironmentList": Rule(
            Need.READ_SOMEWHERE,
            answer=_filter_environment_list,
            stricter=True,
            source=f"{_VIEWER}; lists only environments where it has a role",
        ),
        "EnvironmentGetOrCreate": on(
            read,
            ("deployment_name", NAME),
            creating=Need.OWNER,
            source=f"{_VIEWER}; creating an environment is Workspace management ({_ADMIN})",
        ),
        "EnvironmentCreate": owner(_ADMIN),
        "EnvironmentUpdate": owner(_ADMIN),
        "EnvironmentDelete": owner(_ADMIN),
        "EnvironmentSetBudget": owner(f"{_ADMIN} (billing)"),
        "EnvironmentGetBudget": on(
            read,
            ("environment_id", ENV_ID),
            stricter=True,
            source=f"{_VIEWER} (metrics); inferred: Modal does not say who reads a budget",
        ),
        "WebhookTokenCreate": owner(_PROXY),
        "WebhookTokenList": owner(_PROXY),
        "WebhookTokenListForEnvironment": owner(_PROXY, stricter=True),
        "WebhookTokenUpdate": owner(_PROXY),
        "WebhookTokenEnvironmentAdd": owner(_PROXY),
        "WebhookTokenEnvironmentRemove": owner(_PROXY),
        "WebhookTokenEnvironmentList": owner(_PROXY, stricter=True),
        "WebhookTokenDelete": owner(_PROXY),
        "ServiceUserCreate": owner(_SU_ADMIN),
        "ServiceUserInfo": owner(_SU_ADMIN),
        "ServiceUserList": owner(_SU_ADMIN),
        "ServiceUserDelete": owner(_SU_ADMIN),
        "EnvironmentRoleSet": owner(_SU_ADMIN),
        # ---- apps ----------------------------------------------------------------------
        "AppCreate": on(write, ENV_NAME, source=_CONTRIB),
        "AppGetOrCreate": on(read, ENV_NAME, creating=write, source=f"{_VIEWER}; {_CONTRIB}"),
        "AppGetByDeploymentName": on(read, ENV_NAME, source=_VIEWER),
        "AppList": on(read, ENV_NAME, source=_VIEWER),
        "AppGetLayout": on(read, app, source=_VIEWER),
        "AppGetLifecycle": on(read, app, source=_VIEWER),
        "AppDeploymentHistory": on(read, app, source=_VIEWER),
        "AppGetTags": on(read, app, source=_VIEWER),
        "AppHeartbeat": on(write, app, source=f"{_CONTRIB} (sent by the deploying client)"),
        "AppClientDisconnect": on(write, app, source=f"{_CONTRIB} (sent by the deploying client)"),
        "AppPublish": on(write, app, source=_CONTRIB),
        "AppStop": on(write, app, source=_CONTRIB),
        "AppRollback": on(write, app, source=_CONTRIB),
        "AppSetTags": on(write, app, source=_CONTRIB),
        # ---- logs and containers -------------------------------------------------------
        "AppGetLogs": on(read, app, fn, task, call, source=f"{_VIEWER} (logs)"),
        "AppFetchLogs": on(read, app, fn, task, call, source=f"{_VIEWER} (logs)"),
        "AppCountLogs": on(read, app, fn, task, call, source=f"{_VIEWER} (logs)"),
        "TaskList": on(read, app, ENV_NAME, first=True, source=f"{_VIEWER} (dashboards)"),
        "ContainerStop": on(write, task, source=_CONTRIB),
        # ---- deploy --------------------------------------------------------------------
        "ImageGetOrCreate": on(write, app, source=_CONTRIB),
        "ImageJoinStreaming": Rule(Need.WRITE_SOMEWHERE, stricter=True, source=_UPLOAD),
        "MountBatchedCheckExistence": Rule(Need.WRITE_SOMEWHERE, stricter=True, source=_UPLOAD),
        "MountPutFile": Rule(Need.WRITE_SOMEWHERE, stricter=True, source=_UPLOAD),
        "BlobCreate": Rule(Need.WRITE_SOMEWHERE, stricter=True, source=_UPLOAD),
        "BlobGet": on(
            write,
            fn,
            fallback=Need.WRITE_SOMEWHERE,
            stricter=True,
            source="large function inputs/outputs: part of calling a function",
        ),
        "MountGetOrCreate": on(
            read, app, ENV_NAME, first=True, creating=write, source=f"{_VIEWER}; {_CONTRIB}"
        ),
        "FunctionPrecreate": on(write, app, source=_CONTRIB),
        "FunctionCreate": on(
            write, app, refs=_function_refs, source=f"{_CONTRIB}; attached objects: their env"
        ),
        "ClassCreate": on(write, app, source=_CONTRIB),
        "FunctionGet": on(read, ENV_NAME, source=f"{_VIEWER} (function configuration)"),
        "ClassGet": on(read, ENV_NAME, source=f"{_VIEWER} (function configuration)"),
        "FunctionGetById": on(read, fn, source=f"{_VIEWER} (function configuration)"),
        "FunctionGetSchedulingParams": on(read, fn, source=f"{_VIEWER} (function configuration)"),
        "FunctionUpdateSchedulingParams": on(write, fn, source=_CONTRIB),
        # ---- calling functions ---------------------------------------------------------
        "FunctionMap": on(write, fn, stricter=True, source=calling),
        "FunctionPutInputs": on(write, call, fn, stricter=True, source=calling),
        "FunctionGetOutputs": on(write, call, stricter=True, source=calling),
        "FunctionFinishInputs": on(write, fn, call, stricter=True, source=calling),
        "FunctionRetryInputs": on(
            write, ("function_call_jwt", CALL), stricter=True, source=calling
        ),
        "FunctionCallCancel": on(write, call, fn, stricter=True, source=calling),
        # ---- a container's own calls ---------------------------------------------------
        "ContainerHello": container(),
        "ContainerHeartbeat": container(),
        "ContainerServerLifecycleReady": container(),
        "ContainerCheckpoint": container(),
        "TaskResult": container(),
        "FunctionGetInputs": container(),
        "FunctionPutOutputs": container(),
        "FunctionCallGetDataIn": container(),
        "FunctionCallPutDataOut": container(),
        "FunctionGetDynamicConcurrency": container(),
        # ---- secrets, volumes, dicts ---------------------------------------------------
        "SecretGetOrCreate": on(
            read, ENV_NAME, app, creating=write, source=f"{_VIEWER}; {_CONTRIB}"
        ),
        "SecretGetInfo": on(read, secret, source=_VIEWER),
        "SecretList": on(read, ENV_NAME, source=_VIEWER),
        "SecretUpdate": on(write, secret, source=_CONTRIB),
        "SecretDelete": on(write, secret, source=_CONTRIB),
        "VolumeGetOrCreate": on(
            read, ENV_NAME, app, creating=write, source=f"{_VIEWER}; {_CONTRIB}"
        ),
        "VolumeGetById": on(read, volume, source=_VIEWER),
        "VolumeList": on(read, ENV_NAME, source=_VIEWER),
        "VolumeDelete": on(write, volume, source=_CONTRIB),
        "VolumeRename": on(write, volume, source=_CONTRIB),
        "VolumeHeartbeat": on(write, volume, source=f"{_CONTRIB} (keeps an ephemeral volume)"),
        "VolumeCommit": on(write, volume, source=_CONTRIB),
        "VolumeReload": on(read, volume, source=_VIEWER),
        "DictGetOrCreate": on(read, ENV_NAME, creating=write, source=f"{_VIEWER}; {_CONTRIB}"),
        "DictGet": on(read, dict_, source=_VIEWER),
        "DictContains": on(read, dict_, source=_VIEWER),
        "DictLen": on(read, dict_, source=_VIEWER),
        "DictUpdate": on(write, dict_, source=_CONTRIB),
        "DictPop": on(write, dict_, source=_CONTRIB),
        "DictClear": on(write, dict_, source=_CONTRIB),
        "DictDelete": on(write, dict_, source=_CONTRIB),
        "DictHeartbeat": on(write, dict_, source=f"{_CONTRIB} (keeps an ephemeral dict)"),
    }
    return rules


#: RPC name -> what a service user needs to call it. Not listed: refused.
RULES: dict[str, Rule] = _rules()


# ---- deciding ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Env:
    id: str | None  # None: the name/id does not resolve
    label: str  # how the refusal names it
    unknown_object: bool = False  # an object id the emulator does not know


def _creating(request: Any) -> bool:
    value = getattr(request, "object_creation_type", api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED)
    return bool(value != api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED)


def _env_of_object(state: Any, runtime: Any, kind: str, value: str) -> str | None:
    """The environment id of the object `value` of `kind`, or None when it is unknown."""
    sql = {
        APP: "SELECT env_id FROM apps WHERE id = ?",
        FUNCTION: "SELECT a.env_id FROM functions f JOIN apps a ON a.id = f.app_id WHERE f.id = ?",
        SECRET: "SELECT env_id FROM secrets WHERE id = ?",
        VOLUME: "SELECT env_id FROM volumes WHERE id = ?",
        ENV_ID: "SELECT id FROM environments WHERE id = ?",
    }.get(kind)
    if sql is not None:
        with state.store.read() as db:
            row = db.execute(sql, (value,)).fetchone()
        return str(row[0]) if row is not None else None
    if kind == DICT:
        try:
            return str(state.dicts.get(value).env_id)
        except EmulatorError:  # NotFound, or a malformed id (InvalidArgument)
            return None
    if runtime is None:
        return None
    if kind == CALL:
        fc = runtime.calls.get(value)
        return _env_of_object(state, runtime, FUNCTION, fc.function_id) if fc else None
    if kind == TASK:
        container = runtime.container(value)
        return _env_of_object(state, runtime, APP, container.app_id) if container else None
    return None


def _environments(state: Any, runtime: Any, rule: Rule, request: Any) -> list[_Env]:
    """The environments the request acts in, as the rule says where to find them."""
    found: list[_Env] = []
    for name, kind in rule.env:
        value = str(getattr(request, name, ""))
        if kind == NAME:
            if rule.first and found:
                break
            try:
                env = state.environments.lookup(value)
                found.append(_Env(env.id, repr(env.name)))
            except NotFound:
                found.append(_Env(None, repr(value)))
            if rule.first:
                break
            continue
        if not value:
            continue
        env_id = _env_of_object(state, runtime, kind, value)
        if env_id is None:
            found.append(_Env(None, f"of {kind} {value}", unknown_object=True))
        else:
            found.append(_Env(env_id, _env_label(state, env_id)))
        if rule.first:
            break
    return found


def _env_label(state: Any, env_id: str) -> str:
    try:
        return repr(state.environments.get(env_id).name)
    except NotFound:
        return env_id


def _grant_env(label: str) -> str:
    return label.strip("'") if label.startswith("'") else "ENV"


def authorize(state: Any, runtime: Any, su: ServiceUser, method: str, request: Any) -> Rule:
    """PermissionDenied unless the service user may call `method` with `request`; else the
    RPC's rule (its `answer` filter applies to the handler's answer)."""
    rule = RULES.get(method)
    who = su.label
    if rule is None:
        raise PermissionDenied(
            f"{who} may not call {method}: the emulator's role table (dev/emulator/models/rbac.py)"
            " does not classify this RPC, so no service user may call it (deny by default). "
            "Use the workspace token (Owner), or classify the RPC with its source."
        )
    need = rule.creating if rule.creating is not None and _creating(request) else rule.need
    envs = _environments(state, runtime, rule, request) if need in (Need.READ, Need.WRITE) else []
    if need in (Need.READ, Need.WRITE) and not envs:
        if rule.fallback is None:
            raise PermissionDenied(
                f"{who} may not call {method}: the request names no environment (none of "
                f"{', '.join(f for f, _ in rule.env)} is set), so its role cannot be checked."
            )
        need = rule.fallback
    if need is Need.ANYONE:
        return rule
    if need is Need.OWNER and su.container_task:
        raise PermissionDenied(
            f"{who} may not call {method}: it needs {need.value}, and a container acts with"
            " the role of the identity that deployed its app, in the app's environment only,"
            " never as the workspace Owner (issue 32). Run workspace management from outside"
            " a container, with an Owner's or Manager's token."
        )
    if need is Need.OWNER:
        raise PermissionDenied(
            f"{who} may not call {method}: it needs {need.value} (workspace management,"
            " billing or workspace settings), which no service user has: a service user has"
            " at most a workspace Member's permissions (modal.com/docs/guide/service-users)."
            " Use an Owner's or Manager's token (the emulator's --token-id)."
        )
    if need is Need.CONTAINER and su.container_task:
        _check_own_task(su, method, request)
        return rule
    if need is Need.CONTAINER:
        raise PermissionDenied(
            f"{who} may not call {method}: only a container of a running app makes this call,"
            " with its own identity, never with a service user's token."
        )
    writes = need in (Need.WRITE, Need.WRITE_SOMEWHERE)
    roles = WRITE_ROLES if writes else READ_ROLES
    grant = "contributor" if writes else "viewer"
    if need in (Need.READ_SOMEWHERE, Need.WRITE_SOMEWHERE):
        for env in state.environments.list():
            if state.service_users.role_in(su, env.id) in roles:
                return rule
        raise PermissionDenied(
            f"{who} may not call {method}: it needs {need.value} (the request names no"
            f" environment), and it has no such role anywhere (its roles:"
            f" {_roles_text(state, su)}). Grant one with"
            f" `{GRANT.format(name=su.name, env='ENV', role=grant)}`."
        )
    for env in envs:
        role = state.service_users.role_in(su, env.id) if env.id is not None else None
        if role in roles:
            continue
        where = f"environment {env.label}"
        if env.unknown_object:
            raise PermissionDenied(
                f"{who} may not call {method}: the emulator does not know the object, so the"
                f" environment {env.label} and its role there cannot be checked ({method}"
                f" needs {grant} there)."
            )
        has = f"has {role} access to {where}" if role else f"has no access to {where}"
        raise PermissionDenied(
            f"{who} {has} (role: {role or 'none'}), but {method} needs"
            f" {' or '.join(roles)} there. Grant it with"
            f" `{GRANT.format(name=su.name, env=_grant_env(env.label), role=grant)}`"
            f"{'' if writes else ' (contributor to also deploy or change things there)'},"
            " run by a workspace Owner or Manager."
        )
    if rule.refs is not None:
        _check_references(state, runtime, su, method, rule.refs(request))
    return rule


def _check_own_task(su: ServiceUser, method: str, request: Any) -> None:
    """A container's lifecycle calls name its own task, if they name one."""
    task = str(getattr(request, "task_id", "") or "")
    if task and task != su.container_task:
        raise PermissionDenied(
            f"{su.label} may not call {method} for container {task}: a container makes its"
            " lifecycle calls for itself only."
        )


def _check_references(
    state: Any, runtime: Any, su: ServiceUser, method: str, refs: list[tuple[str, str]]
) -> None:
    """Every object a function attaches by id must be one the caller may use where it lives
    (issue 32 item 1). Modal scopes Secrets, Volumes and Dicts to an environment
    (modal.com/docs/guide/environments: "Each Environment has its own set of Secrets", and
    lookups from an App default to its own environment) and lets a lookup name another
    environment (modal 1.6.4 `Secret.from_name(..., environment_name=...)`), which a service
    user can do only where it holds a role (`SecretGetOrCreate` and `VolumeGetOrCreate` are
    checked in the environment they name). An id sent without that lookup gets the same
    check here: the caller needs contributor in the object's environment (stricter than the
    viewer a lookup needs: attaching a Secret hands its values to code the caller wrote)."""
    for kind, object_id in refs:
        env_id = _env_of_object(state, runtime, kind, object_id)
        if env_id is None:
            raise NotFound(
                f"{method}: the {kind} {object_id} the function attaches does not exist;"
                " look it up by name (e.g. modal.Secret.from_name) before deploying."
            )
        role = state.service_users.role_in(su, env_id)
        if role in WRITE_ROLES:
            continue
        label = _env_label(state, env_id)
        raise PermissionDenied(
            f"{su.label} may not attach {kind} {object_id} of environment {label} in {method}:"
            f" its role there is {role or 'none'}, and using another environment's {kind}"
            f" needs contributor there. Use a {kind} of the app's own environment, or have a"
            f" workspace Owner or Manager grant it with"
            f" `{GRANT.format(name=su.name, env=_grant_env(label), role='contributor')}`."
        )


def _roles_text(state: Any, su: ServiceUser) -> str:
    roles = state.service_users.roles_by_name(su)
    return ", ".join(f"{role} in {env!r}" for env, role in sorted(roles.items())) or "none"


def filter_answer(state: Any, su: ServiceUser, rule: Rule, answer: Any) -> Any:
    """The handler's answer as this service user may see it."""
    return rule.answer(state, su, answer) if rule.answer is not None else answer
