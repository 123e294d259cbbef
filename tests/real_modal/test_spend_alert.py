"""SpendAlert resource on real Modal: a tiny budget on the throwaway environment, refresh,
no-op diff, budget update, delete (the environment had no budget, so delete clears it)."""

from __future__ import annotations

from components.modal.spend_alert import SpendAlertProvider
from tests.harness.provider_server import ProviderServer
from tests.real_modal.conftest import ENV_KEY, ThrowawayEnvironment
from tests.real_modal.support import REAL_MODAL, assert_diff_none, destroying, is_gone

pytestmark = REAL_MODAL
P = SpendAlertProvider()


def inputs(env: str, budget: float) -> dict[str, object]:
    return {"environment": env, "monthly_budget_usd": budget, "thresholds": [0.5, 1.0]}


def test_spend_alert_tiny_budget_then_delete_clears_it(
    real_server: ProviderServer, throwaway_environment: ThrowawayEnvironment
) -> None:
    env = throwaway_environment.name
    env_id = throwaway_environment.engine.states[ENV_KEY].id
    with destroying(real_server) as engine:
        assert engine.up("alert", P, inputs(env, 1.0)) == "create"
        st = engine.states["alert"]
        assert st.id == env_id  # the alert is keyed on its environment
        assert st.outputs.get("previous_budget_usd") is None  # a new environment has none
        assert 0 < st.outputs["effective_limit_usd"] <= 1.0  # our budget is in force
        assert st.outputs["current_usage_usd"] >= 0
        assert st.outputs["thresholds_crossed"] == []  # nothing here spends $0.50
        assert engine.refresh("alert") == "same"
        assert_diff_none(engine, "alert", P, inputs(env, 1.0))

        assert engine.up("alert", P, inputs(env, 2.0)) == "update"
        st = engine.states["alert"]
        assert st.outputs["monthly_budget_usd"] == 2.0
        assert 1.0 < st.outputs["effective_limit_usd"] <= 2.0
        assert engine.refresh("alert") == "same"
        assert_diff_none(engine, "alert", P, inputs(env, 2.0))

        last = (st.outputs, st.inputs)
        engine.destroy("alert")
        # Read of a cleared budget finds no alert: delete cleared what create set.
        assert is_gone(real_server, P, env_id, *last)
