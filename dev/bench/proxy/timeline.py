"""``python -m bench.proxy.timeline [--requests N] [--token-delay-ms D]
[--first-token-delay-ms D]`` (``make bench-proxy-timeline``): where a streamed answer's time
to first byte goes, seen from the client, for the engine called directly, the
proxy and nginx, in one run.

Why: the latency bench's TTFB row (``python -m bench.proxy``) gives one number per target. This
splits it. For each streamed request the client records when the response head was parsed,
when the first body bytes were read (the TTFB), when the stream ended, and how many body bytes
that first read held. The stand-in engine writes the head, then each event, then the end, each
its own write (uvicorn's ``send`` per ASGI message); with ``--token-delay-ms 0`` (the latency
bench's TTFB mode) all of it in a burst, else the events that far apart;
``--first-token-delay-ms`` puts a pause between the head and the first event (a prefill), so
the head is relayed with nothing else going on.

Reading it: a target whose head is as late as its first event loses its time before or at the
head (the request's way in, the engine's head on its way out), not in relaying events. A first
read that holds most of the stream means the client could not read between the head and the
events: they were relayed while it waited for a CPU (on 2 CPUs the engine's burst and the
proxy's relay can keep both busy).

Raw numbers go to data/bench-results/proxy_timeline.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench.proxy.loadgen import AUTH, CHAT, PATH
from bench.proxy.procs import Nginx, Proxy, machine
from bench.standin import PROJECT_ROOT, StubEngineProcess
from serving.proxy.upstream import UpstreamClient

BLOCK = 50  # requests to one target before the next (the order rotates each round)
COLUMNS = ("head", "first", "end")


async def _stream_once(client: UpstreamClient, body: bytes) -> tuple[float, float, float, int, int]:
    t0 = time.perf_counter()
    resp = await client.request(b"POST", PATH, AUTH, body)
    await resp.head()
    head = time.perf_counter() - t0
    data = await resp.read()
    first = time.perf_counter() - t0
    first_bytes = total = len(data)
    while data:
        data = await resp.read()
        total += len(data)
    if resp.status != 200:
        raise RuntimeError(f"timeline request failed with HTTP {resp.status}")
    return head, first, time.perf_counter() - t0, first_bytes, total


async def _measure(targets: dict[str, str], n: int, warmup: int) -> dict[str, dict[str, Any]]:
    body = json.dumps({**CHAT, "stream": True}).encode()
    clients = {name: UpstreamClient(url, idle_ttl_s=3600) for name, url in targets.items()}
    for client in clients.values():
        for _ in range(warmup):
            await _stream_once(client, body)
    rows: dict[str, dict[str, Any]] = {
        name: {"head": [], "first": [], "end": [], "first_bytes": [], "total_bytes": []}
        for name in clients
    }
    names = list(clients)
    for turn in range(-(-n // BLOCK)):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            for _ in range(BLOCK):
                row = rows[name]
                for key, value in zip(row, await _stream_once(clients[name], body), strict=True):
                    row[key].append(value)
    for client in clients.values():
        client.close()
    return rows


def render(rows: dict[str, dict[str, Any]]) -> str:
    direct = {col: statistics.median(rows["direct"][col]) for col in COLUMNS}
    out = [
        "| target | head p50 ms | first event p50 ms (TTFB) | end p50 ms | first read, bytes p50 |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        cells = []
        for col in COLUMNS:
            value = statistics.median(row[col])
            added = "" if name == "direct" else f" ({(value - direct[col]) * 1000:+.3f})"
            cells.append(f"{value * 1000:.3f}{added}")
        first_bytes = int(statistics.median(row["first_bytes"]))
        total = int(statistics.median(row["total_bytes"]))
        out.append(f"| {name} | {' | '.join(cells)} | {first_bytes} of {total} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.timeline", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="streams per target")
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0,
                        help="the engine's pause between its head and the first event")  # fmt: skip
    parser.add_argument("--token-delay-ms", type=float, default=0.0,
                        help="the engine's pause between events (0: a burst)")  # fmt: skip
    parser.add_argument(
        "--json", type=Path, default=PROJECT_ROOT / "data/bench-results/proxy_timeline.json"
    )
    args = parser.parse_args(argv)
    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, "
          f"load avg {info['load_avg_at_start']}", flush=True)  # fmt: skip
    stub = StubEngineProcess(
        tokens=16, token_delay_ms=args.token_delay_ms,
        first_token_delay_ms=args.first_token_delay_ms, record=False,
    ).start()  # fmt: skip
    proxy = nginx = None
    try:
        proxy = Proxy(stub.url)
        targets = {"direct": stub.url, "proxy": proxy.url}
        if shutil.which("nginx"):
            nginx = Nginx(stub.port)
            targets["nginx"] = nginx.url
        rows = asyncio.run(_measure(targets, args.requests, warmup=100))
    finally:
        for thing in (proxy, nginx):
            if thing is not None:
                thing.stop()
        stub.stop()
    print(f"\nStreamed chat, 16 events, the first {args.first_token_delay_ms:g} ms after the head, "
          f"{args.token_delay_ms:g} ms between events, {args.requests} per target; added ms "
          "vs direct in brackets\n")  # fmt: skip
    print(render(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "token_delay_ms": args.token_delay_ms,
                                     "first_token_delay_ms": args.first_token_delay_ms,
                                     "rows": rows}, indent=1))  # fmt: skip
    print(f"\nraw results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
