"""The proxy's metrics pushed to a Prometheus Pushgateway (issue 35 item 3).

On Modal no one can scrape a given container (requests reach containers through Modal's edge,
which picks one), so each container sends its own ``/metrics`` text instead: every
``PUSH_INTERVAL_S`` an HTTP ``PUT`` of the whole text to the Pushgateway under the grouping key
``job/serving-proxy/service/S/version/V/container/C``, which replaces that group's series
(Pushgateway 1.5 README, "PUT method"). On shutdown a ``DELETE`` of the group, so a container
that is gone stops showing its series at once. The labels ``service``, ``version`` and
``container`` come from the grouping key, so the proxy's own text stays as it is
(docs/monitoring.md, "What the proxy must add").

Cheap and off the request path: one asyncio task; the text is rendered on the event loop (what
a /metrics answer costs), the blocking ``urllib`` request runs in a thread. A failed push is
logged once per ``FAILURE_LOG_S`` at most, and never touches serving.

Where the settings come from (the container's env, all set by the deploy):

- ``SERVING_METRICS_PUSH_URL``: the Pushgateway's base URL (``http://host:9091``, credentials
  as ``https://user:password@host``); unset or empty: no push.
- ``SERVING_APP_NAME``: the service (the App is named after the service,
  components/llm_service.py ``App(name=name)``; serving/app.py bakes it into the image env).
- ``SERVING_SPEC_SHA256``: the version, as ``spec.<12 hex>``, the first half of the deployment
  tag ``modal app history`` shows (components/modal/_decide.py ``deployment_tag``; serving/
  app.py bakes the digest into the image env).
- ``SERVING_METRICS_PUSH_INTERVAL_S``: seconds between pushes (default ``PUSH_INTERVAL_S``).
- ``MODAL_TASK_ID``: the container, which Modal sets in each container (modal 1.6.4
  ``modal/experimental/flash.py`` reads it); the emulator sets it too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from serving.proxy.logs import log_event

PUSH_URL_ENV = "SERVING_METRICS_PUSH_URL"
INTERVAL_ENV = "SERVING_METRICS_PUSH_INTERVAL_S"
SERVICE_ENV = "SERVING_APP_NAME"
SPEC_DIGEST_ENV = "SERVING_SPEC_SHA256"  # serving/spec.py SPEC_DIGEST_ENV (not imported: the
# proxy ships without the spec's dependencies)
TASK_ENV = "MODAL_TASK_ID"
JOB = "serving-proxy"
PUSH_INTERVAL_S = 10.0  # a fraction of Prometheus' usual 15-30 s scrape interval
PUSH_TIMEOUT_S = 5.0
FAILURE_LOG_S = 60.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class PushTarget:
    """Where to push and under which grouping key; ``url`` never goes into a log line (it
    may hold credentials): ``shown`` is the URL without them."""

    url: str  # the group's URL, credentials removed
    shown: str
    authorization: str | None
    labels: tuple[tuple[str, str], ...]
    interval_s: float = PUSH_INTERVAL_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PushTarget | None:
        """The target from the container's env; None without a push URL. ``ValueError`` on
        a URL that is not http(s) (the message names the variable, never the value)."""
        base = env.get(PUSH_URL_ENV, "").strip()
        if not base:
            return None
        spec_digest = env.get(SPEC_DIGEST_ENV, "")
        labels = (
            ("service", env.get(SERVICE_ENV) or "unknown"),
            ("version", f"spec.{spec_digest[:12]}" if spec_digest else "unknown"),
            ("container", env.get(TASK_ENV) or "unknown"),
        )
        interval = env.get(INTERVAL_ENV, "").strip()
        try:
            interval_s = float(interval) if interval else PUSH_INTERVAL_S
        except ValueError:
            interval_s = 0.0
        if not 0 < interval_s < float("inf"):
            raise ValueError(f"env {INTERVAL_ENV}={interval!r} is not a number of seconds > 0")
        return cls.build(base, labels, interval_s)

    @classmethod
    def build(
        cls, base: str, labels: tuple[tuple[str, str], ...], interval_s: float = PUSH_INTERVAL_S
    ) -> PushTarget:
        parts = urllib.parse.urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"env {PUSH_URL_ENV} is not an http(s) URL with a host (e.g. "
                "http://pushgateway.example:9091); fix the stack's metricsPushUrl"
            )
        authorization = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            authorization = f"Basic {token}"
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if parts.port is not None:
            netloc += f":{parts.port}"
        # Label values base64url-encoded (the Pushgateway's `label@base64/value` form), so any
        # value, a '/' or an empty one included, is one path segment.
        group = "".join(
            f"/{name}@base64/{base64.urlsafe_b64encode(value.encode()).decode() or '='}"
            for name, value in (("job", JOB), *labels)
        )
        root = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        return cls(f"{root}/metrics{group}", root, authorization, labels, interval_s)

    def request(self, method: str, body: bytes | None = None) -> None:
        """One blocking request to the group's URL; raises on a failure or a non-2xx."""
        req = urllib.request.Request(self.url, data=body, method=method)  # noqa: S310 - http(s) checked
        if body is not None:
            req.add_header("Content-Type", CONTENT_TYPE)
        if self.authorization is not None:
            req.add_header("Authorization", self.authorization)
        with urllib.request.urlopen(req, timeout=PUSH_TIMEOUT_S) as resp:  # noqa: S310
            resp.read()


def push_target(env: Mapping[str, str]) -> PushTarget | None:
    """``PushTarget.from_env``, but a bad URL is logged and means no push: the metrics are
    not worth a container that refuses to serve."""
    try:
        return PushTarget.from_env(env)
    except ValueError as exc:
        log_event(logging.ERROR, "metrics_push_off", why=str(exc))
        return None


class MetricsPusher:
    """Pushes ``render()`` to ``target`` every ``target.interval_s`` from one asyncio task;
    ``stop`` deletes the group. Never raises into the server."""

    def __init__(self, target: PushTarget, render: Callable[[], bytes]) -> None:
        self.target = target
        self.render = render
        self.interval_s = target.interval_s
        self._task: asyncio.Task[None] | None = None
        self._last_failure_log = float("-inf")
        self.pushes = 0  # successful pushes (tests, logs)

    def start(self) -> None:
        log_event(
            logging.WARNING, "metrics_push_started", url=self.target.shown,
            interval_s=self.interval_s, **dict(self.target.labels),
        )  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self.push_once()
            await asyncio.sleep(self.interval_s)

    async def push_once(self) -> bool:
        try:
            body = self.render()
            await asyncio.to_thread(self.target.request, "PUT", body)
        except Exception as exc:  # any failure: logged, serving goes on
            self._failed("PUT", exc)
            return False
        self.pushes += 1
        return True

    async def stop(self) -> None:
        """Stop pushing, then delete this container's group (its series are gone at once)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await asyncio.to_thread(self.target.request, "DELETE")
        except Exception as exc:
            self._last_failure_log = float("-inf")  # the last word: always logged
            self._failed("DELETE", exc)

    def _failed(self, method: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_failure_log < FAILURE_LOG_S:
            return
        self._last_failure_log = now
        if isinstance(exc, urllib.error.HTTPError):
            what = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        else:
            what = f"{type(exc).__name__}: {exc}"
        log_event(
            logging.WARNING, "metrics_push_failed", method=method, url=self.target.shown,
            error=what, next=f"retrying every {self.interval_s:g} s (logged once a minute); "
            f"check that the Pushgateway at {self.target.shown} answers from the container "
            "and that the stack's metricsPushUrl is right; serving is not affected",
        )  # fmt: skip
