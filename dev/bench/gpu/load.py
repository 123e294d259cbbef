"""Streaming chat load, the engine directly vs through the proxy, interleaved on one machine.

``python3 -m bench.gpu.load --direct URL --proxy URL --key KEY --plan 1:3:16,32:3:128 --out F``

Each request: a short prompt, ``max_tokens`` (64) with ``ignore_eos`` so every answer has the
same length, ``stream`` with ``include_usage``. TTFT is send -> the first chunk with content;
total is send -> ``[DONE]``; tokens are the usage chunk's ``completion_tokens``.

A plan item ``C:R:N`` runs concurrency C: a warm-up round per target (not counted), then R
rounds per target of N requests each, the order of the targets flipped every round so that
neither always follows the other. A round is C streams in a closed loop spread over worker
processes (uvloop + httpx), each with its own client: a fresh client per round, so every
round's first requests open new client connections, as a burst of new clients would.
Tokens/s is the sum of tokens over the sum of the rounds' wall times. Rounds are kept apart in
the raw output, so each figure's spread across rounds can be read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import random
import re
import statistics
import time
from collections.abc import Sequence
from typing import Any

PROMPT = "Write one short sentence about the sea."
# (status or error text, ttft s or None, total s, completion tokens)
Result = tuple[int | str, float | None, float, int]


# Long prompts (`--prompt-tokens`): filler words after a per-request random head, so that no
# two requests share a cached prefix (vLLM's prefix cache would otherwise skip the prefill and
# the bench would measure a short prompt with a long body). The words per token of the
# model's tokenizer are measured once per run (`calibrate`), not assumed.
FILLER = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "near",
    "calm",
    "blue",
    "water",
    "at",
    "dawn",
]


def prompt_text(words: int) -> str:
    if words <= 0:
        return PROMPT
    head = f"[{random.getrandbits(64):016x}] "
    return head + " ".join(FILLER[i % len(FILLER)] for i in range(words)) + " " + PROMPT


def body(model: str, max_tokens: int, words: int = 0) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(words)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN when empty."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# Matched on the text, not parsed: 256 streams of 64 chunks each are parsed by a few client
# processes, which must not become the bottleneck. Either JSON layout (vLLM writes it compact).
_CONTENT_RE = re.compile(r'"content":\s?"(?!")')
_EMPTY_CHOICES_RE = re.compile(r'"choices":\s?\[\]')


def read_event(data: str) -> tuple[bool, int | None]:
    """(has content, completion tokens if it is the usage-only chunk) for one `data:` value."""
    if _CONTENT_RE.search(data):
        return True, None
    if _EMPTY_CHOICES_RE.search(data) and '"usage"' in data:
        usage = json.loads(data).get("usage") or {}
        return False, int(usage.get("completion_tokens") or 0)
    return False, None


async def _one(client: Any, url: str, headers: dict[str, str], payload: dict[str, Any]) -> Result:
    t0 = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    async with client.stream("POST", url, json=payload, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp.status_code, None, time.perf_counter() - t0, 0
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            content, usage = read_event(data)
            if content and ttft is None:
                ttft = time.perf_counter() - t0
            if usage is not None:
                tokens = usage
    return resp.status_code, ttft, time.perf_counter() - t0, tokens


async def _worker(
    base: str,
    headers: dict[str, str],
    model: str,
    streams: int,
    requests: int,
    max_tokens: int,
    words: int = 0,
) -> tuple[list[Result], float, float]:
    import httpx

    url = base + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    results: list[Result] = []
    left = [requests]
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as client:
        start = time.time()

        async def loop() -> None:
            while left[0] > 0:
                left[0] -= 1
                try:
                    results.append(await _one(client, url, headers, body(model, max_tokens, words)))
                except Exception as exc:  # a failed request is a result, not the end
                    results.append((type(exc).__name__, None, 0.0, 0))

        await asyncio.gather(*(loop() for _ in range(streams)))
    return results, start, time.time()


def _proc(args: tuple[Any, ...], queue: Any) -> None:
    try:
        import uvloop

        queue.put(uvloop.run(_worker(*args)))
    except ImportError:
        queue.put(asyncio.run(_worker(*args)))


def run_round(
    base: str,
    headers: dict[str, str],
    model: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
    words: int = 0,
) -> tuple[list[Result], float, float]:
    """One round: `requests` streams, `concurrency` at a time, over a few processes.
    Returns the results, the round's wall seconds and its start (epoch seconds)."""
    procs = 1 if concurrency == 1 else (4 if concurrency <= 32 else 8)
    procs = min(procs, concurrency)
    queue: Any = mp.Queue()
    workers = []
    for i in range(procs):
        streams = concurrency // procs + (1 if i < concurrency % procs else 0)
        n = requests // procs + (1 if i < requests % procs else 0)
        args = (base, headers, model, streams, n, max_tokens, words)
        p = mp.Process(target=_proc, args=(args, queue))
        p.start()
        workers.append(p)
    results: list[Result] = []
    starts, ends = [], []
    for _ in workers:
        res, t_start, t_end = queue.get()
        results += res
        starts.append(t_start)
        ends.append(t_end)
    for p in workers:
        p.join()
    return results, max(ends) - min(starts), min(starts)


def summarize(
    target: str, concurrency: int, rounds: list[tuple[list[Result], float, float]]
) -> dict[str, Any]:
    results = [r for res, _, _ in rounds for r in res]
    ok = [r for r in results if r[0] == 200]
    ttft = [r[1] for r in ok if r[1] is not None]
    total = [r[2] for r in ok]
    wall = sum(w for _, w, _ in rounds)
    tokens = sum(r[3] for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if r[0] != 200:
            errors[str(r[0])] = errors.get(str(r[0]), 0) + 1
    per_round = []
    for res, w, start in rounds:
        good = [r for r in res if r[0] == 200]
        per_round.append(
            {
                "start": round(start, 3),  # epoch s: matches the CPU samples (remote.CpuSampler)
                "wall_s": round(w, 3),
                "tok_per_s": round(sum(r[3] for r in good) / w, 1) if w else 0.0,
                "ttft_p50_ms": round(percentile([r[1] for r in good if r[1]], 50) * 1e3, 1),
                "ttft_p99_ms": round(percentile([r[1] for r in good if r[1]], 99) * 1e3, 1),
            }
        )
    return {
        "target": target,
        "concurrency": concurrency,
        "n": len(results),
        "ok": len(ok),
        "errors": errors,
        "ttft_p50_ms": percentile(ttft, 50) * 1e3,
        "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "total_p50_ms": percentile(total, 50) * 1e3,
        "total_p99_ms": percentile(total, 99) * 1e3,
        "tok_per_s": tokens / wall if wall else 0.0,
        "mean_completion_tokens": statistics.mean(r[3] for r in ok) if ok else 0.0,
        "rounds": per_round,
    }


def run_plan(
    targets: dict[str, tuple[str, dict[str, str]]],
    plan: str,
    model: str,
    max_tokens: int,
    words: int = 0,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    order = list(targets)
    for item in plan.split(","):
        concurrency, rounds, requests = (int(x) for x in item.split(":"))
        for name in order:  # warm-up: connections, CUDA graphs for this batch size
            base, headers = targets[name]
            run_round(base, headers, model, concurrency, concurrency, max_tokens, words)
        acc: dict[str, list[tuple[list[Result], float, float]]] = {name: [] for name in order}
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                base, headers = targets[name]
                acc[name].append(
                    run_round(base, headers, model, concurrency, requests, max_tokens, words)
                )
        for name in order:
            row = summarize(name, concurrency, acc[name])
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| streams | target | ok/n | TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms "
        "| tokens/s | vs direct | TTFT p99 vs direct | vs plain | TTFT p99 vs plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratios(r: dict[str, Any], base: dict[str, Any] | None) -> str:
        if base is None:
            return "| | "
        tok = r["tok_per_s"] / base["tok_per_s"] if base["tok_per_s"] else math.nan
        p99 = r["ttft_p99_ms"] / base["ttft_p99_ms"] if base["ttft_p99_ms"] else math.nan
        return f"| {tok:.3f}x | {p99:.3f}x "

    by = {(r["target"], r["concurrency"]): r for r in rows}
    for r in rows:
        c = r["concurrency"]
        errors = f" {r['errors']}" if r["errors"] else ""
        lines.append(
            f"| {c} | {r['target']} | {r['ok']}/{r['n']}{errors} "
            f"| {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['total_p50_ms']:.1f} "
            f"| {r['total_p99_ms']:.1f} | {r['tok_per_s']:.0f} "
            + ratios(r, by.get(("direct", c)))
            + ratios(r, by.get(("plain", c)))
            + "|"
        )
    return "\n".join(lines)


def calibrate(base: str, model: str, tokens: int) -> tuple[int, int]:
    """(filler words, the prompt tokens they make) for about `tokens` prompt tokens, from the
    engine's own usage count of a 1000-word probe and of the final prompt."""
    import httpx

    def count(words: int) -> int:
        payload = {**body(model, 1, words), "stream": False}
        payload.pop("stream_options")
        resp = httpx.post(base + "/v1/chat/completions", json=payload, timeout=120)
        resp.raise_for_status()
        return int(resp.json()["usage"]["prompt_tokens"])

    per_word = (count(1000) - count(0)) / 1000
    words = max(1, int((tokens - count(0)) / per_word))
    return words, count(words)


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python3 -m bench.gpu.load", description=__doc__)
    cli.add_argument("--direct", default="http://127.0.0.1:8001")
    cli.add_argument("--proxy", default="http://127.0.0.1:8000")
    cli.add_argument("--plain", help="a default `vllm serve` to compare with (optional)")
    cli.add_argument(
        "--proxy-target",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="another proxy to compare (with the key), e.g. proxy-1w=http://127.0.0.1:8003",
    )
    cli.add_argument("--key", required=True, help="an API key the proxy accepts")
    cli.add_argument("--model", default="llama")
    cli.add_argument("--max-tokens", type=int, default=64)
    cli.add_argument("--plan", default="1:3:16,32:3:128,256:3:768")
    cli.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="long prompts of about this many tokens, unique per request (0: the short prompt)",
    )
    cli.add_argument("--out", help="write the rows as JSON here")
    args = cli.parse_args(argv)
    targets: dict[str, tuple[str, dict[str, str]]] = {}
    if args.plain:
        targets["plain"] = (args.plain, {})
    targets |= {
        "direct": (args.direct, {}),
        "proxy": (args.proxy, {"Authorization": f"Bearer {args.key}"}),
    }
    for item in args.proxy_target:
        name, _, url = item.partition("=")
        targets[name] = (url, {"Authorization": f"Bearer {args.key}"})
    t0 = time.monotonic()
    words, measured = 0, 0
    if args.prompt_tokens:
        words, measured = calibrate(args.direct, args.model, args.prompt_tokens)
        print(f"prompts: {words} filler words = {measured} prompt tokens", flush=True)
    rows = run_plan(targets, args.plan, args.model, args.max_tokens, words)
    result: dict[str, Any] = {"plan": args.plan, "max_tokens": args.max_tokens, "rows": rows}
    result["prompt_words"], result["prompt_tokens"] = words, measured
    result["seconds"] = round(time.monotonic() - t0, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
