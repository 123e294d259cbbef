"""The stand-in engine: vLLM's or SGLang's OpenAI server where neither can run (no GPU).

The local stack (`modal-llm:engineStandin: true`, docs/serving.md) runs serving/app.py's real
container lifecycle (serving/engine.py) with this process in the engine's place. It never runs
a model: every completion is the same fixed text saying so. What it does keep from the real
engines is what the lifecycle and the proxy depend on:

- it takes the real engine's command line, as the spec renders it, after ``--``
  (``python -m standin_engine -- vllm serve MODEL --served-model-name NAME --host H
  --port P ...``), checks every flag against the pinned parser's recorded list
  (serving/engine_flags/; an unknown flag exits 2 like argparse does) and serves on that
  host and port, under that served model name;
- ``GET /v1/models``; ``POST /v1/chat/completions``, ``/v1/completions`` (stream and non-stream,
  ``max_tokens`` honoured, ``usage`` on every answer; streams end with a usage-only chunk when
  the client asks (``stream_options.include_usage``) or when the command line has vLLM's
  ``--enable-force-include-usage`` (which also puts running usage on every chunk) or SGLang's
  ``--stream-response-default-include-usage``), ``/v1/embeddings``; ``GET /health``;
  ``GET /metrics``; SGLang's ``GET /model_info`` (``is_generation: true``);
- errors in the engine's own shape (vLLM: ``{"error": {message, type, param, code}}``, SGLang:
  ``{"object": "error", message, type, param, code}``), vLLM's 404 for a model name it does
  not serve;
- the snapshot routes: vLLM's ``POST /sleep?level=N``, ``POST /wake_up``, ``GET /is_sleeping``
  (only with ``VLLM_SERVER_DEV_MODE=1``, sleeping only with ``--enable-sleep-mode``) and
  SGLang's ``/release_memory_occupation`` and ``/resume_memory_occupation`` (GET or POST);
  while asleep, the generation routes answer 503.

It can be told to fail, for the deploy health gate's tests: ``--fail start`` exits 1 before it
listens (an engine that crashes while loading), ``--fail never-ready`` listens but its
``/health`` answers 503 for ever; ``--startup-delay-s S`` answers 503 for S seconds (loading
weights). The environment variable ``SERVING_STANDIN_FAIL`` (``start`` / ``never-ready``)
does the same without changing the command line.

CLI: ``python -m standin_engine [options] [-- ENGINE ARGV]`` prints
``stand-in engine port: http://HOST:PORT`` once the port is bound and
``stand-in engine ready: http://HOST:PORT`` once it listens. Without an engine command line it
serves a vLLM stand-in on ``--host``/``--port`` as ``--model`` (benchmarks).
``StandinEngineProcess`` runs it as a subprocess from Python.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Self

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the repository (dev/standin_engine.py)
LABEL = "stand-in engine"
FAIL_ENV = "SERVING_STANDIN_FAIL"
START_FAILURES = ("start", "never-ready")
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# Where each engine's snapshot routes live (serving/engine.py SLEEP_ROUTES / WAKE_ROUTES call
# them). vLLM: vllm/entrypoints/serve/dev/sleep/api_router.py (POST /sleep?level=,
# POST /wake_up, GET /is_sleeping, registered only with VLLM_SERVER_DEV_MODE=1). SGLang:
# python/sglang/srt/entrypoints/http_server.py (api_route GET+POST for both).
VLLM_SLEEP_ROUTES = ("/sleep", "/wake_up", "/is_sleeping")
SGLANG_SLEEP_ROUTES = ("/release_memory_occupation", "/resume_memory_occupation")
# What every completion says: a stand-in, never a model.
REPLY = (
    "[stand-in engine] No model ran: this fixed reply comes from dev/standin_engine.py, "
    "standing in for {engine} serving {model} on a machine without a GPU."
)


@dataclasses.dataclass
class Settings:
    """How the stand-in answers; read from the engine command line and the CLI options."""

    engine: str = "vllm"  # whose behaviour and error shape: "vllm" or "sglang"
    model: str = "standin-model"  # the served model name (vLLM answers 404 for others)
    model_path: str = "standin-model"  # the checkpoint the real engine would load
    check_model: bool = True  # vLLM refuses a model name it does not serve
    tokens: int | None = None  # a fixed completion length (None: the reply, cut at max_tokens)
    token_delay_ms: float = 0.0
    first_token_delay_ms: float = 0.0
    startup_delay_s: float = 0.0  # /health answers 503 this long (weights loading)
    never_ready: bool = False  # /health answers 503 for ever
    force_include_usage: bool = False  # every stream ends with a usage-only chunk
    continuous_usage: bool = False  # running usage on every stream chunk
    sleep_mode: bool = False  # vLLM --enable-sleep-mode / SGLang --enable-memory-saver
    dev_mode: bool = False  # vLLM's VLLM_SERVER_DEV_MODE=1: the sleep routes exist

    def update(self, values: Mapping[str, Any]) -> None:
        names = {f.name for f in dataclasses.fields(self)}
        for name, value in values.items():
            if name not in names:
                raise ValueError(f"unknown {LABEL} setting {name!r}")
            setattr(self, name, value)


def error_body(engine: str, status: int, message: str, err_type: str) -> dict[str, Any]:
    """An error in the engine's own shape.

    vLLM: ErrorResponse(error=ErrorInfo(message, type, param, code)) (vllm/entrypoints/serve/
    exception_handling/error_response.py); SGLang: ErrorResponse(object="error", message, type,
    param, code) (python/sglang/srt/entrypoints/openai/protocol.py).
    """
    info = {"message": message, "type": err_type, "param": None, "code": status}
    return {"error": info} if engine == "vllm" else {"object": "error", **info}


class StandinEngineApp:
    """The ASGI app. Subclasses (tests/harness/stub_engine.py) hook in through the methods
    `new_call`, `route`, `settings_for`, `pieces`, `send_completion`, `send_event`,
    `before_tail` and `health_status`; `call` dicts carry one request's progress."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.started_at = time.monotonic()
        self.sleeping = False

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
        if scope["type"] == "http":
            await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/health":
            # vLLM and SGLang answer 200 with an empty body once serving.
            await send_raw(send, self.health_status(), b"", b"application/json")
            return
        body = await read_body(receive)
        call = self.new_call(scope, body)
        await self.route(scope, body, call, receive, send)

    def health_status(self) -> int:
        s = self.settings
        if s.never_ready or time.monotonic() - self.started_at < s.startup_delay_s:
            return 503
        return 200

    def new_call(self, scope: Scope, body: bytes) -> dict[str, Any]:
        """One request's progress: status, tokens sent, whether it completed or was cancelled."""
        return {"status": None, "tokens_sent": 0, "completed": False, "cancelled": False}

    async def error(
        self, send: Send, call: dict[str, Any], status: int, message: str, err_type: str
    ) -> None:
        call["status"] = status
        await respond(send, status, error_body(self.settings.engine, status, message, err_type))

    async def route(
        self, scope: Scope, body: bytes, call: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        s = self.settings
        if path == "/metrics" and method == "GET":
            call["status"] = 200
            text = b"# TYPE standin_engine_up gauge\nstandin_engine_up 1\n"
            await send_raw(send, 200, text, b"text/plain; version=0.0.4")
        elif path == "/v1/models" and method == "GET":
            call["status"] = 200
            card = {
                "id": s.model, "object": "model", "created": int(self.started_at),
                "owned_by": s.engine, "root": s.model_path,
            }  # fmt: skip
            await respond(send, 200, {"object": "list", "data": [card]})
        elif s.engine == "sglang" and path == "/model_info" and method == "GET":
            # SGLang 0.5.15 sglang/srt/entrypoints/http_server.py `model_info` (the fields
            # serving.engine and SGLang's own warm-up read); the stand-in generates
            call["status"] = 200
            info = {"model_path": s.model_path, "is_generation": True}
            await respond(send, 200, info)
        elif s.engine == "vllm" and s.dev_mode and path in VLLM_SLEEP_ROUTES:
            await self._vllm_sleep_route(scope, call, send)
        elif s.engine == "sglang" and path in SGLANG_SLEEP_ROUTES and method in ("GET", "POST"):
            # SGLang without --enable-memory-saver uses a no-op saver: the call succeeds and
            # frees nothing (a snapshot would then hold the GPU memory).
            self.sleeping = path == SGLANG_SLEEP_ROUTES[0]
            call["status"] = 200
            await respond(send, 200, None)  # the endpoint returns None: `null`
        elif method == "POST" and path in GENERATION_ROUTES:
            await self._generation(path, body, call, receive, send)
        else:
            call["status"] = 404
            await respond(send, 404, {"detail": "Not Found"})  # FastAPI's unknown route

    async def _vllm_sleep_route(self, scope: Scope, call: dict[str, Any], send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/is_sleeping" and method == "GET":
            call["status"] = 200
            await respond(send, 200, {"is_sleeping": self.sleeping})
            return
        if method != "POST" or path == "/is_sleeping":
            call["status"] = 405
            await respond(send, 405, {"detail": "Method Not Allowed"})
            return
        if not self.settings.sleep_mode:
            # vLLM's workers refuse to sleep unless the engine was started with sleep mode.
            await self.error(
                send, call, 500, "Sleep mode is not enabled: start vLLM with --enable-sleep-mode",
                "InternalServerError",
            )  # fmt: skip
            return
        self.sleeping = path == "/sleep"
        call["status"] = 200
        await send_raw(send, 200, b"", b"application/json")

    async def _generation(
        self, path: str, body: bytes, call: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError:
            await self.error(
                send, call, 400, "The request body is not a JSON object", "BadRequestError"
            )
            return
        s = self.settings_for(request)
        if self.sleeping:
            # vLLM docs/features/sleep_mode.md: routes that need the weights answer 503 asleep.
            await self.error(
                send, call, 503, "The engine is sleeping: wake it first", "ServiceUnavailableError"
            )
            return
        model = request.get("model")
        if s.check_model and s.engine == "vllm" and model not in (None, s.model):
            # vLLM's OpenAIServing._check_model: 404 NotFoundError for an unknown model name.
            await self.error(
                send, call, 404, f"The model `{model}` does not exist.", "NotFoundError"
            )
            return
        cancel = CancelWatch(receive, call)
        try:
            await self.generate(Exchange(path, request, s, call, cancel, send))
        finally:
            cancel.done()

    def settings_for(self, request: dict[str, Any]) -> Settings:
        """The settings one request is served with (a copy: requests may change it)."""
        return dataclasses.replace(self.settings)

    async def generate(self, ex: Exchange) -> None:
        if ex.path == "/v1/embeddings":
            await self._embeddings(ex)
        elif ex.request.get("stream"):
            await self._stream(ex)
        else:
            await self._complete(ex)

    def pieces(self, request: dict[str, Any], s: Settings) -> tuple[list[str], str]:
        """The completion's tokens (text pieces) and its finish_reason."""
        words = REPLY.format(engine=s.engine, model=s.model).split()
        if s.tokens is not None:
            words = [words[i % len(words)] for i in range(s.tokens)]
            finish = "length"
        else:
            limit = request.get("max_completion_tokens") or request.get("max_tokens")
            cut = isinstance(limit, int) and 0 < limit < len(words)
            words = words[:limit] if cut else words
            finish = "length" if cut else "stop"
        return [w + " " for w in words[:-1]] + words[-1:], finish

    async def _embeddings(self, ex: Exchange) -> None:
        inputs = ex.request.get("input", "")
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
        ex.call["status"] = 200
        ex.call["completed"] = True
        await respond(ex.send, 200, {
            "object": "list", "model": ex.s.model, "data": data,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        })  # fmt: skip

    async def _complete(self, ex: Exchange) -> None:
        s, request, cancel = ex.s, ex.request, ex.cancel
        pieces, finish = self.pieces(request, s)
        delay = (s.first_token_delay_ms + s.token_delay_ms * len(pieces)) / 1000
        if delay > 0:
            await cancel.sleep(delay)
        if cancel.cancelled:
            return
        text = "".join(pieces).rstrip()
        chat = ex.path == "/v1/chat/completions"
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": text, "finish_reason": finish}
        )
        prompt = prompt_tokens(request)
        payload = json.dumps({
            "id": f"cmpl-standin-{id(ex):x}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": s.model, "choices": [choice],
            "usage": usage_info(prompt, len(pieces)),
        }).encode()  # fmt: skip
        ex.call["status"] = 200
        await self.send_completion(ex, payload, len(pieces))

    async def send_completion(self, ex: Exchange, payload: bytes, tokens: int) -> None:
        ex.call["tokens_sent"] = tokens
        ex.call["completed"] = True
        await send_raw(ex.send, 200, payload, b"application/json")

    async def _stream(self, ex: Exchange) -> None:
        s, request, call, cancel, send = ex.s, ex.request, ex.call, ex.cancel, ex.send
        chat = ex.path == "/v1/chat/completions"
        rid = f"cmpl-standin-{id(ex):x}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        options = request.get("stream_options")
        include_usage = s.force_include_usage or (
            isinstance(options, dict) and bool(options.get("include_usage"))
        )
        pieces, finish = self.pieces(request, s)
        prompt = prompt_tokens(request)
        call["status"] = 200
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
        ]})  # fmt: skip
        if s.first_token_delay_ms > 0:
            await cancel.sleep(s.first_token_delay_ms / 1000)
        delay = s.token_delay_ms / 1000
        for i, piece in enumerate(pieces):
            if i and delay > 0:
                await cancel.sleep(delay)
            if cancel.cancelled:
                return
            done = finish if i == len(pieces) - 1 else None  # the engines mark the last chunk
            delta: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": done}
                if chat
                else {"index": 0, "text": piece, "finish_reason": done}
            )
            chunk = {"id": rid, "object": obj, "created": created, "model": s.model,
                     "choices": [delta]}  # fmt: skip
            if s.continuous_usage:
                chunk["usage"] = usage_info(prompt, i + 1)
            event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if not await self.send_event(ex, i, event):
                return
            call["tokens_sent"] = i + 1
        tail = b""
        if include_usage:
            usage = usage_info(prompt, len(pieces))
            final = {"id": rid, "object": obj, "created": created, "model": s.model,
                     "choices": [], "usage": usage}  # fmt: skip
            tail = b"data: " + json.dumps(final).encode() + b"\n\n"
        rest = await self.before_tail(ex, tail)
        if rest is None:
            return
        call["completed"] = True
        await send({"type": "http.response.body", "body": rest + b"data: [DONE]\n\n",
                    "more_body": False})  # fmt: skip

    async def send_event(self, ex: Exchange, index: int, event: bytes) -> bool:
        """Send one token's event; False when the client went away (stop streaming)."""
        await ex.send({"type": "http.response.body", "more_body": True, "body": event})
        return True

    async def before_tail(self, ex: Exchange, tail: bytes) -> bytes | None:
        """What remains of the usage chunk to send with [DONE]; None to stop."""
        return tail


@dataclasses.dataclass
class Exchange:
    """One generation request in flight: what was asked, with which settings, its progress
    (`call`), the client's disconnect watch and the ASGI send."""

    path: str
    request: dict[str, Any]
    s: Settings
    call: dict[str, Any]
    cancel: CancelWatch
    send: Send


class CancelWatch:
    """Watches ``receive()`` for the client going away before the response ended."""

    def __init__(self, receive: Receive, call: dict[str, Any]) -> None:
        self.cancelled = False
        self.event = asyncio.Event()
        self._call = call
        self._finished = False
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._finished and not self._call["completed"]:
            self.cancelled = True
            self._call["cancelled"] = True
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


def usage_info(prompt: int, completion: int) -> dict[str, int]:
    """An OpenAI ``usage`` object in vLLM's field order: its ``UsageInfo`` model declares
    ``prompt_tokens``, ``total_tokens``, ``completion_tokens`` (vllm/entrypoints/openai/
    engine/protocol.py), so ``completion_tokens`` comes last, the case a proxy reading the
    counts from a stream cut between two reads must get right."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def prompt_tokens(request: dict[str, Any]) -> int:
    """Words of the prompt or of the messages' contents (at least 1)."""
    if isinstance(request.get("messages"), list):
        text = " ".join(
            str(m.get("content", "")) for m in request["messages"] if isinstance(m, dict)
        )
    else:
        text = str(request.get("prompt", ""))
    return max(1, len(text.split()))


async def read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def send_raw(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
    ]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def respond(send: Send, status: int, payload: Any) -> None:
    await send_raw(send, status, json.dumps(payload).encode(), b"application/json")


# ---- the engine's command line ----------------------------------------------------------------


class EngineArgvError(ValueError):
    """The engine command line is not one the stand-in (or the pinned engine) accepts."""


def _value(argv: Sequence[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def read_engine_argv(argv: Sequence[str], settings: Settings) -> tuple[str, int]:
    """Fill `settings` from the real engine command line; returns its (host, port).

    Every flag is checked against the pinned release's recorded parser flags, as the engine
    itself would (argparse exits 2 on an unknown flag).
    """
    from serving.engine_flags import parser_name
    from serving.spec import engine_flags  # pydantic: imported only when a command line is read

    args = list(argv)
    if len(args) >= 3 and Path(args[0]).name == "vllm" and args[1] == "serve":
        engine, model_path, flags_from = "vllm", args[2], 3
    elif "sglang.launch_server" in args[:3]:
        engine, flags_from = "sglang", args.index("sglang.launch_server") + 1
        model_path = _value(args, "--model-path") or _value(args, "--model") or ""
    else:
        raise EngineArgvError(
            f"not a vLLM or SGLang server command line: {' '.join(args[:3])!r}; expected "
            "`vllm serve MODEL ...` or `python3 -m sglang.launch_server --model-path MODEL ...`"
        )
    flags = engine_flags(engine)
    unknown, ambiguous = [], []
    for token in args[flags_from:]:
        if token.startswith("--") or (token.startswith("-") and not token[1:2].isdigit()):
            option, matches = flags.resolve(parser_name(engine, token))
            actions = {flags.aliases(m) for m in matches}
            if option is None and not actions:
                unknown.append(token)
            elif option is None and len(actions) > 1:  # argparse takes a unique prefix only
                ambiguous.append(f"{token} could match {', '.join(matches[:4])}")
    if unknown or ambiguous:
        said = [f"unrecognized arguments: {' '.join(unknown)}"] if unknown else []
        said += [f"ambiguous option: {a}" for a in ambiguous]
        raise EngineArgvError(
            f"{'; '.join(said)} ({engine}=={flags.version}; the pinned parser's flags are in "
            f"{flags.source})"
        )
    present = set(args)
    settings.engine = engine
    settings.model_path = model_path
    settings.model = _value(args, "--served-model-name") or model_path
    if engine == "vllm":
        settings.sleep_mode = "--enable-sleep-mode" in present
        settings.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        forced = "--enable-force-include-usage" in present
        settings.force_include_usage = settings.continuous_usage = forced
    else:
        settings.sleep_mode = "--enable-memory-saver" in present
        settings.force_include_usage = "--stream-response-default-include-usage" in present
    # Both engines default to 127.0.0.1 / their own port when none is given.
    default_port = 8000 if engine == "vllm" else 30000
    return _value(args, "--host") or "127.0.0.1", int(_value(args, "--port") or default_port)


# ---- running it -------------------------------------------------------------------------------


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening-ready TCP socket (SO_REUSEADDR, so a stopped server's port can be reused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


#: How long each engine keeps an idle HTTP connection (seconds), and the env that sets it:
#: vLLM passes `VLLM_HTTP_TIMEOUT_KEEP_ALIVE` (default 5) to uvicorn (vllm/envs.py,
#: vllm/entrypoints/launchers/api_server/entry.py); SGLang 0.5.15+ `SGLANG_TIMEOUT_KEEP_ALIVE`
#: (default 5; sglang/srt/environ.py, entrypoints/http_server.py). The proxy's engine pool keeps
#: connections 60 s (`--upstream-idle-s`) and the spec sets these to 75 s: the stand-in honours
#: them too, so a pool that outlives the engine's keep-alive fails here as it would there.
KEEP_ALIVE_ENV = {"vllm": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "sglang": "SGLANG_TIMEOUT_KEEP_ALIVE"}
DEFAULT_KEEP_ALIVE_S = 5


def keep_alive_s(engine: str) -> int:
    """The idle keep-alive the real `engine` would use in this environment."""
    raw = os.environ.get(KEEP_ALIVE_ENV.get(engine, ""), "")
    return int(raw) if raw.strip().isdigit() else DEFAULT_KEEP_ALIVE_S


def serve(
    app: Any,
    host: str,
    port: int,
    *,
    label: str,
    listen_delay_s: float = 0.0,
    keep_alive: int = DEFAULT_KEEP_ALIVE_S,
) -> int:
    """Serve `app` on host:port with uvicorn (uvloop when installed, like the real engines).

    Prints ``<label> port: URL`` once bound, then ``<label> ready: URL`` once it listens;
    for ``listen_delay_s`` in between, connections are refused (a model still loading).
    """
    sock = bind_socket(host, port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="critical", access_log=False, lifespan="on", ws="none", backlog=4096,
        timeout_graceful_shutdown=1, timeout_keep_alive=keep_alive,
    )  # fmt: skip
    server = uvicorn.Server(config)
    print(f"{label} port: http://{host}:{port}", flush=True)

    async def run() -> None:
        await asyncio.sleep(listen_delay_s)  # bound but not listening: connect refused
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.005)
        print(f"{label} ready: http://{host}:{port}", flush=True)
        await task

    loop_factory = config.get_loop_factory()
    if loop_factory is None:
        asyncio.run(run())
    else:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(run())
    return 0


def settings_options(p: argparse.ArgumentParser, d: Settings) -> None:
    """The CLI options shared with the test stub (tests/harness/stub_engine.py)."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    p.add_argument("--listen-delay-s", type=float, default=0.0,
                   help="refuse connections this long (port bound, not listening), like an "
                   "engine still loading its model")  # fmt: skip
    p.add_argument("--tokens", type=int, default=d.tokens)
    p.add_argument("--token-delay-ms", type=float, default=d.token_delay_ms)
    p.add_argument("--first-token-delay-ms", type=float, default=d.first_token_delay_ms)
    p.add_argument("--startup-delay-s", type=float, default=d.startup_delay_s,
                   help="/health answers 503 for this long after start")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    own, engine_argv = (
        (args_in[: args_in.index("--")], args_in[args_in.index("--") + 1 :])
        if "--" in args_in
        else (args_in, [])
    )
    p = argparse.ArgumentParser(prog="python -m standin_engine", description=__doc__.split("\n")[0])
    settings_options(p, Settings())
    p.add_argument("--model", default=Settings.model,
                   help="without an engine command line: the model name served")  # fmt: skip
    p.add_argument("--fail", choices=START_FAILURES, default=os.environ.get(FAIL_ENV) or None,
                   help=f"fail on purpose (also env {FAIL_ENV})")  # fmt: skip
    args = p.parse_args(own)
    settings = Settings(
        model=args.model, model_path=args.model, tokens=args.tokens,
        token_delay_ms=args.token_delay_ms, first_token_delay_ms=args.first_token_delay_ms,
        startup_delay_s=args.startup_delay_s, never_ready=args.fail == "never-ready",
    )  # fmt: skip
    host, port = args.host, args.port
    if engine_argv:
        try:
            host, port = read_engine_argv(engine_argv, settings)
        except EngineArgvError as exc:
            print(f"{LABEL}: error: {exc}", file=sys.stderr, flush=True)
            return 2
        print(f"{LABEL} for: {' '.join(engine_argv)}", flush=True)
    print(
        f"{LABEL}: no model runs here; every completion is a fixed text saying so "
        f"({settings.engine} behaviour, model name {settings.model!r})",
        flush=True,
    )
    if args.fail == "start":
        time.sleep(args.listen_delay_s + args.startup_delay_s)
        print(
            f"{LABEL}: failing start-up on purpose (--fail start or {FAIL_ENV}=start)", flush=True
        )
        return 1
    return serve(
        StandinEngineApp(settings),
        host,
        port,
        label=LABEL,
        listen_delay_s=args.listen_delay_s,
        keep_alive=keep_alive_s(settings.engine),
    )


class StandinEngineProcess:
    """The stand-in engine as a subprocess: ``.url``, ``.port``, ``.proc``, ``.stop()``.

    ``settings`` are CLI options of the module (``tokens=16`` → ``--tokens 16``).
    """

    module = "standin_engine"
    label = LABEL

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        listen_delay_s: float = 0.0,
        engine_argv: Sequence[str] = (),
        **settings: Any,
    ) -> None:
        self.check_settings(settings)
        self.host = host
        self.port = port
        self.listen_delay_s = listen_delay_s
        self.engine_argv = list(engine_argv)
        self.behaviour = settings
        self.proc: subprocess.Popen[str] | None = None

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        Settings().update(settings)  # unknown names fail here, not in the child

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def options(self) -> list[str]:
        out: list[str] = []
        for name, value in self.behaviour.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                out += [flag] if value else []
            elif value is not None:
                out += [flag, str(value)]
        return out

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", self.module, "--host", self.host, "--port", str(self.port),
               "--listen-delay-s", str(self.listen_delay_s), *self.options()]  # fmt: skip
        return cmd + (["--", *self.engine_argv] if self.engine_argv else [])

    def start(self, wait_listening: bool = True) -> Self:
        """Start it; return once it listens (or, with ``wait_listening=False``, once its port
        is known: connections are refused until ``listen_delay_s`` has passed)."""
        self.proc = subprocess.Popen(
            self.command(), cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
        )
        self._expect(f"{self.label} port: ")
        if wait_listening:
            self.wait_listening()
        return self

    def wait_listening(self) -> None:
        self._expect(f"{self.label} ready: ")

    def _expect(self, prefix: str) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        while line.startswith(f"{self.label}: ") or line.startswith(f"{self.label} for: "):
            line = self.proc.stdout.readline()  # the banner lines
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"{self.label} did not start: {self.command()} printed {line!r}")
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
