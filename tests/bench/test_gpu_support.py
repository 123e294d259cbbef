"""The GPU tests' own helpers (tests/gpu/support.py), on this machine (no GPU): a client that
reads the first events of a stream stays connected until it closes, and the gauge polls
read what a scripted gauge gives them.

Kept (issue 33 item 7): the product's GPU tests (tests/gpu/test_vllm_serving.py and
test_sglang_serving.py: the proxy passes a client's disconnect on to the engine) rely on these
helpers; a client that left at a `for ... break` would make those checks pass without testing
the disconnect (httpx's stream closes on the generator's exit: httpcore 1.0.9
httpcore/_sync/connection_pool.py `PoolByteStream.__iter__`; docs/gpu.md run AE)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.gpu.support import gauge_reads, read_events, wait_stable_zero
from tests.harness.stub_engine import StubEngine, running_stub

TOKENS = 400  # 4 s of 10 ms tokens: far longer than any test here stays
STREAM = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def engine() -> Iterator[StubEngine]:
    """The project's stub engine, streaming a token every 10 ms; its record says whether the
    client went away before the end (``cancelled``) and how many tokens it sent."""
    with running_stub(tokens=TOKENS, token_delay_ms=10) as stub:
        yield stub


def record(engine: StubEngine) -> dict[str, Any]:
    [only] = engine.requests("/v1/chat/completions")
    return only


def wait_cancelled(engine: StubEngine, timeout: float = 2.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if record(engine)["cancelled"]:
            return True
        time.sleep(0.01)
    return False


def test_read_events_keeps_the_client_until_it_closes(engine: StubEngine) -> None:
    """read_events on a held iter_lines(): the engine still streams 0.3 s later, and sees the
    client go only at r.close()."""
    client = httpx.Client(base_url=engine.url, timeout=10)
    with client, client.stream("POST", "/v1/chat/completions", json=STREAM) as r:
        lines = r.iter_lines()
        assert read_events(lines, 5) == 5
        time.sleep(0.3)
        assert not record(engine)["cancelled"], "the client left before it closed"
        r.close()
        del lines  # held until the close above
    assert wait_cancelled(engine)
    assert 20 <= record(engine)["tokens_sent"] < TOKENS  # it streamed on while the client held


def test_a_for_loop_that_breaks_leaves_at_the_break(engine: StubEngine) -> None:
    """Why read_events exists (its docstring): `for line in r.iter_lines(): ... break` closes
    the connection at the break, with r.close() not yet called (httpx 0.28.1, httpcore)."""
    client = httpx.Client(base_url=engine.url, timeout=10)
    with client, client.stream("POST", "/v1/chat/completions", json=STREAM) as r:
        count = 0
        for line in r.iter_lines():
            count += line.startswith("data:")
            if count >= 5:
                break
        assert wait_cancelled(engine, timeout=1.0), "the client stayed after the break"
    assert record(engine)["tokens_sent"] < TOKENS


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
