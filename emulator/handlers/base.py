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
from emulator.faults import FAULTS
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

    def __init__(self, state: State, config: ServerConfig, counter: RpcCounter) -> None:
        self.state = state
        self.config = config
        self.counter = counter

    def _authenticate(self, method: str, metadata: dict[str, str]) -> None:
        cfg = self.config
        if cfg.token_id is None or cfg.token_secret is None:
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
        await _inject_fault(method, "before")
        ctx = Context(state=self.state, config=self.config, method=method, metadata=metadata)
        started = time.perf_counter()
        try:
            if inspect.isasyncgenfunction(fn):
                async for message in fn(ctx, request):
                    await stream.send_message(message)
            else:
                result = fn(ctx, request)
                if inspect.isawaitable(result):
                    result = await result
                await _inject_fault(method, "after")  # applied, then the answer is lost
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


async def _inject_fault(method: str, when: str) -> None:
    """Delay and/or fail this call as a test armed it (emulator/faults.py); no-op otherwise."""
    fault = FAULTS.take(method, when)
    if fault is None:
        return
    log.info("%s: injected fault %s (%s the handler)", method, fault, when)
    if fault.delay_s:
        await asyncio.sleep(fault.delay_s)
    if fault.status != "NONE":
        raise GRPCError(Status[fault.status], f"injected fault: {fault.status} {when} {method}")


def _make_method(name: str) -> Callable[..., Any]:
    async def method(self: ServicerBase, stream: Stream[Any, Any]) -> None:
        await self._dispatch(name, stream)

    method.__name__ = name
    method.__qualname__ = f"EmulatorServicer.{name}"
    return method


def rpc_names() -> list[str]:
    """Every RPC of Modal's API, as the installed modal_proto declares it."""
    return sorted(ModalClientBase.__abstractmethods__)


def build_servicer(state: State, config: ServerConfig, counter: RpcCounter) -> ServicerBase:
    """An instance serving every RPC: registered handlers, or UNIMPLEMENTED naming the RPC."""
    from emulator import handlers  # noqa: F401  (import registers all handler modules)

    unknown = set(REGISTRY) - set(rpc_names())
    if unknown:
        raise RuntimeError(f"handlers registered for RPCs modal_proto lacks: {sorted(unknown)}")
    namespace = {name: _make_method(name) for name in rpc_names()}
    cls = type("EmulatorServicer", (ServicerBase,), namespace)
    servicer: ServicerBase = cls(state, config, counter)
    return servicer
