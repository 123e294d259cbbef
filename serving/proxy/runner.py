"""How one proxy process serves: uvicorn (httptools with the head limits of server.py, uvloop)
on a bound socket, until SIGTERM/SIGINT, then a graceful shutdown. Used by the CLI in its own
process (``--workers 1``) and by each worker process (serving/proxy/workers.py).

Why uvicorn and not an HTTP server of our own: the proxy had one (serving/proxy/httpserver.py,
~970 lines, no coroutine per request) beside uvicorn until issue 33 measured both in front of
the same engine, same run, targets interleaved: bench run AP, 2026-11-28, one NVIDIA H200,
vLLM 0.26.0, a Llama-3.2-1B-shaped model, server cores 0-7, clients 8-15,
``python3 -m bench.gpu.remote run --phases bench --uvicorn-proxy --plan
256:3:2048,1024:2:4096`` (bench/gpu/remote.py as of 42ca547, whose ``--uvicorn-proxy`` started
the second proxy on ``--server uvicorn``; proxy CPU: % of one core, per round):

    streams  target              TTFT p99 ms  tokens/s  vs direct  proxy CPU
    256      direct                    243.7     19799     1.000x  -
    256      proxy (own server)        241.2     20713     1.046x  41-44
    256      proxy on uvicorn          257.7     19469     0.983x  53-62
    1024     direct                   1014.8     20986     1.000x  -
    1024     proxy (own server)        870.6     21570     1.028x  45-47
    1024     proxy on uvicorn          918.0     21243     1.012x  67-76

Tokens/s vary +-10 % from round to round for the same target (19.2k-22.8k), so throughput is
the same within noise; TTFT p99 is 17 ms (256) and 47 ms (1024) longer on uvicorn, 5-7 %, and
the proxy uses ~0.15-0.3 of a core more, beside ~3 cores of vLLM's API servers. No user would
notice that, so the well-kept library serves and our own server is gone (docs/proxy.md, "Why
uvicorn").
"""

from __future__ import annotations

import gc
import signal
import socket
import sys
from typing import Any

import uvicorn
import uvloop

from serving.proxy.app import ProxyApp, ProxyConfig
from serving.proxy.logs import configure_logging
from serving.proxy.server import guarded_httptools_protocol


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet: uvicorn listens on it).
    ``reuse_port``: with SO_REUSEPORT, so that several processes (``--workers``) can each
    listen on the port and the kernel spreads new connections across them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def tune_gc() -> None:
    """Fewer, cheaper GC passes: the start-up heap is frozen, young-object collections are
    rarer. Called once the app is built, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def uvicorn_settings(config: ProxyConfig) -> dict[str, Any]:
    """uvicorn's settings for the proxy, but where to listen."""
    return {
        "loop": "uvloop",  # for uvicorn's own run(); run_uvicorn runs the server on uvloop itself
        "http": guarded_httptools_protocol(config.max_head_bytes, config.head_timeout_s),
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
    sock: socket.socket,
    access_log: bool,
    shared_stream: bool = False,
) -> None:
    """uvicorn on ``sock`` (bound by ``bind``, not listening yet), until SIGTERM/SIGINT, then
    a graceful shutdown (open requests get up to 30 s); returns then, so the process exits 0.

    uvicorn's ``Config`` runs ``logging.config.dictConfig``, which closes every handler there
    is, the proxy's batching one included: its flusher stopped, and access lines then waited
    for the next warning or the 512th line. So the proxy's logging is set up again after it.

    uvicorn re-raises the signal it caught once it has shut down (uvicorn 0.54.0,
    ``Server.capture_signals``); that finds the handler set below, so the process returns
    instead of dying of the signal. The handler also catches a signal that comes before
    uvicorn's own are in place (uvicorn then stops as soon as it has started)."""
    settings = uvicorn.Config(app, **uvicorn_settings(config))
    configure_logging(access_log, shared_stream=shared_stream)
    server = uvicorn.Server(settings)

    def stop(sig: int, frame: object) -> None:
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    # What uvicorn's Server.run does (0.54.0: asyncio.run of serve() on the configured loop),
    # on uvloop named here: the bench's figures are on it.
    uvloop.run(server.serve(sockets=[sock]))
    if not server.started:  # as uvicorn.run: it could not start
        sys.exit(3)
