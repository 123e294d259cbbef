"""Turn the benchmark's raw results into the markdown tables printed and put in docs/proxy.md."""

from __future__ import annotations

from typing import Any

TOKENS = 16  # stub stream: tokens per response ...
TOKEN_DELAY_MS = 40  # ... and the pause between them (25 tokens/s, a busy engine's pace)


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    if "clients" in results:
        render_clients(results["clients"], out)
    if "latency" in results:
        render_latency(results["latency"], out)
    if "streams" in results:
        render_streams(results["streams"], out)
    if "memory_bytes_per_stream" in results:
        render_memory(results["memory_bytes_per_stream"], out)
    return "\n".join(out)


def render_clients(clients: dict[str, Any], out: list[str]) -> None:
    out.append(
        f"\nUpstream client choice: non-stream requests straight to the stub, one at a time "
        f"({clients['n']} each)"
    )
    out.append("| client | p50 ms | p99 ms | client CPU µs/request |")
    out.append("|---|---|---|---|")
    for name, row in clients.items():
        if name != "n":
            out.append(
                f"| {name} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} "
                f"| {row['cpu_us_per_request']:.0f} |"
            )


def render_latency(lat: dict[str, Any], out: list[str]) -> None:
    rows = lat["rows"]
    direct = rows["direct"]
    out.append(f"\nNon-stream chat completion, one at a time ({lat['n']} per target, interleaved)")
    out.append("| target | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU µs/request |")
    out.append("|---|---|---|---|---|---|")
    for name, row in rows.items():
        added50 = row["p50_ms"] - direct["p50_ms"]
        added99 = row["p99_ms"] - direct["p99_ms"]
        cpu = lat["cpu_us_per_request"].get(name)
        out.append(
            f"| {name} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
            + ("-" if name == "direct" else f"{added50:+.3f}")
            + " | "
            + ("-" if name == "direct" else f"{added99:+.3f}")
            + f" | {'-' if cpu is None else f'{cpu:.0f}'} |"
        )
    out.append(
        f"x-proxy-overhead-ms header: p50 {lat['overhead_header_p50_ms']:.3f} ms, "
        f"p99 {lat['overhead_header_p99_ms']:.3f} ms"
    )


def render_streams(streams: list[dict[str, Any]], out: list[str]) -> None:
    out.append(f"\nStreams ({TOKENS} tokens, {TOKEN_DELAY_MS} ms apart, clients back to back)")
    out.append(
        "| concurrency | target | TTFT p50 ms | TTFT p99 ms | events/s | x direct | errors "
        "| CPU µs/event | machine busy | loadgen CPU |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    by_level: dict[int, float] = {}
    for row in streams:
        if row["target"] == "direct":
            by_level[row["concurrency"]] = row["events_per_s"]
    for row in streams:
        ratio = (
            row["events_per_s"] / by_level[row["concurrency"]]
            if by_level.get(row["concurrency"])
            else float("nan")
        )
        cpu = f"{row['cpu_us_per_event']:.0f}"
        out.append(
            f"| {row['concurrency']} | {row['target']} | {row['ttft_p50_ms']:.2f} "
            f"| {row['ttft_p99_ms']:.2f} | "
            f"{row['events_per_s']:.0f} | {ratio:.2f} | {row['errors']} | {cpu} "
            f"| {row.get('machine_busy', float('nan')):.0%} "
            f"| {row.get('loadgen_cpu_share', float('nan')):.0%} |"
        )


def render_memory(mem: dict[str, Any], out: list[str]) -> None:
    out.append(f"\nMemory per open stream ({mem['streams']} streams held open)")
    out.append("| target | KiB per stream |")
    out.append("|---|---|")
    for name in ("proxy", "nginx"):
        if name in mem:
            out.append(f"| {name} | {mem[name] / 1024:.1f} |")
