"""The proxy's counters, gauges and histograms, rendered as Prometheus text (format 0.0.4).

Kept dependency-free and cheap: a counter is a dict entry, a histogram observation is one
``bisect``. Label values are route names, status codes and key *names* (validated at start to
``[A-Za-z0-9._-]``), never a raw path or a key.

With ``--workers N`` each worker keeps its own ``Metrics``; ``state()`` is what a worker
publishes (plain JSON-able data) and ``Metrics.merged`` sums the workers' states for /metrics
(serving/proxy/workers.py).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class Histogram:
    """Cumulative-bucket histogram per label tuple."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        row = self.series.get(labels)
        if row is None:
            # one slot per bucket, +Inf, then sum and count
            row = self.series[labels] = [0.0] * (len(self.buckets) + 3)
        row[bisect.bisect_left(self.buckets, value)] += 1
        row[-2] += value
        row[-1] += 1

    def state(self) -> list[list[object]]:
        """The series as JSON-able data: ``[[labels...], [bucket counts..., sum, count]]``."""
        return [[list(labels), row] for labels, row in self.series.items()]

    def add(self, state: list[list[object]]) -> None:
        """Add another histogram's ``state()`` (same buckets) to this one."""
        for labels, row in state:
            assert isinstance(labels, list) and isinstance(row, list)
            key = tuple(str(v) for v in labels)
            mine = self.series.get(key)
            if mine is None:
                self.series[key] = [float(v) for v in row]
            else:
                for i, v in enumerate(row):
                    mine[i] += v

    def render(self, name: str, label_names: tuple[str, ...], out: list[str]) -> None:
        for labels, row in sorted(self.series.items()):
            base = ",".join(f'{k}="{v}"' for k, v in zip(label_names, labels, strict=True))
            sep = "," if base else ""
            cumulative = 0.0
            # Counts as integers: "{:g}" would print 1234567 as 1.23457e+06 (lost increments).
            for bound, count in zip(self.buckets, row, strict=False):
                cumulative += count
                out.append(f'{name}_bucket{{{base}{sep}le="{bound:g}"}} {int(cumulative)}')
            cumulative += row[len(self.buckets)]
            out.append(f'{name}_bucket{{{base}{sep}le="+Inf"}} {int(cumulative)}')
            out.append(f"{name}_sum{{{base}}} {row[-2]:.6f}")
            out.append(f"{name}_count{{{base}}} {int(row[-1])}")


class Metrics:
    """Everything /metrics shows. Single event loop: plain ints, no locks."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self.tokens: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.upstream_errors: defaultdict[str, int] = defaultdict(int)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.overhead = Histogram(OVERHEAD_BUCKETS)
        self.in_flight = 0
        # Requests waiting for an in-flight slot (fair share between keys): read from the
        # admission counts when /metrics is rendered, not kept here or in ``state``.
        self.waiting = 0
        self.engine_ready = False
        self.connect_retries = 0
        self.health_failures = 0

    def state(self) -> dict[str, object]:
        """Everything here as JSON-able data (a worker's published state; see ``merged``)."""
        return {
            "requests": [[*labels, n] for labels, n in self.requests.items()],
            "tokens": [[*labels, n] for labels, n in self.tokens.items()],
            "upstream_errors": [[kind, n] for kind, n in self.upstream_errors.items()],
            "latency": self.latency.state(),
            "ttft": self.ttft.state(),
            "overhead": self.overhead.state(),
            "in_flight": self.in_flight,
            "engine_ready": self.engine_ready,
            "connect_retries": self.connect_retries,
            "health_failures": self.health_failures,
        }

    @classmethod
    def merged(cls, states: list[dict[str, Any]]) -> Metrics:
        """The sum of several ``state()``s: counters and histograms summed, ``in_flight``
        summed, ``engine_ready`` only if every state says ready (and there is one)."""
        total = cls()
        total.engine_ready = bool(states)
        for state in states:
            for route, status, key, n in state["requests"]:
                total.requests[(route, status, key)] += n
            for key, kind, n in state["tokens"]:
                total.tokens[(key, kind)] += n
            for kind, n in state["upstream_errors"]:
                total.upstream_errors[kind] += n
            total.latency.add(state["latency"])
            total.ttft.add(state["ttft"])
            total.overhead.add(state["overhead"])
            total.in_flight += state["in_flight"]
            total.engine_ready = total.engine_ready and bool(state["engine_ready"])
            total.connect_retries += state["connect_retries"]
            total.health_failures += state["health_failures"]
        return total

    def render(self) -> bytes:
        out: list[str] = []
        out += [
            "# HELP proxy_requests_total Requests answered, by route, status and API key name.",
            "# TYPE proxy_requests_total counter",
        ]
        for (route, status, key), n in sorted(self.requests.items()):
            out.append(f'proxy_requests_total{{route="{route}",status="{status}",key="{key}"}} {n}')
        out += [
            "# HELP proxy_in_flight Engine requests in progress (streams count until they end).",
            "# TYPE proxy_in_flight gauge",
            f"proxy_in_flight {self.in_flight}",
            "# HELP proxy_waiting Requests waiting for an in-flight slot: keys below their fair "
            "share while the pool is full.",
            "# TYPE proxy_waiting gauge",
            f"proxy_waiting {self.waiting}",
            "# HELP proxy_engine_ready 1 when the proxy sends requests to the engine (see /ready).",
            "# TYPE proxy_engine_ready gauge",
            f"proxy_engine_ready {int(self.engine_ready)}",
            "# HELP proxy_request_duration_seconds Time from request start to last byte sent.",
            "# TYPE proxy_request_duration_seconds histogram",
        ]
        self.latency.render("proxy_request_duration_seconds", ("route",), out)
        out += [
            "# HELP proxy_time_to_first_token_seconds Streams: request start to first engine "
            "bytes sent to the client.",
            "# TYPE proxy_time_to_first_token_seconds histogram",
        ]
        self.ttft.render("proxy_time_to_first_token_seconds", ("route",), out)
        out += [
            "# HELP proxy_overhead_seconds The proxy's own time per request "
            "(as in the x-proxy-overhead-ms header).",
            "# TYPE proxy_overhead_seconds histogram",
        ]
        self.overhead.render("proxy_overhead_seconds", ("route",), out)
        out += [
            "# HELP proxy_tokens_total Tokens from the engine's usage reports, by key name.",
            "# TYPE proxy_tokens_total counter",
        ]
        for (key, kind), n in sorted(self.tokens.items()):
            out.append(f'proxy_tokens_total{{key="{key}",kind="{kind}"}} {n}')
        out += [
            "# HELP proxy_upstream_errors_total Engine exchanges that failed, by kind.",
            "# TYPE proxy_upstream_errors_total counter",
        ]
        for kind, n in sorted(self.upstream_errors.items()):
            out.append(f'proxy_upstream_errors_total{{kind="{kind}"}} {n}')
        out += [
            "# HELP proxy_upstream_connect_retries_total Connect attempts retried "
            "(the engine was not reached).",
            "# TYPE proxy_upstream_connect_retries_total counter",
            f"proxy_upstream_connect_retries_total {self.connect_retries}",
            "# HELP proxy_health_check_failures_total Engine /health polls that failed "
            "(error, non-200 or too slow).",
            "# TYPE proxy_health_check_failures_total counter",
            f"proxy_health_check_failures_total {self.health_failures}",
        ]
        return ("\n".join(out) + "\n").encode()
