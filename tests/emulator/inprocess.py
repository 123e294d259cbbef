"""A runtime driven in-process through the RPC handlers, its loop never started: for tests of
what the handlers and the runtime do by themselves (no containers, no sockets, no waiting)."""

from __future__ import annotations

from pathlib import Path

from modal_proto import api_pb2

from emulator.handlers.apps import AppPublish
from emulator.handlers.base import Context, ServerConfig
from emulator.models import State
from emulator.runtime.manager import Runtime, RuntimeOptions
from emulator.store import Store


class InProcessRuntime:
    """A fresh in-memory state (environment `main`), a runtime on it and a handler context.
    Close with ``await runtime.close()`` (it removes its scratch directory)."""

    def __init__(self, data_dir: Path) -> None:
        self.state = State(Store(None), "ws")
        self.runtime = Runtime(self.state, RuntimeOptions(data_dir=data_dir, netns=False))
        self.ctx = Context(
            state=self.state,
            config=ServerConfig("ws", "http://127.0.0.1:1"),
            method="AppPublish",
            metadata={},
            runtime=self.runtime,
        )
        self.state.environments.get_or_create("main", True)

    def create_app(self, name: str, tag: str) -> tuple[str, str]:
        """An app in `main` with one precreated function `tag`: (app id, function id)."""
        app = self.state.apps.create("main", name, "initializing")
        return app.id, self.state.apps.precreate_function(app.id, tag).id

    def publish(
        self, app_id: str, name: str, function_id: str, def_id: str, fn: api_pb2.Function
    ) -> None:
        """Save `fn` as definition `def_id` of the app's function and deploy it (AppPublish)."""
        data = api_pb2.FunctionData(
            function_name=fn.function_name,
            ranked_functions=[api_pb2.FunctionData.RankedFunction(rank=0, function=fn)],
        )
        self.state.apps.save_definition(def_id, function_id, data.SerializeToString(), b"")
        AppPublish(
            self.ctx,
            api_pb2.AppPublishRequest(
                app_id=app_id,
                name=name,
                app_state=api_pb2.APP_STATE_DEPLOYED,
                function_ids={fn.function_name: function_id},
                definition_ids={function_id: def_id},
            ),
        )
