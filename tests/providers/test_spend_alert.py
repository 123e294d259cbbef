"""SpendAlert provider: Modal's environment budget plus our thresholds (reported, not posted)."""

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
    lifecycle,
)
from tests.providers.helpers import Webhook, mutating_calls, rpc_delta

P = SpendAlertProvider()


def inputs(budget: float = 100.0, env: str = "main", **kw: object) -> dict[str, object]:
    return {"environment": env, "monthly_budget_usd": budget, **kw}


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


def test_crossed_thresholds_are_reported_and_an_up_never_posts_or_mutates(
    engine: Engine, emulator: EmulatorProcess, webhook: Webhook, srv: ProviderServer
) -> None:
    """Issue 14 item 7: delivery is the spend watcher's (tests/providers/test_spend_watch.py);
    the provider only reports, so an `up` with unchanged inputs is a no-op whatever the usage,
    even for a state written by the version that posted (webhook_url, a pending threshold)."""
    engine.up("b", P, inputs(100, thresholds=[0.5, 1.0]))
    emulator.set_usage("main", 120)
    assert engine.refresh("b") == "update"
    out = engine.states["b"].outputs
    assert out["current_usage_usd"] == 120 and out["limit_reached"] is True
    assert out["thresholds_crossed"] == [0.5, 1.0]
    assert "thresholds_alerted" not in out and "webhook_url" not in out
    before = emulator.rpc_counts()
    assert engine.up("b", P, inputs(100, thresholds=[0.5, 1.0])) == "same"
    assert mutating_calls(before, emulator.rpc_counts()) == {}
    # A state from the posting version: the old webhook and an unsent threshold change nothing.
    old = {**out, "webhook_url": webhook.url, "thresholds_alerted": [0.5]}
    diff = srv.diff(P, engine.states["b"].id, old, inputs(100, thresholds=[0.5, 1.0]))
    assert diff.changes == "none"
    assert webhook.bodies == []


def test_zero_budget_crosses_nothing_until_there_is_usage(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """Review finding 8: 0 >= t * 0 held for every threshold at zero usage."""
    engine.up("b", P, inputs(0))
    assert engine.states["b"].outputs["thresholds_crossed"] == []
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
    f = srv.check(P, inputs(-5, thresholds=[0, 0.5, 1.6])).failures
    props = sorted({p for p, _ in f})
    assert props == ["monthly_budget_usd", "thresholds"]
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
