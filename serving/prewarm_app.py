"""The Modal app that applies a service's scheduled pre-warm windows (serving/prewarm.py).

Deployed per service by the App resource (as `<service>-prewarm`, `app_file` this file) with a
JSON config in place of a serving spec (the file env SERVING_SPEC names at deploy time; it is
baked into the image ENV, so a change of windows changes the definition and redeploys):

    {"target_app": "chat", "server": "Serving", "base_min_containers": 0,
     "windows": [{"cron": "30 8 * * 1-5", "duration_minutes": 570, "min_containers": 2}]}

Every 5 minutes (`modal.Cron("*/5 * * * *")`, so a window opens within 5 minutes of its cron
time: start windows a little before the peak) `prewarm` computes the minimum the service
should have now and, when the live autoscaler differs, sets it with the client's
`Server.autoscaler.update(min_containers=...)` (FunctionUpdateSchedulingParams); after the
last window it sets the base back. A deploy of the service resets Modal's override to the
decorator's value (modal 1.6.4 `update_autoscaler` docstring); the next run re-applies an open
window within 5 minutes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import modal

CONFIG_ENV = "PREWARM_CONFIG"  # the config, baked into the image ENV (so a change redeploys)
if modal.is_local():
    CONFIG_TEXT = Path(os.environ.get("SERVING_SPEC") or "prewarm.json").read_text()
else:
    CONFIG_TEXT = os.environ[CONFIG_ENV]
CONFIG: dict[str, Any] = json.loads(CONFIG_TEXT)
APP_NAME = os.environ.get("SERVING_APP_NAME") or f"{CONFIG['target_app']}-prewarm"
EVERY = "*/5 * * * *"
# Modal runs this file as /root/prewarm_app.py; beside it ship these modules and nothing else
# of serving/ (a literal: components/modal/_source.py digests exactly what ships without
# importing this file; serving/app.py says how a module name is found).
SHIPPED_MODULES = ("serving.__init__", "serving.prewarm")

image = (
    modal.Image.debian_slim(python_version="3.11")
    .env({CONFIG_ENV: json.dumps(CONFIG, sort_keys=True), "SERVING_APP_NAME": APP_NAME})
    .add_local_python_source(*SHIPPED_MODULES)
)
app = modal.App(APP_NAME)


def _apply(now: dt.datetime) -> dict[str, Any]:
    from serving.prewarm import desired_min, parse_windows

    windows = parse_windows(CONFIG["windows"])
    want = desired_min(windows, int(CONFIG["base_min_containers"]), now)
    server = modal.Server.from_name(CONFIG["target_app"], CONFIG.get("server") or "Serving")
    live = server.autoscaler.settings().min_containers
    if live != want:
        server.autoscaler.update(min_containers=want)
    print(
        f"prewarm {CONFIG['target_app']}: min_containers {live} -> {want} at {now.isoformat()}",
        flush=True,
    )
    return {"target_app": CONFIG["target_app"], "was": live, "min_containers": want}


@app.function(image=image, schedule=modal.Cron(EVERY), timeout=120, max_containers=1)
def prewarm(at: str = "") -> dict[str, Any]:
    """Apply the windows now (or at `at`, an ISO time with offset: for tests and dry runs)."""
    now = dt.datetime.fromisoformat(at) if at else dt.datetime.now(dt.UTC)
    return _apply(now)
