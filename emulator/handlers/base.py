"""gRPC plumbing shared by all handlers: registry, auth, error mapping, RPC counts.

Handlers are plain functions named exactly like the RPC and registered with `@rpc`:

    @rpc
    def SecretGetInfo(ctx: Context, req: api_pb2.SecretGetInfoRequest) -> ...:

They may be sync, async, or async generators (server-streaming RPCs). `build_servicer()`
generates one grpclib method per RPC of `ModalClientBase` (about 300), so every method the
emulator does not implement answers UNIMPLEMENTED with its own name. Model errors map to gRPC
statuses; anything unexpected is logged with its traceback and answered INTERNAL (the client
retries INTERNAL silently, so the log is the only trace of a handler bug).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpclib import GRPCError, Status
from grpclib.server import Stream
from modal_proto.api_grpc import ModalClientBase

from emulator.errors import EmulatorError
from emulator.models import State

log = logging.getLogger("emulator.rpc")

Handler = Callable[..., Any]
REGISTRY: dict[str, Handler] = {}


def rpc(fn: Handler) -> Handler:
    """Register `fn` as the implementation of the RPC with the same name."""
    if fn.__name__ in REGISTRY:
        raise RuntimeError(f"RPC {fn.__name__} registered twice")
    REGISTRY[fn.__name__] = fn
    return fn


@dataclass(frozen=True)
class ServerConfig:
    workspace: str
    http_url: str
    token_id: str | None = None
    token_secret: str | None = None
    rbac: bool = False  # workspace with RBAC: proxy tokens are scoped to environments


@dataclass
class Context:
    """What a handler gets besides its request."""

    state: State
    config: ServerConfig
    method: str
    metadata: dict[str, str]
    runtime: Any = None  # emulator.runtime.Runtime when containers run, else None
    task_id: str = ""  # set when the call comes from a container (its own unix socket)

    @property
    def client_version(self) -> str:
        return self.metadata.get("x-modal-client-version", "")


class RpcCounter:
    """Per-method count of RPCs received (thread safe), reset with the state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, method: str) -> None:
        with self._lock:
            self._counts[method] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


_STATUS = {
    "NOT_FOUND": Status.NOT_FOUND,
    "ALREADY_EXISTS": Status.ALREADY_EXISTS,
    "INVALID_ARGUMENT": Status.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": Status.FAILED_PRECONDITION,
    "INTERNAL": Status.INTERNAL,
}


class ServicerBase(ModalClientBase):
    """Holds the state; `build_servicer()` adds one method per RPC that calls `_dispatch`."""

    def __init__(
        self,
        state: State,
        config: ServerConfig,
        counter: RpcCounter,
        runtime: Any = None,
        task_id: str = "",
    ) -> None:
        self.state = state
        self.config = config
        self.counter = counter
        self.runtime = runtime
        self.task_id = task_id  # a container's own socket: no token, calls come from it

    def _authenticate(self, method: str, metadata: dict[str, str]) -> None:
        cfg = self.config
        if cfg.token_id is None or cfg.token_secret is None or self.task_id:
            return
        token_id = metadata.get("x-modal-token-id", "")
        token_secret = metadata.get("x-modal-token-secret", "")
        ok = hmac.compare_digest(token_id.encode(), cfg.token_id.encode()) and hmac.compare_digest(
            token_secret.encode(), cfg.token_secret.encode()
        )
        if not ok:
            shown = token_id or "(none)"
            log.warning("%s: rejected credentials (token id %s)", method, shown)
            raise GRPCError(
                Status.UNAUTHENTICATED,
                f"Invalid or missing token: token id {shown!r} with its secret is not accepted "
                "by this emulator. Use the --token-id/--token-secret it was started with "
                "(MODAL_TOKEN_ID / MODAL_TOKEN_SECRET).",
            )

    async def _dispatch(self, method: str, stream: Stream[Any, Any]) -> None:
        self.counter.add(method)
        metadata = {str(k): str(v) for k, v in stream.metadata.items()} if stream.metadata else {}
        self._authenticate(method, metadata)
        fn = REGISTRY.get(method)
        if fn is None:
            log.info("%s: not implemented (answered UNIMPLEMENTED)", method)
            raise GRPCError(
                Status.UNIMPLEMENTED,
                f"{method} is not implemented by the Modal emulator; see docs/emulator.md for "
                "the RPCs it serves.",
            )
        request = await stream.recv_message()
        ctx = Context(
            state=self.state,
            config=self.config,
            method=method,
            metadata=metadata,
            runtime=self.runtime,
            task_id=self.task_id,
        )
        started = time.perf_counter()
        try:
            if inspect.isasyncgenfunction(fn):
                async for message in fn(ctx, request):
                    await stream.send_message(message)
            else:
                key = metadata.get("x-idempotency-key", "")
                if key:
                    result = await IDEMPOTENCY.run(method, key, lambda: _call(fn, ctx, request))
                else:
                    result = await _call(fn, ctx, request)
                await stream.send_message(result)
        except EmulatorError as exc:
            log.info("%s: %s: %s", method, exc.status_name, exc)
            raise GRPCError(_STATUS[exc.status_name], str(exc)) from None
        except (GRPCError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("%s: handler crashed (answering INTERNAL)", method)
            raise GRPCError(
                Status.INTERNAL,
                f"{method} failed inside the Modal emulator ({type(exc).__name__}: {exc}); "
                "the emulator log has the traceback.",
            ) from None
        log.debug("%s: OK in %.1f ms", method, (time.perf_counter() - started) * 1000)


async def _call(fn: Handler, ctx: Context, request: Any) -> Any:
    result = fn(ctx, request)
    if inspect.isawaitable(result):
        result = await result
    return result


class IdempotencyCache:
    """Unary RPCs carrying the same `x-idempotency-key` run once; retries get the first answer.

    The modal client puts one random key on a call and keeps it across its own retries
    (`modal/_utils/grpc_utils.py`, `retry_transient_errors`: `x-idempotency-key` plus an
    increasing `x-retry-attempt`), so a retry whose first attempt did reach the server (the
    answer was lost, or the attempt timed out) must not create a second token, secret or
    function call. Keyed by (method, key); a retry arriving while the first attempt still runs
    waits for it. Answers and model errors (NOT_FOUND, ALREADY_EXISTS, ...) are replayed; a
    handler crash (INTERNAL) is not cached, so a retry runs again. The newest MAX_ENTRIES keys
    are kept, for at most TTL seconds.
    """

    MAX_ENTRIES = 20_000
    TTL = 3600.0

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[float, asyncio.Future[Any]]] = {}

    async def run(self, method: str, key: str, call: Callable[[], Any]) -> Any:
        now = time.monotonic()
        entry = self._entries.get((method, key))
        if entry is not None and now - entry[0] < self.TTL:
            log.info("%s: idempotency key seen before: answering with the first result", method)
            return await asyncio.shield(entry[1])
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._entries[(method, key)] = (now, future)
        if len(self._entries) > self.MAX_ENTRIES + 1000:  # evict the oldest, in batches
            for old in list(self._entries)[: len(self._entries) - self.MAX_ENTRIES]:
                del self._entries[old]
        try:
            result = await call()
        except (EmulatorError, GRPCError) as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody retries
            raise
        except BaseException as exc:
            self._entries.pop((method, key), None)
            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            future.exception()
            raise
        future.set_result(result)
        return result

    def clear(self) -> None:
        self._entries.clear()


IDEMPOTENCY = IdempotencyCache()


def _make_method(name: str) -> Callable[..., Any]:
    async def method(self: ServicerBase, stream: Stream[Any, Any]) -> None:
        await self._dispatch(name, stream)

    method.__name__ = name
    method.__qualname__ = f"EmulatorServicer.{name}"
    return method


def rpc_names() -> list[str]:
    """Every RPC of Modal's API, as the installed modal_proto declares it."""
    return sorted(ModalClientBase.__abstractmethods__)


_SERVICER_CLASS: type[ServicerBase] | None = None


def build_servicer(
    state: State,
    config: ServerConfig,
    counter: RpcCounter,
    runtime: Any = None,
    task_id: str = "",
) -> ServicerBase:
    """An instance serving every RPC: registered handlers, or UNIMPLEMENTED naming the RPC.

    `task_id` makes the servicer a container's own (served on that container's unix socket):
    its calls carry no token, as a container's client sends none.
    """
    global _SERVICER_CLASS
    from emulator import handlers  # noqa: F401  (import registers all handler modules)

    if _SERVICER_CLASS is None:
        unknown = set(REGISTRY) - set(rpc_names())
        if unknown:
            raise RuntimeError(f"handlers registered for RPCs modal_proto lacks: {sorted(unknown)}")
        namespace = {name: _make_method(name) for name in rpc_names()}
        _SERVICER_CLASS = type("EmulatorServicer", (ServicerBase,), namespace)
    servicer: ServicerBase = _SERVICER_CLASS(state, config, counter, runtime, task_id)
    return servicer
