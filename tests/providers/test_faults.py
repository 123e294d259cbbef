"""Issue 14 (providers, items 1-6): regression tests for faults found by the adversarial pass.

Each test is named after the item it covers (test_14_<item>_...) and failed before its fix.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.modal.environment import EnvironmentProvider
from components.modal.secret import SecretProvider
from components.modal.volume import VolumeProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, Secret
from tests.providers.helpers import server_env


@pytest.fixture
def own_emulator(tmp_path: Path) -> Iterator[EmulatorProcess]:
    """An emulator with a state file (kill -9 and restart keep its state and port)."""
    emu = EmulatorProcess(state_path=tmp_path / "state.db").start()
    try:
        yield emu
    finally:
        emu.close()


def _secret(name: str) -> dict[str, object]:
    return {"name": name, "environment": "main", "values": Secret({"K": "value-1234"})}


def test_14_1_half_open_client_dropped_after_an_outage(own_emulator: EmulatorProcess) -> None:
    """kill -9 the emulator mid-run: the call fails after its retry budget; once Modal is
    back on the same state and port, later calls of the same provider process succeed."""
    with ProviderServer(env=server_env(own_emulator)) as srv:
        srv.create(SecretProvider(), _secret("before"))  # a live, cached client
        own_emulator.kill()
        with pytest.raises(ProviderCallError) as ei:
            srv.create(SecretProvider(), _secret("during"))
        assert "Gave up after 4 attempts" in ei.value.details
        own_emulator.start()
        assert own_emulator.url.endswith(f":{own_emulator.port}")
        created = srv.create(SecretProvider(), _secret("after"))
        assert created.id.startswith("st-")
    names = sorted(s["name"] for s in own_emulator.state()["secrets"])
    assert names == ["after", "before"]


def test_14_5_salt_is_secret_and_short_values_do_not_mangle_messages(
    modal_env: EmulatorProcess,
) -> None:
    """The digest's salt is a secret output (in state only encrypted); redaction replaces
    whole values of at least MIN_REDACTED_LENGTH characters, never a 1-character value
    inside ids."""
    from components.modal._base import MIN_REDACTED_LENGTH, redact

    text = "secret st-abc123 in environment 'main': value s3cr3t-value-long"
    assert redact(text, ["a", "1", "s3cr3t-value-long"]) == (
        "secret st-abc123 in environment 'main': value [secret]"
    )
    assert redact("x" * MIN_REDACTED_LENGTH, ["x" * MIN_REDACTED_LENGTH]) == "[secret]"
    with ProviderServer(env=server_env(modal_env)) as srv:
        engine = Engine(srv)
        engine.up("s", SecretProvider(), {**_secret("salted")})
        stored = engine.stored_state()
        salt = engine.states["s"].outputs["values_salt"]
        assert isinstance(salt, Secret)
        assert salt.value not in str(stored)  # only the ciphertext marker is stored
        # A state written before this fix holds the salt in clear: a refresh re-records it
        # as a secret.
        old = {**engine.states["s"].outputs, "values_salt": salt.value}
        read = srv.read(SecretProvider(), engine.states["s"].id, state=old)
        assert isinstance(read.outputs["values_salt"], Secret)
        assert read.outputs["values_digest"] == engine.states["s"].outputs["values_digest"]


def test_14_6_one_threshold_rule_for_config_and_provider(srv: ProviderServer) -> None:
    """Config (whole percentages) and the provider (fractions) accept exactly the same
    thresholds: the rule lives in spend_alert.threshold_problem."""
    from components.config import ConfigError, parse_stack_config
    from components.modal.spend_alert import MAX_THRESHOLD, SpendAlertProvider

    base = {
        "environment": "dev",
        "services": '[{"name": "chat", "engine": "vllm", "model": "Qwen/Qwen3-0.6B", "gpu": "T4"}]',
        "monthlyBudgetUsd": "100000",
    }
    top = round(MAX_THRESHOLD * 100)
    cfg = parse_stack_config({**base, "alertThresholdsPct": f"[50, {top}]"}, stack="dev")
    assert cfg.alert_thresholds == [0.5, MAX_THRESHOLD]
    with pytest.raises(ConfigError, match=f"between 1 and {top}"):
        parse_stack_config({**base, "alertThresholdsPct": f"[{top + 1}]"}, stack="dev")
    props = {"environment": "dev", "monthly_budget_usd": 100.0}
    ok = srv.check(SpendAlertProvider(), {**props, "thresholds": cfg.alert_thresholds})
    assert ok.failures == []
    over = srv.check(SpendAlertProvider(), {**props, "thresholds": [(top + 1) / 100]})
    assert [p for p, _ in over.failures] == ["thresholds"]


def test_14_3_environment_delete_refuses_while_volumes_or_secrets_remain(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Deleting an environment deletes what is in it: a cache volume retained by
    protectCaches (or a secret Pulumi never managed) must not die with it."""
    import modal

    engine.up("e", EnvironmentProvider(), {"name": "dev"})
    modal.Volume.objects.create("chat-hf-cache", environment_name="dev")
    modal.Secret.objects.create("by-hand", {"K": "v"}, environment_name="dev")
    with pytest.raises(ProviderCallError) as ei:
        engine.destroy("e")
    msg = ei.value.details
    assert "Environment 'dev'" in msg and "delete refused" in msg
    assert "volumes: chat-hf-cache" in msg and "secrets: by-hand" in msg
    assert "protectCaches" in msg and "force_delete=True" in msg
    assert "dev" in [e["name"] for e in modal_env.state()["environments"]]
    modal.Secret.objects.delete("by-hand", environment_name="dev")
    with pytest.raises(ProviderCallError, match="volumes: chat-hf-cache"):
        engine.destroy("e")
    modal.Volume.objects.delete("chat-hf-cache", environment_name="dev")
    engine.destroy("e")
    assert "dev" not in [e["name"] for e in modal_env.state()["environments"]]


def test_14_4_volume_refresh_reports_a_renamed_environment_as_drift(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    import modal

    modal.Environment.objects.create("dev")
    engine.up("v", VolumeProvider(), {"name": "cache", "environment": "dev"})
    vid = engine.states["v"].id
    modal.environments.update_environment("dev", new_name="dev-renamed")
    assert engine.refresh("v") == "update"  # drift, not a failure
    assert engine.states["v"].outputs["environment"] == "dev-renamed"
    assert engine.states["v"].id == vid


def test_14_4_environment_update_acts_on_the_id_not_the_name(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Deleted and recreated by hand under the same name: a different environment, which an
    update must not modify."""
    import modal

    engine.up("e", EnvironmentProvider(), {"name": "dev", "web_suffix": "one"})
    modal.environments.delete_environment("dev")
    modal.Environment.objects.create("dev")
    by_hand = {e["name"]: e["webhook_suffix"] for e in modal_env.state()["environments"]}["dev"]
    with pytest.raises(ProviderCallError) as ei:
        engine.up("e", EnvironmentProvider(), {"name": "dev", "web_suffix": "two"})
    assert "no longer exists" in ei.value.details and "pulumi refresh" in ei.value.details
    live = {e["name"]: e["webhook_suffix"] for e in modal_env.state()["environments"]}
    assert live["dev"] == by_hand  # the hand-made environment was not touched


def _arm(emu: EmulatorProcess, method: str, **kw: object) -> None:
    """Arm an injected fault (dev/emulator/faults.py) through the control port."""
    emu._request("POST", "/_emulator/faults", {"method": method, **kw})


def _token_accepted(emu: EmulatorProcess, token_id: str, secret: str) -> bool:
    from tests.harness.emulator import EmulatorError

    try:
        emu._request(
            "POST",
            "/_emulator/proxy-auth",
            {"token_id": token_id, "token_secret": secret, "environment": "main"},
        )
    except EmulatorError:
        return False
    return True


def test_14_2_token_create_committed_then_unavailable_leaves_one_token(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """WebhookTokenCreate applied, answer lost (UNAVAILABLE): the retry must not leave two
    tokens (one orphaned, a live credential nobody holds)."""
    from components.modal.proxy_auth_token import ProxyAuthTokenProvider
    from tests.harness.provider_server import reveal

    _arm(emulator, "WebhookTokenCreate", when="after", status="UNAVAILABLE")
    engine.up("t", ProxyAuthTokenProvider(), {"name": "gw", "environments": ["main"]})
    st = engine.states["t"]
    tokens = emulator.state()["proxy_tokens"]
    assert [t["id"] for t in tokens] == [st.id]
    assert _token_accepted(emulator, st.id, reveal(st.outputs["token_secret"]))


@pytest.mark.parametrize(
    ("method", "provider", "props", "table"),
    [
        ("SecretGetOrCreate", SecretProvider(), _secret("keys"), "secrets"),
        ("VolumeGetOrCreate", VolumeProvider(), {"name": "v", "environment": "main"}, "volumes"),
        ("EnvironmentCreate", EnvironmentProvider(), {"name": "dev"}, "environments"),
    ],
)
def test_14_2_create_committed_then_unavailable_is_not_reported_as_foreign(
    engine: Engine,
    emulator: EmulatorProcess,
    method: str,
    provider: object,
    props: dict[str, object],
    table: str,
) -> None:
    """Applied, answer lost: the retry finds the object it made (same idempotency key, or
    "already exists" resolved to it), never "already exists, not managed"."""
    _arm(emulator, method, when="after", status="UNAVAILABLE")
    engine.up("r", provider, props)  # type: ignore[arg-type]
    st = engine.states["r"]
    rows = [r for r in emulator.state()[table] if r["name"] == props["name"]]
    assert [r["id"] for r in rows] == [st.id]


def test_14_2_refused_after_a_sent_attempt_never_claims_nothing_changed(
    own_emulator: EmulatorProcess,
) -> None:
    """Attempt 1 is applied but its answer never comes (Modal stalls, the attempt times
    out); Modal then dies, so later attempts are refused. A refused connection after an
    earlier sent attempt proves nothing: the error must say the create may have been
    applied, never "never reached Modal: nothing was changed"."""
    _arm(own_emulator, "SecretGetOrCreate", when="after", status="NONE", delay_s=5)
    with ProviderServer(env=server_env(own_emulator)) as srv:
        errors: list[ProviderCallError] = []

        def create() -> None:
            try:
                srv.create(SecretProvider(), _secret("keys"))
            except ProviderCallError as e:
                errors.append(e)

        worker = threading.Thread(target=create)
        worker.start()
        deadline = time.monotonic() + 10
        while not own_emulator.state()["secrets"] and time.monotonic() < deadline:
            time.sleep(0.05)
        own_emulator.kill()  # applied, unanswered; from now on: connection refused
        worker.join()
    (err,) = errors
    assert "may have been applied" in err.details and "adopt" in err.details
    assert "never reached Modal" not in err.details
    assert "nothing was changed" not in err.details


def test_14_2_cancelled_token_create_deletes_its_token(
    own_emulator: EmulatorProcess,
) -> None:
    """The attempt times out while the new token is being allowed into its environment (a
    cancellation, not an Exception): the token must be deleted, not orphaned."""
    from components.modal.proxy_auth_token import ProxyAuthTokenProvider

    env = server_env(own_emulator, MODAL_PROVIDER_RETRY_ATTEMPTS="1")
    _arm(own_emulator, "WebhookTokenEnvironmentAdd", when="before", status="NONE", delay_s=3)
    with (
        ProviderServer(env=env) as srv,
        pytest.raises(ProviderCallError, match="did not answer within 1s"),
    ):
        srv.create(ProxyAuthTokenProvider(), {"name": "gw", "environments": ["main"]})
    assert own_emulator.state()["proxy_tokens"] == []


def test_14_2_connection_refused_after_sending_proves_nothing(
    modal_env: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """modal's own retries may have sent a create before the connection was refused, so a
    ConnectionRefusedError is no proof that nothing was sent: an unkeyed create is not
    repeated and the error does not claim that nothing changed."""
    from components.modal._base import ModalProvider, ModalProviderError

    monkeypatch.setenv("MODAL_PROVIDER_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("MODAL_PROVIDER_RETRY_BASE_DELAY", "0.01")
    calls: list[int] = []

    async def go(client: object) -> None:
        calls.append(1)
        raise ConnectionRefusedError(111, "Connect call failed")

    class Probe(ModalProvider):
        kind = "Probe"

    with pytest.raises(ModalProviderError) as ei:
        Probe().run("create", "'x'", go, idempotent=False)
    assert len(calls) == 1
    assert "may have been applied" in str(ei.value)
    assert "nothing was changed" not in str(ei.value)
