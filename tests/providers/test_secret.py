"""Secret provider, driven through the engine protocol against the emulator."""

from __future__ import annotations

import modal
import pytest
from modal._utils.async_utils import synchronizer

from components.modal.secret import SecretProvider, values_digest
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    UNKNOWN,
    Engine,
    ProviderCallError,
    ProviderServer,
    Secret,
    lifecycle,
    reveal,
)
from tests.providers.helpers import mutating_calls, rpc_delta

P = SecretProvider()


def inputs(name: str = "api-keys", env: str = "main", **values: str) -> dict[str, object]:
    return {"name": name, "environment": env, "values": Secret(values or {"A": "a1", "B": "b1"})}


def live_keys(name: str, env: str = "main") -> list[str]:
    """Key names Modal holds for the secret, read with the real SDK."""
    s = modal.Secret.from_name(name, environment_name=env)
    s.hydrate()
    return sorted(synchronizer._translate_in(s)._keys)


def test_lifecycle_create_refresh_noop_update_delete(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    steps = lifecycle(engine, "s", P, inputs(), inputs(A="a2", C="c1"), destroy=False)
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["s"]
    assert st.id.startswith("st-")
    assert st.outputs["secret_id"] == st.id
    assert st.outputs["key_names"] == ["A", "C"]
    assert isinstance(st.outputs["values_salt"], Secret)  # issue 14.5: the salt is secret
    salt = reveal(st.outputs["values_salt"])
    assert len(salt) == 32
    assert st.outputs["values_digest"] == values_digest({"A": "a2", "C": "c1"}, salt)
    assert isinstance(st.outputs["values"], Secret)  # stored encrypted
    engine.destroy("s")
    assert emulator.state()["secrets"] == []


def test_update_holds_exactly_the_new_keys_and_keeps_the_id(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    engine.up("s", P, inputs(A="1", B="2", C="3"))
    first_id = engine.states["s"].id
    assert live_keys("api-keys") == ["A", "B", "C"]
    assert engine.up("s", P, inputs(B="22")) == "update"
    assert engine.states["s"].id == first_id
    assert live_keys("api-keys") == ["B"]


def test_rename_and_environment_change_replace_create_before_delete(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    modal.Environment.objects.create("dev")
    engine.up("s", P, inputs())
    old_id = engine.states["s"].id
    assert engine.preview("s", P, inputs(name="api-keys-2")) == "replace"
    assert engine.up("s", P, inputs(name="api-keys-2")) == "replace"
    assert "replace s ['name']" in engine.log
    new_id = engine.states["s"].id
    assert new_id != old_id
    creates = [r for r in srv.records if r.method in ("Create", "Delete")][-2:]
    assert [r.method for r in creates] == ["Create", "Delete"]  # create-before-delete
    assert engine.up("s", P, inputs(name="api-keys-2", env="dev")) == "replace"
    names = {(s["name"], s["env_id"]) for s in modal_env.state()["secrets"]}
    assert len(names) == 1
    assert live_keys("api-keys-2", "dev") == ["A", "B"]


def test_diff_reports_unknown_values_as_a_change(srv: ProviderServer, engine: Engine) -> None:
    engine.up("s", P, inputs())
    st = engine.states["s"]
    d = srv.diff(P, st.id, st.outputs, {**inputs(), "values": UNKNOWN})
    assert d.changes == "some" and d.replaces == []
    d = srv.diff(P, st.id, st.outputs, {**inputs(), "name": UNKNOWN})
    assert d.changes == "some" and d.replaces == ["name"]


def test_noop_diff_makes_no_modal_call(
    srv: ProviderServer, engine: Engine, emulator: EmulatorProcess
) -> None:
    engine.up("s", P, inputs())
    before = emulator.rpc_counts()
    for _ in range(5):
        assert engine.preview("s", P, inputs()) == "same"
    after = emulator.rpc_counts()
    assert mutating_calls(before, after) == {}
    assert rpc_delta(before, after) == {}  # check+diff never talk to Modal


def test_adopt_claims_an_existing_secret_and_destroy_leaves_it(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    """Issue 9.3: `import_` cannot work under the real engine (Read gets the id only), so an
    existing secret is taken over with `adopt=True`: claimed by id (exactly the declared
    values), recorded as adopted, left in place by destroy."""
    modal.Secret.objects.create("adopted", {"OLD": "o", "A": "x"}, environment_name="main")
    sid = modal.Secret.from_name("adopted", environment_name="main").hydrate().object_id
    assert engine.up("s", P, {**inputs(name="adopted"), "adopt": True}) == "create"
    st = engine.states["s"]
    assert st.id == sid and st.outputs["adopted"] is True
    assert live_keys("adopted") == ["A", "B"]
    assert engine.preview("s", P, {**inputs(name="adopted"), "adopt": True}) == "same"
    assert engine.refresh("s") == "same"
    engine.destroy("s")
    assert live_keys("adopted") == ["A", "B"]  # released, not deleted
    # adopt=True where nothing exists: an ordinary create, deleted by destroy.
    assert engine.up("n", P, {**inputs(name="fresh"), "adopt": True}) == "create"
    assert engine.states["n"].outputs["adopted"] is False
    engine.destroy("n")
    assert [x["name"] for x in modal_env.state()["secrets"]] == ["adopted"]


def test_drift_deleted_behind_pulumis_back(engine: Engine, modal_env: EmulatorProcess) -> None:
    engine.up("s", P, inputs())
    modal.Secret.objects.delete("api-keys", environment_name="main")
    assert engine.refresh("s") == "delete"
    assert "s" not in engine.states
    assert engine.up("s", P, inputs()) == "create"
    assert live_keys("api-keys") == ["A", "B"]


def test_drift_keys_changed_behind_pulumis_back(engine: Engine, modal_env: EmulatorProcess) -> None:
    engine.up("s", P, inputs())
    s = modal.Secret.from_name("api-keys", environment_name="main")
    s.update({"INJECTED": "x"})
    assert engine.refresh("s") == "update"
    assert engine.states["s"].outputs["key_names"] == ["A", "B", "INJECTED"]
    assert engine.preview("s", P, inputs()) == "update"
    assert engine.up("s", P, inputs()) == "update"
    assert live_keys("api-keys") == ["A", "B"]
    assert engine.refresh("s") == "same"


def test_already_exists_names_the_secret_and_what_to_do(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    modal.Secret.objects.create("api-keys", {"OTHER": "1"}, environment_name="main")
    with pytest.raises(ProviderCallError) as ei:
        engine.up("s", P, inputs())
    msg = ei.value.details
    assert "Secret 'api-keys' in environment 'main': create failed" in msg
    assert "AlreadyExistsError" in msg
    # Import cannot work for dynamic resources under the real engine: adopt is what works.
    assert "adopt=True" in msg and "import" not in msg
    assert live_keys("api-keys") == ["OTHER"]  # untouched


def test_check_rejects_bad_inputs_before_touching_anything(
    srv: ProviderServer, emulator: EmulatorProcess
) -> None:
    before = emulator.rpc_counts()
    bad = srv.check(P, {"name": "no spaces!", "environment": "en-x", "values": Secret({"1A": "v"})})
    props = sorted(p for p, _ in bad.failures)
    assert props == ["environment", "name", "values"]
    assert srv.check(P, {"name": "ok", "environment": "main", "values": "notamap"}).failures
    assert srv.check(P, {"name": "ap-" + "a" * 22, "environment": "main", "values": {}}).failures
    assert rpc_delta(before, emulator.rpc_counts()) == {}
    ok = srv.check(P, inputs())
    assert ok.failures == []
    assert reveal(ok.inputs["values"]) == {"A": "a1", "B": "b1"}
    assert isinstance(ok.inputs["values"], Secret)


def test_concurrent_calls_share_the_client_safely(
    srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    """The engine runs up to 4 RPCs at once against one provider process."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda i: srv.create(P, inputs(f"s{i}", K=f"v{i}")), range(12)))
    assert len({c.id for c in created}) == 12
    assert sorted(s["name"] for s in modal_env.state()["secrets"]) == sorted(
        f"s{i}" for i in range(12)
    )
    assert live_keys("s7") == ["K"]


def test_update_after_deleted_outside_fails_and_recreates_nothing(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Review finding 2: the update writes by id, so a deleted secret is not silently
    recreated (an orphan the engine does not know) and refresh + up recovers."""
    engine.up("s", P, inputs())
    modal.Secret.objects.delete("api-keys", environment_name="main")
    with pytest.raises(ProviderCallError) as ei:
        engine.up("s", P, inputs(A="a2"))
    msg = ei.value.details
    assert "NotFoundError" in msg and "pulumi refresh" in msg and "nothing was written" in msg
    assert modal_env.state()["secrets"] == []  # no orphan
    assert engine.refresh("s") == "delete"
    assert engine.up("s", P, inputs(A="a2")) == "create"
    assert live_keys("api-keys") == ["A"]


def test_values_digest_is_salted_per_resource(engine: Engine, emulator: EmulatorProcess) -> None:
    """Review finding 24: a plain sha256 of low-entropy values could be confirmed offline."""
    engine.up("s1", P, inputs("one", A="1"))
    engine.up("s2", P, inputs("two", A="1"))
    d1, d2 = (engine.states[n].outputs["values_digest"] for n in ("s1", "s2"))
    assert d1 != d2 and values_digest({"A": "1"}) not in (d1, d2)
    assert engine.preview("s1", P, inputs("one", A="1")) == "same"
    assert engine.preview("s1", P, inputs("one", A="2")) == "update"
