"""The proxy's own HTTP/1.1 client against a raw socket server that sends canned bytes, split
into tiny pieces, so every parser state sees partial input."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from serving.proxy.upstream import ConnectFailed, UpstreamBroken, UpstreamClient

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


async def fetch(client: UpstreamClient) -> tuple[int, bytes]:
    resp = await client.request(b"GET", b"/x", [])
    await resp.head()
    return resp.status, await resp.read_all(1 << 20)


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


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 2xx OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort",
    ],
    ids=["bad-size", "bad-crlf", "bad-status-line", "bad-status", "truncated"],
)
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
