"""Benchmark the emulator's runtime: the edge's added latency and a local cold start.

    python -m bench.emulator [--requests 3000] [--cold-starts 5] [--json PATH]

One emulator (runtime on, containers in their own network namespace when allowed) and the
trivial `@app.server` in dev/bench/emulator/bench_app.py (a stdlib HTTP server on port 8000):

1. Edge added latency: N sequential GETs on one keep-alive connection through the edge
   (`http://127.0.0.1:<edge port>/`) vs the same client on the container's own port
   (`127.0.0.1:8000` inside the container's network namespace, via `nsenter --net`), in the
   same run, alternating rounds. Added = edge - direct, p50 and p99. Target: p50 <= 1 ms.
2. Cold start: the time from a request to a scaled-to-zero endpoint until its answer
   (container spawn, modal's entrypoint import, @enter, the port answering, the request).
   Baseline in the same run: a warm request. Target: <= 2 s.

Prints a table and writes JSON to data/bench-results/emulator.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from emulator.process import PROJECT_ROOT, EmulatorProcess

APP = str(Path(__file__).with_name("bench_app.py"))


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _get(url: str) -> float:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            assert resp.read() == b"ok"
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"GET {url}: {exc.code} {exc.read()[:500]!r}") from None
    return time.perf_counter() - t0


def _loadgen(prefix: list[str], host: str, port: int, n: int) -> list[float]:
    out = subprocess.run(
        [*prefix, sys.executable, "-m", "bench.emulator.loadgen", host, str(port), str(n)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"load generator failed ({' '.join(prefix)}): {out.stderr[-2000:]}")
    result: list[float] = json.loads(out.stdout)
    return result


def _deploy(emu: EmulatorProcess, warm: bool) -> None:
    subprocess.run(
        [str(Path(sys.executable).with_name("modal")), "deploy", APP],
        env=emu.subprocess_env({"BENCH_WARM": "1" if warm else "0"}),
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )


def _live(emu: EmulatorProcess) -> list[dict[str, Any]]:
    return [c for c in emu.containers() if c["state"] in ("starting", "ready", "stopping")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="per path, over 3 rounds")
    ap.add_argument("--cold-starts", type=int, default=5)
    ap.add_argument("--json", default=str(PROJECT_ROOT / "data/bench-results/emulator.json"))
    args = ap.parse_args(argv)

    results: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        emu = EmulatorProcess(state_path=Path(tmp) / "state.sqlite3", token_id=None).start()
        try:
            _deploy(emu, warm=False)
            url = emu.edge_url("emu-workspace--bench-edge-tiny")
            port = int(url.rsplit(":", 1)[1])

            # 2. cold starts (scaledown_window=2 brings it back to zero between samples)
            cold, warm = [], []
            for _ in range(args.cold_starts):
                deadline = time.monotonic() + 30
                while _live(emu) and time.monotonic() < deadline:
                    time.sleep(0.2)
                cold.append(_get(url))
                warm.append(_get(url))
            _deploy(emu, warm=True)  # min_containers=1: the direct path keeps it warm too
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                live = _live(emu)
                if len(live) == 1 and live[0]["state"] == "ready":
                    break
                time.sleep(0.2)
            (container,) = [c for c in _live(emu) if c["state"] == "ready"]
            netns = bool(container["netns"])

            # 1. edge vs direct, alternating rounds, one container kept warm meanwhile
            prefix = ["nsenter", f"--net=/proc/{container['pid']}/ns/net"] if netns else []
            edge: list[float] = []
            direct: list[float] = []
            per_round = max(args.requests // 3, 1)
            for _ in range(3):
                edge += _loadgen([], "127.0.0.1", port, per_round)
                direct += _loadgen(prefix, "127.0.0.1", 8000, per_round)
        finally:
            emu.close()

    results["edge_ms"] = {"p50": _pct(edge, 0.5), "p99": _pct(edge, 0.99), "n": len(edge)}
    results["direct_ms"] = {"p50": _pct(direct, 0.5), "p99": _pct(direct, 0.99), "n": len(direct)}
    results["added_ms"] = {
        "p50": results["edge_ms"]["p50"] - results["direct_ms"]["p50"],
        "p99": results["edge_ms"]["p99"] - results["direct_ms"]["p99"],
    }
    results["cold_start_s"] = {
        "median": statistics.median(cold),
        "max": max(cold),
        "samples": cold,
        "warm_request_median_s": statistics.median(warm),
    }
    results["container_network"] = "netns" if netns else "host"

    rows = [
        ("edge (through http://127.0.0.1:<edge port>)", results["edge_ms"]),
        ("direct (container's own port 8000)", results["direct_ms"]),
    ]
    print(
        f"emulator runtime bench  (python {results['python']}, {results['cpus']} cpus, "
        f"containers: {results['container_network']})"
    )
    print(f"{'path':<46} {'p50 ms':>8} {'p99 ms':>8} {'n':>6}")
    for name, r in rows:
        print(f"{name:<46} {r['p50']:>8.3f} {r['p99']:>8.3f} {r['n']:>6}")
    added = results["added_ms"]
    verdict = "OK" if added["p50"] <= 1.0 else "OVER TARGET"
    print(
        f"{'edge added latency':<46} {added['p50']:>8.3f} {added['p99']:>8.3f}"
        f"   target p50 <= 1 ms: {verdict}"
    )
    cs = results["cold_start_s"]
    verdict = "OK" if cs["median"] <= 2.0 else "OVER TARGET"
    print(
        f"{'cold start (request to answer), s':<46} {cs['median']:>8.3f} {cs['max']:>8.3f}"
        f"   (median, max of {len(cold)}; warm request {cs['warm_request_median_s'] * 1000:.1f} ms)"
        f"   target <= 2 s: {verdict}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
