"""Sequential GETs on one keep-alive connection; prints the latencies (ms) as JSON.

    python -m bench.emulator.loadgen HOST PORT N [WARMUP]

Run as is against the edge, and under `nsenter --net` in the container's network namespace
against the container's own port: the same client code measures both paths.
"""

import http.client
import json
import sys
import time


def main() -> None:
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    conn = http.client.HTTPConnection(host, port, timeout=10)
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        conn.request("GET", "/")
        resp = conn.getresponse()
        body = resp.read()
        dt = (time.perf_counter() - t0) * 1000
        if resp.status != 200 or body != b"ok":
            raise SystemExit(f"unexpected answer {resp.status} {body[:100]!r}")
        if i >= warmup:
            out.append(dt)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
