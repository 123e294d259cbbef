"""Credentials and failure handling: bad/missing credentials, stack config, transient outages."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from components.modal.secret import SecretProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, Secret
from tests.providers.helpers import server_env

P = SecretProvider()
INPUTS = {"name": "api-keys", "environment": "main", "values": Secret({"K": "v-123456"})}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def secret_names(emu: EmulatorProcess) -> list[str]:
    return [s["name"] for s in emu.state()["secrets"]]


def test_bad_credentials_are_named_with_what_to_do(emulator: EmulatorProcess) -> None:
    env = server_env(emulator, MODAL_TOKEN_SECRET="as-wrong-secret-value-000")
    with ProviderServer(env=env) as srv:
        with pytest.raises(ProviderCallError) as ei:
            srv.create(P, INPUTS)
        msg = ei.value.details
        assert "Secret 'api-keys' in environment 'main': create failed" in msg
        assert "AuthError" in msg
        assert f"{emulator.token_id!r} (from environment) was rejected" in msg
        assert "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET" in msg
        assert "as-wrong-secret-value-000" not in msg + srv.logs()
    assert secret_names(emulator) == []


def test_stack_config_credentials_win_over_env(emulator: EmulatorProcess) -> None:
    env = {
        k: v
        for k, v in server_env(emulator).items()
        if k not in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_SERVER_URL")
    }
    config = {
        "modal:tokenId": emulator.token_id,
        "modal:tokenSecret": Secret(emulator.token_secret),
        "modal:serverUrl": emulator.url,
    }
    with ProviderServer(env=env, config=config) as srv:
        created = srv.create(P, INPUTS)
        assert created.id.startswith("st-")
        assert srv.configure_response.get("acceptSecrets", False) is False
    # Wrong token in config, right one in env: config is used, so it fails.
    bad = {**config, "modal:tokenSecret": Secret("as-config-wrong-000000000")}
    with (
        ProviderServer(env=server_env(emulator), config=bad) as srv,
        pytest.raises(ProviderCallError, match="from stack config"),
    ):
        srv.create(P, {**INPUTS, "name": "other"})


def test_missing_credentials(emulator: EmulatorProcess) -> None:
    env = {k: v for k, v in server_env(emulator).items() if not k.startswith("MODAL_TOKEN")}
    with ProviderServer(env=env) as srv:
        with pytest.raises(ProviderCallError) as ei:
            srv.create(P, INPUTS)
        assert "no Modal credentials" in ei.value.details
        assert "pulumi config set --secret modal:tokenSecret" in ei.value.details


def test_unreachable_modal_is_retried_then_reported(emulator: EmulatorProcess) -> None:
    port = _closed_port()
    env = server_env(emulator, MODAL_SERVER_URL=f"http://127.0.0.1:{port}")
    with ProviderServer(env=env) as srv:
        with pytest.raises(ProviderCallError) as ei:
            srv.create(P, INPUTS)
        msg = ei.value.details
        assert f"Modal at http://127.0.0.1:{port} did not answer within 1s" in msg
        assert "Gave up after 4 attempts" in msg
        assert "nothing was changed" in msg


def test_transient_outage_is_ridden_out(srv: ProviderServer, emulator: EmulatorProcess) -> None:
    engine = Engine(srv)
    engine.up("warm", P, {**INPUTS, "name": "warm"})  # the provider holds a live connection
    emulator.kill()
    restarted = threading.Event()

    def bring_back() -> None:
        time.sleep(1.0)
        emulator.start()
        restarted.set()

    t = threading.Thread(target=bring_back)
    t.start()
    try:
        created = srv.create(P, INPUTS)  # issued while the emulator is down
    finally:
        t.join()
    assert restarted.is_set()
    assert created.id.startswith("st-")
    assert "api-keys" in secret_names(emulator)  # (in-memory emulator: restarted empty)


def test_app_deploy_uses_stack_config_credentials(emulator: EmulatorProcess) -> None:
    """The deploy subprocess gets the provider's credentials, not whatever env it inherits."""
    from components.modal.app import AppProvider
    from serving.spec import ServingSpec

    env = {
        **{k: v for k, v in server_env(emulator).items() if not k.startswith("MODAL_TOKEN")},
        "MODAL_SERVER_URL": "http://127.0.0.1:9",  # would fail if the runner used env
    }
    assert emulator.token_id and emulator.token_secret
    config = {
        "modal:tokenId": emulator.token_id,
        "modal:tokenSecret": Secret(emulator.token_secret),
        "modal:serverUrl": emulator.url,
    }
    spec = ServingSpec.model_validate(
        {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": "q"}
    ).to_json()
    with ProviderServer(env=env, config=config) as srv:
        app = {
            "name": "echo",
            "environment": "main",
            "app_file": "tests/providers/apps/echo_app.py",
            "spec_json": spec,
        }
        created = srv.create(AppProvider(), app)
        assert created.id.startswith("ap-") and created.outputs["version"] == 1
