"""The GPU tests' own helpers (tests/gpu/support.py), on this machine (no GPU): a client that
reads the first events of a stream stays connected until it closes, and the gauge polls
read what a scripted gauge gives them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.gpu.support import gauge_reads, read_events, wait_stable_zero

EVENTS = 400  # 4 s of 10 ms events: far longer than any test here stays


class StreamServer:
    """A real socket that streams SSE events every 10 ms and records when it sees the client
    go (EOF or a failed write), as an engine notices a client that left."""

    def __init__(self) -> None:
        self.gone_at: float | None = None
        self.sent = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        try:
            for i in range(EVENTS):
                data = f'data: {{"n": {i}}}\n\n'.encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                self.sent = i + 1
                await asyncio.sleep(0.01)
                if reader.at_eof():
                    break
        except ConnectionError:
            pass
        self.gone_at = time.monotonic()
        writer.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture
def stream_server() -> Iterator[StreamServer]:
    server = StreamServer()
    yield server
    server.stop()


def wait_gone(server: StreamServer, timeout: float = 2.0) -> float | None:
    end = time.monotonic() + timeout
    while server.gone_at is None and time.monotonic() < end:
        time.sleep(0.01)
    return server.gone_at


def test_read_events_keeps_the_client_until_it_closes(stream_server: StreamServer) -> None:
    """read_events on a held iter_lines(): the server still streams 0.3 s later, and sees the
    client go only at r.close()."""
    with httpx.Client(timeout=10) as client:
        url = f"http://127.0.0.1:{stream_server.port}/"
        with client.stream("GET", url) as r:
            lines = r.iter_lines()
            assert read_events(lines, 5) == 5
            time.sleep(0.3)
            assert stream_server.gone_at is None, "the client left before it closed"
            sent_while_open = stream_server.sent
            t_close = time.monotonic()
            r.close()
            del lines  # held until the close above
    gone = wait_gone(stream_server)
    assert sent_while_open >= 20  # the server kept streaming while the client held it
    assert gone is not None and gone >= t_close


def test_a_for_loop_that_breaks_leaves_at_the_break(stream_server: StreamServer) -> None:
    """Why read_events exists (its docstring): `for line in r.iter_lines(): ... break` closes
    the connection at the break, with r.close() not yet called (httpx 0.28.1, httpcore)."""
    with httpx.Client(timeout=10) as client:
        url = f"http://127.0.0.1:{stream_server.port}/"
        with client.stream("GET", url) as r:
            count = 0
            for line in r.iter_lines():
                count += line.startswith("data:")
                if count >= 5:
                    break
            gone = wait_gone(stream_server, timeout=1.0)
            t_close = time.monotonic()
    assert gone is not None and gone < t_close
    assert stream_server.sent < EVENTS


def scripted(values: list[float]) -> Callable[[httpx.Client], float]:
    """A gauge that reads `values` in turn (the last one from then on)."""
    it = iter(values)
    last = [values[-1]]

    def read(_: httpx.Client) -> float:
        last[0] = next(it, last[0])
        return last[0]

    return read


def test_gauge_reads_reads_for_the_time_given() -> None:
    with httpx.Client() as client:
        reads = gauge_reads(client, 0.1, read=scripted([1, 1, 0]))
    # every 20 ms for 0.1 s, and one at the start: at most 6 (a sleep runs long, never
    # short), at least 2 (one read after the first sleep)
    assert 2 <= len(reads) <= 6
    assert reads == ([1, 1, 0] + [0] * 6)[: len(reads)]  # in order, the last value held


def test_wait_stable_zero_needs_a_held_zero() -> None:
    """A 0 between 1s is not a free slot: the run of zeros counts from the last 1."""
    with httpx.Client() as client:
        zero_at, last = wait_stable_zero(
            client, hold_s=0.1, timeout=2, read=scripted([1, 0, 1, 1, 0, 0])
        )
        assert last == 0 and zero_at is not None
        assert zero_at >= 4 * 0.02 * 0.9  # not the first 0, the 0 after the last 1
        never, value = wait_stable_zero(client, hold_s=0.1, timeout=0.2, read=scripted([1, 0] * 20))
    assert never is None and value in (0, 1)
