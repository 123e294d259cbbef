"""Drift on the live emulator runtime (issue 12 part 3): a runtime autoscaler override of a
deployed `@app.server` (what `modal` / `Server.update_autoscaler` by hand or the pre-warm
function inside a window leaves) is reported by a refresh (`autoscaler_override` output and a
warning), is not an input change (a no-op `up` deploys nothing), and is reset by the next
deploy. An app without a server, or Modal failing that read, never fails a refresh.

The target is the runtime tests' trivial `@app.server` (tests/emulator/apps/rt_server.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.modal.app import AppProvider
from serving.spec import ServingSpec
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine
from tests.providers.helpers import modal_python, mutating_calls

P = AppProvider()
NAME = "drift-target"


def inputs(message: str, app_file: str = "tests/emulator/apps/rt_server.py") -> dict[str, Any]:
    spec = ServingSpec.model_validate(
        {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": "qwen"}
    ).to_json()
    return {
        "name": NAME,
        "environment": "main",
        "app_file": app_file,
        "spec_json": spec,
        "extra_env": {"RT_APP": NAME, "RT_MESSAGE": message},
    }


def override(emu: EmulatorProcess, **settings: int) -> dict[str, Any]:
    """`Server.autoscaler.update` from a separate client, as an operator would run it (the
    runtime follows a deploy before AppPublish answers, so the server is known at once)."""
    code = (
        "import json, sys, modal\n"
        "s = modal.Server.from_name(sys.argv[1], 'Web')\n"
        "s.autoscaler.update(**json.loads(sys.argv[2]))\n"
        "print(json.dumps(s.autoscaler.settings().min_containers))"
    )
    return {"min_containers": modal_python(emu, code, NAME, json.dumps(settings))}


def drift_warnings(engine: Engine) -> list[str]:
    return [
        line for line in engine.server.logs().splitlines() if "runtime autoscaler override" in line
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_refresh_reports_a_runtime_override_and_the_next_deploy_resets_it(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    assert engine.up("t", P, inputs("v1")) == "create"
    assert engine.states["t"].outputs["autoscaler_override"] == {}
    assert engine.refresh("t") == "same"

    # Someone raises the warm pool by hand (or the pre-warm function is inside a window).
    assert override(emulator, min_containers=1, scaledown_window=30) == {"min_containers": 1}
    assert engine.refresh("t") == "update"
    assert engine.states["t"].outputs["autoscaler_override"] == {
        "Web": {"min_containers": 1, "scaledown_window": 30}
    }
    (warning,) = drift_warnings(engine)
    assert f"App '{NAME}' in environment 'main': Web" in warning
    assert "min_containers=1 (deployed: 0), scaledown_window=30 (deployed: 60)" in warning
    assert "next deploy of this app resets it" in warning

    # Not an input change: a no-op up deploys nothing and keeps the override live.
    before = emulator.rpc_counts()
    assert engine.up("t", P, inputs("v1")) == "same"
    assert mutating_calls(before, emulator.rpc_counts()) == {}
    assert engine.refresh("t") == "same"  # still there, same value: no new drift

    # A redeploy drops it; the outputs and then a refresh say so.
    assert engine.up("t", P, inputs("v2")) == "update"
    assert engine.states["t"].outputs["autoscaler_override"] == {}
    # The emulator's runtime takes the new version before AppPublish answers, dropping the
    # override ("Subsequent deployments ... reset the autoscaler", modal 1.6.4): nothing to see.
    assert engine.refresh("t") == "same"
    assert engine.states["t"].outputs["autoscaler_override"] == {}
    warnings = len(drift_warnings(engine))
    assert engine.refresh("t") == "same"
    assert len(drift_warnings(engine)) == warnings  # none live: no warning
    engine.destroy("t")


def test_refresh_without_a_server_or_without_the_rpc_still_succeeds(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    # An app with a plain function and no override (like the spend watcher / pre-warm apps).
    assert engine.up("t", P, inputs("v1", app_file="tests/providers/apps/echo_app.py")) == (
        "create"
    )
    assert engine.refresh("t") == "same"
    assert engine.states["t"].outputs["autoscaler_override"] == {}
    # Modal cannot answer the autoscaler read: the refresh succeeds, keeps the recorded value
    # and says why.
    emulator._request(
        "POST",
        "/_emulator/faults",
        {
            "method": "FunctionGetSchedulingParams",
            "when": "before",
            "status": "INTERNAL",
            "count": 1000,
        },
    )
    try:
        assert engine.refresh("t") == "same"
    finally:
        emulator._request("POST", "/_emulator/faults", {"clear": True})
    assert engine.states["t"].outputs["autoscaler_override"] == {}
    assert "could not read its live autoscaler overrides" in engine.server.logs()
    engine.destroy("t")
