"""One request's facts, from its head to its access-log line: which route it matched, who
sent it, what came of it. ``app.py`` fills them in as the request passes its steps,
``relay.py`` as the engine answers; ``ProxyApp._account`` turns them into metrics and the
access line."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Exchange", "Route"]


@dataclass(frozen=True, slots=True)
class Route:
    path: bytes
    name: str  # metric/log label
    method: str
    kind: int
    usage: bool = False  # responses carry an OpenAI ``usage`` object
    method_bytes: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method_bytes", self.method.encode())


class Exchange:
    """Per-request facts gathered for the access log and metrics, and what ends the request."""

    __slots__ = (
        "admitted",
        "body_held",
        "body_unread",
        "client_gone",
        "completion_tokens",
        "done",
        "duration",
        "ended",
        "error",
        "held",
        "key",
        "method",
        "overhead",
        "path",
        "prompt_tokens",
        "relay",
        "request_id",
        "route",
        "share_full",
        "status",
        "stream",
        "t0",
        "ttft",
        "usage_seen",
        "waiter",
        "wants_usage",
    )

    def __init__(
        self, t0: float, route: Route, request_id: bytes, method: str, path: bytes
    ) -> None:
        self.t0 = t0
        self.route = route
        self.method = method
        self.path = path
        self.request_id = request_id
        self.key = "-"
        self.status = 0
        self.ttft: float | None = None
        self.overhead = 0.0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.error: str | None = None
        self.stream = False
        self.wants_usage = False  # the client set stream_options.include_usage
        self.client_gone = False
        self.relay: Any = None  # its relay.Relay, once the request went to the engine
        # Engine bytes that carry the usage object (a whole answer, or a stream's last two
        # reads that had one): token counts are read from them when the request is accounted.
        self.usage_seen: list[bytes] = []
        self.body_unread = False  # the client announced a body the proxy has not read
        self.held = 0  # bytes of the proxy's buffer budget this request holds
        self.body_held = 0  # of which request-body bytes (also counted in the key's share)
        self.share_full = False  # refused because its key's share of the budget was full
        self.admitted = False  # counted in metrics.in_flight
        self.waiter: Any = None  # app._Waiter while it waits for an in-flight slot
        self.ended = False  # ProxyApp._end ran: slot and budget given back, accounted
        self.duration = 0.0  # seconds from the first byte handled to the end
        # Set by the ASGI path (a coroutine waits for it); ``_end`` completes it.
        self.done: asyncio.Future[None] | None = None
