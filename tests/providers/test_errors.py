"""Credentials and failure handling: bad/missing credentials, stack config, transient outages."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from components.modal._base import ModalProvider, ModalProviderError
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
        # A create is not idempotent: it was retried only because it never reached Modal.
        assert "never reached Modal: nothing was changed" in msg


def test_transient_outage_is_ridden_out(emulator: EmulatorProcess) -> None:
    """An idempotent call (SpendAlert create: lookup + set budget) issued while Modal is down
    succeeds once it is back. Deterministic (review finding 22): the retry window (40
    attempts) is far longer than any restart, and the emulator is restarted only after the
    call has failed at least one attempt."""
    from components.modal.spend_alert import SpendAlertProvider

    env = server_env(emulator, MODAL_PROVIDER_RETRY_ATTEMPTS="40")
    with ProviderServer(env=env) as srv:
        alert = {"environment": "main", "monthly_budget_usd": 5.0}
        Engine(srv).up("warm", SpendAlertProvider(), alert)  # a live connection to break
        emulator.kill()
        result: list[object] = []
        t = threading.Thread(target=lambda: result.append(srv.create(SpendAlertProvider(), alert)))
        t.start()
        try:
            time.sleep(1.5)  # > one attempt (1 s): the call has been refused at least once
            assert t.is_alive()  # still retrying, not failed
            emulator.start()
        finally:
            t.join()
    (created,) = result
    assert getattr(created, "id", "").startswith("en-")
    assert any(e["budget_usd"] == 5.0 for e in emulator.state()["environments"])


def test_half_set_credentials_are_refused_not_mixed(emulator: EmulatorProcess) -> None:
    """Review finding 29: config with only modal:tokenId must not fall back to the env token."""
    config = {"modal:tokenId": emulator.token_id}
    with ProviderServer(env=server_env(emulator), config=config) as srv:
        with pytest.raises(ProviderCallError) as ei:
            srv.create(P, INPUTS)
        msg = ei.value.details
        assert "modal:tokenId is set but modal:tokenSecret is not" in msg
    env = {k: v for k, v in server_env(emulator).items() if k != "MODAL_TOKEN_SECRET"}
    with (
        ProviderServer(env=env) as srv,
        pytest.raises(ProviderCallError, match="MODAL_TOKEN_SECRET"),
    ):
        srv.create(P, INPUTS)
    assert secret_names(emulator) == []


class _Failing(ModalProvider):
    kind = "Probe"

    def fail_after_producing(self, produced: str) -> None:
        """`fn` learns a secret (like a freshly minted token) and then fails quoting it."""
        from modal import exception as mexc

        learned: dict[str, str] = {}

        async def go(client: object) -> None:
            learned["token_secret"] = produced
            raise mexc.InvalidError(f"grant failed for token {produced}")

        self.run("create", "'x'", go, secrets=learned.values())


@pytest.mark.parametrize("produced", ["tk-secret-made-inside-the-call", "abcdefgh"])
def test_secrets_produced_inside_the_call_are_redacted(
    modal_env: EmulatorProcess, produced: str
) -> None:
    """Review findings 11 and 28: the redaction list is read when the error is built (not
    before `fn` ran), down to the minimum redacted length (issue 14.5: shorter values would
    mangle ids, see test_faults.py)."""
    with pytest.raises(ModalProviderError) as ei:
        _Failing().fail_after_producing(produced)
    assert produced not in str(ei.value) and "[secret]" in str(ei.value)


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


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_sent_non_idempotent_call_is_not_repeated(
    modal_env: EmulatorProcess, monkeypatch: pytest.MonkeyPatch, idempotent: bool
) -> None:
    """Review finding 12: a failure after the request went out (INTERNAL, timeouts) may have
    been applied by Modal; only idempotent calls are retried then, and the error says so."""
    from modal import exception as mexc

    monkeypatch.setenv("MODAL_PROVIDER_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("MODAL_PROVIDER_RETRY_BASE_DELAY", "0.01")
    calls: list[int] = []

    async def go(client: object) -> None:
        calls.append(1)
        raise mexc.InternalError("server failed after applying?")

    with pytest.raises(ModalProviderError) as ei:
        _Failing().run("create", "'x'", go, idempotent=idempotent)
    msg = str(ei.value)
    if idempotent:
        assert len(calls) == 3 and "Gave up after 3 attempts" in msg
    else:
        assert len(calls) == 1
        assert "may have been applied" in msg and "adopt" in msg
        assert "nothing was changed" not in msg
