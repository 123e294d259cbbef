"""Volume resource on real Modal: create, refresh, no-op diff, rename in place, delete."""

from __future__ import annotations

from components.modal.volume import VolumeProvider
from tests.harness.provider_server import ProviderServer
from tests.real_modal.conftest import ThrowawayEnvironment
from tests.real_modal.support import REAL_MODAL, assert_diff_none, destroying, is_gone

pytestmark = REAL_MODAL
P = VolumeProvider()


def inputs(env: str, name: str = "iac-test-volume") -> dict[str, object]:
    return {"name": name, "environment": env}


def test_volume_create_refresh_rename_delete(
    real_server: ProviderServer, throwaway_environment: ThrowawayEnvironment
) -> None:
    env = throwaway_environment.name
    with destroying(real_server) as engine:
        assert engine.up("volume", P, inputs(env)) == "create"
        st = engine.states["volume"]
        volume_id = st.id
        assert volume_id.startswith("vo-") and st.outputs["volume_id"] == volume_id
        assert engine.refresh("volume") == "same"
        assert_diff_none(engine, "volume", P, inputs(env))

        renamed = inputs(env, "iac-test-volume-2")
        assert engine.preview("volume", P, renamed) == "update"  # a rename keeps the data
        assert engine.up("volume", P, renamed) == "update"
        st = engine.states["volume"]
        assert st.id == volume_id and st.outputs["name"] == "iac-test-volume-2"
        assert engine.refresh("volume") == "same"  # the new name answers this id on Modal
        assert_diff_none(engine, "volume", P, renamed)

        last = (st.outputs, st.inputs)
        engine.destroy("volume")
        assert is_gone(real_server, P, volume_id, *last)
