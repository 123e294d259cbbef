"""SpendAlert provider: Modal's environment budget plus our thresholds and webhook alerts."""

from __future__ import annotations

import modal
from modal._utils.async_utils import synchronizer
from modal.client import _Client
from modal_proto import api_pb2

from components.modal.spend_alert import SpendAlertProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    Engine,
    ProviderServer,
    Secret,
    lifecycle,
    reveal,
)
from tests.providers.helpers import Webhook, rpc_delta

P = SpendAlertProvider()
SECRET_OUT = ("webhook_url",)


def inputs(
    budget: float = 100.0, env: str = "main", webhook: str | None = None, **kw: object
) -> dict[str, object]:
    d: dict[str, object] = {"environment": env, "monthly_budget_usd": budget, **kw}
    if webhook is not None:
        d["webhook_url"] = Secret(webhook)
    return d


def budget_of(emu: EmulatorProcess, env: str = "main") -> float | None:
    return next(e["budget_usd"] for e in emu.state()["environments"] if e["name"] == env)


async def _set_budget(env_id: str, usd: float) -> None:
    c = await _Client.from_env()
    await c._stub.EnvironmentSetBudget(
        api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, cycle_budget_dollars=usd)
    )


def test_lifecycle_sets_updates_and_clears_the_budget(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    steps = lifecycle(engine, "b", P, inputs(100), inputs(250), destroy=False)
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["b"]
    assert st.id.startswith("en-")
    assert budget_of(emulator) == 250
    assert st.outputs["effective_limit_usd"] == 250
    assert st.outputs["current_usage_usd"] == 0
    assert st.outputs["limit_reached"] is False
    assert st.outputs["thresholds_crossed"] == []
    engine.destroy("b")
    assert budget_of(emulator) is None


def test_refresh_reports_usage_and_up_alerts_each_threshold_once(
    engine: Engine, emulator: EmulatorProcess, webhook: Webhook
) -> None:
    engine.up("b", P, inputs(100, webhook=webhook.url), secret_outputs=SECRET_OUT)
    assert webhook.bodies == []
    emulator.set_usage("main", 55)
    assert engine.refresh("b") == "update"
    out = engine.states["b"].outputs
    assert out["current_usage_usd"] == 55 and out["thresholds_crossed"] == [0.5]
    assert webhook.bodies == []  # refresh only reads (review finding 10)
    assert engine.preview("b", P, inputs(100, webhook=webhook.url)) == "update"
    assert webhook.bodies == []
    assert engine.up("b", P, inputs(100, webhook=webhook.url)) == "update"
    assert [b["threshold"] for b in webhook.bodies] == [0.5]
    assert webhook.bodies[0] == {
        "environment": "main",
        "threshold": 0.5,
        "budget_usd": 100.0,
        "usage_usd": 55.0,
        "effective_limit_usd": 100.0,
        "limit_reached": False,
    }
    engine.refresh("b")
    assert engine.preview("b", P, inputs(100, webhook=webhook.url)) == "same"  # all alerted
    emulator.set_usage("main", 120)
    engine.refresh("b")
    engine.up("b", P, inputs(100, webhook=webhook.url))
    out = engine.states["b"].outputs
    assert out["limit_reached"] is True and out["thresholds_crossed"] == [0.5, 0.8, 1.0]
    assert [b["threshold"] for b in webhook.bodies] == [0.5, 0.8, 1.0]
    assert isinstance(out["webhook_url"], Secret)


def test_refresh_never_posts_so_unsaved_refreshes_cannot_repeat_alerts(
    engine: Engine, emulator: EmulatorProcess, webhook: Webhook, srv: ProviderServer
) -> None:
    """Review finding 10: `preview --refresh` runs Read but its state is never saved."""
    engine.up("b", P, inputs(10, webhook=webhook.url, thresholds=[1.0]), secret_outputs=SECRET_OUT)
    emulator.set_usage("main", 10)
    st = engine.states["b"]
    for _ in range(3):  # three unsaved refreshes (the engine state is not updated)
        r = srv.read(P, st.id, state=st.outputs, inputs=st.inputs, secret_outputs=SECRET_OUT)
        assert r.outputs["thresholds_crossed"] == [1.0]
    assert webhook.bodies == []


def test_failed_delivery_is_retried_at_next_up(
    engine: Engine, emulator: EmulatorProcess, webhook: Webhook, srv: ProviderServer
) -> None:
    alert = inputs(10, webhook=webhook.url, thresholds=[1.0])
    engine.up("b", P, alert, secret_outputs=SECRET_OUT)
    webhook.status = 500
    emulator.set_usage("main", 10)
    engine.refresh("b")
    assert engine.up("b", P, alert) == "update"
    assert engine.states["b"].outputs["thresholds_crossed"] == [1.0]
    assert engine.states["b"].outputs["thresholds_alerted"] == []
    assert "not delivered to the webhook (HTTP 500)" in srv.logs()
    webhook.status = 200
    assert engine.up("b", P, alert) == "update"
    assert engine.states["b"].outputs["thresholds_alerted"] == [1.0]
    assert len(webhook.bodies) == 1
    assert engine.preview("b", P, alert) == "same"


def test_zero_budget_crosses_nothing_until_there_is_usage(
    engine: Engine, emulator: EmulatorProcess, webhook: Webhook
) -> None:
    """Review finding 8: 0 >= t * 0 held for every threshold at zero usage."""
    engine.up("b", P, inputs(0, webhook=webhook.url), secret_outputs=SECRET_OUT)
    assert engine.states["b"].outputs["thresholds_crossed"] == []
    assert webhook.bodies == []
    emulator.set_usage("main", 0.01)
    engine.refresh("b")
    assert engine.states["b"].outputs["thresholds_crossed"] == [0.5, 0.8, 1.0]


def test_destroy_restores_a_budget_set_before_pulumi(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Review finding 9: create records the budget the environment had; delete restores it."""
    env_id = next(e["id"] for e in modal_env.state()["environments"] if e["name"] == "main")
    synchronizer.create_blocking(_set_budget)(env_id, 7.0)
    engine.up("b", P, inputs(100))
    assert engine.states["b"].outputs["previous_budget_usd"] == 7.0
    assert budget_of(modal_env) == 100
    engine.up("b", P, inputs(50))
    engine.destroy("b")
    assert budget_of(modal_env) == 7.0


def test_refresh_takes_the_environment_from_the_id(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    """Review finding 7: the id decides the environment; a state that declares `dev` for
    main's id reads back as main (a replace at the next up), never as dev's budget."""
    modal.Environment.objects.create("dev")
    engine.up("b", P, inputs(40))
    env_id = engine.states["b"].id
    read = srv.read(P, env_id, state={**engine.states["b"].outputs, "environment": "dev"})
    assert read.outputs["environment"] == "main"


def test_existing_budget_drift_and_noop(engine: Engine, modal_env: EmulatorProcess) -> None:
    """A budget set before Pulumi is taken over by create (and restored by destroy, see
    above): no import needed. Drift behind Pulumi's back shows on refresh."""
    env_id = next(e["id"] for e in modal_env.state()["environments"] if e["name"] == "main")
    synchronizer.create_blocking(_set_budget)(env_id, 40.0)
    assert engine.up("b", P, inputs(40)) == "create"
    assert engine.states["b"].outputs["monthly_budget_usd"] == 40
    assert engine.states["b"].outputs["previous_budget_usd"] == 40
    before = modal_env.rpc_counts()
    assert engine.preview("b", P, inputs(40)) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}
    synchronizer.create_blocking(_set_budget)(env_id, 5.0)  # changed behind Pulumi's back
    assert engine.refresh("b") == "update"
    assert engine.preview("b", P, inputs(40)) == "update"
    engine.up("b", P, inputs(40))
    assert budget_of(modal_env) == 40
    modal.Environment.objects.create("dev")
    assert engine.up("b", P, inputs(40, env="dev")) == "replace"
    assert budget_of(modal_env, "dev") == 40 and budget_of(modal_env) == 40  # restored
    # Budget cleared behind Pulumi's back: gone.
    dev_id = engine.states["b"].id

    async def clear(eid: str) -> None:
        c = await _Client.from_env()
        await c._stub.EnvironmentSetBudget(
            api_pb2.EnvironmentSetBudgetRequest(environment_id=eid, clear_budget=True)
        )

    synchronizer.create_blocking(clear)(dev_id)
    assert engine.refresh("b") == "delete"


def test_check_failures(srv: ProviderServer) -> None:
    f = srv.check(P, inputs(-5, thresholds=[0, 0.5, 1.6], webhook="ftp://x")).failures
    props = sorted({p for p, _ in f})
    assert props == ["monthly_budget_usd", "thresholds", "webhook_url"]
    reasons = " ".join(r for p, r in f if p == "thresholds")
    assert "0 is outside (0, 1.5]" in reasons and "1.6 is outside (0, 1.5]" in reasons
    assert srv.check(P, inputs(10, thresholds=[0.5, 0.5])).failures
    # Review finding 27: NaN is not "negative", and infinity is no budget.
    for bad in (float("nan"), float("inf")):
        (fail,) = srv.check(P, inputs(bad)).failures
        assert fail[0] == "monthly_budget_usd" and "not a finite number" in fail[1]
    assert srv.check(P, inputs(10, thresholds=[1.5, 0.01])).failures == []
    chk = srv.check(P, inputs(0))
    assert chk.failures == [] and chk.inputs["thresholds"] == [0.5, 0.8, 1.0]
    chk = srv.check(P, inputs(5, webhook=""))  # "" = no webhook (unset secret config)
    assert chk.failures == [] and "webhook_url" not in chk.inputs
    assert (
        reveal(srv.check(P, inputs(1, webhook="https://h/x")).inputs["webhook_url"])
        == "https://h/x"
    )
