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


@dataclass(slots=True, eq=False)
class Exchange:
    """Per-request facts gathered for the access log and metrics, and what ends the request."""

    t0: float
    route: Route
    request_id: bytes
    method: str
    path: bytes
    key: str = "-"
    status: int = 0
    ttft: float | None = None
    overhead: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    stream: bool = False
    wants_usage: bool = False  # the client set stream_options.include_usage
    client_gone: bool = False
    relay: Any = None  # its relay.Relay, once the request went to the engine
    # Engine bytes that carry the usage object (a whole answer, or a stream's last two
    # reads that had one): token counts are read from them when the request is accounted.
    usage_seen: list[bytes] = field(default_factory=list)
    body_unread: bool = False  # the client announced a body the proxy has not read
    held: int = 0  # bytes of the proxy's buffer budget this request holds
    body_held: int = 0  # of which request-body bytes (also counted in the key's share)
    share_full: bool = False  # refused because its key's share of the budget was full
    admitted: bool = False  # counted in metrics.in_flight
    waiter: Any = None  # app._Waiter while it waits for an in-flight slot
    ended: bool = False  # ProxyApp._end ran: slot and budget given back, accounted
    duration: float = 0.0  # seconds from the first byte handled to the end
    # Set by the ASGI path (a coroutine waits for it); ``_end`` completes it.
    done: asyncio.Future[None] | None = None
