"""App provider: real `modal` deploys (in a subprocess) of a small test app on the emulator."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import modal
import pytest

from components.modal._source import shipped_files, source_digest
from components.modal.app import AppProvider
from serving.spec import ServingSpec
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, lifecycle
from tests.providers.helpers import mutating_calls, rpc_delta

P = AppProvider()
APP_FILE = "tests/providers/apps/echo_app.py"


def spec(model: str = "qwen", **kw: object) -> str:
    return ServingSpec.model_validate(
        {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": model, **kw}
    ).to_json()


def inputs(
    name: str = "echo", env: str = "main", app_file: str = APP_FILE, **kw: object
) -> dict[str, object]:
    return {"name": name, "environment": env, "app_file": app_file, "spec_json": spec(), **kw}


def apps(emu: EmulatorProcess) -> dict[str, str]:
    """app id → state name, from the emulator's state dump."""
    return {a["id"]: str(a.get("state")) for a in emu.state()["apps"]}


def modal_cli(emu: EmulatorProcess, *args: str) -> None:
    subprocess.run(
        [str(PROJECT_ROOT / ".venv/bin/modal"), *args],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )


def test_shipped_files_cover_the_app_and_its_local_packages() -> None:
    rel = sorted(str(p.relative_to(PROJECT_ROOT)) for p in shipped_files(APP_FILE, PROJECT_ROOT))
    assert rel == [
        "tests/providers/apps/echo_app.py",
        "tests/providers/apps/echo_helpers/__init__.py",
    ]


def test_lifecycle_spec_change_redeploys_in_place(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    new = {**inputs(), "spec_json": spec("qwen-2")}
    steps = lifecycle(engine, "a", P, inputs(), new, destroy=False)
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["a"]
    assert st.id.startswith("ap-") and st.outputs["app_id"] == st.id
    assert st.outputs["web_url"] == emulator.edge_url("emu-workspace--echo-echo")
    assert st.outputs["version"] == 2
    assert st.outputs["spec_digest"] == ServingSpec.model_validate_json(spec("qwen-2")).digest()
    assert st.outputs["source_digest"] == source_digest(APP_FILE, PROJECT_ROOT)
    assert apps(emulator) == {st.id: "deployed"}
    engine.destroy("a")
    assert apps(emulator) == {st.id: "stopped"}


def test_noop_makes_no_deploy(engine: Engine, emulator: EmulatorProcess) -> None:
    engine.up("a", P, inputs())
    before = emulator.rpc_counts()
    for _ in range(3):
        assert engine.preview("a", P, inputs()) == "same"
    after = emulator.rpc_counts()
    assert mutating_calls(before, after) == {}
    assert rpc_delta(before, after) == {}


def test_source_change_redeploys_and_unshipped_files_do_not(
    engine: Engine, tmp_path: Path, emulator: EmulatorProcess
) -> None:
    shutil.copytree(PROJECT_ROOT / "tests/providers/apps", tmp_path / "apps")
    app_file = str(tmp_path / "apps/echo_app.py")
    engine.up("a", P, inputs(app_file=app_file))
    (tmp_path / "apps/NOTES.txt").write_text("not shipped")
    assert engine.preview("a", P, inputs(app_file=app_file)) == "same"
    helper = tmp_path / "apps/echo_helpers/__init__.py"
    helper.write_text(helper.read_text().replace("hello from", "hi from"))
    assert engine.preview("a", P, inputs(app_file=app_file)) == "update"
    assert engine.up("a", P, inputs(app_file=app_file)) == "update"
    assert engine.states["a"].outputs["version"] == 2
    assert (
        engine.preview("a", P, inputs(app_file=app_file, extra_env={"ECHO_EXTRA": "1"})) == "update"
    )


def test_name_change_replaces_and_stops_the_old_app(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    engine.up("a", P, inputs())
    old = engine.states["a"].id
    assert engine.preview("a", P, inputs(name="echo-2")) == "replace"
    assert engine.up("a", P, inputs(name="echo-2")) == "replace"
    new = engine.states["a"]
    assert new.id != old
    assert new.outputs["web_url"] == emulator.edge_url("emu-workspace--echo-2-echo")
    assert engine.refresh("a") == "same"
    assert apps(emulator) == {old: "stopped", new.id: "deployed"}


def test_drift_stopped_app_reads_as_drift_then_redeploys(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """Issue 32 item 12: a stopped app stays the resource, read with nothing live and the
    reason; the next up deploys it again under the name (an update)."""
    engine.up("a", P, inputs())
    old_id = engine.states["a"].id
    modal_cli(emulator, "app", "stop", "echo", "-y")
    assert engine.refresh("a") == "update"
    drift = engine.states["a"].outputs["drift"]
    assert drift.startswith(f"live app stopped by hand: {old_id} is stopped"), drift
    assert engine.up("a", P, inputs()) == "update"
    out = engine.states["a"].outputs
    assert out["app_id"] != old_id and apps(emulator)[out["app_id"]] == "deployed"
    assert engine.refresh("a") == "same"


def test_adopt_an_app_deployed_outside_pulumi(engine: Engine, emulator: EmulatorProcess) -> None:
    """Issue 9.3 / 11.5: create never deploys over an existing app unless adopted; adopted,
    it deploys over it, records it, and destroy leaves it deployed."""
    modal_cli(emulator, "deploy", APP_FILE, "--name", "echo")
    app_id = next(iter(apps(emulator)))
    with pytest.raises(ProviderCallError) as ei:
        engine.up("a", P, inputs())
    msg = ei.value.details
    assert "App 'echo' in environment 'main': create refused" in msg and app_id in msg
    assert "adopt=True" in msg and "import" not in msg
    assert rpc_delta({}, emulator.rpc_counts()).get("AppPublish") == 1  # only the CLI's
    assert engine.up("a", P, {**inputs(), "adopt": True}) == "create"
    st = engine.states["a"]
    assert st.id == app_id and st.outputs["adopted"] is True and st.outputs["version"] == 2
    assert st.outputs["web_url"]  # the live URL (its form is the emulator's business)
    assert engine.preview("a", P, {**inputs(), "adopt": True}) == "same"
    before = emulator.rpc_counts()
    assert engine.up("a", P, inputs()) == "update"  # the flag alone: no redeploy
    assert rpc_delta(before, emulator.rpc_counts()).get("AppPublish") is None
    assert engine.states["a"].outputs["version"] == 2
    assert engine.states["a"].outputs["adopted"] is True  # recorded at create, kept
    engine.destroy("a")
    assert apps(emulator) == {app_id: "deployed"}  # adopted: left in place


def test_read_back_failure_after_a_deploy_does_not_fail_the_create(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """Issue 11.5: Modal completed the deploy; the URL/version read-back keeps failing. The
    create succeeds (the app is in state, so destroy can stop it), the outputs say what
    failed, and a refresh fills the values in."""
    emulator._request(
        "POST",
        "/_emulator/faults",
        {"method": "AppDeploymentHistory", "when": "before", "status": "INTERNAL", "count": 1000},
    )
    assert engine.up("a", P, inputs()) == "create"
    st = engine.states["a"]
    assert apps(emulator) == {st.id: "deployed"}
    assert "could not be read back" in st.outputs["read_back_error"]
    assert st.outputs["version"] == 0
    emulator._request("POST", "/_emulator/faults", {"clear": True})
    assert engine.refresh("a") == "update"
    assert engine.states["a"].outputs["version"] == 1
    assert engine.states["a"].outputs["read_back_error"] == ""
    engine.destroy("a")
    assert apps(emulator) == {st.id: "stopped"}


def test_check_failures(srv: ProviderServer) -> None:
    # The spec is opaque to the App (LLMService validates it): only its shape and digest.
    f = srv.check(P, {**inputs(), "spec_digest": "0" * 64}).failures
    assert [p for p, _ in f] == ["spec_digest"]
    f = srv.check(
        P, {**inputs(name="bad name", app_file="nope.py"), "extra_env": {"1X": "v"}}
    ).failures
    assert sorted({p for p, _ in f}) == ["app_file", "extra_env", "name"]
    assert srv.check(P, {**inputs(), "spec_json": "{not json"}).failures
    assert srv.check(P, {**inputs(), "spec_json": "[1]"}).failures
    ok = srv.check(P, inputs())
    assert ok.failures == []
    assert ok.inputs["spec_digest"] == ServingSpec.model_validate_json(spec()).digest()


def test_broken_app_fails_with_a_clear_error(engine: Engine, tmp_path: Path) -> None:
    broken = tmp_path / "broken_app.py"
    broken.write_text(
        "import modal\napp = modal.App('broken')\nraise RuntimeError('boom at import')\n"
    )
    with pytest.raises(ProviderCallError) as ei:
        engine.up("a", P, inputs(app_file=str(broken)))
    msg = ei.value.details
    assert "App 'echo' in environment 'main': create (deploy of" in msg
    assert "modal deploy" in msg


def test_update_after_stopped_outside_then_destroy_stops_the_live_app(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """Review finding 1: stopped behind Pulumi's back, then a spec change without refresh.
    The redeploy makes a new app id; refresh must follow it and destroy must stop it."""
    engine.up("a", P, inputs())
    first = engine.states["a"].id
    modal_cli(emulator, "app", "stop", "echo", "-y")
    assert engine.up("a", P, {**inputs(), "spec_json": spec("qwen-2")}) == "update"
    st = engine.states["a"]
    live = st.outputs["app_id"]
    assert st.id == first and live != first
    assert apps(emulator) == {first: "stopped", live: "deployed"}
    assert engine.refresh("a") == "same"  # not "gone": read checks the live app id
    engine.destroy("a")
    assert apps(emulator) == {first: "stopped", live: "stopped"}


def test_environment_change_replaces(engine: Engine, emulator: EmulatorProcess) -> None:
    modal_cli(emulator, "environment", "create", "dev")
    engine.up("a", P, inputs())
    old = engine.states["a"].id
    assert engine.preview("a", P, inputs(env="dev")) == "replace"
    assert engine.up("a", P, inputs(env="dev")) == "replace"
    new = engine.states["a"].id
    assert new != old and apps(emulator) == {old: "stopped", new: "deployed"}


def test_environment_deleted_reads_as_gone(engine: Engine, modal_env: EmulatorProcess) -> None:
    """Review finding 26: AppGetByDeploymentName answers NotFound for a deleted environment."""
    modal.Environment.objects.create("dev")
    engine.up("a", P, inputs(env="dev"))
    modal.environments.delete_environment("dev")
    assert engine.refresh("a") == "delete"


FLAKY_APP = """
import pathlib

import modal
import modal.client
from modal import exception as mexc

marker = pathlib.Path(__file__).with_suffix(".attempts")
attempts = int(marker.read_text()) + 1 if marker.exists() else 1
marker.write_text(str(attempts))
if attempts <= FAILURES:  # Modal "unreachable" for the first deploy attempt(s)

    async def _down(*args, **kwargs):
        raise mexc.ConnectionError("simulated outage")

    modal.client._Client.from_env = _down

app = modal.App("flaky")


@app.function()
def f() -> None:
    pass
"""


@pytest.mark.parametrize("failures", [1, 2])
def test_transient_deploy_failure_is_retried_once(
    engine: Engine, tmp_path: Path, emulator: EmulatorProcess, failures: int
) -> None:
    """Review finding 21: a deploy that fails transiently (the runner reports Modal
    unreachable) is retried once in a fresh runner; a second failure is reported."""
    app_file = tmp_path / "flaky_app.py"
    app_file.write_text(FLAKY_APP.replace("FAILURES", str(failures)))
    if failures == 1:
        assert engine.up("a", P, inputs(app_file=str(app_file))) == "create"
        assert engine.states["a"].outputs["version"] == 1
        assert apps(emulator) == {engine.states["a"].id: "deployed"}
    else:
        with pytest.raises(ProviderCallError) as ei:
            engine.up("a", P, inputs(app_file=str(app_file)))
        assert "ConnectionError: simulated outage" in ei.value.details
        assert "Modal is unreachable or failing" in ei.value.details
        assert apps(emulator) == {}
    assert app_file.with_suffix(".attempts").read_text() == "2"


def test_a_create_whose_publish_answer_was_lost_is_found_and_kept(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """Issue 21: Modal published the app but every answer was lost, so the deploy failed.
    The provider looks: the app is there, so the release goes on (ungated here) and the
    create records it; state and Modal agree, and destroy stops it."""
    emulator._request(
        "POST",
        "/_emulator/faults",
        {"method": "AppPublish", "when": "after", "status": "UNAVAILABLE", "count": 1000},
    )
    try:
        assert engine.up("a", P, inputs()) == "create"
    finally:
        emulator._request("POST", "/_emulator/faults", {"clear": True})
    st = engine.states["a"]
    assert apps(emulator) == {st.id: "deployed"} and st.outputs["version"] == 1
    assert "the deploy's answer was lost, but Modal published v1" in engine.server.logs()
    engine.destroy("a")
    assert set(apps(emulator).values()) == {"stopped"}


def test_failed_create_leaves_nothing_deployed(engine: Engine, emulator: EmulatorProcess) -> None:
    """Issue 11: the publish never reached Modal. A failed create is not in state (destroy
    would never stop it): nothing may be left deployed, and a rerun is not blocked."""
    emulator._request(
        "POST",
        "/_emulator/faults",
        {"method": "AppPublish", "when": "before", "status": "UNAVAILABLE", "count": 1000},
    )
    try:
        with pytest.raises(ProviderCallError) as ei:
            engine.up("a", P, inputs())
    finally:
        emulator._request("POST", "/_emulator/faults", {"clear": True})
    assert "Nothing was left deployed." in ei.value.details
    assert "deployed" not in set(apps(emulator).values())
    assert "a" not in engine.states
    assert engine.up("a", P, inputs()) == "create"  # the rerun is not blocked
