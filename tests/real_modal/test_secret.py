"""Secret resource on real Modal: create, refresh, no-op diff, update in place, delete."""

from __future__ import annotations

import secrets

from components.modal.secret import SecretProvider
from tests.harness.provider_server import ProviderServer, Secret, scan_for_leaks
from tests.real_modal.conftest import ThrowawayEnvironment
from tests.real_modal.support import REAL_MODAL, assert_diff_none, destroying, is_gone

pytestmark = REAL_MODAL
P = SecretProvider()


def inputs(env: str, **values: str) -> dict[str, object]:
    return {"name": "iac-test-secret", "environment": env, "values": Secret(values)}


def test_secret_create_refresh_update_delete(
    real_server: ProviderServer, throwaway_environment: ThrowawayEnvironment
) -> None:
    env = throwaway_environment.name
    v1, v2, v3 = (f"val-{secrets.token_hex(12)}" for _ in range(3))
    with destroying(real_server) as engine:
        assert engine.up("secret", P, inputs(env, A=v1, B=v2)) == "create"
        st = engine.states["secret"]
        secret_id = st.id
        assert secret_id.startswith("st-") and st.outputs["secret_id"] == secret_id
        assert st.outputs["key_names"] == ["A", "B"]
        assert isinstance(st.outputs["values"], Secret)
        assert engine.refresh("secret") == "same"  # Modal holds exactly the declared keys
        assert_diff_none(engine, "secret", P, inputs(env, A=v1, B=v2))

        assert engine.preview("secret", P, inputs(env, A=v3, C=v1)) == "update"
        assert engine.up("secret", P, inputs(env, A=v3, C=v1)) == "update"
        st = engine.states["secret"]
        assert st.id == secret_id  # updated in place, not replaced
        assert st.outputs["key_names"] == ["A", "C"]
        assert engine.refresh("secret") == "same"  # B was unset on Modal
        assert_diff_none(engine, "secret", P, inputs(env, A=v3, C=v1))

        last = (st.outputs, st.inputs)
        engine.destroy("secret")
        assert is_gone(real_server, P, secret_id, *last)
        leaks = scan_for_leaks(real_server.leak_surfaces(engine), [v1, v2, v3])
        assert leaks == []
