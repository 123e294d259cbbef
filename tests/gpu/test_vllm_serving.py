"""Real vLLM behind the proxy, started by the container's own lifecycle (`serving.engine`).

One start for the module (conftest `served`): the shipped spec with `snapshot: true`, run with
`--snapshot-cycle`, so readiness, warm-up and the sleep/wake a memory snapshot does all happen
before SERVING READY; then requests through the proxy (port 8000, with a key) and straight to
the engine (8001) where the comparison tells something.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from bench.gpu import device
from tests.gpu.support import (
    AUTH,
    ENGINE,
    PROXY,
    Served,
    chat,
    gauge_reads,
    metric_value,
    read_events,
    sse_data,
    usage_only,
    wait_stable_zero,
)

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
TARGETS = {"proxy": (PROXY, AUTH), "engine": (ENGINE, {})}
# Tokens asked of the stream a client leaves: ~4 s of decoding for the 1B model on an H100
# (one stream, ~3 ms a token: run AE made 117-135 in the ~0.35 s its client stayed), so it
# is still running when the client closes, 0.3 s after its first 5 events.
LONG_ANSWER = 1500
# How long after the slot is freed the engine must have made no more tokens.
STILL_S = 1.0


def test_ready_after_health_and_warm_up(served: Served, results: dict[str, Any]) -> None:
    healthy = served.first("healthy after")
    warmed = served.first("warm-up done")
    ready = served.first("SERVING READY")
    assert healthy <= warmed <= ready
    assert served.matching("warm-up done: 1 prompt(s) via /v1/chat/completions")
    with httpx.Client(timeout=30) as c:
        assert c.get(f"{PROXY}/ready").status_code == 200
        models = c.get(f"{PROXY}/v1/models", headers=AUTH)
        assert models.status_code == 200, models.text
        assert [m["id"] for m in models.json()["data"]] == [device.SERVED_NAME]
        assert c.get(f"{PROXY}/v1/models").status_code == 401  # no key
    results["ready"] = {
        "healthy_s": round(healthy, 1),
        "warmed_s": round(warmed, 1),
        "ready_s": round(ready, 1),
        "engine_lines": served.matching(
            "Loading weights took", "torch.compile", "Graph capturing", "init engine",
            "Available KV cache", "Maximum concurrency",
        ),
    }  # fmt: skip


def test_snapshot_cycle_sleeps_wakes_and_answers(served: Served, results: dict[str, Any]) -> None:
    warmed = served.first("warm-up done")
    slept = served.first("sleep: POST /sleep?level=1 -> 200")
    woke = served.first("wake: POST /wake_up -> 200")
    ready = served.first("SERVING READY")
    assert warmed <= slept <= woke <= ready
    t0 = time.monotonic()
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{PROXY}/v1/chat/completions", headers=AUTH, json=chat(16))
    first_answer_s = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    results["snapshot_cycle"] = {
        "sleep_s": round(slept - warmed, 2),
        "wake_s": round(woke - slept, 2),
        "answer_after_wake_s": round(first_answer_s, 3),
        "engine_lines": served.matching("sleep", "Sleep", "wake", "Wake", "freed"),
    }


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "no_usage"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_stream_usage(
    served: Served, results: dict[str, Any], target: str, include_usage: bool
) -> None:
    """The engine always ends a stream with a usage chunk (--enable-force-include-usage), so
    the proxy can count tokens; the proxy passes that chunk on only to clients who asked."""
    base, headers = TARGETS[target]
    extra: dict[str, Any] = {"stream": True}
    if include_usage:
        extra["stream_options"] = {"include_usage": True}
    with (
        httpx.Client(timeout=60) as c,
        c.stream(
            "POST", f"{base}/v1/chat/completions", headers=headers, json=chat(16, **extra)
        ) as r,
    ):
        assert r.status_code == 200
        events = sse_data(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    usage = usage_only(events)
    content = [e for e in events[:-1] if json.loads(e).get("choices")]
    expected = 1 if (include_usage or target == "engine") else 0
    results.setdefault("stream_usage", {})[f"{target}-{'with' if include_usage else 'without'}"] = {
        "events": len(events),
        "content_chunks": len(content),
        "usage_chunks": [u["usage"] for u in usage],
    }
    assert len(usage) == expected, events[-3:]
    if usage:
        assert usage[0]["usage"]["completion_tokens"] == 16
        assert json.loads(events[-2]) == usage[0]  # the last chunk before [DONE]


def test_non_stream_usage(served: Served) -> None:
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{PROXY}/v1/chat/completions", headers=AUTH, json=chat(16))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_client_disconnect_frees_the_engine_slot(
    served: Served, results: dict[str, Any], target: str
) -> None:
    """A client that goes away mid-stream: the engine's running-requests gauge back to 0
    within 1 s, and the answer cut short (through the proxy: the proxy must close its engine
    connection at once)."""
    base, headers = TARGETS[target]
    with httpx.Client(timeout=30) as metrics:
        idle, value = wait_stable_zero(metrics, hold_s=0.5, timeout=10)
        assert idle is not None, f"{value} requests still running before the test"
        generated_before = metric_value(metrics, device.GENERATION_METRIC) or 0.0
        body = chat(LONG_ANSWER, stream=True)  # still decoding when we leave
        client = httpx.Client(timeout=60)
        with client.stream("POST", f"{base}/v1/chat/completions", headers=headers, json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # held: the client stays until r.close() (read_events)
            assert read_events(lines, 5) == 5
            # the stream is open and decoding: the gauge counts it
            during = gauge_reads(metrics, 0.3)
            t_close = time.monotonic()
            r.close()  # the client disconnects mid-stream
            del lines  # held until the close above
        client.close()
        # freed: the gauge reads 0 at every poll for 0.5 s, from within 1 s of the close
        t_wait = time.monotonic()
        zero_after, left = wait_stable_zero(metrics, hold_s=0.5, timeout=10)
        generated = (metric_value(metrics, device.GENERATION_METRIC) or 0.0) - generated_before
        # and it stays so: a stream still decoding would add ~300 tokens a second
        time.sleep(STILL_S)
        later = (metric_value(metrics, device.GENERATION_METRIC) or 0.0) - generated_before
    gone_s = None if zero_after is None else round(t_wait - t_close + zero_after, 3)
    results.setdefault("disconnect", {})[target] = {
        "running_reads_before_close": len(during),
        "running_reads_ge_1_before_close": sum(1 for v in during if v >= 1),
        "running_after": left,
        "freed_within_s": gone_s,
        "tokens_generated": generated,
        f"tokens_generated_{STILL_S:g}s_later": later,
    }
    assert min(during) >= 1, f"the engine's gauge did not count the open stream: {during}"
    # the engine stopped the answer: no token after the gauge's 0, and fewer than asked
    # (ignore_eos: it would otherwise make all of them)
    assert later == generated, f"{later - generated} tokens generated after the slot was freed"
    assert 0 < generated < LONG_ANSWER, f"{generated} tokens generated of {LONG_ANSWER} asked"
    assert gone_s is not None and gone_s <= 1.0, (
        f"the gauge did not stay at 0 from within 1 s of the close (last read {left})"
    )
