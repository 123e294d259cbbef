"""Environment provider, driven through the engine protocol against the emulator."""

from __future__ import annotations

import subprocess

import modal
import pytest

from components.modal.environment import EnvironmentProvider
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import (
    UNKNOWN,
    Engine,
    ProviderCallError,
    ProviderServer,
    lifecycle,
)
from tests.providers.helpers import rpc_delta

P = EnvironmentProvider()


def inputs(name: str = "dev", **kw: object) -> dict[str, object]:
    return {"name": name, **kw}


def envs(emu: EmulatorProcess) -> dict[str, str]:
    return {e["name"]: e["webhook_suffix"] for e in emu.state()["environments"]}


def test_lifecycle_web_suffix_updates_in_place(engine: Engine, emulator: EmulatorProcess) -> None:
    steps = lifecycle(
        engine, "e", P, inputs(web_suffix="dev1"), inputs(web_suffix="dev2"), destroy=False
    )
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["e"]
    assert st.id.startswith("en-") and st.outputs["environment_id"] == st.id
    assert st.outputs["web_suffix"] == "dev2"
    assert envs(emulator)["dev"] == "dev2"
    engine.destroy("e")
    assert "dev" not in envs(emulator)


def test_unmanaged_suffix_reports_modals_value_and_rename_replaces(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    engine.up("e", P, inputs())
    assert engine.states["e"].outputs["web_suffix"] == envs(emulator)["dev"]
    assert engine.preview("e", P, inputs()) == "same"
    assert engine.up("e", P, inputs("staging")) == "replace"
    assert "dev" not in envs(emulator) and "staging" in envs(emulator)


def test_adopt_flag(engine: Engine, modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("shared")
    with pytest.raises(ProviderCallError) as ei:
        engine.up("e", P, inputs("shared"))
    assert "Environment 'shared': create failed" in ei.value.details
    assert "adopt=True" in ei.value.details
    # Issue 34 finding 3: the access stack's way to adopt is named too (it named only the
    # service stack's `modal-llm:adoptEnvironment`, a key the access stack does not have).
    assert "`modal-llm:adoptEnvironment: true`" in ei.value.details
    assert "the access stack: `adopt: true` in its `environments` entry 'shared'" in (
        " ".join(ei.value.details.split())
    )
    assert engine.up("e", P, inputs("shared", adopt=True)) == "create"
    assert engine.states["e"].outputs["adopted"] is True
    engine.destroy("e")
    assert "shared" in envs(modal_env)  # released, not deleted: Pulumi did not create it


def test_adopt_and_drift(engine: Engine, modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("prod")
    suffix = envs(modal_env)["prod"]
    engine.up("e", P, inputs("prod", web_suffix=suffix, adopt=True))
    before = modal_env.rpc_counts()
    assert engine.preview("e", P, inputs("prod", web_suffix=suffix, adopt=True)) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}
    modal.environments.update_environment("prod", new_web_suffix="drifted")
    assert engine.refresh("e") == "update"
    assert engine.preview("e", P, inputs("prod", web_suffix=suffix, adopt=True)) == "update"
    engine.up("e", P, inputs("prod", web_suffix=suffix, adopt=True))
    assert envs(modal_env)["prod"] == suffix
    modal.environments.delete_environment("prod")
    assert engine.refresh("e") == "delete"


def test_delete_refuses_while_apps_are_deployed(engine: Engine, emulator: EmulatorProcess) -> None:
    engine.up("e", P, inputs())
    subprocess.run(
        [
            str(PROJECT_ROOT / ".venv/bin/modal"),
            "deploy",
            "tests/providers/apps/echo_app.py",
            "--name",
            "echo",
            "-e",
            "dev",
        ],
        env=emulator.subprocess_env(),
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )
    with pytest.raises(ProviderCallError) as ei:
        engine.destroy("e")
    msg = ei.value.details
    assert "Environment 'dev'" in msg and "delete refused" in msg and "echo" in msg
    assert "force_delete=True" in msg
    assert "dev" in envs(emulator)
    assert "e" in engine.states  # a failed delete keeps the resource
    assert engine.up("e", P, inputs(force_delete=True)) == "update"
    engine.destroy("e")
    assert "dev" not in envs(emulator)


def test_check_failures(srv: ProviderServer) -> None:
    f = srv.check(P, {"name": "en-reserved", "web_suffix": "Bad_Suffix", "adopt": "yes"}).failures
    assert sorted(p for p, _ in f) == ["adopt", "name", "web_suffix"]
    assert srv.check(P, inputs("has.period")).failures
    assert srv.check(P, inputs(web_suffix="ok-1")).failures == []


def test_suffix_conflict_on_create_leaves_no_environment_behind(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Review finding 3: EnvironmentCreate succeeded, the suffix update failed: the new
    environment is deleted again, so fixing the suffix and rerunning works."""
    modal.Environment.objects.create("other")
    modal.environments.update_environment("other", new_web_suffix="taken")
    with pytest.raises(ProviderCallError) as ei:
        engine.up("e", P, inputs(web_suffix="taken"))
    assert "Environment 'dev': create failed" in ei.value.details
    assert "dev" not in envs(modal_env)
    assert engine.up("e", P, inputs(web_suffix="free")) == "create"
    assert envs(modal_env)["dev"] == "free"


def test_adopted_env_survives_a_suffix_conflict(engine: Engine, modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("shared")
    modal.Environment.objects.create("other")
    modal.environments.update_environment("other", new_web_suffix="taken")
    with pytest.raises(ProviderCallError):
        engine.up("e", P, inputs("shared", web_suffix="taken", adopt=True))
    assert "shared" in envs(modal_env)  # never delete what Pulumi only adopted


def test_unknown_flags_report_a_change(srv: ProviderServer, engine: Engine) -> None:
    """Review finding 30: an unknown adopt/force_delete (preview) must not read as unchanged."""
    engine.up("e", P, inputs(adopt=True, force_delete=True))  # True: bool(<unknown>) is True
    st = engine.states["e"]
    for flag in ("adopt", "force_delete"):
        news = {**inputs(adopt=True, force_delete=True), flag: UNKNOWN}
        d = srv.diff(P, st.id, st.outputs, news)
        assert d.changes == "some" and d.replaces == []
