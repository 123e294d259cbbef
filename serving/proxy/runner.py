"""How one proxy process serves: the proxy's own HTTP server (serving/proxy/httpserver.py) or
uvicorn (``--server uvicorn``), until SIGTERM/SIGINT, then a graceful shutdown. Used by the
CLI in its own process (``--workers 1``) and by each worker process (serving/proxy/workers.py).
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import sys
from typing import Any

import uvicorn

from serving.proxy.app import ProxyApp, ProxyConfig
from serving.proxy.httpserver import ServerLimits, serve
from serving.proxy.logs import configure_logging


def server_limits(config: ProxyConfig) -> ServerLimits:
    return ServerLimits(max_head_bytes=config.max_head_bytes, head_timeout_s=config.head_timeout_s)


def tune_gc() -> None:
    """Fewer, cheaper GC passes: the start-up heap is frozen, young-object collections are
    rarer. Called once the app is built, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def run_own_server(app: ProxyApp, config: ProxyConfig, sock: socket.socket) -> None:
    """The proxy's own server on ``sock`` (bound, not listening yet), on uvloop when
    installed, until SIGTERM/SIGINT, then a graceful shutdown (open requests get up to 30 s)."""
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(app, sock, server_limits(config), stop)

    with runner:
        runner.run(main())


def http_protocol(config: ProxyConfig) -> Any:
    """uvicorn's ``http`` setting: httptools with the head limits (serving/proxy/server.py)
    when httptools is installed, else uvicorn's h11 (its own 16 KiB head limit; no head
    timeout)."""
    try:
        from serving.proxy.server import guarded_httptools_protocol
    except ImportError:
        return "h11"
    return guarded_httptools_protocol(config.max_head_bytes, config.head_timeout_s)


def uvicorn_settings(config: ProxyConfig) -> dict[str, Any]:
    """uvicorn's settings for the proxy (``--server uvicorn``), but where to listen."""
    return {
        "loop": "auto",  # uvloop when installed
        "http": http_protocol(config),  # httptools + head limits when installed
        "ws": "none",
        "lifespan": "on",
        "access_log": False,
        "server_header": False,
        "log_level": "warning",
        "timeout_keep_alive": 75,
        "timeout_graceful_shutdown": 30,  # on SIGTERM: let open streams finish, at most 30 s
        "proxy_headers": False,  # client addresses are not used; skip uvicorn's middleware
        "backlog": 4096,
    }


def run_uvicorn(
    app: ProxyApp,
    config: ProxyConfig,
    where: tuple[str, int] | socket.socket,
    access_log: bool,
    shared_stream: bool = False,
) -> None:
    """uvicorn on ``(host, port)`` (it binds; one process) or on a socket (a worker's
    SO_REUSEPORT one), until SIGTERM/SIGINT, then a graceful shutdown.

    uvicorn's ``Config`` runs ``logging.config.dictConfig``, which closes every handler there
    is, the proxy's batching one included: its flusher stopped, and access lines then waited
    for the next warning or the 512th line. So the proxy's logging is set up again after it.

    On a socket (a worker) it returns after the graceful shutdown instead of dying of the
    signal: uvicorn re-raises the signal it caught once it has shut down, which here finds
    the handler set below (so the worker exits 0, like the own server's); that handler also
    catches a signal that comes before uvicorn's own are in place (uvicorn then stops as soon
    as it has started). In its own process it dies of the signal, as it always did."""
    if isinstance(where, socket.socket):
        settings = uvicorn.Config(app, **uvicorn_settings(config))
        sockets: list[socket.socket] | None = [where]
    else:
        settings = uvicorn.Config(app, host=where[0], port=where[1], **uvicorn_settings(config))
        sockets = None
    configure_logging(access_log, shared_stream=shared_stream)
    server = uvicorn.Server(settings)
    if sockets is not None:

        def stop(sig: int, frame: object) -> None:
            server.should_exit = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
    server.run(sockets=sockets)
    if not server.started:  # as uvicorn.run: it could not start (e.g. the port is taken)
        sys.exit(3)
