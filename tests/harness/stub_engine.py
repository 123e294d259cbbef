"""A stub OpenAI-compatible engine for tests and benchmarks: the product's stand-in engine
(dev/standin_engine.py) plus test-only knobs.

What it adds to the stand-in:
- any model name is accepted, and completions are ``tokens`` (default 8) pieces ``tok0 tok1 ...``;
- ``/health`` can be forced (``health_status``, e.g. 503) or fail the next ``health_fail_next``
  polls, and every poll is counted (``health_hits``);
- the routes that must never be exposed (``DANGEROUS_ROUTES``: ``/invocations``, ``/tokenize``,
  ``/sleep``, ``/wake_up``, ``/release_memory_occupation`` and more) answer 200, so a test can
  prove the proxy never forwarded them (every hit is recorded);
- failures on demand (``fail``): ``"500"``, ``"die_mid_stream"`` (drop the connection after
  ``fail_after_tokens`` tokens), ``"die_mid_body"`` (non-stream: drop the connection half-way
  through the body), ``"pause"`` (stop ``pause_s`` seconds after ``fail_after_tokens`` tokens),
  ``"pause_mid_event"`` (same, but after sending half of the next event's bytes; with
  ``fail_after_tokens == tokens``, the usage chunk is cut inside its completion_tokens number);
  refusing connections is ``StubEngine.stop()`` / ``refuse_for(s)`` (nothing listens);
- a record of every request (method, raw path, headers, body, status, tokens sent, and
  whether the client went away before the end: ``cancelled``).

Streams, usage (``force_include_usage``: every stream ends with the usage-only chunk, SGLang's
``--stream-response-default-include-usage``; add ``continuous_usage`` for vLLM's
``--enable-force-include-usage``), pacing (``token_delay_ms``, ``first_token_delay_ms``) and
``startup_delay_s`` are the stand-in's own.

Behaviour is set at start (CLI flags / constructor keywords), changed at run time with
``POST /_stub/config`` / ``configure(**kw)``, or per request with a ``"stub"`` object in the
JSON body, e.g. ``{"model": "m", "stream": true, "stub": {"fail": "die_mid_stream"}}``.

Python API: ``StubEngine(**behaviour).start()`` runs it in-process (uvicorn in a thread;
``open_connections`` counts the TCP connections it holds, for leak checks);
``StubEngineProcess(**behaviour).start()`` runs ``python -m tests.harness.stub_engine`` as a
subprocess. Both have ``.url``, ``.port``, ``.requests(path=None)``, ``.reset()``,
``.configure(**kw)``, ``.stop()``. Control endpoints: ``GET /_stub/log``,
``POST /_stub/reset``, ``GET|POST /_stub/config``.

CLI: ``python -m tests.harness.stub_engine --port 0 --tokens 16 --token-delay-ms 20`` prints
``stub engine port: http://127.0.0.1:PORT`` once the port is bound and
``stub engine ready: http://127.0.0.1:PORT`` once it listens (``--listen-delay-s S`` keeps
connections refused for S seconds in between, like an engine loading its model).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import uvicorn

from standin_engine import (
    PROJECT_ROOT,
    Exchange,
    Message,
    Receive,
    Scope,
    Send,
    Settings,
    StandinEngineApp,
    StandinEngineProcess,
    bind_socket,
    read_body,
    respond,
    serve,
    settings_options,
)

__all__ = [
    "DANGEROUS_ROUTES", "PROJECT_ROOT", "Behaviour", "Message", "Receive", "Scope", "Send",
    "StubEngine", "StubEngineApp", "StubEngineProcess", "UvicornThread", "bind_socket",
    "running_stub",
]  # fmt: skip

FAIL_MODES = ("500", "die_mid_stream", "die_mid_body", "pause", "pause_mid_event")
DANGEROUS_ROUTES = (  # vLLM and SGLang routes (some dev-mode only) that must never be exposed
    "/invocations", "/tokenize", "/detokenize", "/sleep", "/wake_up", "/is_sleeping",
    "/release_memory_occupation", "/resume_memory_occupation", "/collective_rpc",
    "/reset_prefix_cache", "/pause", "/resume", "/update_weights", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/server_info", "/get_server_info", "/get_model_info",
    "/model_info", "/flush_cache", "/health_generate", "/generate", "/update_weights_from_disk",
    "/start_profile", "/stop_profile", "/scale_elastic_ep", "/pooling", "/classify", "/score",
    "/rerank", "/v1/responses", "/v1/audio/transcriptions",
)  # fmt: skip
_PER_REQUEST = (
    "tokens", "token_delay_ms", "first_token_delay_ms", "fail", "fail_after_tokens", "pause_s",
    "force_include_usage", "continuous_usage",
)  # fmt: skip


@dataclasses.dataclass
class Behaviour(Settings):
    """What the stub does; every field can be set at start, at run time, or per request."""

    model: str = "stub-model"
    check_model: bool = False  # any model name is served
    tokens: int | None = 8
    fail: str | None = None
    fail_after_tokens: int = 2
    pause_s: float = 0.0
    health_status: int | None = None  # force /health to answer this (e.g. 503)
    health_fail_next: int = 0  # the next N /health polls answer 503 (counts down per poll)
    record: bool = True  # keep a log of requests (the bench turns it off)

    def update(self, values: Mapping[str, Any]) -> None:
        if "fail" in values and values["fail"] not in (None, *FAIL_MODES):
            raise ValueError(f"fail must be one of {FAIL_MODES} or null, got {values['fail']!r}")
        super().update(values)


def _behaviour(ex: Exchange) -> Behaviour:
    assert isinstance(ex.s, Behaviour)  # StubEngineApp.settings_for returns one
    return ex.s


class _StubDeath(Exception):
    """Raised inside the ASGI app to make uvicorn drop the connection mid-response."""


class StubEngineApp(StandinEngineApp):
    """The ASGI app. Records are plain dicts (JSON-ready) in ``self.records``."""

    settings: Behaviour

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        super().__init__(behaviour or Behaviour())
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=10000)
        self.health_hits = 0
        self._next_id = 0

    @property
    def behaviour(self) -> Behaviour:
        return self.settings

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/health":
            self.health_hits += 1
            await respond(send, self.health_status(), {"status": "stub"})
        elif scope["path"].startswith("/_stub/"):
            await self._control(scope["path"], scope["method"], receive, send)
        else:
            await super().handle(scope, receive, send)

    def health_status(self) -> int:
        b = self.behaviour
        status = super().health_status()
        if status != 200:
            return status
        if b.health_fail_next > 0:
            b.health_fail_next -= 1
            return 503
        return b.health_status or 200

    def new_call(self, scope: Scope, body: bytes) -> dict[str, Any]:
        self._next_id += 1
        record: dict[str, Any] = {
            **super().new_call(scope, body),
            "id": self._next_id,
            "method": scope["method"],
            "path": scope["path"],
            "raw_path": (scope.get("raw_path") or b"").decode("latin-1"),
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
            "body": body[:65536].decode("utf-8", "replace"),
            "started_at": time.time(),
            "finished_at": None,
        }
        if self.behaviour.record:
            self.records.append(record)
        return record

    async def route(
        self, scope: Scope, body: bytes, call: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        try:
            if scope["path"] in DANGEROUS_ROUTES:
                call["status"] = 200
                await respond(
                    send, 200, {"ok": True, "stub": f"dangerous route {scope['path']} reached"}
                )
            else:
                await super().route(scope, body, call, receive, send)
        finally:
            call["finished_at"] = time.time()

    async def _control(self, path: str, method: str, receive: Receive, send: Send) -> None:
        if path == "/_stub/log" and method == "GET":
            await respond(
                send, 200, {"requests": list(self.records), "health_hits": self.health_hits}
            )
        elif path == "/_stub/reset" and method == "POST":
            self.records.clear()
            self.health_hits = 0
            await respond(send, 200, {"ok": True})
        elif path == "/_stub/config" and method in ("GET", "POST"):
            if method == "POST":
                try:
                    self.behaviour.update(json.loads(await read_body(receive) or b"{}"))
                except (ValueError, TypeError) as exc:
                    await respond(send, 400, {"error": str(exc)})
                    return
            await respond(send, 200, dataclasses.asdict(self.behaviour))
        else:
            await respond(send, 404, {"error": f"no stub control route {method} {path}"})

    def settings_for(self, request: dict[str, Any]) -> Behaviour:
        b = dataclasses.replace(self.behaviour)
        overrides = request.get("stub")
        if isinstance(overrides, dict):
            b.update({k: v for k, v in overrides.items() if k in _PER_REQUEST})
        return b

    async def generate(self, ex: Exchange) -> None:
        if _behaviour(ex).fail == "500":
            ex.call["status"] = 500
            error = {"message": "stub: internal error on demand", "type": "InternalServerError"}
            await respond(ex.send, 500, {"error": {**error, "code": 500}})
            return
        await super().generate(ex)

    def pieces(self, request: dict[str, Any], s: Settings) -> tuple[list[str], str]:
        return [f"tok{i} " for i in range(s.tokens or 0)], "length"

    async def send_completion(self, ex: Exchange, payload: bytes, tokens: int) -> None:
        send = ex.send
        if _behaviour(ex).fail == "die_mid_body":
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ]})  # fmt: skip
            await send({"type": "http.response.body", "body": payload[: len(payload) // 2],
                        "more_body": True})  # fmt: skip
            raise _StubDeath("stub: dying mid-body on demand")
        await super().send_completion(ex, payload, tokens)

    async def send_event(self, ex: Exchange, index: int, event: bytes) -> bool:
        b, cancel, send = _behaviour(ex), ex.cancel, ex.send
        if index == b.fail_after_tokens:
            if b.fail == "die_mid_stream":
                raise _StubDeath("stub: dying mid-stream on demand")
            if b.fail == "pause":
                await cancel.sleep(b.pause_s)
                if cancel.cancelled:
                    return False
            if b.fail == "pause_mid_event":
                half = len(event) // 2
                await send({"type": "http.response.body", "body": event[:half], "more_body": True})
                await cancel.sleep(b.pause_s)
                if cancel.cancelled:
                    return False
                event = event[half:]
        return await super().send_event(ex, index, event)

    async def before_tail(self, ex: Exchange, tail: bytes) -> bytes | None:
        b, cancel, send = _behaviour(ex), ex.cancel, ex.send
        if tail and b.fail == "pause_mid_event" and b.fail_after_tokens == b.tokens:
            # split the usage chunk inside its completion_tokens number
            cut = tail.index(b'"completion_tokens": ') + len(b'"completion_tokens": ') + 1
            await send({"type": "http.response.body", "body": tail[:cut], "more_body": True})
            await cancel.sleep(b.pause_s)
            if cancel.cancelled:
                return None
            return tail[cut:]
        return tail


# ---- running it -----------------------------------------------------------------------------


class UvicornThread:
    """Any ASGI app served by uvicorn in a background thread on a loopback port.

    Used for the stub engine and, in tests, for the proxy itself.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn_kw: Any) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.uvicorn_kw = uvicorn_kw
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> UvicornThread:
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        kw: dict[str, Any] = {
            "log_level": "critical", "access_log": False, "lifespan": "on", "ws": "none",
            "timeout_graceful_shutdown": 1, "backlog": 4096,
        }  # fmt: skip
        kw.update(self.uvicorn_kw)
        server = uvicorn.Server(uvicorn.Config(self.app, **kw))
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn:{self.port}"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn on {self.url} did not start within {timeout} s")
            time.sleep(0.005)
        self._sock = sock  # asyncio listens on this very socket (uvloop on a duplicate)
        return self

    def stop(self) -> None:
        self.request_stop()
        self.join()

    def request_stop(self) -> None:
        """Ask the server to exit without waiting (stop several servers at once, then join)."""
        if self._server is not None:
            self._server.should_exit = True

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = None
        self._thread = None
        self._sock = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def open_connections(self) -> int:
        """Client connections the server holds open right now (for leak checks)."""
        server = self._server
        return 0 if server is None else len(server.server_state.connections)


class StubEngine:
    """The stub engine in-process (uvicorn thread). ``stop()``/``start()`` keep port and log."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **behaviour: Any) -> None:
        self.behaviour = Behaviour(**behaviour)
        self.app = StubEngineApp(self.behaviour)
        self._server = UvicornThread(self.app, host=host, port=port)

    def start(self) -> StubEngine:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def request_stop(self) -> None:
        self._server.request_stop()

    def join(self) -> None:
        self._server.join()

    def refuse_for(self, seconds: float) -> threading.Thread:
        """Stop listening now and listen again on the same port after ``seconds``."""
        self.stop()

        def later() -> None:
            time.sleep(seconds)
            self.start()

        thread = threading.Thread(target=later, daemon=True)
        thread.start()
        return thread

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def open_connections(self) -> int:
        """TCP connections open to the stub right now (a proxy's pool, or leaked ones)."""
        return self._server.open_connections

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        return [dict(r) for r in list(self.app.records) if path is None or r["path"] == path]

    def reset(self) -> None:
        self.app.records.clear()
        self.app.health_hits = 0

    def configure(self, **values: Any) -> None:
        self.behaviour.update(values)

    def __enter__(self) -> StubEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StubEngineProcess(StandinEngineProcess):
    """The stub engine as a subprocess (``python -m tests.harness.stub_engine``)."""

    module = "tests.harness.stub_engine"
    label = "stub engine"

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        Behaviour(**settings)  # validate names early

    def options(self) -> list[str]:
        record = self.behaviour.get("record", True)
        rest = StandinEngineProcess.options(self)
        return [o for o in rest if o != "--record"] + ([] if record else ["--no-record"])

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def requests(self, path: str | None = None) -> list[dict[str, Any]]:
        records = self._call("GET", "/_stub/log")["requests"]
        return [r for r in records if path is None or r["path"] == path]

    def reset(self) -> None:
        self._call("POST", "/_stub/reset", {})

    def configure(self, **values: Any) -> None:
        self._call("POST", "/_stub/config", values)


@contextlib.contextmanager
def running_stub(**behaviour: Any) -> Iterator[StubEngine]:
    """``with running_stub(tokens=4) as engine: ...`` (in-process)."""
    engine = StubEngine(**behaviour).start()
    try:
        yield engine
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(
        prog="python -m tests.harness.stub_engine", description=__doc__.split("\n")[0]
    )
    d = Behaviour()
    settings_options(p, d)
    p.add_argument("--model", default=d.model)
    p.add_argument("--fail", choices=FAIL_MODES, default=None)
    p.add_argument("--fail-after-tokens", type=int, default=d.fail_after_tokens)
    p.add_argument("--pause-s", type=float, default=d.pause_s)
    p.add_argument("--health-status", type=int, default=None)
    p.add_argument("--health-fail-next", type=int, default=d.health_fail_next,
                   help="the first N /health polls answer 503")  # fmt: skip
    p.add_argument("--force-include-usage", action="store_true",
                   help="end every stream with a usage chunk, asked for or not")  # fmt: skip
    p.add_argument("--continuous-usage", action="store_true",
                   help="running usage on every stream chunk (with --force-include-usage: "
                   "vLLM's --enable-force-include-usage)")  # fmt: skip
    p.add_argument("--no-record", action="store_true", help="keep no request log (benchmarks)")
    args = p.parse_args(argv)
    behaviour = Behaviour(
        model=args.model, tokens=args.tokens, token_delay_ms=args.token_delay_ms,
        first_token_delay_ms=args.first_token_delay_ms, startup_delay_s=args.startup_delay_s,
        fail=args.fail, fail_after_tokens=args.fail_after_tokens, pause_s=args.pause_s,
        health_status=args.health_status, record=not args.no_record,
        health_fail_next=args.health_fail_next, force_include_usage=args.force_include_usage,
        continuous_usage=args.continuous_usage,
    )  # fmt: skip
    return serve(
        StubEngineApp(behaviour), args.host, args.port, label="stub engine",
        listen_delay_s=args.listen_delay_s,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
