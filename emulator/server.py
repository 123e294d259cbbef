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


def ready_line(grpc_url: str, http_url: str, options: Options) -> str:
    """The one line printed on stdout once both ports accept connections."""
    where = str(options.state_path) if options.state_path else ":memory:"
    auth = "token" if options.token_id else "any-token"
    return (
        f"MODAL EMULATOR READY grpc={grpc_url} http={http_url} "
        f"workspace={options.workspace} state={where} auth={auth}"
    )


async def serve(options: Options) -> None:
    """Run until SIGTERM/SIGINT; always closes the servers and the store."""
    store = Store(options.state_path)
    state = State(store, options.workspace)
    counter = RpcCounter()
    control = ControlServer(state, counter, options.host, options.http_port)
    http_port = await control.start()
    http_url = f"http://{options.host}:{http_port}"
    config = ServerConfig(
        workspace=options.workspace,
        http_url=http_url,
        token_id=options.token_id,
        token_secret=options.token_secret,
    )
    grpc_server = Server([build_servicer(state, config, counter)])
    try:
        await grpc_server.start(options.host, options.port)
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
        grpc_server.close()
        try:
            await asyncio.wait_for(grpc_server.wait_closed(), timeout=5)
        except TimeoutError:
            log.warning("gRPC connections did not close within 5 s; exiting anyway")
        await control.close()
        store.close()
        log.info("stopped cleanly")
