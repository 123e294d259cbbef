"""``python -m bench.proxy.instructions [--baseline-ref REF | --baseline-root DIR]
[--requests N]``: the CPU instructions the proxy runs per request, for this checkout and a
baseline, in one run.

Why: the latency bench (``python -m bench.proxy``) measures what a client sees, but on a
shared 2-core machine its medians move by ±20 µs from run to run, so a change worth 5 µs of
CPU cannot be told from noise there. Counting instructions with valgrind's callgrind is
repeatable: the same binary, inputs and request give the same count (within 0.4 % on the
non-stream kinds, 1.4 % on the stream, here), whatever else the machine is doing. It
measures CPU cost only (user space: the kernel's socket work and wake-ups are not counted),
so it complements the latency bench and never replaces it.

How: the proxy runs under ``valgrind --tool=callgrind`` in front of the stub engine (its
access log on, as in the latency bench). After a warm-up of 50 requests the counters are
zeroed (``callgrind_control -z``), N requests are sent one at a time, and the counters are
dumped (``callgrind_control -d``): start-up, imports and shutdown are not in the count. The
engine health poll is set to once an hour, so no poll falls in the window (under valgrind a
request takes milliseconds, and a poll every 0.5 s would add 1-2 % that grows with wall time);
the server's once-a-second sweep still counts, well under 0.5 %.
Kinds: a 68 B and a 64 KiB non-stream
chat, a streamed chat (16 events), and ``GET /health`` (no key, no engine: the cost of the
HTTP server, the ASGI call and the access log alone).

Needs valgrind (``apt-get install -y valgrind``). Raw numbers go to
data/bench-results/proxy_instructions.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.proxy.__main__ import _export, loadgen, root_problem
from bench.proxy.procs import BENCH_KEY, free_port, wait_http
from bench.standin import PROJECT_ROOT, StubEngineProcess
from serving.proxy.keys import digest_of

WARMUP = 50
KINDS: dict[str, dict[str, Any]] = {
    "chat 68 B": {"body": "68B"},
    "chat 64 KiB": {"body": "64KiB"},
    # 5 ms between events: each event is one engine write and one proxy read, as with a real
    # engine (with no delay, how events group into reads varies from run to run: ±5 %).
    "stream, 16 events": {"stream": True, "token_delay_ms": 5},
    "GET /health": {"health": True},
}
_TOTALS_RE = re.compile(r"^(?:summary|totals): (\d+)", re.M)


def _health_requests(port: int, n: int) -> None:
    """``n`` keep-alive ``GET /health`` on one connection, one at a time."""
    request = b"GET /health HTTP/1.1\r\nhost: bench\r\nuser-agent: bench\r\naccept: */*\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        for _ in range(n):
            conn.sendall(request)
            got = b""
            while b"\r\n\r\n" not in got:
                got += conn.recv(65536)
            head, _, body = got.partition(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                body += conn.recv(65536)


def _send(port: int, kind: dict[str, Any], n: int) -> None:
    if kind.get("health"):
        _health_requests(port, n)
        return
    job = {"kind": "latency", "targets": {"proxy": f"http://127.0.0.1:{port}"}, "n": n,
           "warmup": 0, "block": 50}  # fmt: skip
    job.update((k, v) for k, v in kind.items() if k in ("body", "stream"))
    loadgen(job)


def count(root: Path, upstream: str, kind: dict[str, Any], n: int, scratch: Path) -> float:
    """Instructions per request of ``python -m serving.proxy`` from ``root``."""
    port = free_port()
    out = scratch / f"callgrind.{port}.out"
    env = {**os.environ, "SERVING_API_KEYS": json.dumps({"bench": digest_of(BENCH_KEY)}),
           "PYTHONPATH": str(root)}  # fmt: skip
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         sys.executable, "-m", "serving.proxy", "--upstream", upstream, "--port", str(port),
         "--host", "127.0.0.1", "--max-in-flight", "100000", "--health-interval-s", "3600"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout=180)
        _send(port, kind, WARMUP)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        _send(port, kind, n)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    dump = Path(f"{out}.1")  # the first explicit dump: zeroed after the warm-up
    match = _TOTALS_RE.search(dump.read_text())
    if match is None:
        raise RuntimeError(f"no instruction total in {dump}")
    return int(match.group(1)) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.instructions")
    parser.add_argument("--baseline-ref", default="HEAD",
                        help="git ref whose serving/ package is the baseline (default HEAD, "
                        "so uncommitted changes are compared with the last commit)")  # fmt: skip
    parser.add_argument("--baseline-root", type=Path, default=None, metavar="DIR",
                        help="instead: the proxy in DIR (a directory holding a `serving` "
                        "package, e.g. built by `python -m bench.proxy.compiled DIR`)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=300, help="requests counted per kind")
    parser.add_argument("--only", default="", help="only the kinds whose name contains this")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: apt-get install -y valgrind", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="bench-instr-"))
    (scratch / "base").mkdir()
    if args.baseline_root is not None:
        base = args.baseline_root.resolve()
        label = base.name
        if problem := root_problem(base):
            print(problem, file=sys.stderr)
            return 2
    else:
        label = args.baseline_ref
        try:
            base = _export(args.baseline_ref, scratch / "base")
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            print(f"cannot export serving/ at {args.baseline_ref!r}: "
                  f"{exc.stderr.decode().strip()}", file=sys.stderr)  # fmt: skip
            return 2
    targets = {"this checkout": PROJECT_ROOT, f"baseline {label}": base}
    results: dict[str, dict[str, float]] = {}
    stub = StubEngineProcess(tokens=16, token_delay_ms=0, record=False).start()
    try:
        for name, kind in KINDS.items():
            if args.only not in name:
                continue
            stub.configure(token_delay_ms=kind.get("token_delay_ms", 0))
            results[name] = {
                target: count(root, stub.url, kind, args.requests, scratch)
                for target, root in targets.items()
            }
            print(f"  {name}: " + ", ".join(f"{t} {v:,.0f}" for t, v in results[name].items()),
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        stub.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    mine, baseline = targets
    print(f"\nInstructions per request (callgrind, {args.requests} requests per kind, after "
          f"{WARMUP} warm-up)\n")  # fmt: skip
    print(f"| request | {mine} | {baseline} | change |")
    print("|---|---|---|---|")
    for name, row in results.items():
        change = (row[mine] - row[baseline]) / row[baseline] * 100
        print(f"| {name} | {row[mine]:,.0f} | {row[baseline]:,.0f} | {change:+.1f} % |")
    out = PROJECT_ROOT / "data" / "bench-results" / "proxy_instructions.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"requests": args.requests, "baseline": label,
                               "results": results}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
