"""The App's release transaction (issue 21) on the live local runtime: faults at each step,
two bad releases in a row, and drift a refresh must see.

After every failure the live version is the last known-good one (or what served before),
the release records on the app (its tags) say which version passed and which failed, a
refresh reads the truth from Modal, and nothing is left deployed that no state knows of.
Faults are armed in the emulator (dev/emulator/faults.py): `after` = Modal applied the call and
the answer was lost; `before` = Modal never saw it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError
from tests.providers.test_app_gate import (
    APP,
    BAD_GATE_TIMEOUT_S,
    OLD_KEY,
    ServingApp,
    Stack,
    TestApp,
    live_apps,
    records,
)


def fault(emu: EmulatorProcess, method: str, when: str = "before", count: int = 1000) -> None:
    emu._request(
        "POST",
        "/_emulator/faults",
        {"method": method, "when": when, "status": "UNAVAILABLE", "count": count},
    )


def clear(emu: EmulatorProcess) -> None:
    emu._request("POST", "/_emulator/faults", {"clear": True})


def live_version(emu: EmulatorProcess, name: str = "gate") -> tuple[int, int]:
    """(live version, the version it rolled back to or 0), from the emulator's history."""
    (app,) = [a for a in emu.state()["apps"] if a.get("name") == name and a["state"] == "deployed"]
    rows = [v for v in emu.state()["app_versions"] if v["app_id"] == app["id"]]
    live = max(rows, key=lambda v: v["version"])
    return int(live["version"]), int(live["rollback_version"] or 0)


def modal_cli(emu: EmulatorProcess, *args: str) -> str:
    """The real `modal` CLI against the emulator, as an operator would run it."""
    proc = subprocess.run(
        [sys.executable, "-m", "modal", *args],
        env=emu.subprocess_env(),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture
def stack(engine: Engine) -> Stack:
    return Stack(engine, TestApp())


def bad(stack: Stack, fail: str, timeout: float = BAD_GATE_TIMEOUT_S) -> dict[str, Any]:
    return stack.app(spec_json=stack.kind.spec(fail=fail), health_gate_timeout_s=timeout)


# ---- the gate refuses a crash loop at once ------------------------------------------------


@pytest.mark.slow
def test_a_crash_loop_is_refused_before_the_startup_budget(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    started = time.monotonic()
    with pytest.raises(ProviderCallError) as err:
        engine.up("a", APP, bad(stack, "start", timeout=300.0))
    took = time.monotonic() - started
    details = err.value.details
    assert "crash loop: 3 of v2's containers exited before it got ready" in details
    assert took < 90, f"refused after {took:.0f} s of a 300 s budget"
    assert "Rolled back to v1 (last known good), live as v3" in details
    assert live_version(emulator) == (3, 1)
    assert records(emulator)["llm-iac.gate.v2"] == "failed"


# ---- two bad releases in a row, then a good one: traffic never sees them -------------------


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_bad_releases_then_a_good_one_keep_serving_the_known_good_version(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    """serving/app.py itself (the stand-in engine; @enter waits for it, so Modal routes no
    request to a container that is not ready): a crash loop, then a release that never gets
    ready, then a good one. Each rollback lands on a version that passed its gate; a
    gateway calling with the old key the whole time gets only 200s."""
    stack = Stack(engine, ServingApp())
    engine.up("a", APP, stack.app())
    url = engine.states["a"].outputs["web_url"]
    statuses: list[int] = []
    stop = threading.Event()

    def gateway() -> None:
        while not stop.is_set():
            statuses.append(stack.call(url, "/v1/chat/completions", OLD_KEY))
            time.sleep(0.2)

    caller = threading.Thread(target=gateway, daemon=True)
    caller.start()
    try:
        for fail in ("start", "never-ready"):
            with pytest.raises(ProviderCallError) as err:
                engine.up("a", APP, bad(stack, fail, timeout=20.0))
            assert "Rolled back to v" in err.value.details, err.value.details
            assert "(last known good)" in err.value.details
        # v1 passed; v2 failed → rolled back to v1 as v3 (re-checked: passed); v4 failed →
        # rolled back to v3 (the newest that passed, never v2 or v4) as v5.
        assert records(emulator) == {
            "llm-iac.gate.v1": "passed",
            "llm-iac.gate.v2": "failed",
            "llm-iac.gate.v3": "passed",
            "llm-iac.gate.v4": "failed",
            "llm-iac.gate.v5": "passed",
        }
        assert live_version(emulator) == (5, 3)
        good = stack.app(spec_json=stack.kind.spec(message="pong-2"))
        assert engine.up("a", APP, good) == "update"
        out = engine.states["a"].outputs
        assert (out["version"], out["previous_version"], out["known_good_version"]) == (6, 5, 6)
        assert out["rollback_command"] == "modal app rollback gate v5 -e main"
    finally:
        stop.set()
        caller.join(10)
    assert statuses and set(statuses) == {200}, statuses
    engine.destroy("a")
    assert live_apps(emulator) == []


# ---- faults at each step --------------------------------------------------------------------


def test_a_lost_publish_answer_is_still_gated(stack: Stack, emulator: EmulatorProcess) -> None:
    """Modal published, the answer never came back (every retry too): the provider looks,
    finds the new version and gates it like any other release."""
    engine = stack.engine
    engine.up("a", APP, stack.app())
    fault(emulator, "AppPublish", when="after", count=50)
    try:
        assert engine.up("a", APP, stack.app(spec_json=stack.kind.spec(message="p2"))) == "update"
    finally:
        clear(emulator)
    out = engine.states["a"].outputs
    assert out["version"] == 2 and out["gate_result"].startswith("passed: v2")
    assert "the deploy's answer was lost, but Modal published v2" in engine.server.logs()
    assert records(emulator)["llm-iac.gate.v2"] == "passed"


def test_a_lost_publish_answer_of_a_bad_release_is_rolled_back(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    fault(emulator, "AppPublish", when="after", count=50)
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.up("a", APP, bad(stack, "never-ready"))
    finally:
        clear(emulator)
    assert "Rolled back to v1 (last known good), live as v3" in err.value.details
    assert live_version(emulator) == (3, 1)


def test_a_publish_that_never_reached_modal_changes_nothing(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    fault(emulator, "AppPublish", when="before", count=50)
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.up("a", APP, bad(stack, "never-ready"))
    finally:
        clear(emulator)
    assert "Nothing was published: v1 (checked in Modal's history just now) keeps serving" in (
        err.value.details
    )
    assert live_version(emulator) == (1, 0)


def test_a_history_read_error_before_publish_publishes_nothing(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    fault(emulator, "AppGetTags")
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.up("a", APP, stack.app(spec_json=stack.kind.spec(message="p2")))
    finally:
        clear(emulator)
    assert "read the deployment history and release records failed" in err.value.details
    assert live_version(emulator) == (1, 0)


def test_a_modal_error_during_the_gate_rolls_back(stack: Stack, emulator: EmulatorProcess) -> None:
    """TaskList fails from the first look of the gate on: the gate's outcome is a failure
    (not an exception that escapes), the release is rolled back; the re-check cannot look
    either, and says so."""
    engine = stack.engine
    engine.up("a", APP, stack.app())
    fault(emulator, "TaskList")
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.up("a", APP, stack.app(spec_json=stack.kind.spec(message="p2")))
    finally:
        clear(emulator)
    details = err.value.details
    assert "the gate could not finish" in details and "list containers failed" in details
    assert "Rolled back to v1 (last known good), live as v3, but it did NOT answer" in details
    assert live_version(emulator) == (3, 1)
    assert records(emulator)["llm-iac.gate.v2"] == "failed"
    # The state still holds the release that passed; a refresh reads what is live.
    assert engine.refresh("a") == "update"
    out = engine.states["a"].outputs
    assert (
        out["version"] == 3 and out["gate_result"] == "failed: v3 (the release record on the app)"
    )


def test_a_failed_rollback_names_the_command_that_finishes_it(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    fault(emulator, "AppRollback")
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.up("a", APP, bad(stack, "never-ready"))
    finally:
        clear(emulator)
    details = err.value.details
    assert "The rollback to v1 (last known good) FAILED" in details
    assert "Finish it with `modal app rollback gate v1 -e main`." in details
    assert live_version(emulator) == (2, 0)
    # The command it names finishes the job; a refresh then sees v1's release live again.
    modal_cli(emulator, "app", "rollback", "gate", "v1", "-e", "main")
    assert live_version(emulator) == (3, 1)
    engine.refresh("a")
    assert engine.states["a"].outputs["version"] == 3
    assert engine.preview("a", APP, stack.app()) == "same"


def test_a_failed_record_write_does_not_fail_a_good_release(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    fault(emulator, "AppSetTags")
    try:
        assert engine.up("a", APP, stack.app()) == "create"
    finally:
        clear(emulator)
    assert engine.states["a"].outputs["gate_result"].startswith("passed: v1")
    assert "could not record v1 passed on the app" in engine.server.logs()


def test_a_failed_create_with_a_lost_answer_leaves_nothing(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    fault(emulator, "AppPublish", when="after", count=50)
    try:
        with pytest.raises(ProviderCallError) as err:
            stack.engine.up("a", APP, bad(stack, "never-ready"))
    finally:
        clear(emulator)
    assert "nothing of this release is left serving" in err.value.details
    assert "a" not in stack.engine.states
    assert live_apps(emulator) == []


# ---- drift: what a refresh sees, what `up` heals --------------------------------------------


@pytest.mark.slow
def test_refresh_sees_a_rollback_by_hand_and_up_heals_it(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    v2 = stack.app(spec_json=stack.kind.spec(message="p2"))
    engine.up("a", APP, v2)
    modal_cli(emulator, "app", "rollback", "gate", "v1", "-e", "main")
    assert engine.refresh("a") == "update"
    out = engine.states["a"].outputs
    assert out["version"] == 3 and out["spec_digest"].startswith("live v3: ")
    assert engine.preview("a", APP, v2) == "update"
    assert engine.up("a", APP, v2) == "update"
    out = engine.states["a"].outputs
    assert out["version"] == 4 and out["gate_result"].startswith("passed: v4")
    assert engine.refresh("a") == "same"
    assert engine.preview("a", APP, v2) == "same"


@pytest.mark.slow
def test_refresh_sees_a_deploy_by_hand_and_up_heals_it(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    # An operator deploys the same app file with another spec, untagged, outside Pulumi.
    spec = PROJECT_ROOT / ".pytest-hand-spec.json"
    spec.write_text(stack.kind.spec(message="by-hand"))
    try:
        env = emulator.subprocess_env(
            {"SERVING_SPEC": str(spec), "SERVING_APP_NAME": "gate", "MODAL_ENVIRONMENT": "main"}
        )
        proc = subprocess.run(
            [sys.executable, "-m", "modal", "deploy", stack.kind.app_file, "--name", "gate"],
            env=env,
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    finally:
        spec.unlink()
    assert engine.refresh("a") == "update"
    out = engine.states["a"].outputs
    assert out["spec_digest"] == "live v2: no deployment tag (deployed outside Pulumi)"
    assert out["gate_result"].startswith("unrecorded: v2")
    assert engine.up("a", APP, stack.app()) == "update"
    assert engine.states["a"].outputs["version"] == 3
    assert engine.refresh("a") == "same"


def test_refresh_sees_an_app_stopped_by_hand_and_up_heals_it(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    engine = stack.engine
    engine.up("a", APP, stack.app())
    modal_cli(emulator, "app", "stop", "gate", "-e", "main", "-y")
    # Still the resource, with nothing live and the reason (issue 32 item 12): the next
    # Diff plans an update that deploys it again under the name.
    assert engine.refresh("a") == "update"
    out = engine.states["a"].outputs
    assert out["version"] == 0 and out["drift"].startswith("live app stopped by hand")
    assert engine.up("a", APP, stack.app()) == "update"
    out = engine.states["a"].outputs
    assert out["gate_result"].startswith("passed: v1") and out["drift"] == ""
    assert len(live_apps(emulator)) == 1
    assert engine.refresh("a") == "same"


# ---- the emulator killed mid-release ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_modal_killed_during_the_gate_ends_on_the_known_good_version(tmp_path: Any) -> None:
    """kill -9 of Modal (the emulator, with its state file) just after a bad release was
    published, back a second later: the release still ends rolled back to the known-good
    version (or names the command that finishes it), and a refresh tells the truth."""
    from tests.harness.provider_server import ProviderServer
    from tests.providers.helpers import server_env

    emu = EmulatorProcess(state_path=tmp_path / "state.db").start()
    try:
        with ProviderServer(env=server_env(emu)) as srv:
            engine = Engine(srv)
            stack = Stack(engine, TestApp())
            engine.up("a", APP, stack.app())
            errors: list[str] = []

            def release() -> None:
                try:
                    engine.up("a", APP, bad(stack, "never-ready", timeout=15.0))
                except ProviderCallError as e:
                    errors.append(e.details)

            worker = threading.Thread(target=release)
            worker.start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(emu.state()["app_versions"]) < 2:
                time.sleep(0.1)
            assert len(emu.state()["app_versions"]) == 2, "the bad release never published"
            emu.kill()
            time.sleep(1.0)
            emu.start()
            worker.join(240)
            assert not worker.is_alive()
            (details,) = errors
            if "Finish it with `modal app rollback gate v1 -e main`" in details:
                modal_cli(emu, "app", "rollback", "gate", "v1", "-e", "main")
            else:
                assert "Rolled back to v1 (last known good)" in details, details
            version, rolled_to = live_version(emu)
            assert rolled_to == 1 and version >= 3
            assert engine.refresh("a") == "update"
            out = engine.states["a"].outputs
            assert out["version"] == version and out["spec_json"] == stack.kind.spec()
            assert engine.preview("a", APP, stack.app()) == "same"
            engine.destroy("a")
            assert live_apps(emu) == []
    finally:
        emu.close()


# ---- every RPC of a release failing for good: the invariant ---------------------------------

RELEASE_RPCS = [
    "AppGetByDeploymentName",
    "FunctionCreate",  # one of the deploy's own calls before AppPublish
    "AppDeploymentHistory",
    "AppGetTags",
    "AppSetTags",
    "TaskList",
    "AppFetchLogs",
    "AppRollback",
    "AppStop",
]


@pytest.mark.slow
@pytest.mark.parametrize("method", RELEASE_RPCS)
def test_any_release_rpc_failing_leaves_the_known_good_version_live(
    stack: Stack, emulator: EmulatorProcess, method: str
) -> None:
    """A bad release while one RPC fails every time it is sent (from the first call of the
    release on): the `up` fails, and once Modal answers again the live version runs the
    known-good release, or the error named the one command that makes it so; a refresh
    then agrees with Modal, and no other app is left deployed."""
    engine = stack.engine
    engine.up("a", APP, stack.app())
    good_tag = engine.states["a"].outputs["deployment_tag"]
    fault(emulator, method)
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.up("a", APP, bad(stack, "never-ready", timeout=3.0))
    finally:
        clear(emulator)
    details = err.value.details
    version, rolled_to = live_version(emulator)
    if version == 2:  # the failed release is live: the error must say how to undo it
        assert "Finish it with `modal app rollback gate v1 -e main`" in details, details
        modal_cli(emulator, "app", "rollback", "gate", "v1", "-e", "main")
        version, rolled_to = live_version(emulator)
    assert version in (1, 3) and rolled_to in (0, 1), details
    engine.refresh("a")
    out = engine.states["a"].outputs
    assert out["version"] == version and out["deployment_tag"] == good_tag
    assert engine.preview("a", APP, stack.app()) == "same"
    assert len(live_apps(emulator)) == 1


@pytest.mark.parametrize("method", ["AppGetByDeploymentName", "AppDeploymentHistory", "AppGetTags"])
def test_a_refresh_that_cannot_read_fails_and_keeps_the_state(
    stack: Stack, emulator: EmulatorProcess, method: str
) -> None:
    """A refresh never guesses: when Modal cannot say what is live, it fails and the state
    stays as it was (no resource dropped as gone, no outputs invented)."""
    engine = stack.engine
    engine.up("a", APP, stack.app())
    before = dict(engine.states["a"].outputs)
    fault(emulator, method)
    try:
        with pytest.raises(ProviderCallError) as err:
            engine.refresh("a")
    finally:
        clear(emulator)
    assert f"{method}" in err.value.details or "read failed" in err.value.details
    assert engine.states["a"].outputs == before
    assert engine.refresh("a") == "same"


def test_22_6_a_create_finds_its_own_release_left_by_an_interrupted_run(
    stack: Stack, emulator: EmulatorProcess
) -> None:
    """A create whose run was interrupted after Modal published (the state never recorded it)
    is rerun: the app under the name runs this very release (same deployment tag), so the
    rerun takes it as its own, verified, instead of refusing it forever (issue 22 item 6).
    An app running anything else under the name is still refused."""
    engine = stack.engine
    engine.up("a", APP, stack.app())
    app_id = engine.states["a"].outputs["app_id"]
    del engine.states["a"]  # the interrupted run: Modal has the app, the state does not
    assert engine.up("a", APP, stack.app()) == "create"
    out = engine.states["a"].outputs
    assert out["app_id"] == app_id and out["version"] == 1
    assert "runs this create's own release" in engine.server.logs()
    del engine.states["a"]
    with pytest.raises(ProviderCallError) as err:
        engine.up("a", APP, stack.app(spec_json=stack.kind.spec(message="other")))
    assert "create refused: an app is already deployed under this name" in err.value.details
