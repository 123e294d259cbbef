"""FunctionCreate / AppPublish / FunctionGetById rules through raw RPCs over the socket.

Kept (issue 33 item 7): the serving App's GPU and resource requests and its web URL
(serving/app.py, the release gate's probe) must be refused or routed as Modal does, or the
providers' tests would pass on a request Modal refuses (modal 1.6.4 modal/_functions.py,
modal/app.py `_App.function`/`server` arguments).
"""

from __future__ import annotations

import time

import pytest
from modal.exception import AlreadyExistsError, InvalidError, NotFoundError
from modal_proto import api_pb2

from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for, reset_modal_client_caches

WEB = api_pb2.WEBHOOK_TYPE_FUNCTION


def _app(description: str) -> str:
    resp = raw_rpc(
        "AppCreate",
        api_pb2.AppCreateRequest(description=description, app_state=api_pb2.APP_STATE_INITIALIZING),
    )
    return str(resp.app_id)


def _function(
    app_id: str, name: str = "web", label: str = "", **fields: object
) -> api_pb2.FunctionCreateResponse:
    fn = api_pb2.Function(function_name=name, **fields)  # type: ignore[arg-type]
    if label is not None:
        fn.webhook_config.CopyFrom(api_pb2.WebhookConfig(type=WEB, requested_suffix=label))
    return raw_rpc("FunctionCreate", api_pb2.FunctionCreateRequest(app_id=app_id, function=fn))


def _publish(
    app_id: str, name: str, functions: dict[str, api_pb2.FunctionCreateResponse]
) -> api_pb2.AppPublishResponse:
    return raw_rpc(
        "AppPublish",
        api_pb2.AppPublishRequest(
            app_id=app_id,
            name=name,
            app_state=api_pb2.APP_STATE_DEPLOYED,
            function_ids={tag: r.function_id for tag, r in functions.items()},
            definition_ids={
                r.function_id: r.handle_metadata.definition_id for r in functions.values()
            },
        ),
    )


@pytest.mark.parametrize("label", ["Same_Label!", "-edge", "edge-", "12345", "a" * 64])
def test_invalid_web_labels_are_refused_not_rewritten(
    modal_env: EmulatorProcess, label: str
) -> None:
    with pytest.raises(InvalidError, match="Invalid web endpoint label"):
        _function(_app("a"), label=label)


def test_a_web_url_belongs_to_one_live_app(modal_env: EmulatorProcess) -> None:
    first_app = _app("first")
    first = _function(first_app, label="same-label")
    assert first.function.web_url == modal_env.edge_url("emu-workspace--same-label")
    _publish(first_app, "first", {"web": first})
    second_app = _app("second")
    with pytest.raises(AlreadyExistsError, match=r"same-label\.modal\.run is already served by"):
        _function(second_app, label="same-label")
    # Generated URLs collide too: app "a-b" function "c" vs app "a" function "b-c".
    ab = _app("a-b")
    _publish(ab, "a-b", {"c": _function(ab, name="c", label="")})
    with pytest.raises(AlreadyExistsError, match=r"a-b-c\.modal\.run"):
        _function(_app("a"), name="b-c", label="")
    # A redeploy of the owner keeps its URL; once the owner is stopped, the URL is free.
    _publish(first_app, "first", {"web": _function(first_app, label="same-label")})
    raw_rpc("AppStop", api_pb2.AppStopRequest(app_id=first_app))
    taken = _function(second_app, label="same-label")
    assert taken.function.web_url == first.function.web_url


@pytest.mark.parametrize(
    ("gpu", "scaling", "concurrency", "message"),
    [
        (("H999", 1), None, None, "unknown GPU type 'H999'"),
        (("H100", 9), None, None, "9 x H100 is not available"),
        (("A10G", 8), None, None, "1 to 4 A10G"),
        (("H100", 0), None, None, "0 x H100"),
        (None, (3, 1), None, r"min_containers \(3\) cannot be greater than max_containers \(1\)"),
        (None, None, (4, 8), r"target concurrent inputs \(8\) cannot exceed max"),
    ],
)
def test_function_create_validates_resources(
    modal_env: EmulatorProcess,
    gpu: tuple[str, int] | None,
    scaling: tuple[int, int] | None,
    concurrency: tuple[int, int] | None,
    message: str,
) -> None:
    fn = api_pb2.Function(function_name="f")
    if gpu is not None:
        fn.resources.gpu_config.CopyFrom(api_pb2.GPUConfig(gpu_type=gpu[0], count=gpu[1]))
    if scaling is not None:
        fn.autoscaler_settings.CopyFrom(
            api_pb2.AutoscalerSettings(min_containers=scaling[0], max_containers=scaling[1])
        )
    if concurrency is not None:
        fn.max_concurrent_inputs, fn.target_concurrent_inputs = concurrency
    app_id = _app("v")
    with pytest.raises(InvalidError, match=message):
        raw_rpc("FunctionCreate", api_pb2.FunctionCreateRequest(app_id=app_id, function=fn))
    assert modal_env.state()["function_definitions"] == []


def test_valid_gpu_requests_pass(modal_env: EmulatorProcess) -> None:
    app_id = _app("ok")
    for i, (gpu_type, count) in enumerate([("H100", 3), ("A10G", 4), ("B200+", 8), ("L40S", 1)]):
        fn = api_pb2.Function(function_name=f"f{i}")
        fn.resources.gpu_config.CopyFrom(api_pb2.GPUConfig(gpu_type=gpu_type, count=count))
        raw_rpc("FunctionCreate", api_pb2.FunctionCreateRequest(app_id=app_id, function=fn))
    assert len(modal_env.state()["function_definitions"]) == 4


def test_publish_refuses_unknown_or_foreign_definition_ids(modal_env: EmulatorProcess) -> None:
    app_id = _app("svc")
    f = _function(app_id, name="f", label="")
    g = _function(app_id, name="g", label="")
    base = {"f": f.function_id}
    for definition_ids, shown in (
        ({f.function_id: "de-" + "x" * 22}, "de-xxxx"),
        ({f.function_id: g.handle_metadata.definition_id}, g.handle_metadata.definition_id),
    ):
        with pytest.raises(NotFoundError, match=shown):
            raw_rpc(
                "AppPublish",
                api_pb2.AppPublishRequest(
                    app_id=app_id,
                    name="svc",
                    app_state=api_pb2.APP_STATE_DEPLOYED,
                    function_ids=base,
                    definition_ids=definition_ids,
                ),
            )
    assert modal_env.state()["app_versions"] == []


def test_function_get_by_id_follows_rollback_and_rollback_counts_back(
    modal_env: EmulatorProcess,
) -> None:
    app_id = _app("svc")
    v1 = _function(app_id, name="f", label="", timeout_secs=10)
    _publish(app_id, "svc", {"f": v1})
    for secs in (20, 30):
        fid = v1.function_id
        resp = raw_rpc(
            "FunctionCreate",
            api_pb2.FunctionCreateRequest(
                app_id=app_id,
                existing_function_id=fid,
                function=api_pb2.Function(function_name="f", timeout_secs=secs),
            ),
        )
        _publish(app_id, "svc", {"f": resp})

    def served_timeout() -> int:
        got = raw_rpc("FunctionGetById", api_pb2.FunctionGetByIdRequest(function_id=fid))
        return int(got.function.ranked_functions[0].function.timeout_secs)

    assert served_timeout() == 30
    with pytest.raises(InvalidError, match="version 0 does not exist"):
        raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=0))
    raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=-2))  # v3 -> v1
    assert served_timeout() == 10
    hist = raw_rpc("AppDeploymentHistory", api_pb2.AppDeploymentHistoryRequest(app_id=app_id))
    assert hist.app_deployment_histories[0].rollback_version == 1
    with pytest.raises(Exception, match="nothing to roll back to"):
        raw_rpc("AppRollback", api_pb2.AppRollbackRequest(app_id=app_id, version=-9))


def test_apps_that_are_not_deployed_get_dev_urls(modal_env: EmulatorProcess) -> None:
    for state, ephemeral_suffix, expected in (
        (api_pb2.APP_STATE_EPHEMERAL, "", "emu-workspace--serve-web-dev"),
        (api_pb2.APP_STATE_DETACHED, "", "emu-workspace--run-web-dev"),
        (api_pb2.APP_STATE_EPHEMERAL, "abc", "emu-workspace--mine-abc"),
    ):
        description = "run" if state == api_pb2.APP_STATE_DETACHED else "serve"
        app_id = raw_rpc(
            "AppCreate", api_pb2.AppCreateRequest(description=description, app_state=state)
        ).app_id
        fn = api_pb2.Function(
            function_name="web",
            webhook_config=api_pb2.WebhookConfig(
                type=WEB,
                requested_suffix="mine" if ephemeral_suffix else "",
                ephemeral_suffix=ephemeral_suffix,
            ),
        )
        created = raw_rpc(
            "FunctionCreate", api_pb2.FunctionCreateRequest(app_id=app_id, function=fn)
        )
        assert created.function.web_url == modal_env.edge_url(expected)


def test_silent_initializing_apps_are_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    with EmulatorProcess(heartbeat_timeout=0.2) as emu:
        modal_env_for(emu, monkeypatch)
        try:
            app_id = _app("abandoned")
            (row,) = emu.state()["apps"]
            assert row["state"] == "initializing" and row["last_heartbeat"]
            deadline = time.monotonic() + 30
            while emu.state()["apps"][0]["state"] == "initializing":
                assert time.monotonic() < deadline, "never stopped"
                raw_rpc("AppList", api_pb2.AppListRequest())  # listing expires silent apps
                time.sleep(0.1)
            life = raw_rpc("AppGetLifecycle", api_pb2.AppGetLifecycleRequest(app_id=app_id))
            assert life.lifecycle.app_state == api_pb2.APP_STATE_STOPPED
        finally:
            reset_modal_client_caches()
