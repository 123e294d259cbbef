"""`modal deploy` (CLI and in process) against the emulator: both app styles, blobs, cache
hits on redeploy, app list, history, rollback, stop.

Kept (issue 33 item 7): the App provider deploys, reads history, rolls back and stops through
these (components/modal/_deploy_runner.py, _effects.py); modal 1.6.4 modal/runner.py
`_deploy_app`, modal/cli/app.py `rollback`, `stop`, `history`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import modal
import pytest
from modal_proto import api_pb2

from tests.emulator.helpers import APPS_DIR, cli_batch, json_out, modal_cli, raw_rpc
from tests.harness.emulator import EmulatorProcess

CLS_APP = str(APPS_DIR / "cls_web_app.py")
SERVER_APP = str(APPS_DIR / "server_app.py")
BIG = 5 * 1024 * 1024


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


@pytest.fixture
def big_file(tmp_path: Path) -> str:
    """A >= 4 MiB file generated at test time (uploaded through BlobCreate + HTTP PUT)."""
    path = tmp_path / "big_weights.bin"
    path.write_bytes(os.urandom(BIG))
    return str(path)


def _function_get(app: str, tag: str, env: str = "") -> Any:
    return raw_rpc(
        "FunctionGet",
        api_pb2.FunctionGetRequest(app_name=app, object_tag=tag, environment_name=env),
    )


def test_cls_web_server_deploy_redeploy_history_rollback_stop(
    modal_env: EmulatorProcess, big_file: str
) -> None:
    emu = modal_env
    modal.Secret.objects.create("hf-secret", {"HF_TOKEN": "hf_x"})
    env = {"EMU_BIG_FILE": big_file}

    first = modal_cli(emu, "deploy", CLS_APP, extra_env=env)
    url = emu.edge_url("emu-workspace--llm-server-llm-serve")  # Modal's name, a local port
    assert url in first.stdout
    counts1 = emu.rpc_counts()
    assert counts1["BlobCreate"] == 1  # the 5 MiB file went through a blob
    assert counts1["ImageJoinStreaming"] == 4  # base, uv_pip_install, two copy layers
    assert counts1["MountPutFile"] == 3  # the app file, the config file, the big file
    state = emu.state()
    assert [b["content_length"] for b in state["blobs"]] == [BIG]
    assert sorted(v["name"] for v in state["volumes"]) == ["llm-cache", "llm-models"]
    (app,) = state["apps"]
    assert (app["name"], app["state"], app["version"]) == ("llm-server", "deployed", 1)

    # Unchanged code: every image and mount is a cache hit; nothing is uploaded or built, and
    # the deploy is a no-op (AppPublish answers deployed_at == 0: no new version).
    second = modal_cli(emu, "deploy", CLS_APP, extra_env=env)
    assert url in second.stdout
    assert "Deployment skipped: no changes detected" in second.stdout
    delta = _diff(emu.rpc_counts(), counts1)
    for method in ("ImageJoinStreaming", "MountPutFile", "BlobCreate", "AppCreate"):
        assert method not in delta, delta
    assert delta["AppGetLayout"] == 1 and delta["AppPublish"] == 1
    (app2,) = emu.state()["apps"]
    assert (app2["id"], app2["version"]) == (app["id"], 1)
    v1_image = _function_get("llm-server", "LLM.*").function.ranked_functions[0].function.image_id

    # A real change (new env var layer) builds again and is version 2.
    counts2 = emu.rpc_counts()
    modal_cli(emu, "deploy", CLS_APP, extra_env={**env, "EMU_VARIANT": "3"})
    assert _diff(emu.rpc_counts(), counts2)["ImageJoinStreaming"] >= 1
    got = _function_get("llm-server", "LLM.*")
    v2_image = got.function.ranked_functions[0].function.image_id
    assert v2_image != v1_image
    assert got.handle_metadata.method_handle_metadata["serve"].web_url == url

    cls = modal.Cls.from_name("llm-server", "LLM")
    assert cls().serve.get_web_url() == url

    results = cli_batch(
        emu,
        ["app", "list", "--json"],
        ["app", "history", "llm-server", "--json"],
        ["app", "rollback", "llm-server", "v1"],
        ["app", "history", "llm-server", "--json"],
    )
    assert [r["exit_code"] for r in results] == [0, 0, 0, 0], results
    listed = json_out(results[0])
    assert [(a["app_id"], a["description"], a["state"]) for a in listed] == [
        (app["id"], "llm-server", "deployed")
    ]
    assert [h["version"] for h in json_out(results[1])] == ["v2", "v1"]
    assert [h["version"] for h in json_out(results[3])] == ["v3", "v2", "v1"]
    rolled = _function_get("llm-server", "LLM.*").function.ranked_functions[0].function
    assert rolled.image_id == v1_image  # back to v1's image; v2's is gone
    history = raw_rpc("AppDeploymentHistory", api_pb2.AppDeploymentHistoryRequest(app_id=app["id"]))
    assert history.app_deployment_histories[0].rollback_version == 1

    results = cli_batch(
        emu,
        ["app", "stop", "llm-server", "-y"],
        ["app", "list", "--json"],
        ["app", "stop", "llm-server", "-y"],
        ["app", "rollback", "llm-server"],
    )
    assert results[0]["exit_code"] == 0, results[0]
    assert [a["state"] for a in json_out(results[1])] == ["stopped"]
    assert json_out(results[1])[0]["stopped_at"]
    assert results[2]["exit_code"] != 0 and "already stopped" in results[2]["error"]
    assert results[3]["exit_code"] != 0 and "not deployed" in results[3]["error"]
    lookup = raw_rpc(
        "AppGetByDeploymentName", api_pb2.AppGetByDeploymentNameRequest(name="llm-server")
    )
    assert (lookup.app_id, lookup.previous_app_id) == ("", app["id"])
    assert lookup.lifecycle.app_state == api_pb2.APP_STATE_STOPPED
    with pytest.raises(modal.exception.NotFoundError):
        _function_get("llm-server", "LLM.*")

    # The name is free again: a new deploy makes a new app.
    modal_cli(emu, "deploy", CLS_APP, extra_env=env)
    apps = {a["id"]: a["state"] for a in emu.state()["apps"]}
    assert apps.pop(app["id"]) == "stopped"
    assert list(apps.values()) == ["deployed"]


def test_server_deploy_flash_url_and_environment_suffix(
    modal_env: EmulatorProcess, big_file: str
) -> None:
    emu = modal_env
    modal.Environment.objects.create("staging")
    for env_name in ("main", "staging"):
        modal.Secret.objects.create("hf-secret", {"HF_TOKEN": "x"}, environment_name=env_name)
    out = modal_cli(emu, "deploy", SERVER_APP, extra_env={"EMU_BIG_FILE": big_file})
    url = emu.edge_url("emu-workspace--llm-flash-server")
    assert url in out.stdout
    assert modal.Server.from_name("llm-flash", "Server").get_url() == url
    got = _function_get("llm-flash", "Server")
    assert modal.Server.from_id(got.function_id).get_url() == url  # FunctionGetById
    assert got.function.ranked_functions[0].function.is_server
    assert list(got.handle_metadata._experimental_flash_urls) == [url]
    assert emu.rpc_counts().get("ClassCreate", 0) == 0  # servers have no class object

    modal_cli(emu, "deploy", SERVER_APP, "-e", "staging")
    staged = modal.Server.from_name("llm-flash", "Server", environment_name="staging")
    assert staged.get_url() == emu.edge_url("emu-workspace-staging--llm-flash-server")
    assert staged.get_url() != url


def _load_app_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_in_process_deploy_with_tag(modal_env: EmulatorProcess, monkeypatch: Any) -> None:
    monkeypatch.setenv("EMU_APP_NAME", "inproc-app")
    modal.Secret.objects.create("hf-secret", {"HF_TOKEN": "x"})
    module = _load_app_module(CLS_APP, "emu_inproc_cls_app")
    module.app.deploy(tag="v1")
    history = raw_rpc(
        "AppDeploymentHistory",
        api_pb2.AppDeploymentHistoryRequest(
            app_id=modal.App.lookup("inproc-app").app_id or ""  # AppGetOrCreate (lookup)
        ),
    )
    assert [(h.version, h.tag) for h in history.app_deployment_histories] == [(1, "v1")]
    assert history.app_deployment_histories[0].client_version == modal.__version__


def test_failed_deploy_reports_and_stops_the_new_app(modal_env: EmulatorProcess) -> None:
    out = modal_cli(modal_env, "deploy", CLS_APP, check=False)  # hf-secret does not exist
    assert out.returncode != 0
    assert "hf-secret" in out.stdout + out.stderr
    assert modal_env.rpc_counts()["AppClientDisconnect"] == 1
    assert [a["state"] for a in modal_env.state()["apps"]] == ["stopped"]


def test_asgi_function_with_gpu_fallbacks_and_label_in_an_environment(
    modal_env: EmulatorProcess,
) -> None:
    modal.Environment.objects.create("dev")
    modal.Secret.objects.create("hf-secret", {"HF_TOKEN": "x"}, environment_name="dev")
    app_file = str(APPS_DIR / "asgi_app.py")
    out = modal_cli(modal_env, "deploy", app_file, "-e", "dev", "--name", "asgi2")
    url = modal_env.edge_url("emu-workspace-dev--my-custom-label")
    assert f"{url} 🔑" in out.stdout
    fn = modal.Function.from_name("asgi2", "web", environment_name="dev")
    assert fn.get_web_url() == url
    assert fn.info().gpus == [("H100", 1), ("A100", 1)]
    with pytest.raises(modal.exception.NotFoundError, match="asgi2"):
        modal.Function.from_name("asgi2", "web").hydrate()  # not in the default environment
