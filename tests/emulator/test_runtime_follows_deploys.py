"""The runtime follows a deploy, a stop and a rollback before the RPC answers.

On Modal a web URL answers as soon as `modal deploy` returns and stops answering once
`modal app stop` returns. The emulator once only woke its background loop in those RPCs, so a
request sent right after `modal deploy` could get 404 (CI saw it once in
test_runtime_server.py). Here the runtime's loop is never started: only what the handlers
do themselves can make the edge route the URL.

Kept (issue 33 item 7): the release gate probes the URL right after the deploy
(components/modal/_gate.py); modal 1.6.4 modal/runner.py `_deploy_app` returns once
`_publish_app` (AppPublish) has answered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from modal_proto import api_pb2

from emulator.handlers.apps import AppRollback, AppStop
from tests.emulator.inprocess import InProcessRuntime

URL_V1 = "https://ws--follow-web.modal.run"
URL_V2 = "https://ws--follow-web-v2.modal.run"


def test_publish_stop_and_rollback_change_routes_before_answering(tmp_path: Path) -> None:
    async def run() -> None:
        rt = InProcessRuntime(tmp_path)  # the runtime's loop is never started
        runtime, ctx = rt.runtime, rt.ctx
        app_id, fid = rt.create_app("follow", "web")

        def publish(def_id: str, url: str) -> None:
            rt.publish(
                app_id, "follow", fid, def_id, api_pb2.Function(function_name="web", web_url=url)
            )

        assert runtime.route(URL_V1) is None
        publish("fd-1", URL_V1)
        assert runtime.route(URL_V1) is not None  # deployed: routed at once

        publish("fd-2", URL_V2)  # a second version with another URL
        pool = runtime.route(URL_V2)
        assert pool is not None and pool.definition.id == "fd-2"
        assert runtime.route(URL_V1) is None

        AppRollback(ctx, api_pb2.AppRollbackRequest(app_id=app_id, version=1))
        rolled = runtime.route(URL_V1)
        assert rolled is not None and rolled.definition.id == "fd-1"

        AppStop(ctx, api_pb2.AppStopRequest(app_id=app_id))
        assert runtime.route(URL_V1) is None  # stopped: 404 from the next request on
        await runtime.close()  # removes its socket directory (no container ever ran)

    asyncio.run(run())
