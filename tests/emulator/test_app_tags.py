"""App tags (AppSetTags/AppGetTags, AppCreate/AppPublish `tags`) and the release record a
deployment history carries, through the real modal 1.6.4 client against the emulator.

Semantics under test (the stricter reading, dev/emulator/models/apps.py and docs/emulator.md):
`App.set_tags` replaces the whole set; every AppPublish replaces it with the deploy's own tags
(none: cleared); each version keeps the set it was published with and a rollback restores it.

Kept (issue 33 item 7): the App release finds its own release by the tags it publishes
(components/modal/_effects.py, _decide.py); modal 1.6.4 modal/app.py `_App.set_tags` ("replaces
previous tags"). The schema-2 upgrade is the developer flow: a state file from before tags
keeps working with `make up` after a pull.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import modal
import pytest
from modal.exception import InvalidError, NotFoundError
from modal_proto import api_pb2

from emulator.store import SCHEMA_VERSION
from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.fixtures import modal_env_for

APP = "tags-app"
SECRET = "tags-secret"
UNKNOWN_APP = "ap-" + "x" * 22


def ping() -> str:
    return "pong"


def _deploy(
    variant: int,
    tags: dict[str, str] | None = None,
    tag: str = "",
    environment: str = "main",
    secret: bool = False,
) -> None:
    """Deploy `APP` in process; another `variant` is another definition (a new version)."""
    app = modal.App(APP, tags=tags)  # the client sends these with AppCreate and AppPublish
    secrets = [modal.Secret.from_name(SECRET, environment_name=environment)] if secret else []
    app.function(timeout=60 + variant, secrets=secrets)(ping)
    app.deploy(environment_name=environment, tag=tag)


def _lookup(environment: str = "main") -> modal.App:
    return modal.App.lookup(APP, environment_name=environment)  # AppGetOrCreate, no create


def _history(app_id: str) -> Any:
    return raw_rpc("AppDeploymentHistory", api_pb2.AppDeploymentHistoryRequest(app_id=app_id))


def _rollback(app_id: str, version: int) -> None:
    raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=version))


def test_set_tags_replaces_the_whole_set_and_get_tags_reads_it(
    modal_env: EmulatorProcess,
) -> None:
    modal.Environment.objects.create("staging")
    _deploy(1, environment="staging")
    app = _lookup("staging")
    assert app.get_tags() == {}

    app.set_tags({"release": "v1", "gate": "passed"})
    assert _lookup("staging").get_tags() == {"release": "v1", "gate": "passed"}
    app.set_tags({"gate": "failed"})  # not an update: "release" goes
    assert app.get_tags() == {"gate": "failed"}
    app.set_tags({})
    assert app.get_tags() == {}

    # The rule's edges: 63 characters and every allowed character pass.
    edge = {"k" * 63: "A-z_0.9" + "v" * 56}
    app.set_tags(edge)
    assert app.get_tags() == edge
    with pytest.raises(NotFoundError, match="not found"):
        _lookup("main")  # tags-app lives in staging only
    for method, request in (
        ("AppSetTags", api_pb2.AppSetTagsRequest(app_id=UNKNOWN_APP, tags={"a": "b"})),
        ("AppGetTags", api_pb2.AppGetTagsRequest(app_id=UNKNOWN_APP)),
    ):
        with pytest.raises(NotFoundError, match=UNKNOWN_APP):
            raw_rpc(method, request)


def test_invalid_tags_are_refused_and_leave_the_set_alone(modal_env: EmulatorProcess) -> None:
    _deploy(1, tags={"team": "ml"})
    app = _lookup()
    assert app.get_tags() == {"team": "ml"}  # App(tags=...) arrived with the deploy

    with pytest.raises(InvalidError, match="Invalid tag key"):
        app.set_tags({"bad key": "x"})  # the client's own check refuses first

    # What the emulator itself answers to a request the client would not send (raw RPC).
    app_id = app.app_id or ""
    bad: list[tuple[dict[str, str], str]] = [
        ({"bad key": "x"}, "invalid tag key 'bad key'"),
        ({"k": "v" * 64}, "invalid value 'vvv"),
        ({"": "x"}, "invalid tag key ''"),
        ({"k": ""}, "invalid value '' for tag 'k'"),
        ({"k": "x\n"}, "invalid value 'x\\\\n'"),  # the client's re.match lets this through
        ({"ключ": "x"}, "invalid tag key"),
    ]
    for tags, message in bad:
        with pytest.raises(InvalidError, match=message) as info:
            raw_rpc("AppSetTags", api_pb2.AppSetTagsRequest(app_id=app_id, tags=tags))
        assert "check_tag_dict" in str(info.value)  # cites the client's rule
    assert app.get_tags() == {"team": "ml"}

    # AppCreate carries tags too (modal/runner.py _init_local_app_new): checked the same way.
    with pytest.raises(InvalidError, match="AppCreate: invalid tag key 'a/b'"):
        raw_rpc("AppCreate", api_pb2.AppCreateRequest(description="x", tags={"a/b": "c"}))
    # A deployment tag follows the client's 50-character rule (modal/runner.py).
    with pytest.raises(InvalidError, match="invalid deployment tag"):
        raw_rpc(
            "AppPublish",
            api_pb2.AppPublishRequest(
                app_id=app_id,
                name=APP,
                app_state=api_pb2.APP_STATE_DEPLOYED,
                deployment_tag="t" * 51,
            ),
        )
    assert app.get_tags() == {"team": "ml"}
    assert len(_history(app_id).app_deployment_histories) == 1


def test_a_publish_replaces_the_tags_and_a_rollback_restores_the_versions_set(
    modal_env: EmulatorProcess,
) -> None:
    emu = modal_env
    modal.Secret.objects.create(SECRET, {"K": "v"})
    _deploy(1, tags={"spec": "aaa"}, tag="d1", secret=True)
    app = _lookup()
    app_id = app.app_id or ""
    app.set_tags({"spec": "aaa", "v1": "passed"})  # the release record, after the gate

    # A real redeploy without tags clears them (stricter reading: AppPublish replaces).
    _deploy(2, tag="d2", secret=True)
    assert app.get_tags() == {}
    app.set_tags({"v2": "failed"})
    _deploy(3, tags={"spec": "ccc"}, tag="d3", secret=True)
    assert app.get_tags() == {"spec": "ccc"}

    # Rollback to v1: the tags v1 was published with, not what set_tags added later.
    _rollback(app_id, 1)
    assert app.get_tags() == {"spec": "aaa"}

    history = _history(app_id)
    rows = [
        (h.version, h.tag, h.rollback_version, h.deployment_type)
        for h in history.app_deployment_histories
    ]
    assert rows == [
        (4, "d1", 1, api_pb2.DEPLOYMENT_TYPE_ROLLBACK),
        (3, "d3", 0, api_pb2.DEPLOYMENT_TYPE_STANDARD),
        (2, "d2", 0, api_pb2.DEPLOYMENT_TYPE_STANDARD),
        (1, "d1", 0, api_pb2.DEPLOYMENT_TYPE_STANDARD),
    ]
    assert history.production_app_version == 4
    times = [h.deployed_at for h in history.app_deployment_histories]
    assert times == sorted(times, reverse=True) and times[-1] > 0
    hashes = [h.commit_info.commit_hash for h in history.app_deployment_histories]
    if (PROJECT_ROOT / ".git").exists():  # the client sends the checkout's commit
        assert all(re.fullmatch(r"[0-9a-f]{40}", h) for h in hashes), hashes
    assert hashes[0] == hashes[3]  # the rollback is v1's commit
    assert [h.rollback_allowed for h in history.app_deployment_histories] == [
        False,
        True,
        True,
        True,
    ]

    # The rolled-back version keeps v1's inputs fingerprint (its secret), so deploying v1's
    # code again is the no-op it is: no v5. Its tags still replace the set.
    layouts = {v["version"]: json.loads(v["layout"]) for v in emu.state()["app_versions"]}
    assert layouts[1]["inputs_fingerprint"]  # v1 uses a secret
    assert layouts[4] == layouts[1]  # function/class/definition ids and the fingerprint
    _deploy(1, tags={"spec": "aaa", "again": "yes"}, tag="d1-again", secret=True)
    assert len(_history(app_id).app_deployment_histories) == 4  # skipped
    assert app.get_tags() == {"spec": "aaa", "again": "yes"}
    _rollback(app_id, 3)  # v3's set; the skipped deploy added no version, no record
    assert app.get_tags() == {"spec": "ccc"}
    assert _history(app_id).production_app_version == 5

    app.stop()
    assert _history(app_id).production_app_version == 0  # stopped: nothing is live
    assert app.get_tags() == {"spec": "ccc"}  # a stopped app's tags can still be read


def test_tags_and_each_versions_set_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EmulatorProcess(state_path=tmp_path / "state.sqlite3", runtime=False) as emu:
        modal_env_for(emu, monkeypatch)
        _deploy(1, tags={"spec": "one"}, tag="d1")
        _deploy(2, tags={"spec": "two"}, tag="d2")
        _lookup().set_tags({"spec": "two", "v2": "passed"})

        emu.restart()
        modal_env_for(emu, monkeypatch)
        app = _lookup()
        assert app.get_tags() == {"spec": "two", "v2": "passed"}
        history = _history(app.app_id or "")
        assert [(h.version, h.tag) for h in history.app_deployment_histories] == [
            (2, "d2"),
            (1, "d1"),
        ]
        _rollback(app.app_id or "", 1)  # v1's set was kept in the state file
        assert app.get_tags() == {"spec": "one"}


def test_a_schema_2_state_file_is_upgraded_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state file written before tags existed (schema 2) keeps its apps and gains tags."""
    state = tmp_path / "state.sqlite3"
    with EmulatorProcess(state_path=state, runtime=False) as emu:
        modal_env_for(emu, monkeypatch)
        _deploy(1, tag="old")
        emu.stop()
        with sqlite3.connect(state) as db:  # what an emulator of schema 2 left behind
            db.execute("ALTER TABLE apps DROP COLUMN created_by")  # schema 4's additions
            for table in ("service_users", "service_user_roles", "issued_tokens"):
                db.execute(f"DROP TABLE {table}")
            db.execute("ALTER TABLE apps DROP COLUMN tags")
            db.execute("ALTER TABLE app_versions DROP COLUMN tags")
            db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        db.close()

        emu.start()
        modal_env_for(emu, monkeypatch)
        app = _lookup()
        assert app.get_tags() == {}
        assert [h.tag for h in _history(app.app_id or "").app_deployment_histories] == ["old"]
        app.set_tags({"after": "upgrade"})
        assert app.get_tags() == {"after": "upgrade"}
        ws = modal.Workspace.from_context()  # schema 4's tables were added by the upgrade
        ws.service_users.create("after-upgrade", expires_in=None)
        emu.restart()
        modal_env_for(emu, monkeypatch)
        names = [su.name for su in modal.Workspace.from_context().service_users.list()]
        assert names == ["after-upgrade"]
        emu.stop()
    with sqlite3.connect(state) as db:
        (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    db.close()
    assert version == str(SCHEMA_VERSION) == "4"
