"""Load generator for the proxy benchmark; runs in its own process (uvloop when installed).

``python -m bench.proxy.loadgen '<json job>'`` prints one JSON result line on stdout. Jobs:
- ``{"kind": "latency", "targets": {name: url}, "n": N, "block": B, "warmup": W,
  "body": "68B" | "64KiB", "stream": false}``: sequential requests, rotating between targets
  every B requests (B = 1: one by one, "interleaved", so each request finds caches cold from
  the other target's), the order rotated each round (no target always follows the same one),
  so that noise from other processes hits every target alike;
  per-target latencies (s) and, when present, the ``x-proxy-overhead-ms`` header values.
  With ``"stream": true`` the latency is the time to the first body bytes of a stream (the
  first event; TTFB), the rest of the stream is then read and dropped.
- ``{"kind": "streams", "url": U, "concurrency": C, "duration_s": S, "warmup_s": W,
  "burst": false}``: C workers each running streamed chat requests back to back for S
  seconds (``"burst": true``: in rounds, all C streams started together and the next round
  once all C have ended); only events and TTFTs in the window [W, S] count (connecting,
  and any reconnect of a proxy's pool whose idle connections expired while other targets
  ran, fall in the warm-up); prints
  ``{"mark": "start"}`` / ``{"mark": "end"}`` at the window's edges so the caller can read
  CPU counters there.
- ``{"kind": "clients", "url": U, "n": N}``: the same sequential requests straight to the
  stub with our client, httpx and aiohttp (whichever are installed), to show why the proxy
  carries its own client: per-request latency and this process's CPU time.
- ``{"kind": "hold", "url": U, "streams": N}``: open N streams that stay open (the stub
  pauses them), print ``{"open": N}``, wait for a line on stdin, then close them all.

The client is the proxy's own pooled HTTP/1.1 client (serving/proxy/upstream.py), the
cheapest one we have, so the generator is not the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from serving.proxy.upstream import UpstreamClient

AUTH = [(b"authorization", b"Bearer sk-bench-0123456789"), (b"content-type", b"application/json")]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "bench me please"}]}
# 68 bytes: the small request. 64 KiB: a realistic chat with some context.
BODIES = {
    "68B": json.dumps({"model": "m", "messages": [{"role": "user", "content": "say two words"}]},
                      separators=(",", ":")).encode(),
    "64KiB": json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": ("lorem ipsum dolor sit amet " * 2500)[:65400]}]},
        separators=(",", ":")).encode(),
}  # fmt: skip
STREAM_BODY = json.dumps({**CHAT, "stream": True}).encode()
HOLD_BODY = json.dumps(
    {**CHAT, "stream": True, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 600}}
).encode()
PATH = b"/v1/chat/completions"


async def _one(
    client: UpstreamClient, body: bytes, stream: bool = False
) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    resp = await client.request(b"POST", PATH, AUTH, body)
    await resp.head()
    if stream:
        await resp.read()
        elapsed = time.perf_counter() - t0  # first body bytes: time to first event
        while await resp.read() != b"":
            pass
    else:
        await resp.read_all(1 << 24)
        elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"bench request failed with HTTP {resp.status}")
    overhead = None
    for name, value in resp.headers:
        if name == b"x-proxy-overhead-ms":
            overhead = float(value) / 1000
    return elapsed, overhead


async def latency(job: dict[str, Any]) -> dict[str, Any]:
    # idle_ttl_s: the bench's own connections never expire between blocks
    clients = {name: UpstreamClient(url, idle_ttl_s=3600) for name, url in job["targets"].items()}
    stream = bool(job.get("stream", False))
    body = (
        json.dumps({**CHAT, "stream": True}).encode() if stream else BODIES[job.get("body", "68B")]
    )
    for client in clients.values():
        for _ in range(job["warmup"]):
            await _one(client, body, stream)
    lat: dict[str, list[float]] = {name: [] for name in clients}
    ovh: dict[str, list[float]] = {name: [] for name in clients}
    done = 0
    names = list(clients)
    turn = 0
    while done < job["n"]:
        # The order rotates each round: a target is not always the one right after the same
        # other target (with "block": 1, the one after "direct" found other caches colder and
        # was measured slower, whatever it was: a position effect, not the target's own).
        start = turn % len(names)
        turn += 1
        for name in names[start:] + names[:start]:
            client = clients[name]
            for _ in range(job["block"]):
                elapsed, overhead = await _one(client, body, stream)
                lat[name].append(elapsed)
                if overhead is not None:
                    ovh[name].append(overhead)
        done += job["block"]
    return {"latency": lat, "overhead_header": ovh}


async def streams(job: dict[str, Any]) -> dict[str, Any]:
    client = UpstreamClient(job["url"], max_idle=100000, connect_retries=10, idle_ttl_s=3600)
    t_start = time.perf_counter()
    w_start = t_start + job.get("warmup_s", 0.0)
    w_end = t_start + job["duration_s"]
    ttfts: list[float] = []
    counts = {"events": 0, "streams": 0, "errors": 0}
    marks: dict[str, float] = {}

    async def mark_window() -> None:
        await asyncio.sleep(max(0.0, w_start - time.perf_counter()))
        print(json.dumps({"mark": "start"}), flush=True)
        marks["cpu0"] = time.process_time()
        await asyncio.sleep(max(0.0, w_end - time.perf_counter()))
        print(json.dumps({"mark": "end"}), flush=True)
        marks["cpu1"] = time.process_time()

    async def one(warm: bool) -> None:
        t0 = time.perf_counter()
        try:
            resp = await client.request(b"POST", PATH, AUTH, STREAM_BODY)
            await resp.head()
            first = True
            while True:
                data = await resp.read()
                if not data:
                    break
                now = time.perf_counter()
                if first:
                    if warm and w_start <= t0 and now <= w_end:
                        ttfts.append(now - t0)
                    first = False
                if w_start <= now <= w_end:
                    counts["events"] += data.count(b"data: {")
            if w_start <= t0:
                counts["streams"] += 1
        except Exception:
            counts["errors"] += 1
            await asyncio.sleep(0.01)

    async def worker() -> None:
        warm = False  # a worker's first stream pays for connecting: not counted in TTFT
        while time.perf_counter() < w_end:
            await one(warm)
            warm = True

    async def bursts() -> None:
        """All C streams start together; the next C once every one has ended (the GPU
        bench's load: a batch finishes together and the next batch arrives together)."""
        warm = False
        while time.perf_counter() < w_end:
            await asyncio.gather(*(one(warm) for _ in range(job["concurrency"])))
            warm = True

    if job.get("burst"):
        await asyncio.gather(mark_window(), bursts())
    else:
        await asyncio.gather(mark_window(), *(worker() for _ in range(job["concurrency"])))
    wall = w_end - w_start
    cpu = marks["cpu1"] - marks["cpu0"]
    return {"ttft": ttfts, "wall_s": wall, "loadgen_cpu_s": cpu, **counts}


async def clients(job: dict[str, Any]) -> dict[str, Any]:
    url = job["url"] + PATH.decode()
    headers = {k.decode(): v.decode() for k, v in AUTH}
    calls: dict[str, Callable[[], Awaitable[None]]] = {}
    ours = UpstreamClient(job["url"])

    async def call_ours() -> None:
        await _one(ours, BODIES["68B"])

    calls["ours (serving/proxy/upstream.py)"] = call_ours
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        import httpx

        hx = httpx.AsyncClient()
        closers.append(hx.aclose)

        async def call_httpx() -> None:
            r = await hx.post(url, content=BODIES["68B"], headers=headers)
            r.raise_for_status()

        calls[f"httpx {httpx.__version__}"] = call_httpx
    except ImportError:
        pass
    try:
        import aiohttp

        session = aiohttp.ClientSession()
        closers.append(session.close)

        async def call_aiohttp() -> None:
            async with session.post(url, data=BODIES["68B"], headers=headers) as r:
                await r.read()
                r.raise_for_status()

        calls[f"aiohttp {aiohttp.__version__}"] = call_aiohttp
    except ImportError:
        pass
    results: dict[str, Any] = {}
    for name, call in calls.items():
        for _ in range(200):
            await call()
        lat = []
        cpu0 = time.process_time()
        for _ in range(job["n"]):
            t0 = time.perf_counter()
            await call()
            lat.append(time.perf_counter() - t0)
        results[name] = {"latency": lat, "cpu_s": time.process_time() - cpu0}
    for close in closers:
        await close()
    return results


async def hold(job: dict[str, Any]) -> None:
    client = UpstreamClient(job["url"], max_idle=100000, connect_retries=10)
    responses = []

    async def open_one() -> None:
        resp = await client.request(b"POST", PATH, AUTH, HOLD_BODY)
        await resp.head()
        while True:
            data = await resp.read()
            if data:
                break
        responses.append(resp)

    await asyncio.gather(*(open_one() for _ in range(job["streams"])))
    print(json.dumps({"open": len(responses)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for resp in responses:
        resp.abort()
    print(json.dumps({"closed": len(responses)}), flush=True)


def main() -> None:
    job = json.loads(sys.argv[1])
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        if job["kind"] == "latency":
            print(json.dumps(runner.run(latency(job))), flush=True)
        elif job["kind"] == "streams":
            print(json.dumps(runner.run(streams(job))), flush=True)
        elif job["kind"] == "clients":
            print(json.dumps(runner.run(clients(job))), flush=True)
        elif job["kind"] == "hold":
            runner.run(hold(job))
        else:
            raise SystemExit(f"unknown job kind {job['kind']!r}")


if __name__ == "__main__":
    main()
