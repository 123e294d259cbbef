"""The proxy's own HTTP/1.1 client against a raw socket server that sends canned bytes, split
into tiny pieces, so every parser state sees partial input."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest

from serving.proxy.upstream import _PAUSE_AT, ConnectFailed, UpstreamBroken, UpstreamClient

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def with_server(script: Script, body: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await body(f"http://127.0.0.1:{port}")
    finally:
        server.close()


def replying(*responses: bytes, piece: int = 1) -> Script:
    """A server that answers each request on a connection with the next canned response,
    written ``piece`` bytes at a time."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for response in responses:
            await reader.readuntil(b"\r\n\r\n")
            for i in range(0, len(response), piece):
                writer.write(response[i : i + piece])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    return script


async def fetch(client: UpstreamClient, method: bytes = b"GET") -> tuple[int, bytes]:
    resp = await client.request(method, b"/x", [])
    await resp.head()
    return resp.status, await resp.read_all(1 << 22)


CHUNKED = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: 1\r\n\r\n"
)
LENGTH = b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world"


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_chunked_and_length_bodies_in_any_split(piece: int) -> None:
    async def body(url: str) -> None:
        client = UpstreamClient(url)
        assert await fetch(client) == (200, b"hello world")
        assert client.idle_connections == 1  # reusable: kept in the pool
        assert await fetch(client) == (200, b"hello world")  # same connection, next response

    asyncio.run(with_server(replying(CHUNKED, LENGTH, piece=piece), body))


def test_idle_connections_past_their_ttl_are_pruned() -> None:
    async def body(url: str) -> None:
        client = UpstreamClient(url, idle_ttl_s=0.05)
        assert await fetch(client) == (200, b"hello world")
        assert client.idle_connections == 1
        await asyncio.sleep(0.1)
        client.prune()
        assert client.idle_connections == 0

    asyncio.run(with_server(replying(LENGTH, piece=1000), body))


def test_informational_head_is_skipped_and_close_delimited_body_is_read_to_eof() -> None:
    response = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nconnection: close\r\n\r\nbye"

    async def body(url: str) -> None:
        client = UpstreamClient(url)
        assert await fetch(client) == (201, b"bye")
        assert client.idle_connections == 0  # "connection: close" is never pooled

    asyncio.run(with_server(replying(response, piece=2), body))


EVENTS = [b'data: {"i": %d, "text": "%s"}\n\n' % (i, b"w" * (i % 7)) for i in range(40)]
BURST = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS[:20])
    # with extensions (RFC 9112 7.1.1: no whitespace after one; llhttp refuses it)
    + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in EVENTS[20:])
    + b"0\r\n\r\n"
)


@pytest.mark.parametrize("piece", [1, 5, 17, 64, 333, 100000])
def test_a_burst_of_many_chunks_in_one_read_or_cut_anywhere(piece: int) -> None:
    # An engine's many small SSE chunks arrive in one read (taken in one pass) or cut at any
    # byte: the body is the same, and the connection goes back to the pool.
    async def body(url: str) -> None:
        client = UpstreamClient(url)
        for _ in range(2):
            assert await fetch(client) == (200, b"".join(EVENTS))
            assert client.idle_connections == 1

    asyncio.run(with_server(replying(BURST, BURST, piece=piece), body))


@pytest.mark.parametrize(
    "tail",
    [b"5\r\nhelloXY0\r\n\r\n", b"zz\r\nhello\r\n0\r\n\r\n", b"0x5\r\nhello\r\n", b"1" * 1100],
    ids=["bad-crlf", "bad-size", "hex-prefix", "size-line-too-long"],
)
def test_a_bad_chunk_after_good_ones_in_the_same_read_breaks_the_exchange(tail: bytes) -> None:
    async def body(url: str) -> None:
        with pytest.raises(UpstreamBroken):
            await fetch(UpstreamClient(url))

    response = BURST[: BURST.index(b"0\r\n\r\n")] + tail
    asyncio.run(with_server(replying(response, piece=100000), body))


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 2xx OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort",
        b"HTTP/1.1 999 Odd\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 20 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
    ],
    ids=[
        "bad-size", "bad-crlf", "bad-status-line", "bad-status", "truncated", "status-999",
        "status-2-digits", "negative-length", "conflicting-lengths", "hex-prefix", "signed-size",
    ],
)  # fmt: skip
def test_malformed_or_truncated_responses_raise_upstream_broken(response: bytes) -> None:
    async def body(url: str) -> None:
        with pytest.raises(UpstreamBroken):
            await fetch(UpstreamClient(url))

    asyncio.run(with_server(replying(response, piece=4), body))


def test_connect_refused_is_connect_failed_after_retries() -> None:
    async def body() -> None:
        server = await asyncio.start_server(replying(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        client = UpstreamClient(f"http://127.0.0.1:{port}", connect_retries=2, retry_backoff_s=0.01)
        with pytest.raises(ConnectFailed):
            await fetch(client)
        assert client.retries == 2

    asyncio.run(body())


def test_upstream_url_must_be_plain_http_origin() -> None:
    for bad in ("https://127.0.0.1:8001", "http://127.0.0.1:8001/v1", "127.0.0.1:8001"):
        with pytest.raises(ValueError, match="upstream URL"):
            UpstreamClient(bad)


def test_head_and_204_have_no_body_and_keep_the_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n"  # the length of the GET body
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"

    async def body(url: str) -> None:
        client = UpstreamClient(url)
        assert await fetch(client, b"HEAD") == (200, b"")
        assert await fetch(client) == (204, b"")
        assert await fetch(client) == (200, b"hello world")  # still in step: same connection
        assert client.idle_connections == 1

    asyncio.run(with_server(replying(head, no_content, LENGTH, piece=5), body))


def test_connection_close_with_a_length_is_read_whole_and_not_pooled() -> None:
    closing = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"

    async def body(url: str) -> None:
        client = UpstreamClient(url)
        assert await fetch(client) == (200, b"hello")
        assert client.idle_connections == 0

    asyncio.run(with_server(replying(closing, piece=3), body))


def test_reset_during_a_close_delimited_body_is_an_error_not_the_end() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart of a bo")
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN: the body was cut

    async def body(url: str) -> None:
        with pytest.raises(UpstreamBroken, match="mid-response"):
            await fetch(UpstreamClient(url))

    asyncio.run(with_server(script, body))


def test_body_that_ends_past_the_pause_mark_leaves_a_working_pooled_connection() -> None:
    """The last piece of a large body pushes the unread backlog over the pause mark: the
    connection goes back to the pool and must still read the next response."""
    big = b"x" * (_PAUSE_AT + 1)  # the pause can only happen with the very last byte
    big_response = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big

    async def body(url: str) -> None:
        client = UpstreamClient(url)
        resp = await client.request(b"GET", b"/x", [])
        await resp.head()
        while not resp.finished:  # let the whole body arrive before reading any of it
            await asyncio.sleep(0.005)
        assert client.idle_connections == 1
        assert len(await resp.read_all(1 << 22)) == len(big)
        # a paused pooled connection would wait here forever for bytes it never reads
        assert await asyncio.wait_for(fetch(client), 10) == (200, b"hello world")

    asyncio.run(with_server(replying(big_response, LENGTH, piece=1 << 20), body))


def test_header_block_checked_at_once_accepts_what_the_rules_allow() -> None:
    # One regex over the whole header block (token ":" value without controls but HTAB); a
    # block it refuses is checked line by line for the message.
    ok = (
        b"HTTP/1.1 200 OK\r\nx-tab:\tv\tw \r\nx-empty:\r\nx-colon: a:b\r\n"
        b"x-obs: caf\xe9\r\ncontent-length: 2\r\n\r\nok"
    )

    async def body(url: str) -> None:
        client = UpstreamClient(url)
        resp = await client.request(b"GET", b"/x", [])
        await resp.head()
        assert await resp.read_all(100) == b"ok"
        assert resp.headers[:4] == [
            (b"x-tab", b"v\tw"), (b"x-empty", b""), (b"x-colon", b"a:b"), (b"x-obs", b"caf\xe9"),
        ]  # fmt: skip

    asyncio.run(with_server(replying(ok), body))
    for bad, why in (
        (b"x-del: a\x7fb", "controls"),
        (b"x-lf: a\nb", "controls"),
        (b"x sp: a", "token"),
        (b"no-colon", "token"),
    ):
        response = b"HTTP/1.1 200 OK\r\n" + bad + b"\r\ncontent-length: 0\r\n\r\n"

        async def broken(url: str, why: str = why) -> None:
            with pytest.raises(UpstreamBroken, match=why):
                await fetch(UpstreamClient(url))

        asyncio.run(with_server(replying(response), broken))


class _Recorder:
    """A ResponseListener that records its events; ``fail_on`` makes one of them raise."""

    def __init__(self, fail_on: str = "") -> None:
        self.events: list[tuple[str, object]] = []
        self.fail_on = fail_on
        self.over = asyncio.get_running_loop().create_future()

    def _note(self, name: str, value: object = None) -> None:
        self.events.append((name, value))
        if name == self.fail_on:
            raise RuntimeError(f"simulated bug in {name}")

    def on_head(self) -> None:
        self._note("head")

    def on_data(self, data: bytes) -> None:
        self._note("data", data)

    def on_end(self, data: bytes) -> None:
        self._note("end", data)
        self.over.set_result(None)

    def on_error(self, error: Exception) -> None:
        self.events.append(("error", type(error).__name__))
        self.over.set_result(None)

    def on_tick(self) -> None:
        self._note("tick")

    def on_bug(self, exc: Exception) -> None:
        self.events.append(("bug", str(exc)))
        self.over.set_result(None)


@pytest.mark.parametrize("piece", [1, 1000])
def test_a_listener_gets_head_pieces_and_end_in_order_from_the_callbacks(piece: int) -> None:
    async def body(url: str) -> None:
        client = UpstreamClient(url)
        assert client.idle_connections == 0  # none yet
        resp = await client.request(b"GET", b"/x", [])
        listener = _Recorder()
        resp.listen(listener)
        await listener.over
        assert listener.events[0] == ("head", None) and listener.events[-1][0] == "end"
        data = b"".join(v for k, v in listener.events if k in ("data", "end"))  # type: ignore[misc]
        assert data == b"hello world"
        if piece == 1000:  # all in one read: the body comes with the end, for one write
            assert listener.events == [("head", None), ("end", b"hello world")]
        # the connection went back to the pool before the end was announced: reusable now
        assert client.idle_connections == 1
        again = await client.request(b"GET", b"/x", [])
        assert client.idle_connections == 0  # the same connection, taken from the pool
        second = _Recorder()
        again.listen(second)
        await second.over
        assert second.events[-1][0] == "end"

    asyncio.run(with_server(replying(CHUNKED, LENGTH, piece=piece), body))


@pytest.mark.parametrize(
    ("fail_on", "piece", "pooled"),
    [
        # One byte per read: the body's first pieces come through on_data, before the end;
        # the connection is dropped (the response is not complete).
        ("head", 1, 0),
        ("data", 1, 0),
        # The response was parsed whole before on_end: its connection is clean and pooled.
        ("end", 1000, 1),
    ],
)
def test_a_listener_that_raises_gets_on_bug_once_and_no_event_after(
    fail_on: str, piece: int, pooled: int
) -> None:
    async def body(url: str) -> None:
        client = UpstreamClient(url)
        resp = await client.request(b"GET", b"/x", [])
        listener = _Recorder(fail_on=fail_on)
        resp.listen(listener)
        await listener.over
        await asyncio.sleep(0.05)  # any event that would still come
        assert listener.events[-1][0] == "bug" and fail_on in str(listener.events[-1][1])
        ends = [k for k, _ in listener.events if k in ("end", "error", "bug")]
        assert ends == (["end", "bug"] if fail_on == "end" else ["bug"])
        assert resp.finished and client.idle_connections == pooled

    asyncio.run(with_server(replying(CHUNKED, piece=piece), body))


def test_an_abort_with_an_error_from_on_data_ends_with_that_error_only() -> None:
    async def body(url: str) -> None:
        client = UpstreamClient(url)
        resp = await client.request(b"GET", b"/x", [])
        listener = _Recorder()

        def on_data(data: bytes) -> None:
            listener.events.append(("data", data))
            resp.abort(UpstreamBroken("too large"))

        listener.on_data = on_data  # type: ignore[method-assign]
        resp.listen(listener)
        await listener.over
        await asyncio.sleep(0.05)
        assert [k for k, _ in listener.events] == ["head", "data", "error"]
        assert client.idle_connections == 0  # never pooled after an abort

    # one byte per read: the first body byte comes through on_data, not with the end
    asyncio.run(with_server(replying(LENGTH, piece=1), body))
