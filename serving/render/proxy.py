"""The auth proxy's command line (serving/proxy), from the spec's `proxy` and `timeouts`."""

from __future__ import annotations

import sys

from serving.spec import ENGINE_PORT, PROXY_PORT, ServingSpec


def proxy_workers(spec: ServingSpec) -> int:
    """Auth-proxy processes (`python -m serving.proxy --workers N`): explicit `proxy.workers`,
    else 1. With 4 vLLM API servers on one H100 the proxy added 36 ms to TTFT p50 at 256
    streams and 76 ms at 1024 (docs/gpu.md, run M); 4 proxy processes against 1, same engine,
    same run (run O), took 24 ms off TTFT p50 at 256 streams but nothing at 1024, with tokens/s
    0.971x vs 1.009x direct and TTFT p99 1.044x vs 0.928x at 256: no gain shown, so one process
    stays the default. The proxy's CPU is counted in SUPPORT_CPUS (serving/sizing.py) either
    way (its work per token is the same, spread or not)."""
    return spec.proxy.workers if spec.proxy.workers is not None else 1


def proxy_command(
    spec: ServingSpec,
    *,
    port: int = PROXY_PORT,
    engine_port: int = ENGINE_PORT,
    python: str = sys.executable,
) -> list[str]:
    """The auth proxy's command line (serving/proxy; keys come from env SERVING_API_KEYS);
    `--workers` only when the spec wants more than one process (`proxy_workers`)."""
    cmd = [
        python, "-m", "serving.proxy",
        "--upstream", f"http://127.0.0.1:{engine_port}",
        "--port", str(port),
        "--max-in-flight", str(spec.proxy.max_in_flight),
        "--max-body-bytes", str(spec.proxy.max_body_bytes),
        "--keepalive-s", repr(float(spec.proxy.keepalive_s)),
        "--upstream-timeout-s", str(spec.timeouts.request_s),
    ]  # fmt: skip
    workers = proxy_workers(spec)
    if workers > 1:
        cmd += ["--workers", str(workers)]
    for name, limit in sorted((spec.proxy.key_max_in_flight or {}).items()):
        cmd += ["--key-max-in-flight", f"{name}={limit}"]  # a key's own in-flight limit
    return cmd
