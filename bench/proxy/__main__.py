"""``python -m bench.proxy [--quick] [--no-nginx] [--only PARTS]``: proxy vs direct vs nginx.

Starts, in separate processes: the stub engine (tests/harness/stub_engine.py, uvloop), our
proxy (``python -m serving.proxy``, access log on, stderr to /dev/null) and nginx as a plain
reverse proxy (generated config, one worker, keep-alive upstream pool, ``proxy_buffering
off``), all on loopback. The load generator (bench/proxy/loadgen.py) runs in its own process.

Measured in the same run, direct first, targets taking turns so the machine's changing load
hits them alike:
1. non-stream latency, one request at a time, targets interleaved in blocks of 50: p50/p99
   and the added latency (a percentile through a proxy minus the same percentile direct);
2. streams at 1, 64, 256, 1024 concurrent clients (stub: 16 tokens, 40 ms apart), in rounds
   of slices per target: TTFT p50/p99, SSE events/s and the ratio to direct;
3. memory per open stream: RSS of a fresh proxy (nginx: all its processes) with N streams
   held open minus RSS before, divided by N;
plus the CPU time each process used per request / per streamed event (for "direct": the
stub's) and how busy the whole machine was.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.proxy.procs import (
    Nginx,
    Proxy,
    busy_share,
    cpu_seconds,
    hold_streams,
    machine,
    machine_cpu,
)
from bench.proxy.report import TOKEN_DELAY_MS, TOKENS, render
from bench.standin import PROJECT_ROOT, StubEngineProcess


def loadgen(job: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.proxy.loadgen", json.dumps(job)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed for {job['kind']}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run (fewer requests/levels)")
    p.add_argument("--no-nginx", action="store_true", help="skip the nginx baseline")
    p.add_argument("--only", default="clients,latency,streams,memory",
                   help="comma-separated parts: clients, latency, streams, memory")  # fmt: skip
    p.add_argument("--json", type=Path, default=PROJECT_ROOT / "bench/results/proxy.json")
    args = p.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    quick = args.quick
    n_latency = 600 if quick else 5000
    levels = [1, 64, 256] if quick else [1, 64, 256, 1024]
    duration = 2.0 if quick else 4.0
    rounds = 2 if quick else 3
    hold_n = 256 if quick else 1024
    use_nginx = not args.no_nginx and shutil.which("nginx") is not None
    if not args.no_nginx and not use_nginx:
        print("nginx not found: install it with `apt-get install -y nginx` (skipping the floor)")

    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, "
          f"load avg {info['load_avg_at_start']}")  # fmt: skip
    stub = StubEngineProcess(tokens=TOKENS, token_delay_ms=TOKEN_DELAY_MS, record=False).start()
    proxy = nginx = None
    results: dict[str, Any] = {"machine": info, "quick": quick}
    try:
        proxy = Proxy(stub.url)
        nginx = Nginx(stub.port) if use_nginx else None
        targets = {"direct": stub.url, "proxy": proxy.url}
        assert stub.proc is not None
        pids = {"direct": stub.proc.pid, "proxy": proxy.proc.pid}
        if nginx:
            targets["nginx"] = nginx.url
            pids["nginx"] = nginx.proc.pid

        parts = set(args.only.split(","))
        if "clients" in parts:
            results["clients"] = measure_clients(stub.url, 500 if quick else 3000)
        # 1. non-stream latency
        if "latency" in parts:
            results["latency"] = measure_latency(targets, pids, n_latency)
        if "streams" in parts:
            results["streams"] = measure_streams(targets, pids, levels, duration, rounds)
        if "memory" in parts:
            results["memory_bytes_per_stream"] = measure_memory(stub, hold_n, use_nginx)
    finally:
        for thing in (proxy, nginx):
            if thing is not None:
                thing.stop()
        stub.stop()

    print(render(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nraw results: {args.json}")
    return 0


def measure_latency(
    targets: dict[str, str], pids: dict[str, int], n_latency: int
) -> dict[str, Any]:
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
    lat = loadgen({"kind": "latency", "targets": targets, "n": n_latency, "block": 50,
                   "warmup": 200})  # fmt: skip
    cpu_per_req = {k: (cpu_seconds(v) - cpu0[k]) / (n_latency + 200) for k, v in pids.items()}
    # the stub served every target's requests: its CPU per request is the engine side's cost
    cpu_per_req["direct"] /= len(targets)
    rows = {}
    for name, values in lat["latency"].items():
        rows[name] = {"p50_ms": pct(values, 0.5) * 1e3, "p99_ms": pct(values, 0.99) * 1e3}
    header = lat["overhead_header"].get("proxy", [])
    return {
        "n": n_latency, "rows": rows,
        "cpu_us_per_request": {k: v * 1e6 for k, v in cpu_per_req.items()},
        "overhead_header_p50_ms": pct(header, 0.5) * 1e3,
        "overhead_header_p99_ms": pct(header, 0.99) * 1e3,
    }  # fmt: skip


def measure_clients(url: str, n: int) -> dict[str, Any]:
    raw = loadgen({"kind": "clients", "url": url, "n": n})
    return {
        name: {
            "p50_ms": pct(r["latency"], 0.5) * 1e3,
            "p99_ms": pct(r["latency"], 0.99) * 1e3,
            "cpu_us_per_request": r["cpu_s"] * 1e6 / n,
        }
        for name, r in raw.items()
    } | {"n": n}


def measure_streams(
    targets: dict[str, str], pids: dict[str, int], levels: list[int], duration: float, rounds: int
) -> list[dict[str, Any]]:
    """Per level, the targets take turns (``rounds`` slices of ``duration`` s each), so a
    change in the machine's load hits them alike; figures are summed over the slices."""
    stream_rows: list[dict[str, Any]] = []
    for c in levels:
        acc: dict[str, dict[str, Any]] = {
            name: {"ttft": [], "events": 0, "wall": 0.0, "streams": 0, "errors": 0, "cpu": 0.0,
                   "busy": [], "loadgen_cpu": 0.0}
            for name in targets
        }  # fmt: skip
        for _ in range(rounds):
            for name, url in targets.items():
                a = acc[name]
                cpu_before = cpu_seconds(pids[name])
                machine_before = machine_cpu()
                job = {"kind": "streams", "url": url, "concurrency": c, "duration_s": duration}
                r = loadgen(job)
                a["busy"].append(busy_share(machine_before, machine_cpu()))
                a["cpu"] += cpu_seconds(pids[name]) - cpu_before
                a["ttft"] += r["ttft"]
                a["events"] += r["events"]
                a["wall"] += r["wall_s"]
                a["streams"] += r["streams"]
                a["errors"] += r["errors"]
                a["loadgen_cpu"] += r["loadgen_cpu_s"]
        for name, a in acc.items():
            stream_rows.append({
                "target": name, "concurrency": c, "ttft_p50_ms": pct(a["ttft"], 0.5) * 1e3,
                "ttft_p99_ms": pct(a["ttft"], 0.99) * 1e3,
                "events_per_s": a["events"] / a["wall"], "streams": a["streams"],
                "errors": a["errors"], "cpu_us_per_event": a["cpu"] * 1e6 / max(1, a["events"]),
                "machine_busy": sum(a["busy"]) / len(a["busy"]),
                "loadgen_cpu_share": a["loadgen_cpu"] / a["wall"],
            })  # fmt: skip
    return stream_rows


def measure_memory(stub: StubEngineProcess, hold_n: int, use_nginx: bool) -> dict[str, Any]:
    """Fresh proxy / nginx processes, so memory freed by earlier runs does not hide growth."""
    memory: dict[str, Any] = {"streams": hold_n}
    proxy = Proxy(stub.url)
    try:
        memory["proxy"] = hold_streams(proxy.url, hold_n, proxy.proc.pid)
    finally:
        proxy.stop()
    if use_nginx:
        nginx = Nginx(stub.port)
        try:
            memory["nginx"] = hold_streams(nginx.url, hold_n, nginx.proc.pid)
        finally:
            nginx.stop()
    return memory


if __name__ == "__main__":
    sys.exit(main())
