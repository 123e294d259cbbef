"""The spend watcher (watchers/spend_alerts.py) deployed by the providers on the emulator's
runtime, as ServingEnvironment deploys it: its schedule fired through the control route posts
each crossed threshold once to a real loopback webhook, retries a failed post at its next run,
and a no-op `up` stays a no-op while the webhook is down.

The emulator here runs containers on the host network (`--container-network host`): in a
network namespace a container cannot reach the machine's loopback, where the webhook listens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import modal
import pytest

from components.llm_service import (
    SPEND_TOKEN_ID_ENV,
    SPEND_TOKEN_SECRET_ENV,
    SPEND_WATCH_APP_FILE,
    SPEND_WATCH_APP_NAME,
    SPEND_WATCH_DICT_NAME,
    SPEND_WATCH_SECRET_NAME,
    SPEND_WEBHOOK_ENV,
)
from components.modal import SecretProvider
from components.modal.spend_alert import SpendAlertProvider, SpendWatchProvider
from tests.emulator.helpers import modal_cli
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for
from tests.harness.provider_server import Engine, ProviderServer, Secret
from tests.providers.helpers import Webhook, mutating_calls, server_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def host_emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    tmp: Path = tmp_path_factory.mktemp("watch")
    emu = EmulatorProcess(
        state_path=tmp / "state.sqlite3", container_network="host", stop_grace=3.0
    ).start()
    try:
        yield emu
    finally:
        emu.close()


@pytest.fixture
def watch_env(
    host_emu: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[EmulatorProcess, ProviderServer]]:
    host_emu.reset()
    modal_env_for(host_emu, monkeypatch)
    server = ProviderServer(env=server_env(host_emu)).start()
    try:
        yield host_emu, server
    finally:
        server.close()


def _fire(emu: EmulatorProcess) -> Any:
    """Run the watcher's schedule now and wait for the run's result."""
    call_id = emu.run_schedule(SPEND_WATCH_APP_NAME, "watch")
    return modal.FunctionCall.from_id(call_id).get(timeout=120)


def test_watcher_posts_each_threshold_once_retries_and_up_stays_a_no_op(
    watch_env: tuple[EmulatorProcess, ProviderServer], webhook: Webhook
) -> None:
    emu, srv = watch_env
    engine = Engine(srv)
    # The watcher's token: a service user with no access until it is made viewer of "main".
    ws = modal.Workspace.from_context()
    token = ws.service_users.create("spend-watch-main", expires_in=None)
    token_id, token_secret = token.token_id, token.token_secret
    alert_inputs = {"environment": "main", "monthly_budget_usd": 100.0, "thresholds": [0.5, 1.0]}
    secret_inputs = {
        "name": SPEND_WATCH_SECRET_NAME,
        "environment": "main",
        "values": Secret(
            {
                SPEND_WEBHOOK_ENV: webhook.url,
                SPEND_TOKEN_ID_ENV: token_id,
                SPEND_TOKEN_SECRET_ENV: token_secret,
            }
        ),
    }

    def deploy() -> list[str]:
        steps = [engine.up("alert", SpendAlertProvider(), alert_inputs)]
        steps.append(engine.up("secret", SecretProvider(), secret_inputs))
        spec = {
            "environment": "main",
            "environment_id": engine.states["alert"].outputs["environment_id"],
            "thresholds": [0.5, 1.0],
            "secret": SPEND_WATCH_SECRET_NAME,
            "dict": SPEND_WATCH_DICT_NAME,
            "period_minutes": 15,
        }
        watch_inputs = {
            "name": SPEND_WATCH_APP_NAME,
            "environment": "main",
            "app_file": SPEND_WATCH_APP_FILE,
            "spec_json": json.dumps(spec, sort_keys=True),
        }
        steps.append(engine.up("watch", SpendWatchProvider(), watch_inputs))
        return steps

    assert deploy() == ["create", "create", "create"]
    with pytest.raises(Exception, match="has no access to environment"):
        _fire(emu)  # the token is not yet allowed to read main's budget
    ws.service_users.set_role("spend-watch-main", "main", role="viewer")
    assert _fire(emu)["crossed"] == []  # no usage yet: nothing to say
    assert webhook.bodies == []

    emu.set_usage("main", 55)
    assert _fire(emu)["sent"] == [0.5]
    assert len(webhook.bodies) == 1
    body = webhook.bodies[0]
    assert {k: v for k, v in body.items() if k != "text"} == {
        "environment": "main",
        "threshold": 0.5,
        "budget_usd": 100.0,
        "usage_usd": 55.0,
        "effective_limit_usd": 100.0,
        "limit_reached": False,
    }
    assert "'main'" in body["text"] and "$55.00" in body["text"] and "50%" in body["text"]
    assert _fire(emu) == {"crossed": [0.5], "sent": [], "failed": []}  # remembered
    assert len(webhook.bodies) == 1

    # The webhook fails: the run fails (naming neither URL nor token) and remembers nothing.
    webhook.status = 500
    emu.set_usage("main", 120)
    with pytest.raises(Exception, match=r"1 alert\(s\) not delivered.*HTTP 500") as failed:
        _fire(emu)
    assert webhook.url not in str(failed.value) and token_secret not in str(failed.value)
    assert len(webhook.bodies) == 1

    # A no-op `up` while the webhook is down: every resource "same", no mutating call.
    before = emu.rpc_counts()
    assert deploy() == ["same", "same", "same"]
    assert mutating_calls(before, emu.rpc_counts()) == {}

    # The next run retries and delivers.
    webhook.status = 200
    assert _fire(emu)["sent"] == [1.0]
    assert [b["threshold"] for b in webhook.bodies] == [0.5, 1.0]
    assert webhook.bodies[1]["limit_reached"] is True
    assert "budget is reached" in webhook.bodies[1]["text"]
    assert _fire(emu)["sent"] == []
    assert len(webhook.bodies) == 2

    # No secret value in the app's logs, the provider's logs, outputs or the emulator's state.
    logs = modal_cli(emu, "app", "logs", SPEND_WATCH_APP_NAME).stdout
    assert "not delivered" in logs and "sent [1.0]" in logs
    public = json.dumps(
        [engine.states[n].outputs for n in ("alert", "watch")], default=str
    ) + json.dumps(emu.state())
    for text in (logs, srv.logs(), public):
        assert webhook.url not in text
        assert "hook-secret-123" not in text
        assert token_secret not in text
