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
from typing import Any, NamedTuple

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
            base = _label_text(label_names, labels)
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


class _Series(NamedTuple):
    attr: str  # the ``Metrics`` attribute (and its key in ``state``)
    name: str
    kind: str  # counter, gauge or histogram
    help: str
    labels: tuple[str, ...] = ()  # a labelled counter is a dict: label values -> count


# Everything /metrics shows, in its order.
_SERIES = (
    _Series("requests", "proxy_requests_total", "counter",
            "Requests answered, by route, status and API key name.", ("route", "status", "key")),
    _Series("in_flight", "proxy_in_flight", "gauge",
            "Engine requests in progress (streams count until they end)."),
    _Series("waiting", "proxy_waiting", "gauge", "Requests waiting for an in-flight slot: keys "
            "below their fair share while the pool is full."),
    _Series("engine_ready", "proxy_engine_ready", "gauge",
            "1 when the proxy sends requests to the engine (see /ready)."),
    _Series("latency", "proxy_request_duration_seconds", "histogram",
            "Time from request start to last byte sent.", ("route",)),
    _Series("ttft", "proxy_time_to_first_token_seconds", "histogram",
            "Streams: request start to first engine bytes sent to the client.", ("route",)),
    _Series("overhead", "proxy_overhead_seconds", "histogram",
            "The proxy's own time per request (as in the x-proxy-overhead-ms header).", ("route",)),
    _Series("tokens", "proxy_tokens_total", "counter",
            "Tokens from the engine's usage reports, by key name.", ("key", "kind")),
    _Series("upstream_errors", "proxy_upstream_errors_total", "counter",
            "Engine exchanges that failed, by kind.", ("kind",)),
    _Series("connect_retries", "proxy_upstream_connect_retries_total", "counter",
            "Connect attempts retried (the engine was not reached)."),
    _Series("health_failures", "proxy_health_check_failures_total", "counter",
            "Engine /health polls that failed (error, non-200 or too slow)."),
)  # fmt: skip
# What a worker publishes (``state``) and ``merged`` sums: all but ``waiting``, which is read
# from the admission counts when /metrics is rendered; ``engine_ready`` is and-ed, not summed.
_PUBLISHED = tuple(series for series in _SERIES if series.attr != "waiting")


class Metrics:
    """Everything /metrics shows. Single event loop: plain ints, no locks."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, ...], int] = defaultdict(int)
        self.tokens: defaultdict[tuple[str, ...], int] = defaultdict(int)
        self.upstream_errors: defaultdict[str, int] = defaultdict(int)  # one label: no tuple
        self.latency = Histogram(LATENCY_BUCKETS)
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.overhead = Histogram(OVERHEAD_BUCKETS)
        self.in_flight = 0
        self.waiting = 0
        self.engine_ready = False
        self.connect_retries = 0
        self.health_failures = 0

    def state(self) -> dict[str, object]:
        """Everything here as JSON-able data (a worker's published state; see ``merged``)."""
        out: dict[str, object] = {}
        for series in _PUBLISHED:
            value = getattr(self, series.attr)
            if series.kind == "histogram":
                value = value.state()
            elif series.labels:
                value = [[*_values(labels), n] for labels, n in value.items()]
            out[series.attr] = value
        return out

    @classmethod
    def merged(cls, states: list[dict[str, Any]]) -> Metrics:
        """The sum of several ``state()``s: counters and histograms summed, ``in_flight``
        summed, ``engine_ready`` only if every state says ready (and there is one)."""
        total = cls()
        total.engine_ready = bool(states)
        for state in states:
            for series in _PUBLISHED:
                value, mine = state[series.attr], getattr(total, series.attr)
                if series.attr == "engine_ready":
                    total.engine_ready = total.engine_ready and bool(value)
                elif series.kind == "histogram":
                    mine.add(value)
                elif series.labels:
                    for *labels, n in value:
                        mine[tuple(labels) if len(labels) > 1 else labels[0]] += n
                else:
                    setattr(total, series.attr, mine + value)
        return total

    def render(self) -> bytes:
        out: list[str] = []
        for series in _SERIES:
            name = series.name
            out += [f"# HELP {name} {series.help}", f"# TYPE {name} {series.kind}"]
            value = getattr(self, series.attr)
            if series.kind == "histogram":
                value.render(name, series.labels, out)
            elif series.labels:
                for labels, n in sorted(value.items()):
                    out.append(f"{name}{{{_label_text(series.labels, _values(labels))}}} {n}")
            else:
                out.append(f"{name} {int(value)}")
        return ("\n".join(out) + "\n").encode()


def _values(labels: tuple[str, ...] | str) -> tuple[str, ...]:
    """A labelled counter's key as a tuple (one with a single label is keyed by the value)."""
    return labels if isinstance(labels, tuple) else (labels,)


def _label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in zip(names, values, strict=True))
