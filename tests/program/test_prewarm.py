"""Scheduled pre-warm on the live local runtime: serving/prewarm_app.py deployed by the App
provider, raising and restoring a deployed server's `min_containers` through the client's
`Server.autoscaler.update` (FunctionUpdateSchedulingParams on the emulator); a redeploy of
the service drops the override. Plus the window rules and their cost.

The target is the runtime tests' trivial `@app.server` (tests/emulator/apps/rt_server.py):
what is checked is the autoscaler path, which is the same for serving/app.py's server.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from components import cost
from components.modal.app import AppProvider
from serving.prewarm import (
    ScheduleError,
    desired_min,
    extra_container_hours_per_month,
    parse_windows,
)
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderServer
from tests.providers.helpers import modal_python, server_env

TARGET = "pw-target"
WINDOWS = [{"cron": "0 3 * * *", "duration_minutes": 60, "min_containers": 1}]


@pytest.fixture(scope="module")
def _server(_emulator_session: EmulatorProcess) -> Iterator[ProviderServer]:
    srv = ProviderServer(env=server_env(_emulator_session)).start()
    try:
        yield srv
    finally:
        srv.close()


def prewarm_at(emu: EmulatorProcess, at: str) -> dict[str, Any]:
    code = (
        "import json, modal, sys; f = modal.Function.from_name(sys.argv[1], 'prewarm');"
        " print(json.dumps(f.remote(at=sys.argv[2])))"
    )
    return dict(modal_python(emu, code, f"{TARGET}-prewarm", at))


def live_min(emu: EmulatorProcess) -> int:
    code = (
        "import json, modal; s = modal.Server.from_name('pw-target', 'Web');"
        " print(json.dumps(s.autoscaler.settings().min_containers))"
    )
    return int(modal_python(emu, code))


def autoscaler_drift(emu: EmulatorProcess) -> dict[str, Any]:
    """The server's min_containers as components/modal/_rpc.autoscaler_settings reads it."""
    code = (
        "import json; from modal.client import _Client;"
        " from modal._utils.async_utils import synchronizer;"
        " from components.modal import _rpc\n"
        "async def go():\n"
        "    c = await _Client.from_env()\n"
        "    a = await _rpc.autoscaler_settings(c, 'pw-target', 'Web', '')\n"
        "    o = a.override_settings\n"
        "    return {'effective': a.settings.min_containers,"
        " 'static': a.static_settings.min_containers,"
        " 'override': o.min_containers if o.HasField('min_containers') else None}\n"
        "print(json.dumps(synchronizer.create_blocking(go)()))"
    )
    return dict(modal_python(emu, code))


def deploy_target(emu: EmulatorProcess, message: str) -> str:
    subprocess.run(
        [sys.executable, "-m", "modal", "deploy", "tests/emulator/apps/rt_server.py"],
        env=emu.subprocess_env({"RT_APP": TARGET, "RT_MESSAGE": message}),
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return next(
        a["id"] for a in emu.state()["apps"] if a["name"] == TARGET and a["state"] == "deployed"
    )


def ready_containers(emu: EmulatorProcess, app_id: str) -> int:
    return len([c for c in emu.live_containers(app_id) if c["state"] == "ready"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_prewarm_raises_and_restores_min_containers_and_a_deploy_resets_it(
    emulator: EmulatorProcess, _server: ProviderServer
) -> None:
    app_id = deploy_target(emulator, "v1")
    engine = Engine(_server)
    config = {"target_app": TARGET, "server": "Web", "base_min_containers": 0, "windows": WINDOWS}
    prewarm_inputs = {
        "name": f"{TARGET}-prewarm",
        "environment": "main",
        "app_file": "serving/prewarm_app.py",
        "spec_json": json.dumps(config, sort_keys=True),
    }
    # The app's `*/5` Cron would also run at real time and set the minimum for the real clock,
    # undoing what the steps below set for chosen times (CI saw it once: min back to 0 between
    # two steps). Its wall-clock runs are paused, by name before the deploy so that none can
    # slip in between; firing it by hand still works.
    emulator.pause_schedule(f"{TARGET}-prewarm", "prewarm")
    assert engine.up("prewarm", AppProvider(), prewarm_inputs) == "create"
    assert ready_containers(emulator, app_id) == 0 and live_min(emulator) == 0

    # Inside the window: the override starts a container with no request at all.
    assert prewarm_at(emulator, "2026-11-26T03:30:00+00:00") == {
        "target_app": TARGET,
        "was": 0,
        "min_containers": 1,
    }
    deadline = time.monotonic() + 60
    while ready_containers(emulator, app_id) < 1 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert ready_containers(emulator, app_id) == 1 and live_min(emulator) == 1
    # Still inside: nothing to change.
    assert prewarm_at(emulator, "2026-11-26T03:55:00+00:00")["was"] == 1

    # After the window: the base comes back.
    assert prewarm_at(emulator, "2026-11-26T04:00:00+00:00") == {
        "target_app": TARGET,
        "was": 1,
        "min_containers": 0,
    }
    assert live_min(emulator) == 0

    # Drift: a live override is visible to a read (what a refresh would report) ...
    prewarm_at(emulator, "2026-11-26T03:10:00+00:00")
    assert live_min(emulator) == 1
    assert autoscaler_drift(emulator) == {"effective": 1, "static": 0, "override": 1}
    # ... and dropped by the next deploy of the service.
    deploy_target(emulator, "v2")
    assert live_min(emulator) == 0
    assert autoscaler_drift(emulator) == {"effective": 0, "static": 0, "override": None}

    # The function is registered with its Cron schedule: firing it as the schedule would.
    call_id = emulator.run_schedule(f"{TARGET}-prewarm", "prewarm")
    result = modal_python(
        emulator,
        "import json, modal, sys; print(json.dumps(modal.FunctionCall.from_id(sys.argv[1]).get()))",
        call_id,
    )
    want = desired_min(parse_windows(WINDOWS), 0, dt.datetime.now(dt.UTC))
    assert result["min_containers"] == want

    # A no-op up of the pre-warm app deploys nothing.
    before = emulator.rpc_counts()
    assert engine.up("prewarm", AppProvider(), prewarm_inputs) == "same"
    assert emulator.rpc_counts().get("AppPublish") == before.get("AppPublish")
    engine.destroy("prewarm")


def test_windows_rules_and_cost() -> None:
    windows = parse_windows(
        [
            {"cron": "30 8 * * mon-fri", "duration_minutes": 570, "min_containers": 2},
            {"cron": "0 12 * * 1-5", "duration_minutes": 60, "min_containers": 3},
        ]
    )
    utc = dt.UTC
    assert desired_min(windows, 1, dt.datetime(2026, 11, 26, 9, 0, tzinfo=utc)) == 2  # Thu
    assert desired_min(windows, 1, dt.datetime(2026, 11, 26, 12, 30, tzinfo=utc)) == 3
    assert desired_min(windows, 1, dt.datetime(2026, 11, 26, 18, 0, tzinfo=utc)) == 1
    assert desired_min(windows, 1, dt.datetime(2026, 11, 28, 9, 0, tzinfo=utc)) == 1  # Sat
    # 5 days x (9.5 h x 1 + 1 h x 1) above a base of 1 = 52.5 h a week, x 730 / 168.
    assert extra_container_hours_per_month(windows, 1) == pytest.approx(52.5 * 730 / 168)
    ny = parse_windows(
        [
            {
                "cron": "0 9 * * *",
                "duration_minutes": 60,
                "min_containers": 1,
                "timezone": "America/New_York",
            }
        ]
    )
    assert desired_min(ny, 0, dt.datetime(2026, 11, 26, 14, 30, tzinfo=utc)) == 1  # 09:30 EST
    assert desired_min(ny, 0, dt.datetime(2026, 11, 26, 9, 30, tzinfo=utc)) == 0
    for bad, where in [
        ([{"cron": "61 * * * *", "duration_minutes": 5, "min_containers": 1}], "cron"),
        ([{"cron": "* * * *", "duration_minutes": 5, "min_containers": 1}], "cron"),
        ([{"cron": "* * * * *", "duration_minutes": 0, "min_containers": 1}], "duration_minutes"),
        ([{"cron": "* * * * *", "duration_minutes": 5, "min_containers": 9}], "max_containers"),
        (
            [
                {
                    "cron": "* * * * *",
                    "duration_minutes": 5,
                    "min_containers": 1,
                    "timezone": "Mars/Base",
                }
            ],
            "timezone",
        ),
    ]:
        with pytest.raises(ScheduleError, match=where):
            parse_windows(bad, max_containers=4)
    # The cost model: the windows' extra container-hours at the service's container price.
    svc = cost.service_cost(
        cost.ServiceCostInput(
            name="chat", gpus=("H100",), gpu_count=1, min_containers=1, max_containers=4,
            overhead_pct=0, warm_extra_hours=extra_container_hours_per_month(windows, 1),
        ),
        dict(cost.GPU_PRICES_USD_PER_HOUR),
    )  # fmt: skip
    assert svc.warm_usd == pytest.approx(3.95 * 52.5 * 730 / 168, abs=0.01)
    assert svc.idle_usd == pytest.approx(3.95 * 730 + svc.warm_usd, abs=0.01)


def test_program_deploys_the_prewarm_app_after_the_service_and_prices_the_windows() -> None:
    import yaml

    from tests.program.runner import run_program, stack_config

    raw = yaml.safe_load((PROJECT_ROOT / "Pulumi.local.yaml").read_text())
    service = raw["config"]["modal-llm:services"][0]
    windows = [{"cron": "0 8 * * mon-fri", "duration_minutes": 600, "min_containers": 1}]
    config, keys = stack_config(
        "local", {"modal-llm:services": [{**service, "warm_schedule": windows}]}
    )
    run = run_program("local", config, keys)
    apps = {a.inputs["name"]: a for a in run.of_type("modal:App")}
    assert set(apps) == {"tiny", "tiny-prewarm"}
    prewarm = apps["tiny-prewarm"]
    assert prewarm.inputs["app_file"] == "serving/prewarm_app.py"
    assert json.loads(prewarm.inputs["spec_json"]) == {
        "target_app": "tiny",
        "server": "Serving",
        "base_min_containers": 0,
        "windows": windows,
    }
    assert apps["tiny"].urn in prewarm.dependencies
    summary = run.output("services")["tiny"]
    # 5 x 10 h a week of one T4 container with vLLM's default requests (6 cores, 12 GiB):
    # ($0.59 + 6 x $0.04716 + 12 x $0.007992) x 50 h x 730 / 168.
    warm = round((0.59 + 6 * 0.04716 + 12 * 0.007992) * 50 * 730 / 168, 2)
    assert summary["warm_schedule"] == windows
    assert summary["monthly_cost_warm_usd"] == pytest.approx(warm, abs=0.01)
    assert summary["monthly_cost_idle_usd"] == pytest.approx(warm, abs=0.01)  # base is 0
    assert run.output("monthly_cost_idle_usd") == pytest.approx(warm, abs=0.01)
    bad = [{**windows[0], "min_containers": 2}]  # above max_containers (1)
    config, keys = stack_config(
        "local", {"modal-llm:services": [{**service, "warm_schedule": bad}]}
    )
    with pytest.raises(Exception, match=r"services\[0\]\.warm_schedule\[0\]\.min_containers"):
        run_program("local", config, keys)
