"""The relay (serving/proxy/relay.py) on the proxy's real upstream client, against a raw engine
server sending canned bytes, with a client writer that records what it is asked to write:
how many writes the client's socket gets for an engine answer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from serving.proxy.exchange import Exchange, Route
from serving.proxy.metrics import Metrics
from serving.proxy.relay import Relay
from serving.proxy.upstream import UpstreamClient
from tests.serving.test_proxy_upstream import replying, with_server

EVENTS = [b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(3)]
EVENTS.append(b"data: [DONE]\n\n")
STREAM = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
STREAM += b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in EVENTS) + b"0\r\n\r\n"
WHOLE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class _Writer:
    """A ClientWriter that records each write it is asked for."""

    def __init__(self) -> None:
        self.disconnected = False
        self.on_disconnect: Any = None
        self.calls: list[tuple[str, bytes]] = []

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        self.calls.append(("respond", body))
        return False

    def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.calls.append(("start_stream", b""))  # the head is held until the first write

    def write_piece(self, data: bytes) -> bool:
        self.calls.append(("write_piece", data))
        return False

    def end_stream(self, data: bytes) -> None:
        self.calls.append(("end_stream", data))

    def when_drained(self, callback: Any) -> None:
        callback()

    def when_flushed(self, callback: Any) -> None:
        callback()

    def fail(self) -> None:
        self.calls.append(("fail", b""))


class _Host:
    """What the relay asks of the app (RelayHost), for answers that need no error."""

    config = SimpleNamespace(max_response_bytes=1 << 20, keepalive_s=0, upstream_timeout_s=30)

    def __init__(self) -> None:
        self.metrics = Metrics()

    def hold(self, ex: Exchange, size: int) -> bool:
        return True

    def answer_error(self, *args: object) -> None:
        raise AssertionError(f"no error expected: {args}")

    def answer_buffers_full(self, *args: object) -> None:
        raise AssertionError("no error expected")


async def _relay(url: str) -> list[tuple[str, bytes]]:
    client = UpstreamClient(url)
    route = Route(b"/v1/chat/completions", "chat_completions", "POST", 0, usage=True)
    ex = Exchange(0.0, route, b"req-1", "POST", b"/v1/chat/completions")
    writer = _Writer()
    done = asyncio.get_running_loop().create_future()
    relay = Relay(_Host(), ex, writer, lambda _: done.set_result(None))
    resp = await client.request(b"POST", b"/v1/chat/completions", [], b"{}")
    relay.start(resp, 0.0)
    await asyncio.wait_for(done, 5)
    client.close()
    return writer.calls


def test_a_stream_whose_events_and_end_come_in_one_read_is_one_write() -> None:
    # An engine's last event and its end usually come in one read (uvicorn writes a final
    # body message and the chunked terminator together): they leave in one write, not two.
    calls: list[tuple[str, bytes]] = []

    async def body(url: str) -> None:
        calls.extend(await _relay(url))

    asyncio.run(with_server(replying(STREAM, piece=len(STREAM)), body))
    assert calls == [("start_stream", b""), ("end_stream", b"".join(EVENTS))]


@pytest.mark.parametrize("piece", [1, 7, 64])
def test_a_stream_cut_anywhere_relays_every_byte_in_order_and_ends_once(piece: int) -> None:
    calls: list[tuple[str, bytes]] = []

    async def body(url: str) -> None:
        calls.extend(await _relay(url))

    asyncio.run(with_server(replying(STREAM, piece=piece), body))
    assert calls[0] == ("start_stream", b"")
    assert [name for name, _ in calls[1:-1]] == ["write_piece"] * (len(calls) - 2)
    assert calls[-1][0] == "end_stream"
    assert b"".join(data for _, data in calls) == b"".join(EVENTS)


def test_a_whole_answer_in_one_read_is_one_write() -> None:
    calls: list[tuple[str, bytes]] = []

    async def body(url: str) -> None:
        calls.extend(await _relay(url))

    asyncio.run(with_server(replying(WHOLE, piece=len(WHOLE)), body))
    assert calls == [("respond", b"{}")]
