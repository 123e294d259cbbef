"""CLI: ``python -m serving.proxy --upstream URL --port PORT [options]`` (served by uvicorn on
uvloop + httptools with the proxy's head limits, serving/proxy/runner.py; one process, or
``--workers N`` processes on the port: serving/proxy/workers.py).

Keys come from env ``SERVING_API_KEYS``; without valid keys the proxy refuses to start (exit 2)
with a message that names the problem but never a key or digest.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from serving.proxy.app import ProxyApp, ProxyConfig
from serving.proxy.keys import ENV_VAR, KeyConfigError, KeyRing
from serving.proxy.logs import configure_logging, log_event
from serving.proxy.runner import bind, run_uvicorn, tune_gc
from serving.proxy.workers import run_workers, worker_config

__all__ = ["TUNABLES", "build_parser", "main"]


def _key_limit(text: str) -> tuple[str, int]:
    """``NAME=N`` of ``--key-max-in-flight``."""
    name, sep, value = text.partition("=")
    if not (sep and name and value.strip().isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=N (a key name of SERVING_API_KEYS, then its limit), e.g. ci=16"
        )
    return name, int(value)


#: The ProxyConfig fields set by a flag of the same name (`--max-in-flight` sets max_in_flight,
#: of the field's type, defaulting to the field's default), with the flag's help.
TUNABLES: dict[str, str] = {
    "max_in_flight": "engine requests in progress before answering 429 (streams count until"
    " they end)",
    "fair_wait_s": "when every slot is taken, a request of a key below its fair share"
    " (--max-in-flight / keys active) waits this long at most for a slot (429 after; 0: at"
    " once)",
    "max_body_bytes": "largest request body accepted (413 above)",
    "keepalive_s": "SSE keep-alive comment after this many silent seconds",
    "health_interval_s": "how often to poll the engine's /health",
    "health_timeout_s": "a /health poll slower than this counts as a failed poll",
    "unready_after_failures": "failed /health polls in a row before a ready engine is marked"
    " not ready",
    "upstream_timeout_s": "how long to wait for the engine's response head, or for a whole"
    " non-stream answer (504 after); also a stream's longest silence",
    "upstream_idle_s": "how long an idle engine connection is kept for reuse; the engine's"
    " keep-alive must be longer (vLLM: env VLLM_HTTP_TIMEOUT_KEEP_ALIVE, SGLang: env"
    " SGLANG_TIMEOUT_KEEP_ALIVE)",
    "upstream_max_connecting": "new engine connections being made at once, at most (a burst"
    " ramps up; requests past it wait for a slot or a freed connection)",
    "connect_retries": "retries on connect refused (nothing was sent)",
    "max_buffered_bytes": "request + non-stream response bodies held at once, all requests"
    " together (503 proxy_buffers_full above)",
    "body_timeout_s": "a request body must be complete this long after the request started (408)",
    "max_head_bytes": "largest request head, request line + headers (431 above)",
    "head_timeout_s": "a request head must be complete this long after its first byte (or the"
    " connection's start) (408)",
}


def build_parser() -> argparse.ArgumentParser:
    d = ProxyConfig(upstream="")
    p = argparse.ArgumentParser(
        prog="python -m serving.proxy",
        description=f"Auth proxy in front of an OpenAI-compatible engine. Keys: env {ENV_VAR}.",
    )
    p.add_argument("--upstream", required=True, help="engine base URL, e.g. http://127.0.0.1:8001")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    for name, help_text in TUNABLES.items():
        default = getattr(d, name)
        p.add_argument(
            "--" + name.replace("_", "-"), type=type(default), default=default, help=help_text
        )
    p.add_argument("--key-max-in-flight", action="append", default=[], metavar="NAME=N",
                   type=_key_limit,
                   help="a key's own limit on its requests in flight (429 key_at_limit above), "
                   "NAME as in SERVING_API_KEYS; repeat for more keys; keys not named share "
                   "--max-in-flight fairly")  # fmt: skip
    p.add_argument("--workers", type=int, default=1,
                   help="server processes sharing the port (SO_REUSEPORT), like the engine's "
                   "API servers; --max-in-flight stays the total, --max-buffered-bytes is "
                   "split between them (default 1: one process)")  # fmt: skip
    p.add_argument("--no-access-log", action="store_true", help="do not write JSON access logs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        keys = KeyRing.from_json(os.environ.get(ENV_VAR))
    except KeyConfigError as exc:
        print(f"serving.proxy: refusing to start: {exc}", file=sys.stderr)
        return 2
    try:
        config = ProxyConfig(
            upstream=args.upstream,
            **{name: getattr(args, name) for name in TUNABLES},
            key_max_in_flight=dict(args.key_max_in_flight),
        )
        if args.workers < 1:
            raise ValueError(f"--workers {args.workers} is invalid: it must be at least 1")
        # Built here in either case: it refuses a bad upstream URL before any process
        # starts. With --workers this one is only that check; each worker builds its own.
        app = ProxyApp(config, keys)
        if args.workers > 1:
            worker_config(config, args.workers)  # the buffer budget's split must hold a body
    except ValueError as exc:
        print(f"serving.proxy: refusing to start: {exc}", file=sys.stderr)
        return 2
    configure_logging(not args.no_access_log, shared_stream=args.workers > 1)
    log_event(
        logging.WARNING, "proxy_starting", port=args.port, upstream=args.upstream,
        key_names=keys.names, max_in_flight=config.max_in_flight,
        key_max_in_flight=dict(config.key_max_in_flight), workers=args.workers,
    )  # fmt: skip
    if args.workers > 1:
        return run_workers(config, args.workers, args.host, args.port, not args.no_access_log)
    tune_gc()
    run_uvicorn(app, config, bind(args.host, args.port), not args.no_access_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
