"""Issue 14 "How we will know": every state-changing RPC of every resource step, faulted.

For each resource step (create / update / delete) and the RPC that changes Modal in that
step, the emulator injects (dev/emulator/faults.py):

- `lost`: the RPC is applied, then its answer is lost once (UNAVAILABLE after the handler).
  The step must succeed, and Modal must hold exactly what a clean run holds: no duplicate,
  no orphan, the state's id is the live object's.
- `down`: the RPC fails before it runs, on every attempt (Modal keeps failing). The step
  must fail with a clear error naming the resource and what was asked, Modal must be
  unchanged by the step (a create leaves nothing behind), and the engine keeps the state it
  had.

In both cases no secret value appears in an error, the provider's log or the stored state.
Killing the emulator mid-call is covered by test_faults.py (14.1, 14.2) and test_errors.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from components.modal._base import ModalProvider
from components.modal.environment import EnvironmentProvider
from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from components.modal.secret import SecretProvider
from components.modal.spend_alert import SpendAlertProvider
from components.modal.volume import VolumeProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    Engine,
    ProviderCallError,
    ProviderServer,
    Secret,
    reveal,
)
from tests.providers.helpers import server_env

pytestmark = pytest.mark.slow

VALUE = "fault-suite-secret-value-0001"
VALUE_2 = "fault-suite-secret-value-0002"
# Fast retries: a `down` case must still go through every attempt.
FAST = {
    "MODAL_PROVIDER_RETRY_ATTEMPTS": "2",
    "MODAL_PROVIDER_RETRY_BASE_DELAY": "0.05",
    "MODAL_PROVIDER_ATTEMPT_TIMEOUT": "5",
}
VOL = {"name": "v", "environment": "main"}
TABLES = ("environments", "secrets", "volumes", "proxy_tokens", "proxy_token_envs")


@dataclass(frozen=True)
class Case:
    resource: str
    step: str  # create | update | delete
    rpc: str  # the state-changing RPC of that step
    provider: Callable[[], ModalProvider]
    first: dict[str, Any]  # inputs of the create (and of the state an update/delete starts)
    second: dict[str, Any] | None = None  # inputs of the update
    secret_outputs: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.resource}-{self.step}-{self.rpc}"


def _secret(value: str) -> dict[str, Any]:
    return {"name": "keys", "environment": "main", "values": Secret({"K": value})}


CASES = [
    Case("Secret", "create", "SecretGetOrCreate", SecretProvider, _secret(VALUE)),
    Case("Secret", "update", "SecretUpdate", SecretProvider, _secret(VALUE), _secret(VALUE_2)),
    Case("Secret", "delete", "SecretDelete", SecretProvider, _secret(VALUE)),
    Case("Volume", "create", "VolumeGetOrCreate", VolumeProvider, VOL),
    Case(
        "Volume",
        "update",
        "VolumeRename",
        VolumeProvider,
        VOL,
        {"name": "v2", "environment": "main"},
    ),
    Case("Volume", "delete", "VolumeDelete", VolumeProvider, VOL),
    Case("Environment", "create", "EnvironmentCreate", EnvironmentProvider, {"name": "dev"}),
    Case(
        "Environment",
        "update",
        "EnvironmentUpdate",
        EnvironmentProvider,
        {"name": "dev", "web_suffix": "one"},
        {"name": "dev", "web_suffix": "two"},
    ),
    Case("Environment", "delete", "EnvironmentDelete", EnvironmentProvider, {"name": "dev"}),
    *[
        Case(
            "ProxyAuthToken",
            "create",
            rpc,
            ProxyAuthTokenProvider,
            {"name": "gw", "environments": ["main"]},
            secret_outputs=("token_secret",),
        )
        for rpc in ("WebhookTokenCreate", "WebhookTokenEnvironmentAdd")
    ],
    Case(
        "ProxyAuthToken",
        "update",
        "WebhookTokenUpdate",
        ProxyAuthTokenProvider,
        {"name": "gw", "environments": ["main"]},
        {"name": "gw-2", "environments": ["main"]},
        secret_outputs=("token_secret",),
    ),
    Case(
        "ProxyAuthToken",
        "delete",
        "WebhookTokenDelete",
        ProxyAuthTokenProvider,
        {"name": "gw", "environments": ["main"]},
        secret_outputs=("token_secret",),
    ),
    *[
        Case(
            "SpendAlert",
            step,
            "EnvironmentSetBudget",
            SpendAlertProvider,
            {"environment": "main", "monthly_budget_usd": 10.0},
            {"environment": "main", "monthly_budget_usd": 20.0},
        )
        for step in ("create", "update", "delete")
    ],
]


def _modal(emu: EmulatorProcess) -> dict[str, Any]:
    """What Modal holds, without timestamps and usage counters."""
    state = emu.state()
    out: dict[str, Any] = {}
    for table in TABLES:
        out[table] = sorted(
            (
                {k: v for k, v in row.items() if not k.endswith("_at") and k != "last_used"}
                for row in state[table]
            ),
            key=repr,
        )
    return out


def _arm(emu: EmulatorProcess, rpc: str, when: str, count: int) -> None:
    emu._request(
        "POST",
        "/_emulator/faults",
        {"method": rpc, "when": when, "status": "UNAVAILABLE", "count": count},
    )


def _run_step(engine: Engine, case: Case) -> None:
    if case.step == "create":
        engine.up("r", case.provider(), case.first, secret_outputs=case.secret_outputs)
    elif case.step == "update":
        assert case.second is not None
        engine.up("r", case.provider(), case.second, secret_outputs=case.secret_outputs)
    else:
        engine.destroy("r")


def _clean_result(emulator: EmulatorProcess, case: Case) -> dict[str, Any]:
    """What Modal holds after the same steps without any fault (the reference)."""
    emulator.reset()
    with ProviderServer(env=server_env(emulator, **FAST)) as srv:
        engine = Engine(srv)
        if case.step != "create":
            engine.up("r", case.provider(), case.first, secret_outputs=case.secret_outputs)
        _run_step(engine, case)
    result = _modal(emulator)
    emulator.reset()
    return result


def _ids(modal: dict[str, Any]) -> dict[str, Any]:
    """The reference compared without ids (a clean run makes other ids)."""
    return {
        table: sorted(
            (
                {
                    k: v
                    for k, v in row.items()
                    if k not in ("id", "token_id", "env_id", "environment_id", "secret")
                }
                for row in rows
            ),
            key=repr,
        )
        for table, rows in modal.items()
    }


@pytest.mark.parametrize("mode", ["lost", "down"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault_at_every_step(emulator: EmulatorProcess, case: Case, mode: str) -> None:
    reference = _clean_result(emulator, case) if mode == "lost" else None
    with ProviderServer(env=server_env(emulator, **FAST)) as srv:
        engine = Engine(srv)
        if case.step != "create":
            engine.up("r", case.provider(), case.first, secret_outputs=case.secret_outputs)
        before_modal = _modal(emulator)
        before_state = engine.stored_state()
        if mode == "lost":
            _arm(emulator, case.rpc, "after", 1)
        else:
            _arm(emulator, case.rpc, "before", 1000)
        error = ""
        try:
            _run_step(engine, case)
        except ProviderCallError as e:
            error = e.details
        logs = srv.logs()
        stored = str(engine.stored_state())
    emulator._request("POST", "/_emulator/faults", {"clear": True})
    after = _modal(emulator)
    if mode == "lost":
        assert error == "", f"{case.id}: a lost answer must be ridden out: {error[-600:]}"
        assert _ids(after) == _ids(reference or {}), case.id  # nothing duplicated or orphaned
        if case.step != "delete":
            live = engine.states["r"].id
            assert live in repr(after), f"{case.id}: the state's id {live} is not in Modal"
    else:
        assert error, f"{case.id}: Modal kept failing, yet the step succeeded"
        assert f"{case.resource} " in error and " failed. Modal at " in error, error
        assert "Gave up after 2 attempts" in error or "may have been applied" in error, error
        assert after == before_modal, f"{case.id}: a failed step changed Modal"
        assert engine.stored_state() == before_state, f"{case.id}: the engine state moved"
    for secret in (VALUE, VALUE_2, emulator.token_secret or ""):
        assert secret not in error and secret not in logs, f"{case.id}: secret in error/log"
        assert secret not in stored, f"{case.id}: secret in clear in the stored state"
    for name, st in engine.states.items():
        for key in case.secret_outputs:
            if key in st.outputs:
                assert isinstance(st.outputs[key], Secret) and reveal(st.outputs[key]), name
