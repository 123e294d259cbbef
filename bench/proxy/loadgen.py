"""Load generator for the proxy benchmark; runs in its own process (uvloop when installed).

``python -m bench.proxy.loadgen '<json job>'`` prints one JSON result line on stdout. Jobs:
- ``{"kind": "latency", "targets": {name: url}, "n": N, "block": B, "warmup": W}``:
  sequential non-stream requests, rotating between targets every B requests so that noise
  from other processes hits every target alike; per-target latencies (s) and, when present,
  the ``x-proxy-overhead-ms`` header values.
- ``{"kind": "streams", "url": U, "concurrency": C, "duration_s": S}``: C workers each
  running streamed chat requests back to back for S seconds; SSE events, streams, and TTFTs
  (a worker's first stream, which opens the connection, is left out of the TTFTs).
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
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "bench me please"}]}
NON_STREAM_BODY = json.dumps({**CHAT, "stub": {"tokens": 16, "token_delay_ms": 0}}).encode()
STREAM_BODY = json.dumps({**CHAT, "stream": True}).encode()
HOLD_BODY = json.dumps(
    {**CHAT, "stream": True, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 600}}
).encode()
PATH = b"/v1/chat/completions"


async def _one(client: UpstreamClient, body: bytes) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    resp = await client.request(b"POST", PATH, AUTH, body)
    await resp.head()
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
    clients = {name: UpstreamClient(url) for name, url in job["targets"].items()}
    for client in clients.values():
        for _ in range(job["warmup"]):
            await _one(client, NON_STREAM_BODY)
    lat: dict[str, list[float]] = {name: [] for name in clients}
    ovh: dict[str, list[float]] = {name: [] for name in clients}
    done = 0
    while done < job["n"]:
        for name, client in clients.items():
            for _ in range(job["block"]):
                elapsed, overhead = await _one(client, NON_STREAM_BODY)
                lat[name].append(elapsed)
                if overhead is not None:
                    ovh[name].append(overhead)
        done += job["block"]
    return {"latency": lat, "overhead_header": ovh}


async def streams(job: dict[str, Any]) -> dict[str, Any]:
    client = UpstreamClient(job["url"], max_idle=100000, connect_retries=10)
    deadline = time.perf_counter() + job["duration_s"]
    ttfts: list[float] = []
    counts = {"events": 0, "streams": 0, "errors": 0}

    async def worker() -> None:
        warm = False  # a worker's first stream pays for connecting: not counted in TTFT
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                resp = await client.request(b"POST", PATH, AUTH, STREAM_BODY)
                await resp.head()
                first = True
                while True:
                    data = await resp.read()
                    if data is None:
                        continue
                    if not data:
                        break
                    if first:
                        if warm:
                            ttfts.append(time.perf_counter() - t0)
                        first = False
                    counts["events"] += data.count(b"data: {")
                counts["streams"] += 1
                warm = True
            except Exception:
                counts["errors"] += 1
                await asyncio.sleep(0.01)

    t_start = time.perf_counter()
    cpu_start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(job["concurrency"])))
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu_start
    return {"ttft": ttfts, "wall_s": wall, "loadgen_cpu_s": cpu, **counts}


async def clients(job: dict[str, Any]) -> dict[str, Any]:
    url = job["url"] + PATH.decode()
    headers = {k.decode(): v.decode() for k, v in AUTH}
    calls: dict[str, Callable[[], Awaitable[None]]] = {}
    ours = UpstreamClient(job["url"])

    async def call_ours() -> None:
        await _one(ours, NON_STREAM_BODY)

    calls["ours (serving/proxy/upstream.py)"] = call_ours
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        import httpx

        hx = httpx.AsyncClient()
        closers.append(hx.aclose)

        async def call_httpx() -> None:
            r = await hx.post(url, content=NON_STREAM_BODY, headers=headers)
            r.raise_for_status()

        calls[f"httpx {httpx.__version__}"] = call_httpx
    except ImportError:
        pass
    try:
        import aiohttp

        session = aiohttp.ClientSession()
        closers.append(session.close)

        async def call_aiohttp() -> None:
            async with session.post(url, data=NON_STREAM_BODY, headers=headers) as r:
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
