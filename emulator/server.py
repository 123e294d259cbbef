"""Process wiring: open the store, serve gRPC and HTTP on loopback, stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from grpclib.server import Server

from emulator.handlers.base import RpcCounter, ServerConfig, build_servicer
from emulator.http import ControlServer
from emulator.models import State
from emulator.models.apps import DEFAULT_HEARTBEAT_TIMEOUT
from emulator.store import Store

log = logging.getLogger("emulator")


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 8790
    http_port: int = 8791
    state_path: Path | None = None  # None: in memory
    workspace: str = "emu-workspace"
    token_id: str | None = None
    token_secret: str | None = None
    rbac: bool = False
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT


def ready_line(grpc_url: str, http_url: str, options: Options) -> str:
    """The one line printed on stdout once both ports accept connections."""
    where = str(options.state_path) if options.state_path else ":memory:"
    auth = "token" if options.token_id else "any-token"
    rbac = "on" if options.rbac else "off"
    return (
        f"MODAL EMULATOR READY grpc={grpc_url} http={http_url} "
        f"workspace={options.workspace} state={where} auth={auth} rbac={rbac}"
    )


async def serve(options: Options) -> None:
    """Run until SIGTERM/SIGINT; always closes whatever was opened (servers, store).

    A failure to start (a taken port, a locked or incompatible state file) propagates as the
    original exception (OSError / StoreError) after the cleanup; `__main__` turns it into a
    message and a non-zero exit.
    """
    store = Store(options.state_path)
    control: ControlServer | None = None
    grpc_server: Server | None = None
    grpc_started = False
    try:
        state = State(store, options.workspace, heartbeat_timeout=options.heartbeat_timeout)
        counter = RpcCounter()
        credentials = (
            (options.token_id, options.token_secret)
            if options.token_id is not None and options.token_secret is not None
            else None
        )
        control = ControlServer(state, counter, options.host, options.http_port, credentials)
        http_port = await control.start()
        http_url = f"http://{options.host}:{http_port}"
        config = ServerConfig(
            workspace=options.workspace,
            http_url=http_url,
            token_id=options.token_id,
            token_secret=options.token_secret,
            rbac=options.rbac,
        )
        grpc_server = Server([build_servicer(state, config, counter)])
        await grpc_server.start(options.host, options.port)
        grpc_started = True
        inner = grpc_server._server
        sockets = list(getattr(inner, "sockets", None) or [])
        port = int(sockets[0].getsockname()[1]) if sockets else options.port
        grpc_url = f"http://{options.host}:{port}"

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        sys.stdout.write(ready_line(grpc_url, http_url, options) + "\n")
        sys.stdout.flush()
        log.info("serving Modal's control plane at %s (control surface %s)", grpc_url, http_url)
        await stop.wait()
        log.info("stopping")
    finally:
        if grpc_server is not None and grpc_started:
            grpc_server.close()
            try:
                await asyncio.wait_for(grpc_server.wait_closed(), timeout=5)
            except TimeoutError:
                log.warning("gRPC connections did not close within 5 s; exiting anyway")
        if control is not None:
            await control.close()
        store.close()
        if grpc_started:
            log.info("stopped cleanly")
