"""Apps, their deployed versions, functions (with one definition per FunctionCreate) and classes.

Lifecycle: AppCreate makes an app "initializing"; AppPublish with state "deployed" gives it its
deployment name and a new version (1, 2, ...) whose layout (function/class ids and the
definition of each function) is kept for history and rollback; AppStop marks it "stopped" and
frees the name (lookups by name then report it as the previous app). Rollback publishes the
layout of an older version as a new version.

Tags (key/value metadata on an app, modal 1.6.4 `App.set_tags`/`get_tags`, `App(tags=...)`):
AppSetTags replaces the whole set; AppCreate and AppPublish carry the client's `tags` too.
Modal does not document what a publish does to tags set earlier with `set_tags`; the emulator
takes the stricter reading: every AppPublish (a skipped no-op deploy included) replaces the
app's tag set with the request's (an empty map clears it), each version keeps the set it was
published with, and a rollback restores the set of the version it rolls back to. A client that
wants its tags to survive a deploy or a rollback must send them with the deploy or set them
again afterwards; one written for this reading also works if Modal is more lenient.

Clients heartbeat their apps (AppHeartbeat, every ~15 s). An app still initializing (a deploy
in progress) or ephemeral whose client went silent for `heartbeat_timeout` seconds (default
60) is stopped the next time apps are looked up or listed, as if the client had disconnected:
a deploying client killed with -9 does not leave an app "initializing" forever. An app left
initializing by a previous emulator process is stopped when the next one starts
(`stop_interrupted_deploys`).

Function definitions are opaque bytes here (serialized protobuf owned by the handlers).
"""

from __future__ import annotations

import builtins
import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

from emulator.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from emulator.ids import check_id, check_name, looks_like_id, new_id
from emulator.models.environments import Environment, Environments
from emulator.store import Store

#: App states, named like Modal's APP_STATE_* values (lowercase, without the prefix).
STATES = (
    "ephemeral",
    "detached",
    "deployed",
    "stopping",
    "stopped",
    "initializing",
    "disabled",
    "detached_disconnected",
)
_LIVE_TRANSIENT = ("initializing", "ephemeral", "detached", "detached_disconnected")
#: States that need a heartbeating client; the app is stopped when it goes silent.
_NEEDS_CLIENT = ("initializing", "ephemeral")
DEFAULT_HEARTBEAT_TIMEOUT = 60.0

#: App tag keys and values: the client's rule, modal 1.6.4 `modal/_utils/name_utils.py`
#: `check_tag_dict` (`is_valid_tag` with max_length=63: letters, digits, '.', '_', '-'; 1 to
#: 63 characters), run by `App(tags=...)` and `App.set_tags` before anything is sent. Matched
#: whole here (the client's `re.match(...$)` also lets one trailing newline through).
TAG_RE = re.compile(r"[a-zA-Z0-9._-]{1,63}")
#: A deployment's own tag (`modal deploy --tag`, `App.deploy(tag=...)`): the same characters,
#: at most 50 (modal 1.6.4 `modal/runner.py` `_deploy_app`: `is_valid_tag(tag, max_length=50)`).
DEPLOYMENT_TAG_RE = re.compile(r"[a-zA-Z0-9._-]{1,50}")
_TAG_RULE = (
    "tags may contain only letters, digits, dashes, periods or underscores, 1 to 63 characters "
    "each (the modal client's rule, modal/_utils/name_utils.py check_tag_dict)"
)


def check_tags(rpc: str, tags: dict[str, str]) -> dict[str, str]:
    """`tags` if every key and value follows the client's tag rule, else InvalidArgument."""
    for key, value in tags.items():
        if not TAG_RE.fullmatch(key):
            raise InvalidArgument(f"{rpc}: invalid tag key {key!r}: {_TAG_RULE}.")
        if not TAG_RE.fullmatch(value):
            raise InvalidArgument(f"{rpc}: invalid value {value!r} for tag {key!r}: {_TAG_RULE}.")
    return dict(tags)


def check_deployment_tag(tag: str) -> str:
    """An empty tag (none) or one the client would send, else InvalidArgument."""
    if tag and not DEPLOYMENT_TAG_RE.fullmatch(tag):
        raise InvalidArgument(
            f"AppPublish: invalid deployment tag {tag!r}: a deployment tag may contain only "
            "letters, digits, dashes, periods or underscores, 1 to 50 characters (the modal "
            "client's rule, modal/runner.py)."
        )
    return tag


def _tags_json(tags: dict[str, str]) -> str:
    return json.dumps(dict(sorted(tags.items())))


@dataclass(frozen=True)
class App:
    id: str
    env_id: str
    env_name: str
    name: str | None
    description: str
    state: str
    created_at: float
    deployed_at: float | None
    stopped_at: float | None
    version: int
    #: Who created or last deployed it: "" for the workspace Owner, else a service user's id.
    #: Its containers act as that identity (dev/emulator/handlers/base.py, issue 32 item 2).
    created_by: str = ""

    @property
    def deployed(self) -> bool:
        return self.state == "deployed"


@dataclass(frozen=True)
class AppVersion:
    app_id: str
    version: int
    deployed_at: float
    client_version: str
    deployed_by: str
    tag: str
    commit_hash: str
    commit_dirty: bool
    rollback_version: int
    function_ids: dict[str, str] = field(default_factory=dict)
    class_ids: dict[str, str] = field(default_factory=dict)
    definition_ids: dict[str, str] = field(default_factory=dict)
    inputs_fingerprint: str = ""
    #: The app's tag set this version was published with (restored by a rollback to it).
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FunctionRecord:
    id: str
    app_id: str
    tag: str


@dataclass(frozen=True)
class Definition:
    id: str
    function_id: str
    data: bytes
    handle: bytes


@dataclass(frozen=True)
class PublishRequest:
    name: str
    state: str
    function_ids: dict[str, str]
    class_ids: dict[str, str]
    definition_ids: dict[str, str]
    tag: str = ""
    client_version: str = ""
    deployed_by: str = ""
    commit_hash: str = ""
    commit_dirty: bool = False
    #: What the containers of this version read at start besides the definitions (the
    #: secrets' ids and update times): a change makes a redeploy of equal definitions real.
    inputs_fingerprint: str = ""
    #: AppPublishRequest.tags: the app's whole tag set from now on (see the module docstring).
    tags: dict[str, str] = field(default_factory=dict)


def _version(row: sqlite3.Row) -> AppVersion:
    layout = json.loads(row["layout"])
    return AppVersion(
        app_id=row["app_id"],
        version=row["version"],
        deployed_at=row["deployed_at"],
        client_version=row["client_version"],
        deployed_by=row["deployed_by"],
        tag=row["tag"],
        commit_hash=row["commit_hash"],
        commit_dirty=bool(row["commit_dirty"]),
        rollback_version=row["rollback_version"],
        function_ids=layout.get("function_ids", {}),
        class_ids=layout.get("class_ids", {}),
        definition_ids=layout.get("definition_ids", {}),
        inputs_fingerprint=layout.get("inputs_fingerprint", ""),
        tags=json.loads(row["tags"]),
    )


def _definition(row: sqlite3.Row) -> Definition:
    return Definition(row["id"], row["function_id"], bytes(row["data"]), bytes(row["handle"]))


class Apps:
    def __init__(
        self,
        store: Store,
        environments: Environments,
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    ) -> None:
        self.store = store
        self.environments = environments
        self.heartbeat_timeout = heartbeat_timeout

    def _expire_silent(self, db: sqlite3.Connection) -> None:
        """Stop initializing/ephemeral apps whose client stopped heartbeating."""
        now = self.store.now()
        db.execute(
            "UPDATE apps SET state = 'stopped', stopped_at = ? WHERE state IN (?, ?)"
            " AND COALESCE(last_heartbeat, created_at) < ?",
            (now, *_NEEDS_CLIENT, now - self.heartbeat_timeout),
        )

    # ---- apps ----------------------------------------------------------------------------
    def _load(self, db: sqlite3.Connection, row: sqlite3.Row) -> App:
        env = self.environments.get_by_id(row["env_id"], db)
        return App(
            id=row["id"],
            env_id=row["env_id"],
            env_name=env.name,
            name=row["name"],
            description=row["description"],
            state=row["state"],
            created_at=row["created_at"],
            deployed_at=row["deployed_at"],
            stopped_at=row["stopped_at"],
            version=row["version"],
            created_by=row["created_by"],
        )

    def set_created_by(self, app_id: str, identity_id: str) -> None:
        """Record who created or last deployed the app (see `App.created_by`)."""
        with self.store.tx() as db:
            db.execute("UPDATE apps SET created_by = ? WHERE id = ?", (identity_id, app_id))

    def _row(self, db: sqlite3.Connection, app_id: str) -> sqlite3.Row:
        check_id("app", app_id)
        row = db.execute("SELECT * FROM apps WHERE id = ?", (app_id,)).fetchone()
        if row is None:
            raise NotFound(f"App {app_id!r} not found.")
        return row

    def create(
        self,
        environment: str,
        description: str,
        state: str,
        tags: dict[str, str] | None = None,
        created_by: str = "",
    ) -> App:
        if state not in STATES:
            raise InvalidArgument(f"AppCreate: unsupported app state {state!r}.")
        tags = check_tags("AppCreate", tags or {})
        with self.store.tx() as db:
            env = self.environments.resolve(environment, db)
            app_id = new_id("app")
            now = self.store.now()
            db.execute(
                "INSERT INTO apps (id, env_id, description, state, created_at, last_heartbeat,"
                " tags, created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (app_id, env.id, description[:500], state, now, now, _tags_json(tags), created_by),
            )
            return self._load(db, self._row(db, app_id))

    def get(self, app_id: str) -> App:
        with self.store.tx() as db:
            self._expire_silent(db)
            return self._load(db, self._row(db, app_id))

    def by_deployment_name(
        self, name: str, environment: str
    ) -> tuple[Environment, App | None, App | None]:
        """(environment, deployed app with that name, else the last stopped one)."""
        with self.store.tx() as db:
            self._expire_silent(db)
            env = self.environments.resolve(environment, db)
            row = db.execute(
                "SELECT * FROM apps WHERE env_id = ? AND deployed_name = ?", (env.id, name)
            ).fetchone()
            if row is not None:
                return env, self._load(db, row), None
            prev = db.execute(
                "SELECT * FROM apps WHERE env_id = ? AND name = ? AND state = 'stopped'"
                " ORDER BY stopped_at DESC LIMIT 1",
                (env.id, name),
            ).fetchone()
            return env, None, (self._load(db, prev) if prev is not None else None)

    def get_or_create(
        self,
        name: str,
        environment: str,
        create_if_missing: bool,
        client_version: str = "",
        deployed_by: str = "",
        created_by: str = "",
    ) -> App:
        if not create_if_missing and looks_like_id("app", name):
            return self.get(name)  # an app id instead of a name
        check_name("App", name)
        env, app, _ = self.by_deployment_name(name, environment)
        if app is not None:
            return app
        if not create_if_missing:
            raise NotFound(f"App {name!r} not found in environment {env.name!r}.")
        created = self.create(env.name, name, "initializing", created_by=created_by)
        app, _version = self.publish(
            created.id,
            PublishRequest(
                name=name,
                state="deployed",
                function_ids={},
                class_ids={},
                definition_ids={},
                client_version=client_version,
                deployed_by=deployed_by,
            ),
        )
        return app

    def stop_interrupted_deploys(self) -> builtins.list[str]:
        """At start: stop the apps a previous emulator process left initializing (a deploy in
        progress when it stopped or was killed); their ids.

        Modal stops an app whose deploying client went away (AppClientDisconnect, which
        modal 1.6.4 `modal/runner.py` `_deploy_app` sends when the deploy fails, and the
        heartbeat timeout otherwise). A deploy's client talked to the process that is gone,
        and nothing tells a client that survived it from one that did not: left as it was,
        such an app waited out the heartbeat timeout listed as initializing, or was published
        by a client that retried AppPublish against the new process, an interrupted deploy
        coming back as deployed (issue 22 item 6). It is stopped now; a client that survived
        gets FAILED_PRECONDITION at AppPublish, and a new deploy under the same name works.
        """
        with self.store.tx() as db:
            rows = db.execute("SELECT id FROM apps WHERE state = 'initializing'").fetchall()
            ids = [str(r["id"]) for r in rows]
            if ids:
                db.execute(
                    "UPDATE apps SET state = 'stopped', stopped_at = ?"
                    " WHERE state = 'initializing'",
                    (self.store.now(),),
                )
            return ids

    def heartbeat(self, app_id: str) -> None:
        with self.store.tx() as db:
            self._row(db, app_id)
            db.execute(
                "UPDATE apps SET last_heartbeat = ? WHERE id = ?", (self.store.now(), app_id)
            )

    def disconnect(self, app_id: str) -> App:
        """The client went away: an app that never got deployed is stopped."""
        with self.store.tx() as db:
            row = self._row(db, app_id)
            if row["state"] in _LIVE_TRANSIENT:
                db.execute(
                    "UPDATE apps SET state = 'stopped', stopped_at = ? WHERE id = ?",
                    (self.store.now(), app_id),
                )
            return self._load(db, self._row(db, app_id))

    def list(self, environment: str) -> tuple[Environment, list[App]]:
        with self.store.tx() as db:
            self._expire_silent(db)
            env = self.environments.resolve(environment, db)
            rows = db.execute(
                "SELECT * FROM apps WHERE env_id = ? ORDER BY created_at", (env.id,)
            ).fetchall()
            return env, [self._load(db, r) for r in rows]

    def stop(self, app_id: str) -> App:
        with self.store.tx() as db:
            row = self._row(db, app_id)
            if row["state"] != "stopped":
                db.execute(
                    "UPDATE apps SET state = 'stopped', stopped_at = ?, deployed_name = NULL"
                    " WHERE id = ?",
                    (self.store.now(), app_id),
                )
            return self._load(db, self._row(db, app_id))

    # ---- tags ----------------------------------------------------------------------------
    def set_tags(self, app_id: str, tags: dict[str, str], rpc: str = "AppSetTags") -> None:
        """Replace the app's whole tag set (modal 1.6.4 `App.set_tags`: "Any tags set on the
        App before calling this method will be removed if they are not included")."""
        tags = check_tags(rpc, tags)
        with self.store.tx() as db:
            self._row(db, app_id)
            db.execute("UPDATE apps SET tags = ? WHERE id = ?", (_tags_json(tags), app_id))

    def get_tags(self, app_id: str) -> dict[str, str]:
        with self.store.read() as db:
            tags: dict[str, str] = json.loads(self._row(db, app_id)["tags"])
            return tags

    # ---- deploy / versions -------------------------------------------------------------
    def publish(self, app_id: str, req: PublishRequest) -> tuple[App, AppVersion | None]:
        """Record a deploy: name the app, check its objects, and add a version."""
        if req.state not in STATES:
            raise InvalidArgument(f"AppPublish: unsupported app state {req.state!r}.")
        if req.state == "deployed":
            check_name("App", req.name)
        tags = _tags_json(check_tags("AppPublish", req.tags))
        check_deployment_tag(req.tag)
        with self.store.tx() as db:
            row = self._row(db, app_id)
            if row["state"] == "stopped":
                raise FailedPrecondition(
                    f"App {app_id} is stopped (stopped by hand, its client disconnected or "
                    "went silent, or its deploy was interrupted by a restart of Modal); "
                    "deploy again to create a new app."
                )
            for tag, fid in req.function_ids.items():
                frow = db.execute("SELECT app_id FROM functions WHERE id = ?", (fid,)).fetchone()
                if frow is None or frow["app_id"] != app_id:
                    raise NotFound(
                        f"AppPublish: function {tag!r} ({fid}) was not created in app {app_id}."
                    )
            for tag, cid in req.class_ids.items():
                crow = db.execute("SELECT app_id FROM classes WHERE id = ?", (cid,)).fetchone()
                if crow is None or crow["app_id"] != app_id:
                    raise NotFound(
                        f"AppPublish: class {tag!r} ({cid}) was not created in app {app_id}."
                    )
            for fid, def_id in req.definition_ids.items():
                drow = db.execute(
                    "SELECT function_id FROM function_definitions WHERE id = ?", (def_id,)
                ).fetchone()
                if drow is None or drow["function_id"] != fid:
                    raise NotFound(
                        f"AppPublish: definition {def_id!r} is not a definition of function "
                        f"{fid!r} (unknown, or created for another function); send the "
                        "definition_id FunctionCreate returned for it."
                    )
            now = self.store.now()
            if req.state != "deployed":
                db.execute(
                    "UPDATE apps SET state = ?, tags = ? WHERE id = ?", (req.state, tags, app_id)
                )
                return self._load(db, self._row(db, app_id)), None
            self._check_url_conflicts(db, app_id, list(req.function_ids.values()))
            clash = db.execute(
                "SELECT id FROM apps WHERE env_id = ? AND deployed_name = ? AND id != ?",
                (row["env_id"], req.name, app_id),
            ).fetchone()
            if clash is not None:
                raise AlreadyExists(
                    f"App name {req.name!r} is already deployed as {clash['id']} in this "
                    "environment; stop that app first or deploy under another name."
                )
            definition_ids = dict(req.definition_ids)
            for fid in req.function_ids.values():
                if fid not in definition_ids:
                    latest = db.execute(
                        "SELECT id FROM function_definitions WHERE function_id = ?"
                        " ORDER BY created_at DESC LIMIT 1",
                        (fid,),
                    ).fetchone()
                    if latest is not None:
                        definition_ids[fid] = latest["id"]
            version = row["version"] + 1
            layout = {
                "function_ids": req.function_ids,
                "class_ids": req.class_ids,
                "definition_ids": definition_ids,
                "inputs_fingerprint": req.inputs_fingerprint,
            }
            db.execute(
                "INSERT INTO app_versions (app_id, version, deployed_at, client_version,"
                " deployed_by, tag, commit_hash, commit_dirty, rollback_version, layout, tags)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (
                    app_id,
                    version,
                    now,
                    req.client_version,
                    req.deployed_by,
                    req.tag,
                    req.commit_hash,
                    int(req.commit_dirty),
                    json.dumps(layout),
                    tags,
                ),
            )
            db.execute(
                "UPDATE apps SET state = 'deployed', name = ?, deployed_name = ?, deployed_at = ?,"
                " version = ?, stopped_at = NULL, tags = ? WHERE id = ?",
                (req.name, req.name, now, version, tags, app_id),
            )
            return self._load(db, self._row(db, app_id)), self._get_version(db, app_id, version)

    def unchanged(
        self,
        app_id: str,
        req: PublishRequest,
        same: Callable[[bytes, bytes], bool] = lambda a, b: a == b,
    ) -> bool:
        """Whether deploying `req` would change nothing: same objects, identical definitions.

        The 1.6.4 client treats AppPublish's `deployed_at == 0` as "nothing changed" (prints
        "Deployment skipped: no changes detected", and with the `recreate` strategy keeps the
        running containers: modal/runner.py, `_stop_and_wait_for_containers`); the emulator
        answers that when every function's new definition equals the deployed one by `same`
        (ids of images and mounts are content-addressed, so unchanged code gives equal ids; the
        handler's `same` ignores the order the client happened to list mounts in).
        """
        if req.state != "deployed":
            return False
        with self.store.read() as db:
            row = self._row(db, app_id)
            if row["state"] != "deployed" or not row["version"] or row["deployed_name"] != req.name:
                return False
            current = self._get_version(db, app_id, row["version"])
            if current.function_ids != req.function_ids or current.class_ids != req.class_ids:
                return False
            if current.inputs_fingerprint != req.inputs_fingerprint:
                return False  # e.g. a secret was updated: containers must restart to see it
            for fid in req.function_ids.values():
                old_id = current.definition_ids.get(fid)
                new_id_ = req.definition_ids.get(fid)
                if not old_id or not new_id_:
                    return False
                if old_id == new_id_:
                    continue
                rows = db.execute(
                    "SELECT id, data FROM function_definitions WHERE id IN (?, ?)",
                    (old_id, new_id_),
                ).fetchall()
                datas = {r["id"]: bytes(r["data"]) for r in rows}
                if len(datas) != 2 or not same(datas[old_id], datas[new_id_]):
                    return False
            return True

    def publish_skipped(self, app_id: str, req: PublishRequest) -> App:
        """A deploy `unchanged` found to change nothing: no version, but its tags still
        replace the app's (the stricter reading, module docstring). The version keeps the set
        it was published with."""
        check_deployment_tag(req.tag)
        self.set_tags(app_id, req.tags, rpc="AppPublish")
        return self.get(app_id)

    @staticmethod
    def _get_version(db: sqlite3.Connection, app_id: str, version: int) -> AppVersion:
        row = db.execute(
            "SELECT * FROM app_versions WHERE app_id = ? AND version = ?", (app_id, version)
        ).fetchone()
        if row is None:
            raise NotFound(f"App {app_id} has no version v{version}.")
        return _version(row)

    def current_version(self, app_id: str) -> AppVersion | None:
        with self.store.read() as db:
            row = self._row(db, app_id)
            if row["version"] == 0:
                return None
            return self._get_version(db, app_id, row["version"])

    def deployed_layouts(self) -> builtins.list[tuple[App, AppVersion]]:
        """Every deployed app (all environments) with its current version's layout."""
        with self.store.read() as db:
            rows = db.execute(
                "SELECT * FROM apps WHERE state = 'deployed' AND version > 0 ORDER BY created_at"
            ).fetchall()
            return [(self._load(db, r), self._get_version(db, r["id"], r["version"])) for r in rows]

    def history(self, app_id: str) -> builtins.list[AppVersion]:
        """Every deployed version, newest first."""
        with self.store.read() as db:
            self._row(db, app_id)
            rows = db.execute(
                "SELECT * FROM app_versions WHERE app_id = ? ORDER BY version DESC", (app_id,)
            ).fetchall()
            return [_version(r) for r in rows]

    def rollback(
        self, app_id: str, version: int, client_version: str, deployed_by: str
    ) -> tuple[App, AppVersion]:
        """Publish the layout of `version` anew; a negative version goes back that many.

        api.proto: "signed as we support negative 'roll back n versions' requests"; the CLI
        sends -1 for `modal app rollback APP` without a version. Version 0 does not exist.

        The new version is the old one whole: its layout (with its inputs fingerprint, which
        the no-op check of the next redeploy compares), its deployment tag and commit, and the
        tag set it was published with, which becomes the app's tag set again (modal 1.6.4
        modal/cli/app.py `rollback`: "the App state will be reset to the state at the time of
        the previous deployment", read strictly: tags set since are dropped).
        """
        with self.store.tx() as db:
            row = self._row(db, app_id)
            if row["state"] != "deployed":
                raise FailedPrecondition(
                    f"App {app_id} is {row['state']}, not deployed: only a deployed app can be "
                    "rolled back."
                )
            current = row["version"]
            if version == 0:
                raise InvalidArgument(
                    f"AppRollback for {app_id}: version 0 does not exist; give a version "
                    "(v1, v2, ...) or a negative number of versions to go back (-1: previous)."
                )
            target = current + version if version < 0 else version
            if target < 1:
                raise FailedPrecondition(
                    f"App {app_id} has only version v{current}: nothing to roll back to."
                )
            if target == current:
                raise InvalidArgument(f"App {app_id} is already at v{current}.")
            old = self._get_version(db, app_id, target)
            new_version = current + 1
            now = self.store.now()
            tags = _tags_json(old.tags)
            db.execute(
                "INSERT INTO app_versions (app_id, version, deployed_at, client_version,"
                " deployed_by, tag, commit_hash, commit_dirty, rollback_version, layout, tags)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    app_id,
                    new_version,
                    now,
                    client_version,
                    deployed_by,
                    old.tag,
                    old.commit_hash,
                    int(old.commit_dirty),
                    target,
                    json.dumps(
                        {
                            "function_ids": old.function_ids,
                            "class_ids": old.class_ids,
                            "definition_ids": old.definition_ids,
                            "inputs_fingerprint": old.inputs_fingerprint,
                        }
                    ),
                    tags,
                ),
            )
            db.execute(
                "UPDATE apps SET version = ?, deployed_at = ?, tags = ? WHERE id = ?",
                (new_version, now, tags, app_id),
            )
            return self._load(db, self._row(db, app_id)), self._get_version(db, app_id, new_version)

    # ---- functions and classes ----------------------------------------------------------
    def precreate_function(
        self, app_id: str, tag: str, existing_function_id: str = ""
    ) -> FunctionRecord:
        """The function id for `tag` in this app: the existing one, or a new one."""
        if not tag:
            raise InvalidArgument("FunctionPrecreate/FunctionCreate: function_name is empty.")
        with self.store.tx() as db:
            self._row(db, app_id)
            if existing_function_id:
                check_id("function", existing_function_id)
                row = db.execute(
                    "SELECT * FROM functions WHERE id = ?", (existing_function_id,)
                ).fetchone()
                if row is None or row["app_id"] != app_id:
                    raise NotFound(f"Function {existing_function_id!r} not found in app {app_id}.")
                return FunctionRecord(row["id"], row["app_id"], row["tag"])
            row = db.execute(
                "SELECT * FROM functions WHERE app_id = ? AND tag = ?", (app_id, tag)
            ).fetchone()
            if row is None:
                fid = new_id("function")
                db.execute(
                    "INSERT INTO functions (id, app_id, tag, created_at) VALUES (?, ?, ?, ?)",
                    (fid, app_id, tag, self.store.now()),
                )
                return FunctionRecord(fid, app_id, tag)
            return FunctionRecord(row["id"], row["app_id"], row["tag"])

    def save_definition(
        self, definition_id: str, function_id: str, data: bytes, handle: bytes
    ) -> None:
        with self.store.tx() as db:
            db.execute(
                "INSERT INTO function_definitions (id, function_id, created_at, data, handle)"
                " VALUES (?, ?, ?, ?, ?)",
                (definition_id, function_id, self.store.now(), data, handle),
            )

    def claim_web_urls(self, app_id: str, function_id: str, urls: builtins.list[str]) -> None:
        """Record the web URLs of a function; another live app's URL is ALREADY_EXISTS."""
        with self.store.tx() as db:
            db.execute(
                "DELETE FROM web_urls WHERE app_id = ? AND function_id = ?", (app_id, function_id)
            )
            for url in urls:
                self._check_url_free(db, url, app_id)
                db.execute(
                    "INSERT OR REPLACE INTO web_urls (url, app_id, function_id) VALUES (?, ?, ?)",
                    (url, app_id, function_id),
                )

    @staticmethod
    def _check_url_free(db: sqlite3.Connection, url: str, app_id: str) -> None:
        row = db.execute(
            "SELECT a.id, a.name, a.state FROM web_urls w JOIN apps a ON a.id = w.app_id"
            " WHERE w.url = ? AND w.app_id != ? AND a.state IN ('deployed', 'ephemeral',"
            " 'detached', 'detached_disconnected')",
            (url, app_id),
        ).fetchone()
        if row is not None:
            raise AlreadyExists(
                f"Web URL {url} is already served by app {row['name'] or row['id']!r} "
                f"({row['id']}, {row['state']}); choose another label (or app/function name), "
                "or stop that app first."
            )

    def _check_url_conflicts(
        self, db: sqlite3.Connection, app_id: str, function_ids: builtins.list[str]
    ) -> None:
        for fid in function_ids:
            for r in db.execute(
                "SELECT url FROM web_urls WHERE app_id = ? AND function_id = ?", (app_id, fid)
            ).fetchall():
                self._check_url_free(db, r["url"], app_id)

    def deployed_definition(self, function_id: str) -> Definition:
        """The definition of a function in its app's current version (after rollback too).

        A function not in the current layout (never published yet) gets its latest one.
        """
        check_id("function", function_id)
        with self.store.read() as db:
            row = db.execute(
                "SELECT a.id AS app_id, a.version FROM functions f JOIN apps a ON a.id = f.app_id"
                " WHERE f.id = ?",
                (function_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"Function {function_id!r} not found (or never created).")
            def_id = None
            if row["version"]:
                layout = self._get_version(db, row["app_id"], row["version"])
                def_id = layout.definition_ids.get(function_id)
        return self._published_or_latest(function_id, def_id)

    def _published_or_latest(self, function_id: str, definition_id: str | None) -> Definition:
        """The definition a version layout names, else the function's latest one."""
        if definition_id:
            return self.get_definition(definition_id)
        return self.latest_definition(function_id)

    def get_definition(self, definition_id: str) -> Definition:
        with self.store.read() as db:
            row = db.execute(
                "SELECT * FROM function_definitions WHERE id = ?", (definition_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"Function definition {definition_id!r} not found.")
        return _definition(row)

    def latest_definition(self, function_id: str) -> Definition:
        check_id("function", function_id)
        with self.store.read() as db:
            row = db.execute(
                "SELECT * FROM function_definitions WHERE function_id = ?"
                " ORDER BY created_at DESC LIMIT 1",
                (function_id,),
            ).fetchone()
        if row is None:
            raise NotFound(f"Function {function_id!r} not found (or never created).")
        return _definition(row)

    def lookup_function(
        self, app_name: str, environment: str, tag: str, version: int = 0
    ) -> tuple[App, Definition]:
        """The definition of function `tag` in the deployed app `app_name` (current version)."""
        app, layout = self._deployed_layout(app_name, environment, version)
        fid = layout.function_ids.get(tag)
        if fid is None:
            raise NotFound(
                f"Function {tag!r} not found in app {app_name!r} (environment "
                f"{app.env_name!r}); it has: {', '.join(sorted(layout.function_ids)) or 'none'}."
            )
        return app, self._published_or_latest(fid, layout.definition_ids.get(fid))

    def lookup_class(
        self, app_name: str, environment: str, tag: str, version: int = 0
    ) -> tuple[App, str]:
        app, layout = self._deployed_layout(app_name, environment, version)
        cid = layout.class_ids.get(tag)
        if cid is None:
            raise NotFound(
                f"Class {tag!r} not found in app {app_name!r} (environment {app.env_name!r}); "
                f"it has: {', '.join(sorted(layout.class_ids)) or 'none'}."
            )
        return app, cid

    def _deployed_layout(
        self, app_name: str, environment: str, version: int
    ) -> tuple[App, AppVersion]:
        env, app, _ = self.by_deployment_name(app_name, environment)
        if app is None:
            raise NotFound(f"App {app_name!r} not found in environment {env.name!r}.")
        with self.store.read() as db:
            layout = self._get_version(db, app.id, version or app.version)
        return app, layout

    def create_class(self, app_id: str, existing_class_id: str = "") -> str:
        with self.store.tx() as db:
            self._row(db, app_id)
            if existing_class_id:
                check_id("class", existing_class_id)
                row = db.execute(
                    "SELECT app_id FROM classes WHERE id = ?", (existing_class_id,)
                ).fetchone()
                if row is None or row["app_id"] != app_id:
                    raise NotFound(f"Class {existing_class_id!r} not found in app {app_id}.")
                return existing_class_id
            cid = new_id("class")
            db.execute(
                "INSERT INTO classes (id, app_id, created_at) VALUES (?, ?, ?)",
                (cid, app_id, self.store.now()),
            )
            return cid
