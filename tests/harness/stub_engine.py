"""A stub OpenAI-compatible engine (vLLM/SGLang stand-in) for tests and benchmarks.

It serves what the real engines serve on localhost, with behaviour you set:
- ``/v1/chat/completions``, ``/v1/completions`` (stream and non-stream, with ``usage``; streams
  honour ``stream_options.include_usage``), ``/v1/embeddings``, ``/v1/models``, ``/health``
  (503 until ``startup_delay_s`` has passed, and for the next ``health_fail_next`` polls),
  ``/metrics``;
- the engines' "always report usage" switches: ``force_include_usage`` ends every stream with
  the usage-only chunk (``choices: []``) whatever the client asked (SGLang's
  ``--stream-response-default-include-usage``); add ``continuous_usage`` for running usage
  on every chunk too, which is what vLLM's ``--enable-force-include-usage`` does;
- the routes that must never be exposed (``/invocations``, ``/tokenize``, ``/sleep``,
  ``/wake_up``, ``/release_memory_occupation``, ``/resume_memory_occupation`` and a few more):
  they answer 200 so a test can prove the proxy never forwarded them (every hit is recorded);
- tokens at a set pace (``tokens``, ``token_delay_ms``, ``first_token_delay_ms``);
- failures on demand (``fail``): ``"500"``, ``"die_mid_stream"`` (drop the connection after
  ``fail_after_tokens`` tokens), ``"die_mid_body"`` (non-stream: drop the connection half-way
  through the body), ``"pause"`` (stop ``pause_s`` seconds after ``fail_after_tokens`` tokens),
  ``"pause_mid_event"`` (same, but after sending half of the next event's bytes; with
  ``fail_after_tokens == tokens``, the usage chunk is cut inside its completion_tokens number);
  refusing connections is ``StubEngine.stop()`` / ``refuse_for(s)`` (nothing listens);
- a record of every request (method, raw path, headers, body, status, tokens sent, and
  whether the client went away before the end: ``cancelled``).

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
import asyncio
import collections
import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
FAIL_MODES = ("500", "die_mid_stream", "die_mid_body", "pause", "pause_mid_event")
DANGEROUS_ROUTES = (  # vLLM and SGLang routes (some dev-mode only) that must never be exposed
    "/invocations", "/tokenize", "/detokenize", "/sleep", "/wake_up", "/is_sleeping",
    "/release_memory_occupation", "/resume_memory_occupation", "/collective_rpc",
    "/reset_prefix_cache", "/pause", "/resume", "/update_weights", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/server_info", "/get_server_info", "/get_model_info",
    "/flush_cache", "/health_generate", "/generate", "/update_weights_from_disk",
    "/start_profile", "/stop_profile", "/scale_elastic_ep", "/pooling", "/classify", "/score",
    "/rerank", "/v1/responses", "/v1/audio/transcriptions",
)  # fmt: skip
_PER_REQUEST = (
    "tokens", "token_delay_ms", "first_token_delay_ms", "fail", "fail_after_tokens", "pause_s",
    "force_include_usage", "continuous_usage",
)  # fmt: skip


@dataclasses.dataclass
class Behaviour:
    """What the stub does; every field can be set at start, at run time, or per request."""

    model: str = "stub-model"
    tokens: int = 8
    token_delay_ms: float = 0.0
    first_token_delay_ms: float = 0.0
    startup_delay_s: float = 0.0
    fail: str | None = None
    fail_after_tokens: int = 2
    pause_s: float = 0.0
    health_status: int | None = None  # force /health to answer this (e.g. 503)
    health_fail_next: int = 0  # the next N /health polls answer 503 (counts down per poll)
    # Streams end with the usage-only chunk even when the client did not ask (stream_options).
    force_include_usage: bool = False
    # Running usage on every stream chunk (vLLM's force flag turns this on too).
    continuous_usage: bool = False
    record: bool = True  # keep a log of requests (the bench turns it off)

    def update(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise ValueError(f"unknown stub setting {name!r}")
            if name == "fail" and value not in (None, *FAIL_MODES):
                raise ValueError(f"fail must be one of {FAIL_MODES} or null, got {value!r}")
            setattr(self, name, value)


class _StubDeath(Exception):
    """Raised inside the ASGI app to make uvicorn drop the connection mid-response."""


class StubEngineApp:
    """The ASGI app. Records are plain dicts (JSON-ready) in ``self.records``."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=10000)
        self.health_hits = 0
        self.started_at = time.monotonic()
        self._next_id = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.started_at = time.monotonic()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/health":
            self.health_hits += 1
            await _respond(send, self._health_status(), {"status": "stub"})
            return
        if path.startswith("/_stub/"):
            await self._control(path, method, receive, send)
            return
        body = await _read_body(receive)
        record = self._record(scope, body)
        try:
            await self._serve(scope, path, method, body, record, receive, send)
        finally:
            record["finished_at"] = time.time()

    def _health_status(self) -> int:
        b = self.behaviour
        if time.monotonic() - self.started_at < b.startup_delay_s:
            return 503
        if b.health_fail_next > 0:
            b.health_fail_next -= 1
            return 503
        return b.health_status or 200

    def _record(self, scope: Scope, body: bytes) -> dict[str, Any]:
        self._next_id += 1
        record: dict[str, Any] = {
            "id": self._next_id,
            "method": scope["method"],
            "path": scope["path"],
            "raw_path": (scope.get("raw_path") or b"").decode("latin-1"),
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
            "body": body[:65536].decode("utf-8", "replace"),
            "status": None,
            "tokens_sent": 0,
            "cancelled": False,
            "completed": False,
            "started_at": time.time(),
            "finished_at": None,
        }
        if self.behaviour.record:
            self.records.append(record)
        return record

    async def _control(self, path: str, method: str, receive: Receive, send: Send) -> None:
        if path == "/_stub/log" and method == "GET":
            await _respond(
                send, 200, {"requests": list(self.records), "health_hits": self.health_hits}
            )
        elif path == "/_stub/reset" and method == "POST":
            self.records.clear()
            self.health_hits = 0
            await _respond(send, 200, {"ok": True})
        elif path == "/_stub/config" and method in ("GET", "POST"):
            if method == "POST":
                try:
                    self.behaviour.update(json.loads(await _read_body(receive) or b"{}"))
                except (ValueError, TypeError) as exc:
                    await _respond(send, 400, {"error": str(exc)})
                    return
            await _respond(send, 200, dataclasses.asdict(self.behaviour))
        else:
            await _respond(send, 404, {"error": f"no stub control route {method} {path}"})

    async def _serve(
        self,
        scope: Scope,
        path: str,
        method: str,
        body: bytes,
        record: dict[str, Any],
        receive: Receive,
        send: Send,
    ) -> None:
        if path in DANGEROUS_ROUTES:
            record["status"] = 200
            await _respond(send, 200, {"ok": True, "stub": f"dangerous route {path} reached"})
            return
        if path == "/metrics" and method == "GET":
            record["status"] = 200
            text = b"# TYPE stub_requests_total counter\nstub_requests_total 1\n"
            await _send_raw(send, 200, text, b"text/plain; version=0.0.4")
            return
        if path == "/v1/models" and method == "GET":
            record["status"] = 200
            model = {"id": self.behaviour.model, "object": "model", "owned_by": "stub"}
            await _respond(send, 200, {"object": "list", "data": [model]})
            return
        if method != "POST" or path not in (
            "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
        ):  # fmt: skip
            record["status"] = 404
            await _respond(send, 404, {"error": {"message": f"stub: no route {method} {path}"}})
            return
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError:
            record["status"] = 400
            await _respond(send, 400, {"error": {"message": "stub: body is not a JSON object"}})
            return
        b = dataclasses.replace(self.behaviour)
        overrides = request.get("stub")
        if isinstance(overrides, dict):
            b.update({k: v for k, v in overrides.items() if k in _PER_REQUEST})
        if b.fail == "500":
            record["status"] = 500
            error = {"message": "stub: internal error on demand", "type": "InternalServerError"}
            await _respond(send, 500, {"error": {**error, "code": 500}})
            return
        cancel = _CancelWatch(receive, record)
        try:
            if path == "/v1/embeddings":
                await self._embeddings(request, record, send)
            elif request.get("stream"):
                await self._stream(path, request, b, record, cancel, send)
            else:
                await self._complete(path, request, b, record, cancel, send)
        finally:
            cancel.done()

    async def _embeddings(
        self, request: dict[str, Any], record: dict[str, Any], send: Send
    ) -> None:
        inputs = request.get("input", "")
        items = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": [0.125 * ((i + j) % 8) for j in range(8)],
            }
            for i in range(len(items))
        ]
        prompt = sum(len(str(x).split()) for x in items)
        record["status"] = 200
        record["completed"] = True
        await _respond(send, 200, {
            "object": "list", "model": self.behaviour.model, "data": data,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        })  # fmt: skip

    async def _complete(
        self,
        path: str,
        request: dict[str, Any],
        b: Behaviour,
        record: dict[str, Any],
        cancel: _CancelWatch,
        send: Send,
    ) -> None:
        delay = (b.first_token_delay_ms + b.token_delay_ms * b.tokens) / 1000
        if delay > 0:
            await cancel.sleep(delay)
        if cancel.cancelled:
            return
        text = " ".join(f"tok{i}" for i in range(b.tokens))
        chat = path == "/v1/chat/completions"
        choice: dict[str, Any] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        prompt = _prompt_tokens(request)
        payload = json.dumps({
            "id": f"cmpl-stub-{record['id']}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": b.model, "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": b.tokens,
                      "total_tokens": prompt + b.tokens},
        }).encode()  # fmt: skip
        record["status"] = 200
        if b.fail == "die_mid_body":
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ]})  # fmt: skip
            await send({"type": "http.response.body", "body": payload[: len(payload) // 2],
                        "more_body": True})  # fmt: skip
            raise _StubDeath("stub: dying mid-body on demand")
        record["tokens_sent"] = b.tokens
        record["completed"] = True
        await _send_raw(send, 200, payload, b"application/json")

    async def _stream(
        self,
        path: str,
        request: dict[str, Any],
        b: Behaviour,
        record: dict[str, Any],
        cancel: _CancelWatch,
        send: Send,
    ) -> None:
        chat = path == "/v1/chat/completions"
        rid = f"cmpl-stub-{record['id']}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        options = request.get("stream_options")
        include_usage = b.force_include_usage or (
            isinstance(options, dict) and bool(options.get("include_usage"))
        )
        prompt = _prompt_tokens(request)
        record["status"] = 200
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
        ]})  # fmt: skip
        if b.first_token_delay_ms > 0:
            await cancel.sleep(b.first_token_delay_ms / 1000)
        delay = b.token_delay_ms / 1000
        for i in range(b.tokens):
            if i and delay > 0:
                await cancel.sleep(delay)
            if cancel.cancelled:
                return
            if i == b.fail_after_tokens:
                if b.fail == "die_mid_stream":
                    raise _StubDeath("stub: dying mid-stream on demand")
                if b.fail == "pause":
                    await cancel.sleep(b.pause_s)
                    if cancel.cancelled:
                        return
            piece = f"tok{i} "
            delta: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            chunk = {"id": rid, "object": obj, "created": created, "model": b.model,
                     "choices": [delta]}  # fmt: skip
            if b.continuous_usage:
                chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": i + 1,
                                  "total_tokens": prompt + i + 1}  # fmt: skip
            event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if i == b.fail_after_tokens and b.fail == "pause_mid_event":
                half = len(event) // 2
                await send({"type": "http.response.body", "body": event[:half], "more_body": True})
                await cancel.sleep(b.pause_s)
                if cancel.cancelled:
                    return
                event = event[half:]
            await send({"type": "http.response.body", "more_body": True, "body": event})
            record["tokens_sent"] = i + 1
        tail = b""
        if include_usage:
            usage = {"prompt_tokens": prompt, "completion_tokens": b.tokens,
                     "total_tokens": prompt + b.tokens}  # fmt: skip
            final = {"id": rid, "object": obj, "created": created, "model": b.model,
                     "choices": [], "usage": usage}  # fmt: skip
            tail = b"data: " + json.dumps(final).encode() + b"\n\n"
            if b.fail == "pause_mid_event" and b.fail_after_tokens == b.tokens:
                # split the usage chunk inside its completion_tokens number
                cut = tail.index(b'"completion_tokens": ') + len(b'"completion_tokens": ') + 1
                await send({"type": "http.response.body", "body": tail[:cut], "more_body": True})
                await cancel.sleep(b.pause_s)
                if cancel.cancelled:
                    return
                tail = tail[cut:]
        record["completed"] = True
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n",
                    "more_body": False})  # fmt: skip


class _CancelWatch:
    """Watches ``receive()`` for the client going away before the response ended."""

    def __init__(self, receive: Receive, record: dict[str, Any]) -> None:
        self.cancelled = False
        self.event = asyncio.Event()
        self._record = record
        self._finished = False
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._finished and not self._record["completed"]:
            self.cancelled = True
            self._record["cancelled"] = True
            self.event.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the client goes away (long pauses, slow starts)."""
        if seconds < 0.05:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), seconds)

    def done(self) -> None:
        self._finished = True
        if not self._task.done():
            self._task.cancel()


def _prompt_tokens(request: dict[str, Any]) -> int:
    if isinstance(request.get("messages"), list):
        text = " ".join(
            str(m.get("content", "")) for m in request["messages"] if isinstance(m, dict)
        )
    else:
        text = str(request.get("prompt", ""))
    return max(1, len(text.split()))


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _send_raw(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
    ]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _respond(send: Send, status: int, payload: Any) -> None:
    await _send_raw(send, status, json.dumps(payload).encode(), b"application/json")


# ---- running it -----------------------------------------------------------------------------


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening-ready TCP socket (SO_REUSEADDR, so a stopped server's port can be reused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


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


class StubEngineProcess:
    """The stub engine as a subprocess (``python -m tests.harness.stub_engine``)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, listen_delay_s: float = 0.0, **behaviour: Any
    ) -> None:
        Behaviour(**behaviour)  # validate names early
        self.host = host
        self.port = port
        self.listen_delay_s = listen_delay_s
        self.behaviour = behaviour
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tests.harness.stub_engine", "--host", self.host,
               "--port", str(self.port), "--listen-delay-s", str(self.listen_delay_s)]  # fmt: skip
        for name, value in self.behaviour.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                if name == "record" and not value:
                    cmd.append("--no-record")
                elif name != "record" and value:
                    cmd.append(flag)
            elif value is not None:
                cmd += [flag, str(value)]
        return cmd

    def start(self, wait_listening: bool = True) -> StubEngineProcess:
        """Start it; return once it listens (or, with ``wait_listening=False``, once its port
        is known: connections are refused until ``listen_delay_s`` has passed)."""
        self.proc = subprocess.Popen(
            self.command(), cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
        )
        self._expect("stub engine port: ")
        if wait_listening:
            self.wait_listening()
        return self

    def wait_listening(self) -> None:
        self._expect("stub engine ready: ")

    def _expect(self, prefix: str) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()  # (EOF if it failed)
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"stub engine did not start: {self.command()} printed {line!r}")
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

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

    def __enter__(self) -> StubEngineProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_stub(**behaviour: Any) -> Iterator[StubEngine]:
    """``with running_stub(tokens=4) as engine: ...`` (in-process)."""
    engine = StubEngine(**behaviour).start()
    try:
        yield engine
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.harness.stub_engine", description=__doc__.split("\n")[0]
    )
    d = Behaviour()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    p.add_argument("--model", default=d.model)
    p.add_argument("--tokens", type=int, default=d.tokens)
    p.add_argument("--token-delay-ms", type=float, default=d.token_delay_ms)
    p.add_argument("--first-token-delay-ms", type=float, default=d.first_token_delay_ms)
    p.add_argument("--startup-delay-s", type=float, default=d.startup_delay_s,
                   help="/health answers 503 for this long after start")  # fmt: skip
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
    p.add_argument("--listen-delay-s", type=float, default=0.0,
                   help="refuse connections this long (port bound, not listening), like an "
                   "engine still loading its model")  # fmt: skip
    args = p.parse_args(argv)
    behaviour = Behaviour(
        model=args.model, tokens=args.tokens, token_delay_ms=args.token_delay_ms,
        first_token_delay_ms=args.first_token_delay_ms, startup_delay_s=args.startup_delay_s,
        fail=args.fail, fail_after_tokens=args.fail_after_tokens, pause_s=args.pause_s,
        health_status=args.health_status, record=not args.no_record,
        health_fail_next=args.health_fail_next, force_include_usage=args.force_include_usage,
        continuous_usage=args.continuous_usage,
    )  # fmt: skip
    sock = bind_socket(args.host, args.port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        StubEngineApp(behaviour), log_level="critical", access_log=False, lifespan="on",
        ws="none", backlog=4096, timeout_graceful_shutdown=1,
    )  # fmt: skip
    server = uvicorn.Server(config)

    print(f"stub engine port: http://{args.host}:{port}", flush=True)

    async def serve() -> None:
        await asyncio.sleep(args.listen_delay_s)  # bound but not listening: connect refused
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.005)
        print(f"stub engine ready: http://{args.host}:{port}", flush=True)
        await task

    loop_factory = config.get_loop_factory()  # uvloop when installed, like the real engines
    if loop_factory is None:
        asyncio.run(serve())
    else:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
