"""The runtime's routes on the control surface (`/_emulator/*`, same auth as the others).

- `GET /_emulator/containers`: every container the runtime started (state, pid, ids, failure).
- `GET /_emulator/edge`: the endpoint label -> edge port table.
- `POST /_emulator/schedules/run` with `{"function_id": "fu-..."}` or
  `{"app": NAME, "function": TAG, "environment": ENV}`: run a scheduled function now, as its
  schedule would (an input with no arguments); answers `{"function_call_id": "fc-..."}`.
- `POST /_emulator/schedules/pause` with `{"app": NAME, "function": TAG, "environment": ENV,
  "paused": true|false}`: stop (or restart) the function's automatic runs, by name, so also
  before its app is deployed; the route above still fires it. An emulator switch with no
  Modal counterpart, for tests that set a scheduled function's effect by hand and must not
  race its wall-clock runs (a `*/5` Cron fires every five minutes of real time).
"""

from __future__ import annotations

import json
from typing import Any

from emulator.errors import NotFound
from emulator.http import ControlServer, HttpError, _json
from emulator.runtime.manager import Runtime


def install(control: ControlServer, runtime: Runtime) -> None:
    def containers(_body: bytes) -> Any:
        return _json(200, {"containers": runtime.snapshot()})

    def edge(_body: bytes) -> Any:
        return _json(200, {"ports": runtime.edge.ports() if runtime.edge else {}})

    def json_object(body: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise HttpError(400, "expected a JSON object")
        return payload

    def selected(payload: dict[str, Any]) -> str:
        """The deployed function the body names (by id, or by app, tag, environment)."""
        function_id = str(payload.get("function_id", ""))
        if not function_id:
            app, function = payload.get("app"), payload.get("function")
            if not app or not function:
                raise HttpError(
                    400, 'expected {"function_id": ID} or {"app": NAME, "function": TAG}'
                )
            definition = runtime.state.apps.lookup_function(
                str(app), str(payload.get("environment", "")), str(function)
            )[1]
            function_id = definition.function_id
        return function_id

    def run_schedule(body: bytes) -> Any:
        function_id = selected(json_object(body))
        call_id = runtime.fire_schedule(function_id, reason="fired by /_emulator/schedules/run")
        return _json(200, {"function_call_id": call_id, "function_id": function_id})

    def pause_schedule(body: bytes) -> Any:
        payload = json_object(body)
        app, function = payload.get("app"), payload.get("function")
        paused = payload.get("paused", True)
        if not isinstance(app, str) or not app or not isinstance(function, str) or not function:
            raise HttpError(400, 'expected {"app": NAME, "function": TAG, "paused": true|false}')
        if not isinstance(paused, bool):
            raise HttpError(400, '"paused" must be true or false')
        # By name, so the app (even its environment) need not exist yet; "" is the default
        # environment, which must exist.
        env_name = str(payload.get("environment", ""))
        try:
            with runtime.state.store.read() as db:
                env_name = runtime.state.environments.resolve(env_name, db).name
        except NotFound:
            if not env_name:
                raise
        runtime.pause_schedule(env_name, app, function, paused)
        return _json(
            200, {"environment": env_name, "app": app, "function": function, "paused": paused}
        )

    control.reset_hooks.append(runtime.reset)
    control.extra_routes[("GET", "/_emulator/containers")] = containers
    control.extra_routes[("GET", "/_emulator/edge")] = edge
    control.extra_routes[("POST", "/_emulator/schedules/run")] = run_schedule
    control.extra_routes[("POST", "/_emulator/schedules/pause")] = pause_schedule
