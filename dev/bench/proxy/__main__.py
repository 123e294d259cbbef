"""``python -m bench.proxy [--quick] [--reps N] [--no-nginx] [--only PARTS] [--baseline-ref REF
| --baseline-root DIR] [--proxy-workers N] [--bursts]``: the proxy vs calling the stub engine
directly vs nginx, in one run, with the issue-13 targets table; optionally also the proxy as
of a commit, or from a directory (e.g. compiled by ``python -m bench.proxy.compiled DIR``),
and the proxy with ``--workers N`` (target "proxy xN").

Starts, in separate processes: the stub engine (tests/harness/stub_engine.py, uvicorn +
uvloop), our proxy (``python -m serving.proxy``, on uvicorn as deployed, access log on, stderr
to /dev/null) and nginx as a plain reverse proxy (generated config, one worker, keep-alive
upstream pool, ``proxy_buffering off``; skipped with a hint when nginx is not installed:
``apt-get install -y nginx``), all on loopback. The load generator (dev/bench/proxy/loadgen.py,
uvloop, our pooled client) runs in its own process.

Each part is repeated ``--reps`` times (default 5) and reported as the median over the reps
with the spread (min-max); a target row passes when the median meets it, and says in how many
reps it was met. Parts:
1. ``latency``: one request at a time, added latency = a percentile through a proxy minus the
   same percentile direct, per rep; targets take turns in blocks of 50 requests (or one by one,
   "interleaved": each request finds the caches cold from the other targets' work). Bodies of
   68 B and 64 KiB; streams: time to first event (TTFB).
2. ``streams``: 256 and 1024 concurrent streamed chats (stub: 16 tokens, 40 ms apart), also
   with one CPU kept busy by a spinning process; per rep one slice per target, taking turns;
   only the window after a warm-up counts, so (re)connecting is not measured (the proxy's
   pool drops connections idle for 4 s, below the engine's 5 s keep-alive, which happens
   while the other targets have their slices). SSE events/s and the ratio to direct, proxy
   CPU per relayed event (from /proc, read at the window's edges). ``--bursts``: each slice
   runs in synchronized rounds (all C streams start together, the next C once all have
   ended: the GPU bench's load shape) instead of C clients back to back.
3. ``json``: request-body validation throughput in this process (the proxy's own check,
   ``check_body``) at 68 B, 64 KiB, 1 MiB and the 4 MiB maximum body, and on a long chat
   history of 8000 small messages.
4. ``clients`` and ``memory`` (once): the upstream client choice, and RSS per open stream.
Raw numbers go to data/bench-results/proxy.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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


class Spinner:
    """Keeps one CPU busy (the "one CPU kept busy by another process" condition)."""

    def __enter__(self) -> Spinner:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run (2 reps, fewer levels)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per part (default 5)")
    p.add_argument("--no-nginx", action="store_true", help="skip the nginx baseline")
    p.add_argument("--only", default="json,latency,streams,clients,memory",
                   help="comma-separated parts (default: all)")  # fmt: skip
    p.add_argument("--json", type=Path, default=PROJECT_ROOT / "data/bench-results/proxy.json")
    p.add_argument("--baseline-ref", default=None, metavar="GIT_REF",
                   help="also measure the proxy as of this commit (its serving/ package, from "
                   "git archive) as target 'proxy at REF': a change against its own past, "
                   "in the same run")  # fmt: skip
    p.add_argument("--proxy-workers", type=int, default=0, metavar="N",
                   help="also measure the proxy with --workers N (N > 1) as target "
                   "'proxy xN' in the latency and streams parts")  # fmt: skip
    p.add_argument("--bursts", action="store_true",
                   help="streams part: in synchronized rounds (all C streams start together, "
                   "the next C once all have ended) instead of C clients back to back")  # fmt: skip
    p.add_argument("--baseline-root", type=Path, default=None, metavar="DIR",
                   help="instead: the proxy in DIR (a directory holding a `serving` package, "
                   "e.g. one built by `python -m bench.proxy.compiled DIR`) as target "
                   "'proxy at DIRNAME'")  # fmt: skip
    args = p.parse_args(argv)
    if args.baseline_ref and args.baseline_root:
        p.error("give --baseline-ref or --baseline-root, not both")
    if args.baseline_root and (problem := root_problem(args.baseline_root)):
        p.error(problem)
    if args.proxy_workers == 1 or args.proxy_workers < 0:
        p.error("--proxy-workers N needs N > 1 (the plain 'proxy' target is one process)")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    quick = args.quick
    reps = args.reps or (2 if quick else 5)
    n_latency = 400 if quick else 2000
    levels = [256] if quick else [256, 1024]
    duration, warmup = (3.0, 1.0) if quick else (6.0, 1.5)
    use_nginx = not args.no_nginx and shutil.which("nginx") is not None
    if not args.no_nginx and not use_nginx:
        print("nginx not found: install it with `apt-get install -y nginx` (Debian package "
              "`nginx`) for the nginx column; skipping it")  # fmt: skip

    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, "
          f"load avg {info['load_avg_at_start']}", flush=True)  # fmt: skip
    # Non-stream parts use an engine that answers at once; streams a 25 tokens/s one.
    stub = StubEngineProcess(tokens=TOKENS, token_delay_ms=0, record=False).start()
    proxy = nginx = baseline = workers = None
    results: dict[str, Any] = {"machine": info, "quick": quick, "reps": reps}
    t_start = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="bench-proxy-baseline-")
    try:
        proxy = Proxy(stub.url)
        nginx = Nginx(stub.port) if use_nginx else None
        targets = {"direct": stub.url, "proxy": proxy.url}
        assert stub.proc is not None
        pids = {"direct": stub.proc.pid, "proxy": proxy.proc.pid}
        if nginx:
            targets["nginx"] = nginx.url
            pids["nginx"] = nginx.proc.pid
        lat_targets = dict(targets)
        lat_pids = dict(pids)
        if args.proxy_workers:  # CPU is read over the process tree: main + workers
            workers = Proxy(stub.url, "--workers", str(args.proxy_workers))
            lat_targets[f"proxy x{args.proxy_workers}"] = workers.url
            lat_pids[f"proxy x{args.proxy_workers}"] = workers.proc.pid
        if args.baseline_ref or args.baseline_root:
            if args.baseline_root:
                root = args.baseline_root.resolve()
                label = root.name
                results["baseline_root"] = str(root)
            else:
                root = _export(args.baseline_ref, Path(tmp.name))
                label = results["baseline_ref"] = args.baseline_ref
            baseline = Proxy(stub.url, root=root)
            name = f"proxy at {label}"
            lat_targets[name] = baseline.url
            lat_pids[name] = baseline.proc.pid

        parts = set(args.only.split(","))
        if "json" in parts:
            results["json"] = measure_json(reps)
        if "latency" in parts:
            results["latency"] = measure_latency(lat_targets, lat_pids, n_latency, reps)
        if "streams" in parts:
            stub.configure(token_delay_ms=TOKEN_DELAY_MS)
            lat_pids["direct"] = pids["direct"] = stub.pid  # a restart: new process, same port
            results["streams"] = measure_streams(
                lat_targets, lat_pids, levels, duration, warmup, reps, args.bursts
            )
            results["stream_bursts"] = args.bursts
            stub.configure(token_delay_ms=0)
        if "clients" in parts:
            results["clients"] = measure_clients(stub.url, 500 if quick else 2000)
        if "memory" in parts:
            stub.configure(token_delay_ms=TOKEN_DELAY_MS)
            results["memory_bytes_per_stream"] = measure_memory(stub, 256 if quick else 1024,
                                                                use_nginx)  # fmt: skip
    finally:
        for thing in (proxy, nginx, baseline, workers):
            if thing is not None:
                thing.stop()
        stub.stop()
        tmp.cleanup()
    results["minutes"] = (time.time() - t_start) / 60
    results["load_avg_at_end"] = machine()["load_avg_at_start"]

    print(render(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nraw results: {args.json}")
    return 0


def root_problem(root: Path) -> str | None:
    """What is wrong with ``root`` as a ``--baseline-root`` (None: it holds a proxy)."""
    if not (root / "serving/proxy/__main__.py").exists():
        return f"--baseline-root {root}: no serving/proxy/__main__.py there"
    return None


def _export(ref: str, into: Path) -> Path:
    """The ``serving`` package as of git ``ref``, unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "archive", ref, "serving"], cwd=PROJECT_ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure_json(reps: int) -> dict[str, Any]:
    """GB/s of the proxy's body check (``check_body``: simdjson from 16 KiB, else orjson) vs
    orjson alone and the stdlib parser."""
    import orjson

    from bench.proxy.loadgen import BODIES
    from serving.proxy.app import check_body

    chunk = ("lorem ipsum dolor sit amet " * 40000).encode()
    bodies = {
        "68 B": BODIES["68B"],
        "64 KiB": BODIES["64KiB"],
        "1 MiB": b'{"model":"m","messages":[{"role":"user","content":"' + chunk[:1048000] + b'"}]}',
        "4 MiB": b'{"model":"m","messages":[{"role":"user","content":"'
        + (chunk * 4)[: 4 * 1048576 - 80] + b'"}]}',
        # a long chat history: many small objects (the slowest shape to parse)
        "1 MiB, 8k messages": json.dumps({"model": "m", "messages": [
            {"role": "user", "content": f"message number {i} " + "word " * 20}
            for i in range(8000)]}).encode(),
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, body in bodies.items():
        row: dict[str, Any] = {"bytes": len(body)}
        for label, fn in (("proxy", check_body), ("orjson", orjson.loads), ("stdlib", json.loads)):
            n = max(3, 2_000_000 // len(body))
            speeds = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn(body)
                speeds.append(len(body) * n / (time.perf_counter() - t0) / 1e9)
            row[label] = speeds
        out[name] = row
    return out


def measure_latency(
    targets: dict[str, str], pids: dict[str, int], n: int, reps: int
) -> dict[str, Any]:
    modes: dict[str, dict[str, Any]] = {
        "68 B": {"body": "68B", "block": 50},
        "64 KiB": {"body": "64KiB", "block": 50},
        "68 B interleaved": {"body": "68B", "block": 1},
        "stream TTFB": {"stream": True, "block": 50},
    }
    out: dict[str, Any] = {"n": n, "modes": {}}
    for mode, extra in modes.items():
        per_rep: list[dict[str, Any]] = []
        for _ in range(reps):
            cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
            job = {"kind": "latency", "targets": targets, "n": n, "warmup": 100, **extra}
            lat = loadgen(job)
            total = n + 100
            cpu = {k: (cpu_seconds(v) - cpu0[k]) / total * 1e6 for k, v in pids.items()}
            cpu["direct"] /= len(targets)  # the stub served every target's requests
            rows = {
                name: {"p50_ms": pct(v, 0.5) * 1e3, "p99_ms": pct(v, 0.99) * 1e3}
                for name, v in lat["latency"].items()
            }
            header = lat["overhead_header"].get("proxy", [])
            per_rep.append({"rows": rows, "cpu_us_per_request": cpu,
                            "overhead_header_p50_ms": pct(header, 0.5) * 1e3})  # fmt: skip
        out["modes"][mode] = per_rep
        print(f"latency {mode}: done", flush=True)
    return out


def measure_streams(
    targets: dict[str, str],
    pids: dict[str, int],
    levels: list[int],
    duration: float,
    warmup: float,
    reps: int,
    bursts: bool = False,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for busy in (False, True):
        for c in levels:
            for rep in range(reps):
                for name, url in targets.items():
                    job = {"kind": "streams", "url": url, "concurrency": c,
                           "duration_s": duration, "warmup_s": warmup,
                           "burst": bursts}  # fmt: skip
                    if busy:
                        with Spinner():
                            r = _stream_slice(job, pids[name])
                    else:
                        r = _stream_slice(job, pids[name])
                    rows.append({"target": name, "concurrency": c, "busy_cpu": busy,
                                 "rep": rep, **r})  # fmt: skip
            print(f"streams {c}{' (one CPU busy)' if busy else ''}: done", flush=True)
    return rows


def _stream_slice(job: dict[str, Any], pid: int) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.proxy.loadgen", json.dumps(job)],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    cpu0 = cpu1 = 0.0
    m0 = m1 = (0.0, 0.0)
    result: dict[str, Any] = {}
    for line in proc.stdout:
        msg = json.loads(line)
        if msg.get("mark") == "start":
            cpu0, m0 = cpu_seconds(pid), machine_cpu()
        elif msg.get("mark") == "end":
            cpu1, m1 = cpu_seconds(pid), machine_cpu()
        else:
            result = msg
    if proc.wait(timeout=120) != 0 or not result:
        raise RuntimeError(
            f"stream slice failed: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
        )
    events = result["events"]
    return {
        "events_per_s": events / result["wall_s"], "events": events, "errors": result["errors"],
        "ttft_p50_ms": pct(result["ttft"], 0.5) * 1e3,
        "ttft_p99_ms": pct(result["ttft"], 0.99) * 1e3,
        "cpu_us_per_event": (cpu1 - cpu0) * 1e6 / max(1, events),
        "machine_busy": busy_share(m0, m1),
        "loadgen_cpu_share": result["loadgen_cpu_s"] / result["wall_s"],
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


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


if __name__ == "__main__":
    sys.exit(main())
