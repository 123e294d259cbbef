"""ProxyAuthToken resource on real Modal: create, allowlist revoke/allow, rotate, delete.

The token is workspace-wide (not inside the throwaway environment), so its name carries the
environment's random suffix and the cleanup deletes it explicitly.
"""

from __future__ import annotations

from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from tests.harness.provider_server import ProviderServer, Secret, reveal, scan_for_leaks
from tests.real_modal.conftest import ThrowawayEnvironment
from tests.real_modal.support import REAL_MODAL, assert_diff_none, destroying, is_gone

pytestmark = REAL_MODAL
P = ProxyAuthTokenProvider()
SECRET_OUT = ("token_secret",)  # the resource's additional_secret_outputs


def inputs(name: str, envs: list[str], rotation: str = "") -> dict[str, object]:
    return {"name": name, "environments": envs, "rotation": rotation}


def test_proxy_token_create_allowlist_rotate_delete(
    real_server: ProviderServer, throwaway_environment: ThrowawayEnvironment
) -> None:
    env = throwaway_environment.name
    name = f"{env}-token"
    with destroying(real_server) as engine:
        assert engine.up("token", P, inputs(name, [env]), secret_outputs=SECRET_OUT) == "create"
        st = engine.states["token"]
        first_id = st.id
        assert first_id.startswith("wk-") and st.outputs["token_id"] == first_id
        assert isinstance(st.outputs["token_secret"], Secret)
        first_secret = reveal(st.outputs["token_secret"])
        assert first_secret.startswith("ws-")
        assert st.outputs["allowed_environments"] == [env]
        assert engine.refresh("token") == "same"
        assert_diff_none(engine, "token", P, inputs(name, [env]))

        # Allowlist: revoke the environment, then allow it again (both in place).
        assert engine.up("token", P, inputs(name, []), secret_outputs=SECRET_OUT) == "update"
        assert engine.states["token"].outputs["allowed_environments"] == []
        assert engine.refresh("token") == "same"
        assert engine.up("token", P, inputs(name, [env]), secret_outputs=SECRET_OUT) == "update"
        assert engine.states["token"].outputs["allowed_environments"] == [env]
        assert engine.refresh("token") == "same"
        assert engine.states["token"].id == first_id

        # Rotation: a new token (create-before-delete), the old one gone from Modal.
        old = engine.states["token"]
        rotated = inputs(name, [env], rotation="r1")
        assert engine.up("token", P, rotated, secret_outputs=SECRET_OUT) == "replace"
        st = engine.states["token"]
        assert st.id != first_id
        second_secret = reveal(st.outputs["token_secret"])
        assert second_secret.startswith("ws-") and second_secret != first_secret
        assert st.outputs["allowed_environments"] == [env]
        assert is_gone(real_server, P, first_id, old.outputs, old.inputs)
        assert engine.refresh("token") == "same"
        assert_diff_none(engine, "token", P, rotated)

        last = (st.id, st.outputs, st.inputs)
        engine.destroy("token")
        assert is_gone(real_server, P, *last)
        leaks = scan_for_leaks(real_server.leak_surfaces(engine), [first_secret, second_secret])
        assert leaks == []
