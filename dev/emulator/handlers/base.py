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
import contextlib
import hmac
import inspect
import logging
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from google.protobuf.message import DecodeError
from grpclib import GRPCError, Status
from grpclib.server import Stream
from modal_proto.api_grpc import ModalClientBase

from emulator.errors import EmulatorError
from emulator.faults import FAULTS
from emulator.models import State, rbac

log = logging.getLogger("emulator.rpc")

#: Largest request message accepted. Neither grpclib nor the modal 1.6.4 client sets a message
#: size limit (modal/_utils/grpc_utils.py `create_channel_config` sets only keepalive and 64 MiB
#: flow-control windows), so Modal's limit is inferred: the client sends `modal.Dict` values
#: inline (modal/dict.py `put`/`update`: DictUpdateRequest, no blob path) and Modal documents a
#: 100 MiB per-object Dict limit (modal.com/docs/guide/dicts-and-queues), while a larger
#: request comes back as HTTP status 413, which modal/dict.py and modal/queue.py turn into
#: `RequestSizeError` (they match "status = '413'"). So: 100 MiB, answered with :status 413.
MAX_MESSAGE_BYTES = 100 << 20
#: Prefix of container-made calls in the RPC counts (`/_emulator/rpc-counts`).
CONTAINER_PREFIX = "container:"
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
    max_message_bytes: int = MAX_MESSAGE_BYTES  # larger requests: HTTP 413, body unread


@dataclass
class Context:
    """What a handler gets besides its request."""

    state: State
    config: ServerConfig
    method: str
    metadata: dict[str, str]
    runtime: Any = None  # emulator.runtime.Runtime when containers run, else None
    task_id: str = ""  # set when the call comes from a container (its own unix socket)
    #: Who calls: None for the workspace Owner, else a service user or a container's identity
    #: (dev/emulator/models/service_users.py `ServiceUser`), checked by dev/emulator/models/rbac.py.
    identity: Any = None

    @property
    def client_version(self) -> str:
        return self.metadata.get("x-modal-client-version", "")

    @property
    def identity_id(self) -> str:
        """ "" for the Owner, else the id `App.created_by` records."""
        return str(self.identity.identity_id) if self.identity is not None else ""

    def may_read(self, env_id: str) -> bool:
        """Whether the caller may see what lives in the environment (logs, lists)."""
        if self.identity is None:
            return True
        return self.state.service_users.role_in(self.identity, env_id) in rbac.READ_ROLES


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
    "PERMISSION_DENIED": Status.PERMISSION_DENIED,
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
        #: (app name, environment id, deployer id) of this socket's container, read once.
        self._container_app: tuple[str, str, str] | None = None

    def _authenticate(self, method: str, metadata: dict[str, str]) -> Any:
        """Who is calling: None for the workspace Owner (the emulator's own token, or any
        token in any-token mode that no service user was ever issued), else the identity every
        call is checked against (dev/emulator/models/rbac.py): the service user whose token was
        sent, or, on a container's own socket, the container (`_container`).

        A token id this emulator issued to a service user is that service user's or nobody's,
        in every auth mode (issue 32 item 3): a wrong secret, an expired token, a deleted
        (retired) user's token, or one minted here that the state no longer holds (a reset) is
        UNAUTHENTICATED, never taken for the Owner."""
        cfg = self.config
        users = self.state.service_users
        token_id = metadata.get("x-modal-token-id", "")
        token_secret = metadata.get("x-modal-token-secret", "")
        if self.task_id and not token_id:
            return self._container(method)  # a container's own client sends no token
        if token_id and token_id != cfg.token_id:
            service_user = users.authenticate(token_id, token_secret)
            if service_user is not None:
                return service_user
            holder = users.holds_token(token_id)
            if holder is not None:
                self._refuse(
                    method,
                    f"The token of service user {holder.name!r} (token id {token_id!r}) is "
                    "expired or was sent with a wrong secret. Use the secret shown when it "
                    "was created, or create a new service user.",
                )
            retired = users.retired(token_id)
            if retired is not None:
                self._refuse(
                    method,
                    f"Token id {token_id!r} belonged to service user {retired!r}, which was "
                    "deleted (a rotation deletes the previous service user): it is retired. "
                    "Use the current service user's token.",
                )
            if users.minted_here(token_id):
                self._refuse(
                    method,
                    f"Token id {token_id!r} was issued by this emulator to a service user it "
                    "no longer knows (its state was reset). Create the service user again "
                    "and use its new token.",
                )
        if self.task_id and token_id != cfg.token_id:
            # Code in a container sent a token that is neither a service user's nor the
            # workspace's own: it acts as the container, never promoted (any-token mode too).
            return self._container(method)
        if cfg.token_id is None or cfg.token_secret is None:
            return None  # any-token mode: the workspace's own token
        ok = hmac.compare_digest(token_id.encode(), cfg.token_id.encode()) and hmac.compare_digest(
            token_secret.encode(), cfg.token_secret.encode()
        )
        if not ok:
            shown = token_id or "(none)"
            self._refuse(
                method,
                f"Invalid or missing token: token id {shown!r} with its secret is not accepted "
                "by this emulator. Use the --token-id/--token-secret it was started with "
                "(MODAL_TOKEN_ID / MODAL_TOKEN_SECRET).",
            )
        return None

    @staticmethod
    def _refuse(method: str, message: str) -> NoReturn:
        log.warning("%s: UNAUTHENTICATED: %s", method, message)
        raise GRPCError(Status.UNAUTHENTICATED, message)

    def _container(self, method: str) -> Any:
        """The identity of the container whose socket this is (issue 32 item 2): the role of
        whoever created or last deployed its app, in the app's environment only, never the
        Owner. On Modal a container's client authenticates with credentials of its own task
        (modal 1.6.4 `_Client.from_env`: inside a container, `MODAL_TASK_ID` and no token;
        `_container_entrypoint` never receives the deployer's token), so it cannot act as
        the deploying user beyond what its task is given."""
        container = self.runtime.container(self.task_id) if self.runtime is not None else None
        if container is not None and self._container_app is None:
            # Read once per container (its socket's servicer): every input poll and heartbeat
            # passes here, and `apps.get` is a write transaction. The app's deployer is that
            # of the version this container was started for ("the deployment that started
            # it"); the deployer's role is still looked up on every call.
            with contextlib.suppress(EmulatorError):
                app = self.state.apps.get(container.app_id)
                self._container_app = (app.name or app.description or app.id, app.env_id,
                                       app.created_by)  # fmt: skip
        if container is None or self._container_app is None:
            self._refuse(
                method,
                f"Container {self.task_id} is not running (or its app is gone): its calls are "
                "no longer accepted.",
            )
        name, env_id, deployer = self._container_app
        return self.state.service_users.container_identity(self.task_id, name, env_id, deployer)

    async def _dispatch(self, method: str, stream: Stream[Any, Any]) -> None:
        # Calls a running container makes (its input long polls, heartbeats, the app's own
        # calls) are counted apart, so a client's call counts do not depend on containers.
        self.counter.add(f"{CONTAINER_PREFIX}{method}" if self.task_id else method)
        metadata = {str(k): str(v) for k, v in stream.metadata.items()} if stream.metadata else {}
        service_user = self._authenticate(method, metadata)
        fn = REGISTRY.get(method)
        if fn is None:
            log.info("%s: not implemented (answered UNIMPLEMENTED)", method)
            raise GRPCError(
                Status.UNIMPLEMENTED,
                f"{method} is not implemented by the Modal emulator; see docs/emulator.md for "
                "the RPCs it serves.",
            )
        request = await self._recv_request(method, stream)
        rule = None
        # roles: dev/emulator/models/rbac.py (the Owner is not checked)
        if service_user is not None:
            try:
                rule = rbac.authorize(self.state, self.runtime, service_user, method, request)
            except EmulatorError as exc:
                log.info("%s: %s: %s", method, exc.status_name, exc)
                raise GRPCError(_STATUS[exc.status_name], str(exc)) from None
        await _inject_fault(method, "before")
        ctx = Context(
            state=self.state,
            config=self.config,
            method=method,
            metadata=metadata,
            runtime=self.runtime,
            task_id=self.task_id,
            identity=service_user,
        )
        started = time.perf_counter()
        try:
            if inspect.isasyncgenfunction(fn):
                async for message in fn(ctx, request):
                    await stream.send_message(message)
            else:
                key = metadata.get("x-idempotency-key", "")
                if key:
                    # Keyed by caller too (issue 32 item 5): a key is the client's own
                    # (modal/_utils/grpc_utils.py makes one per call), never a way to replay
                    # another identity's answer.
                    caller = service_user.id if service_user is not None else "owner"
                    result = await IDEMPOTENCY.run(
                        f"{caller}/{method}", key, lambda: _call(fn, ctx, request)
                    )
                else:
                    result = await _call(fn, ctx, request)
                await _inject_fault(method, "after")  # applied, then the answer is lost
                if rule is not None:
                    result = rbac.filter_answer(self.state, service_user, rule, result)
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

    async def _recv_request(self, method: str, stream: Stream[Any, Any]) -> Any:
        """The request message, read like grpclib's `recv_message` but defensively.

        grpclib reads a message's 5-byte prefix and then buffers as many bytes as the prefix
        claims, with no limit, and turns a truncated frame, a compressed flag or bytes that
        are not the RPC's protobuf into "Internal Server Error" (UNKNOWN), which the modal
        client retries as a server fault. Here the prefix is checked first: a message over
        `max_message_bytes` is answered HTTP 413 before its body is read (what Modal's front
        end answers, see MAX_MESSAGE_BYTES), and every malformed request is INVALID_ARGUMENT
        naming the RPC. Uses grpclib's stream internals (`_stream`, `_codec`, `_recv_type`),
        pinned with grpclib 0.4.x (no test since issue 33 item 7: no real client sends these).
        """
        raw = stream._stream

        def refuse(message: str) -> GRPCError:
            log.info("%s: INVALID_ARGUMENT: %s", method, message)
            return GRPCError(Status.INVALID_ARGUMENT, message)

        try:
            prefix = await raw.recv_data(5)
        except AssertionError:  # grpclib: "Received less data than expected"
            prefix = b""
        if len(prefix) < 5:
            raise refuse(
                f"{method} request has no complete message (the stream ended before a whole "
                "5-byte gRPC message prefix arrived); send one protobuf message.",
            )
        compressed, length = struct.unpack(">?I", prefix)
        if compressed:
            raise refuse(
                f"{method} request is compressed, which the emulator does not support (and no "
                "grpc-encoding was negotiated); send it uncompressed.",
            )
        limit = self.config.max_message_bytes
        if length > limit:
            message = (
                f"{method} request of {length} bytes exceeds the emulator's message size limit "
                f"of {limit} bytes (like Modal, which answers HTTP 413); send large data as a "
                "blob (BlobCreate) instead."
            )
            log.warning("%s", message)
            await raw.send_headers(
                [
                    (":status", "413"),
                    ("grpc-status", str(Status.RESOURCE_EXHAUSTED.value)),
                    ("grpc-message", message),
                ],
                end_stream=True,
            )
            if raw.closable:
                raw.reset_nowait()  # stop the client sending the rest of the body
            stream._send_trailing_metadata_done = True  # the answer is complete
            raise GRPCError(Status.RESOURCE_EXHAUSTED, message)
        try:
            body = await raw.recv_data(length)
        except AssertionError:  # grpclib: "Received less data than expected"
            body = b""
        if len(body) != length:
            raise refuse(
                f"{method} request is truncated: its prefix announces {length} bytes but the "
                "stream ended before all of them arrived.",
            )
        try:
            return stream._codec.decode(body, stream._recv_type)
        except DecodeError as exc:
            raise refuse(
                f"{method} request is not a valid {stream._recv_type.__name__} protobuf "
                f"({exc}); the emulator serves the modal 1.6.4 API.",
            ) from None


async def _inject_fault(method: str, when: str) -> None:
    """Delay and/or fail this call as a test armed it (dev/emulator/faults.py); no-op otherwise."""
    fault = FAULTS.take(method, when)
    if fault is None:
        return
    log.info("%s: injected fault %s (%s the handler)", method, fault, when)
    if fault.delay_s:
        await asyncio.sleep(fault.delay_s)
    if fault.status != "NONE":
        raise GRPCError(Status[fault.status], f"injected fault: {fault.status} {when} {method}")


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
