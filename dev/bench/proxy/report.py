"""Turn the benchmark's raw results into the markdown tables printed and put in docs/proxy.md:
first the issue-13 targets with pass/fail, then the detail behind each row."""

from __future__ import annotations

import statistics
from typing import Any

TOKENS = 16  # stub stream: tokens per response ...
TOKEN_DELAY_MS = 40  # ... and the pause between them (25 tokens/s, a busy engine's pace)


def _med(values: list[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float], fmt: str) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{format(min(values), fmt)} to {format(max(values), fmt)}"


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    reps = results.get("reps", 1)
    out.append(
        f"\nTargets (issue 13): median over {reps} reps, spread = min to max over the reps; "
        "pass = the median meets the target"
    )
    out.append("| target | proxy (median) | proxy spread | reps met | nginx (median) | pass |")
    out.append("|---|---|---|---|---|---|")
    for row in _target_rows(results):
        out.append(
            f"| {row['name']} | {row['value']} | {row['spread']} | {row['met']} "
            f"| {row['nginx']} | {'PASS' if row['ok'] else 'FAIL'} |"
        )
    if "latency" in results:
        render_latency(results["latency"], out)
    if "streams" in results:
        render_streams(results["streams"], out, results.get("stream_bursts", False))
    if "json" in results:
        render_json(results["json"], out)
    if "clients" in results:
        render_clients(results["clients"], out)
    if "memory_bytes_per_stream" in results:
        render_memory(results["memory_bytes_per_stream"], out)
    if "minutes" in results:
        out.append(
            f"\nrun took {results['minutes']:.1f} min; load average at start "
            f"{results['machine']['load_avg_at_start']}, at end {results['load_avg_at_end']}"
        )
    return "\n".join(out)


def _added(per_rep: list[dict[str, Any]], target: str, key: str) -> list[float]:
    return [r["rows"][target][key] - r["rows"]["direct"][key] for r in per_rep
            if target in r["rows"]]  # fmt: skip


def _target_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, proxy: list[float], nginx: list[float], limit: float, fmt: str,
            higher_is_better: bool = False) -> None:  # fmt: skip
        if not proxy:
            return
        med = _med(proxy)
        ok = (med >= limit) if higher_is_better else (med <= limit)
        met = sum(1 for v in proxy if (v >= limit if higher_is_better else v <= limit))
        rows.append({
            "name": name, "value": format(med, fmt), "spread": _spread(proxy, fmt),
            "met": f"{met}/{len(proxy)}", "nginx": format(_med(nginx), fmt) if nginx else "-",
            "ok": ok,
        })  # fmt: skip

    lat = results.get("latency", {}).get("modes", {})
    for mode, label in (("68 B", "68 B"), ("64 KiB", "64 KiB"),
                        ("68 B interleaved", "68 B, interleaved one by one")):  # fmt: skip
        if mode in lat:
            per = lat[mode]
            add(f"non-stream {label}: added p50 ≤ 0.2 ms", _added(per, "proxy", "p50_ms"),
                _added(per, "nginx", "p50_ms"), 0.2, "+.3f")  # fmt: skip
            add(f"non-stream {label}: added p99 ≤ 0.5 ms", _added(per, "proxy", "p99_ms"),
                _added(per, "nginx", "p99_ms"), 0.5, "+.3f")  # fmt: skip
    if "stream TTFB" in lat:
        per = lat["stream TTFB"]
        add("stream time to first event: added p50 ≤ 0.25 ms", _added(per, "proxy", "p50_ms"),
            _added(per, "nginx", "p50_ms"), 0.25, "+.3f")  # fmt: skip
    streams = results.get("streams", [])
    for busy in (False, True):
        for c in sorted({r["concurrency"] for r in streams}):
            ratios: dict[str, list[float]] = {"proxy": [], "nginx": []}
            for rep in sorted({r["rep"] for r in streams}):
                got = {
                    r["target"]: r
                    for r in streams
                    if r["concurrency"] == c and r["busy_cpu"] == busy and r["rep"] == rep
                }
                if "direct" in got and got["direct"]["events_per_s"]:
                    for t in ratios:
                        if t in got:
                            ratios[t].append(got[t]["events_per_s"] / got["direct"]["events_per_s"])
            add(f"{c} streams{', one CPU busy' if busy else ''}: ≥ 0.95x direct",
                ratios["proxy"], ratios["nginx"], 0.95, ".2f", higher_is_better=True)  # fmt: skip
    cpu = {t: [r["cpu_us_per_event"] for r in streams
               if r["target"] == t and r["concurrency"] == 256 and not r["busy_cpu"]]
           for t in ("proxy", "nginx")}  # fmt: skip
    add("CPU per streamed event (256 streams) ≤ 35 µs", cpu["proxy"], cpu["nginx"], 35, ".1f")
    for name, row in results.get("json", {}).items():
        if name in ("64 KiB", "1 MiB", "4 MiB", "1 MiB, 8k messages"):
            add(f"JSON check {name}: ≥ 1 GB/s", row["proxy"], [], 1.0, ".2f",
                higher_is_better=True)  # fmt: skip
    return rows


def render_latency(lat: dict[str, Any], out: list[str]) -> None:
    out.append(
        f"\nOne request at a time ({lat['n']} per target per rep; medians over the reps of each "
        "rep's percentile; CPU µs/request of the target process, for direct: the stub's)"
    )
    out.append("| mode | target | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU µs/req |")
    out.append("|---|---|---|---|---|---|---|")
    for mode, per in lat["modes"].items():
        for target in per[0]["rows"]:
            p50 = _med([r["rows"][target]["p50_ms"] for r in per])
            p99 = _med([r["rows"][target]["p99_ms"] for r in per])
            a50 = "-" if target == "direct" else f"{_med(_added(per, target, 'p50_ms')):+.3f}"
            a99 = "-" if target == "direct" else f"{_med(_added(per, target, 'p99_ms')):+.3f}"
            cpu = _med([r["cpu_us_per_request"][target] for r in per])
            out.append(f"| {mode} | {target} | {p50:.3f} | {p99:.3f} | {a50} | {a99} | {cpu:.0f} |")
    header = [r["overhead_header_p50_ms"] for r in lat["modes"].get("68 B", [])]
    if header:
        out.append(f"x-proxy-overhead-ms header (68 B): p50 {_med(header):.3f} ms")


def render_streams(streams: list[dict[str, Any]], out: list[str], bursts: bool = False) -> None:
    how = "in synchronized rounds (--bursts)" if bursts else "clients back to back"
    out.append(
        f"\nStreams ({TOKENS} tokens, {TOKEN_DELAY_MS} ms apart, {how}; medians "
        "over the reps; counted after a warm-up)"
    )
    out.append(
        "| streams | one CPU busy | target | TTFT p50 ms | TTFT p99 ms | events/s "
        "| x direct (spread) | errors | CPU µs/event | machine busy |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["busy_cpu"], r["concurrency"]) for r in streams})
    for busy, c in keys:
        sel = [r for r in streams if r["busy_cpu"] == busy and r["concurrency"] == c]
        direct = {r["rep"]: r["events_per_s"] for r in sel if r["target"] == "direct"}
        targets = list(dict.fromkeys(r["target"] for r in sel))  # in measuring order
        for target in targets:
            mine = [r for r in sel if r["target"] == target]
            if not mine:
                continue
            ratios = [r["events_per_s"] / direct[r["rep"]] for r in mine if direct.get(r["rep"])]
            out.append(
                f"| {c} | {'yes' if busy else 'no'} | {target} "
                f"| {_med([r['ttft_p50_ms'] for r in mine]):.2f} "
                f"| {_med([r.get('ttft_p99_ms', float('nan')) for r in mine]):.2f} "
                f"| {_med([r['events_per_s'] for r in mine]):.0f} "
                f"| {_med(ratios):.2f} ({_spread(ratios, '.2f')}) "
                f"| {sum(r['errors'] for r in mine)} "
                f"| {_med([r['cpu_us_per_event'] for r in mine]):.1f} "
                f"| {_med([r['machine_busy'] for r in mine]):.0%} |"
            )


def render_json(js: dict[str, Any], out: list[str]) -> None:
    out.append("\nRequest-body JSON check, GB/s (median over the reps; this process)")
    out.append("| body | bytes | proxy check | orjson alone | stdlib json |")
    out.append("|---|---|---|---|---|")
    for name, row in js.items():
        orjson = f"{_med(row['orjson']):.2f}" if "orjson" in row else "-"
        out.append(
            f"| {name} | {row['bytes']} | {_med(row['proxy']):.2f} | {orjson} "
            f"| {_med(row['stdlib']):.2f} |"
        )


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


def render_memory(mem: dict[str, Any], out: list[str]) -> None:
    out.append(f"\nMemory per open stream ({mem['streams']} streams held open)")
    out.append("| target | KiB per stream |")
    out.append("|---|---|")
    for name in ("proxy", "nginx"):
        if name in mem:
            out.append(f"| {name} | {mem[name] / 1024:.1f} |")
