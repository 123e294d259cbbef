"""Edge rules through raw RPCs: versions/rollback, name clashes, cascades, mounts, URLs.

Kept (issue 33 item 7): the App's web URL output, the release core's versions and rollback, and
the Environment's delete (components/modal/app.py, _decide.py, environment.py); modal 1.6.4
modal/cli/app.py `rollback`.
"""

from __future__ import annotations

import modal
import pytest
from modal.exception import AlreadyExistsError, ConflictError, InvalidError, NotFoundError
from modal_proto import api_pb2

from emulator.urls import web_url
from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess


def test_web_url_pattern_suffix_and_truncation() -> None:
    assert web_url("ws", "", "llm-server", "LLM.serve").url == (
        "https://ws--llm-server-llm-serve.modal.run"
    )
    assert web_url("ws", "stg", "app", "web").url == "https://ws-stg--app-web.modal.run"
    assert web_url("ws", "", "app", "web", requested="Custom").url == "https://ws--custom.modal.run"
    long = web_url("workspace", "env", "a" * 40, "f" * 40)
    host = long.url.removeprefix("https://").removesuffix(".modal.run")
    assert len(host) <= 63 and long.truncated and long.has_unique_hash
    assert long == web_url("workspace", "env", "a" * 40, "f" * 40)  # stable


def _publish(app_id: str, name: str) -> api_pb2.AppPublishResponse:
    return raw_rpc(
        "AppPublish",
        api_pb2.AppPublishRequest(app_id=app_id, name=name, app_state=api_pb2.APP_STATE_DEPLOYED),
    )


def _create_app(description: str, env: str = "") -> str:
    resp = raw_rpc(
        "AppCreate",
        api_pb2.AppCreateRequest(
            description=description,
            environment_name=env,
            app_state=api_pb2.APP_STATE_INITIALIZING,
        ),
    )
    assert resp.app_id.startswith("ap-") and len(resp.app_id) == 25
    return str(resp.app_id)


def _publish_fn(app_id: str, name: str, timeout: int) -> api_pb2.AppPublishResponse:
    """Publish `app_id` with one function whose definition differs by `timeout`."""
    fn = api_pb2.Function(function_name="f", timeout_secs=timeout)
    created = raw_rpc("FunctionCreate", api_pb2.FunctionCreateRequest(app_id=app_id, function=fn))
    return raw_rpc(
        "AppPublish",
        api_pb2.AppPublishRequest(
            app_id=app_id,
            name=name,
            app_state=api_pb2.APP_STATE_DEPLOYED,
            function_ids={"f": created.function_id},
            definition_ids={created.function_id: created.handle_metadata.definition_id},
        ),
    )


def test_versions_and_rollback_rules(modal_env: EmulatorProcess) -> None:
    app_id = _create_app("svc")
    first = _publish_fn(app_id, "svc", 10)
    assert first.url.endswith("/main/deployed/svc") and first.deployed_at > 0
    # The same definitions again: a no-op (deployed_at 0, as the client expects), no version.
    noop = _publish_fn(app_id, "svc", 10)
    assert noop.deployed_at == 0 and noop.url == first.url
    assert _publish_fn(app_id, "svc", 20).deployed_at > 0
    assert _publish_fn(app_id, "svc", 30).deployed_at > 0
    rolled = raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=-1))
    assert rolled.deployed_at > 0
    hist = raw_rpc("AppDeploymentHistory", api_pb2.AppDeploymentHistoryRequest(app_id=app_id))
    rows = [
        (h.version, h.rollback_version, h.rollback_allowed) for h in hist.app_deployment_histories
    ]
    assert rows == [(4, 2, False), (3, 0, True), (2, 0, True), (1, 0, True)]
    assert hist.production_app_version == 4
    with pytest.raises(InvalidError, match="already at v4"):
        raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=4))
    with pytest.raises(NotFoundError, match="no version v9"):
        raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=9))
    raw_rpc("AppStop", api_pb2.AppStopRequest(app_id=app_id))
    with pytest.raises(ConflictError, match="only a deployed app"):
        raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=1))
    with pytest.raises(ConflictError, match="stopped"):
        _publish_fn(app_id, "svc", 40)
    lifecycle = raw_rpc("AppGetLifecycle", api_pb2.AppGetLifecycleRequest(app_id=app_id))
    assert lifecycle.lifecycle.app_state == api_pb2.APP_STATE_STOPPED
    assert lifecycle.lifecycle.stopped_at > 0 and lifecycle.lifecycle.version == 4


def test_two_apps_cannot_hold_one_deployed_name(modal_env: EmulatorProcess) -> None:
    a, b = _create_app("x"), _create_app("x")
    _publish(a, "shared-name")
    with pytest.raises(AlreadyExistsError, match="already deployed as"):
        _publish(b, "shared-name")
    _publish(b, "other-name")
    with pytest.raises(InvalidError):
        _publish(_create_app("y"), "bad name!")
    listed = raw_rpc("AppList", api_pb2.AppListRequest())
    assert sorted(x.name for x in listed.apps if x.name) == ["other-name", "shared-name"]


def test_deleting_an_environment_drops_what_it_scopes(modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("tmp")
    modal.Secret.objects.create("s", {"K": "v"}, environment_name="tmp")
    modal.Volume.objects.create("v", environment_name="tmp")
    app_id = _create_app("a", env="tmp")
    fn = api_pb2.Function(
        function_name="web",
        webhook_config=api_pb2.WebhookConfig(type=api_pb2.WEBHOOK_TYPE_FUNCTION),
    )
    created = raw_rpc("FunctionCreate", api_pb2.FunctionCreateRequest(app_id=app_id, function=fn))
    class_id = raw_rpc("ClassCreate", api_pb2.ClassCreateRequest(app_id=app_id)).class_id
    raw_rpc(
        "AppPublish",
        api_pb2.AppPublishRequest(
            app_id=app_id,
            name="a",
            app_state=api_pb2.APP_STATE_DEPLOYED,
            function_ids={"web": created.function_id},
            class_ids={"Cls": class_id},
        ),
    )
    kept_app = _create_app("kept")  # in main: must survive
    _publish(kept_app, "kept")
    before = modal_env.state()
    assert len(before["functions"]) == len(before["classes"]) == len(before["web_urls"]) == 1
    token = modal.Workspace.from_context().proxy_tokens.create("t")
    modal.Workspace.from_context().proxy_tokens.allow(token.token_id, "tmp")
    modal.Environment.objects.delete("tmp")
    state = modal_env.state()
    assert [e["name"] for e in state["environments"]] == ["main"]
    assert state["secrets"] == state["volumes"] == []
    assert [a["id"] for a in state["apps"]] == [kept_app]
    for table in ("functions", "function_definitions", "classes", "web_urls"):
        assert state[table] == [], table
    assert [v["app_id"] for v in state["app_versions"]] == [kept_app]
    assert state["proxy_token_envs"] == [] and len(state["proxy_tokens"]) == 1
    with pytest.raises(NotFoundError, match="Environment 'tmp' not found"):
        modal.Secret.objects.list(environment_name="tmp")
