"""`/ready` hysteresis: one failed engine /health poll does not turn traffic away.

The stub's ``health_fail_next=N`` makes its next N /health answers 503, so the number of failed
polls the proxy sees is exact. The proxy counts them (``proxy_health_check_failures_total``)
and logs each state change (``engine_ready`` / ``engine_not_ready`` events).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import pytest

from serving.proxy import KeyRing, ProxyApp, ProxyConfig
from serving.proxy.__main__ import build_parser
from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import AUTH, CHAT, KEYS, RunningProxy, wait_until


def state_changes(caplog: pytest.LogCaptureFixture) -> list[str]:
    events = []
    for record in caplog.records:
        if record.name == "serving.proxy" and record.getMessage().startswith("{"):
            events.append(json.loads(record.getMessage())["event"])
    return [e for e in events if e in ("engine_ready", "engine_not_ready")]


def polls_after(engine: StubEngine, start: int, n: int) -> None:
    wait_until(lambda: engine.app.health_hits >= start + n, what=f"{n} more /health polls")


def test_one_failed_poll_keeps_a_ready_engine_ready(
    proxy: RunningProxy, stub_engine: StubEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="serving.proxy")
    start = stub_engine.app.health_hits
    stub_engine.configure(health_fail_next=1)
    polls_after(stub_engine, start, 3)  # the failed poll and two good ones after it
    assert proxy.app.metrics.health_failures == 1  # the proxy did see the failure
    assert state_changes(caplog) == []  # and never went not ready
    assert proxy.app.ready
    with proxy.client(headers=AUTH) as c:
        assert c.get("/ready").status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        metrics = c.get("/metrics").text
    assert "proxy_health_check_failures_total 1\n" in metrics
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "serving.proxy"]
    assert [e["failed_in_a_row"] for e in logged if e["event"] == "engine_health_failed"] == [1]


def test_failures_in_a_row_make_it_not_ready_then_a_good_poll_ready_again(
    proxy: RunningProxy, stub_engine: StubEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="serving.proxy")
    start = stub_engine.app.health_hits
    stub_engine.configure(health_fail_next=2)
    polls_after(stub_engine, start, 3)
    wait_until(lambda: proxy.app.ready, what="the engine to be ready again")
    assert proxy.app.metrics.health_failures == 2
    assert state_changes(caplog) == ["engine_not_ready", "engine_ready"]


def test_setting_one_restores_the_old_behaviour(
    start_proxy: Callable[..., RunningProxy],
    stub_engine: StubEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = start_proxy(unready_after_failures=1)
    caplog.set_level(logging.INFO, logger="serving.proxy")
    caplog.clear()  # from here on: the start-up's own "engine_ready" is not part of it
    start = stub_engine.app.health_hits
    stub_engine.configure(health_fail_next=1)
    polls_after(stub_engine, start, 2)
    wait_until(lambda: proxy.app.ready, what="the engine to be ready again")
    assert state_changes(caplog) == ["engine_not_ready", "engine_ready"]


def test_cli_flag_and_validation() -> None:
    args = build_parser().parse_args(
        ["--upstream", "http://127.0.0.1:1", "--port", "1", "--unready-after-failures", "3"]
    )
    assert args.unready_after_failures == 3
    assert build_parser().parse_args(["--upstream", "u", "--port", "1"]).unready_after_failures == 2
    with pytest.raises(ValueError, match="unready_after_failures=0 is invalid"):
        ProxyConfig(upstream="http://127.0.0.1:1", unready_after_failures=0)


def test_shutdown_while_a_health_poll_completes_ends_the_poller(stub_engine: StubEngine) -> None:
    # A cancel that arrived just as a poll finished used to be swallowed (Python 3.11's
    # asyncio.wait_for, gh-86296): the poller kept polling and shutdown never returned (tests
    # saw 10 s teardowns). Here the poll (a real one, to the stub) finishes in the same loop
    # iteration as shutdown cancels the poller.
    async def main() -> tuple[int, int]:
        app = ProxyApp(ProxyConfig(upstream=stub_engine.url, health_interval_s=0.01), KeyRing(KEYS))
        real = app._check_health
        gate = asyncio.get_running_loop().create_future()

        async def check() -> tuple[bool, str]:
            result = await real()
            await gate  # released together with the cancel below
            return result

        app._check_health = check  # type: ignore[method-assign]
        await app.startup()
        while stub_engine.app.health_hits == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # the poll's answer is in: check() waits on the gate
        gate.set_result(None)
        stopping = asyncio.ensure_future(app.shutdown())
        done, _ = await asyncio.wait([stopping], timeout=3)
        assert done, "shutdown still waits for the health poller after 3 s"
        hits = stub_engine.app.health_hits
        await asyncio.sleep(0.1)
        return hits, stub_engine.app.health_hits

    hits_at_stop, hits_later = asyncio.run(main())
    assert hits_later == hits_at_stop  # the poller is gone: no polls after shutdown
