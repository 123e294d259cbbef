"""When the runtime fires a deployed function's schedule, and the emulator's pause switch.

The loop calls `Runtime._schedules()` every autoscale tick; here it is called with a chosen
clock, so the timing is checked without waiting for it. Modal runs a `Period` schedule every
period from the deploy and a `Cron` at its wall-clock times (modal 1.6.4 `modal.Period` /
`modal.Cron` docstrings). The pause switch (`POST /_emulator/schedules/pause`) has no Modal
counterpart: it exists so a test that drives a scheduled function by hand (test_prewarm) is
not raced by the function's real runs; the control route still fires a paused function.

Kept (issue 33 item 7): the spend watcher and the prewarm run on schedules
(watchers/spend_alerts.py, serving/prewarm_app.py); tests/program/test_prewarm.py uses the pause
switch.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest
from modal_proto import api_pb2

from emulator.handlers.base import RpcCounter
from emulator.http import ControlServer, HttpError
from emulator.runtime.control import install
from emulator.runtime.manager import Runtime
from tests.emulator.inprocess import InProcessRuntime

T0 = dt.datetime(2026, 11, 26, 13, 2, 30, tzinfo=dt.UTC).timestamp()


def _deploy(rt: InProcessRuntime, schedule: api_pb2.Schedule) -> str:
    """Deploy app `ticks` (environment `main`) with one function `tick` on `schedule`."""
    app_id, fid = rt.create_app("ticks", "tick")
    rt.publish(
        app_id, "ticks", fid, "fd-1", api_pb2.Function(function_name="tick", schedule=schedule)
    )
    return fid


def _runs(runtime: Runtime, function_id: str) -> int:
    return sum(1 for c in runtime.calls.calls.values() if c.function_id == function_id)


def test_a_period_fires_every_period_and_pausing_stops_it(tmp_path: Path) -> None:
    async def run() -> None:
        rt = InProcessRuntime(tmp_path)  # the runtime's loop is never started
        runtime = rt.runtime
        fid = _deploy(rt, api_pb2.Schedule(period=api_pb2.Schedule.Period(seconds=60)))

        runtime._schedules(T0)  # first tick after the deploy: the next run is T0 + 60
        runtime._schedules(T0 + 59)
        assert _runs(runtime, fid) == 0
        runtime._schedules(T0 + 60)
        assert _runs(runtime, fid) == 1
        runtime._schedules(T0 + 100)
        assert _runs(runtime, fid) == 1  # the next one is at T0 + 120

        runtime.pause_schedule("main", "ticks", "tick", True)
        runtime._schedules(T0 + 500)
        assert _runs(runtime, fid) == 1  # paused: no wall-clock run ...
        runtime.fire_schedule(fid, reason="test")
        assert _runs(runtime, fid) == 2  # ... while firing by hand still works

        runtime.pause_schedule("main", "ticks", "tick", False)
        runtime._schedules(T0 + 1000)  # resumed: counted from now, no catch-up burst
        assert _runs(runtime, fid) == 2
        runtime._schedules(T0 + 1059)
        assert _runs(runtime, fid) == 2
        runtime._schedules(T0 + 1060)
        assert _runs(runtime, fid) == 3
        await runtime.close()

    asyncio.run(run())


def test_a_cron_fires_at_its_wall_clock_minute(tmp_path: Path) -> None:
    async def run() -> None:
        rt = InProcessRuntime(tmp_path)
        runtime = rt.runtime
        fid = _deploy(rt, api_pb2.Schedule(cron=api_pb2.Schedule.Cron(cron_string="*/5 * * * *")))

        runtime._schedules(T0)  # 13:02:30: the next run is 13:05:00
        runtime._schedules(T0 + 149)
        assert _runs(runtime, fid) == 0
        runtime._schedules(T0 + 150)
        assert _runs(runtime, fid) == 1
        runtime._schedules(T0 + 449)  # 13:09:59
        assert _runs(runtime, fid) == 1
        runtime._schedules(T0 + 450)  # 13:10:00
        assert _runs(runtime, fid) == 2
        await runtime.close()

    asyncio.run(run())


def test_the_pause_route_works_by_name_and_before_the_deploy(tmp_path: Path) -> None:
    """`POST /_emulator/schedules/pause` names the function; set before the app is deployed,
    the first deploy's schedule never fires by itself (test_prewarm relies on this)."""

    async def run() -> None:
        rt = InProcessRuntime(tmp_path)
        runtime = rt.runtime
        control = ControlServer(rt.state, RpcCounter(), "127.0.0.1", 0)
        install(control, runtime)
        pause = control.extra_routes[("POST", "/_emulator/schedules/pause")]

        status, _, body = pause(json.dumps({"app": "ticks", "function": "tick"}).encode())
        assert status == 200  # not deployed yet; "" is the default environment
        assert json.loads(body) == {
            "environment": "main", "app": "ticks", "function": "tick", "paused": True,
        }  # fmt: skip
        fid = _deploy(rt, api_pb2.Schedule(period=api_pb2.Schedule.Period(seconds=60)))
        for t in (T0, T0 + 61, T0 + 500):
            runtime._schedules(t)
        assert _runs(runtime, fid) == 0

        pause(json.dumps({"app": "ticks", "function": "tick", "paused": False}).encode())
        runtime._schedules(T0 + 600)
        runtime._schedules(T0 + 660)
        assert _runs(runtime, fid) == 1

        for bad in (b"[]", b"{}", b'{"app": "ticks", "function": "tick", "paused": "no"}'):
            with pytest.raises(HttpError) as err:
                pause(bad)
            assert err.value.status == 400
        # an environment that does not exist yet is taken by its name
        status, _, _ = pause(b'{"app": "a", "function": "f", "environment": "later"}')
        assert status == 200 and runtime.paused_schedules == {("later", "a", "f")}
        await runtime.close()

    asyncio.run(run())
