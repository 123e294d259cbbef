"""Volume provider, driven through the engine protocol against the emulator."""

from __future__ import annotations

import modal
import pytest

from components.modal.volume import VolumeProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, lifecycle
from tests.providers.helpers import rpc_delta

P = VolumeProvider()


def inputs(name: str = "hf-cache", env: str = "main") -> dict[str, object]:
    return {"name": name, "environment": env}


def live_volumes(emu: EmulatorProcess) -> dict[str, str]:
    return {v["id"]: v["name"] for v in emu.state()["volumes"]}


def test_lifecycle_rename_is_an_update_that_keeps_id_and_data(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    steps = lifecycle(engine, "v", P, inputs(), inputs(name="hf-cache-2"), destroy=False)
    assert steps == ["create", "same", "same", "update"]
    vid = engine.states["v"].id
    assert vid.startswith("vo-")
    assert engine.states["v"].outputs["volume_id"] == vid
    assert live_volumes(modal_env) == {vid: "hf-cache-2"}
    # The same volume object (same id) answers under the new name.
    assert modal.Volume.from_name("hf-cache-2", environment_name="main").hydrate().object_id == vid
    engine.destroy("v")
    assert live_volumes(modal_env) == {}


def test_environment_change_replaces(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    modal.Environment.objects.create("dev")
    engine.up("v", P, inputs())
    old = engine.states["v"].id
    assert engine.preview("v", P, inputs(env="dev")) == "replace"
    before = modal_env.rpc_counts()
    assert engine.up("v", P, inputs(env="dev")) == "replace"
    assert engine.states["v"].id != old
    assert [r.method for r in srv.records if r.method in ("Create", "Delete")][-2:] == [
        "Create",
        "Delete",
    ]
    assert rpc_delta(before, modal_env.rpc_counts()).get("VolumeDelete") == 1
    assert list(live_volumes(modal_env).values()) == ["hf-cache"]


def test_adopt_noop_and_drift(engine: Engine, modal_env: EmulatorProcess) -> None:
    """Issue 9.3: an existing volume is taken over (with its data) by `adopt=True`, not by
    `import_` (which the real engine cannot do for dynamic resources); destroy leaves it."""
    modal.Volume.objects.create("weights", environment_name="main")
    vid = modal.Volume.from_name("weights", environment_name="main").hydrate().object_id
    adopt = {**inputs(name="weights"), "adopt": True}
    assert engine.up("v", P, adopt) == "create"
    assert engine.states["v"].id == vid and engine.states["v"].outputs["adopted"] is True
    before = modal_env.rpc_counts()
    assert engine.preview("v", P, adopt) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}
    # Renamed behind Pulumi's back: refresh sees it, up renames it back (same id).
    modal.Volume.rename("weights", "weights-x", environment_name="main")
    assert engine.refresh("v") == "update"
    assert engine.states["v"].outputs["name"] == "weights-x"
    assert engine.up("v", P, adopt) == "update"
    assert live_volumes(modal_env) == {vid: "weights"}
    engine.destroy("v")
    assert live_volumes(modal_env) == {vid: "weights"}  # adopted: released, not deleted
    # Deleted behind Pulumi's back: refresh drops it.
    assert engine.up("v", P, adopt) == "create"
    modal.Volume.objects.delete("weights", environment_name="main")
    assert engine.refresh("v") == "delete"


def test_already_exists_and_check_failures(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    modal.Volume.objects.create("hf-cache", environment_name="main")
    with pytest.raises(ProviderCallError) as ei:
        engine.up("v", P, inputs())
    assert "Volume 'hf-cache' in environment 'main': create failed" in ei.value.details
    assert "adopt=True" in ei.value.details and "import" not in ei.value.details
    failures = srv.check(P, {"name": "a/b", "environment": ""}).failures
    assert sorted(p for p, _ in failures) == ["environment", "name"]


def test_read_under_the_wrong_environment_is_refused(
    srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    """Review finding 6: the volume lives in `main`; managing it as a `dev` volume would let
    the next replace delete it, so a read that declares `dev` fails."""
    modal.Environment.objects.create("dev")
    modal.Volume.objects.create("weights", environment_name="main")
    vid = modal.Volume.from_name("weights", environment_name="main").hydrate().object_id
    with pytest.raises(ProviderCallError) as ei:
        srv.read(P, vid, state=inputs(name="weights", env="dev"))
    msg = ei.value.details
    assert f"Volume {vid} ('weights')" in msg and "not the volume of that name" in msg
    assert "'dev'" in msg
    # Same name in dev, another volume: still refused, naming the one that is there.
    modal.Volume.objects.create("weights", environment_name="dev")
    with pytest.raises(ProviderCallError, match="that is vo-"):
        srv.read(P, vid, state=inputs(name="weights", env="dev"))
    assert srv.read(P, vid, state=inputs(name="weights")).id == vid
