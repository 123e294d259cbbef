"""The health gate: does one version of an App serve? Its own collaborator, returning an outcome.

`HealthGate.verify` waits, within a deadline, until the version's containers replaced the ones
it must replace, `GET /ready` answers 200 through the edge and one smoke request of the served
model's task answers 200; it returns a `GateOutcome` and never raises (an exception inside
the gate, a Modal read error included, is an outcome that failed: the release transaction in
`_release.py` then rolls back). The gate owns no App lifecycle: it only looks.

A deployed serving endpoint sits behind Modal's proxy auth (`Modal-Key` / `Modal-Secret`, the
stack's proxy-auth token) and our serving proxy (`Authorization: Bearer <API key>`). `/ready`
answers 200 once the engine is ready (serving/proxy/app.py); the smoke request proves the whole
path a user takes answers with the stack's CURRENT key (after a rotation: the new key):

| task (LLMService) | smoke request                                             |
|-------------------|-----------------------------------------------------------|
| chat              | `POST /v1/chat/completions`, one user message, max_tokens 1 |
| completion        | `POST /v1/completions`, prompt "ping", max_tokens 1        |
| embedding         | `POST /v1/embeddings`, input "ping"                        |

Crash loops are refused as soon as they are evident, not at the end of the budget: each
container that logged since the version was published (`AppFetchLogs` names every batch's
`task_id`) and is no longer listed live (`TaskList`, the listing modal 1.6.4 runner.py
`_stop_and_wait_for_containers` polls) has ended; CRASH_LOOP_CONTAINERS of them ended while
the version never got ready is a crash loop.

The probes are stdlib only (urllib): the provider process must not grow a dependency for a few
requests. No secret is ever part of what the probes return: answers are truncated bodies and
status codes, redacted again before they reach an outcome.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import _rpc
from ._base import redact
from ._decide import GateOutcome, smoke_words
from .defaults import GATE_TASK, SMOKE_REQUESTS

T = TypeVar("T")

GATE_POLL_S = 0.25  # between two looks (a TaskList, then at most two HTTP requests)
#: Containers of the new version that ended before it got ready: a crash loop. Three, not
#: one: a single container may be replaced for reasons of its host (preemption), and modal
#: restarts a failed container (with a backoff) rather than giving up on the first.
CRASH_LOOP_CONTAINERS = 3
CRASH_CHECK_S = 1.0  # how often the logs are asked which containers ran (one AppFetchLogs)
SMOKE_PROMPT = "ping"
BODY_CHARS = 300

#: What the gate needs from Modal: `call(action, fn)` runs `fn(client)` (the provider's
#: retrying `run`, bound to the resource) and raises ModalProviderError when Modal fails.
ModalCall = Callable[[str, Callable[[Any], Awaitable[Any]]], Any]


@dataclass(frozen=True)
class GateTarget:
    """Where and how the gate knocks (the secrets are kept out of repr)."""

    url: str
    token_id: str
    token_secret: str = field(repr=False)
    api_key: str = field(repr=False)
    model: str
    task: str = GATE_TASK

    def secrets(self) -> list[str]:
        return [self.token_secret, self.api_key]


def smoke_request(task: str, model: str) -> tuple[str, bytes, str]:
    """(path, JSON body, what it is in words) of the smoke request for the model's task
    (defaults.SMOKE_REQUESTS; an unknown task is a chat)."""
    task = task if task in SMOKE_REQUESTS else GATE_TASK
    path, words = SMOKE_REQUESTS[task]
    body: dict[str, Any] = {"model": model}
    if task == "embedding":
        body["input"] = SMOKE_PROMPT
    elif task == "completion":
        body.update(prompt=SMOKE_PROMPT, max_tokens=1)
    else:
        body.update(messages=[{"role": "user", "content": SMOKE_PROMPT}], max_tokens=1)
    return path, json.dumps(body).encode(), words


#: How much of a container's log line one progress line shows.
LOG_LINE_CHARS = 200


def log_line_summary(line: str, limit: int = LOG_LINE_CHARS) -> str:
    """A container log line as one readable piece of a progress line, at most `limit` chars.

    The serving proxy logs one JSON object per request (`[proxy] {"ts": ..., "key": ...}`);
    cut at a fixed width it ended mid-string (issue 34 item 9: `..."key":"gatew`). A line
    holding a JSON object is shown as its `key=value` pairs, as many whole pairs as fit, then
    `…`; any other line is cut at a space where one is near, then `…`."""
    text = " ".join(line.split())
    prefix, brace, rest = text.partition("{")
    if brace:
        try:
            doc = json.loads(brace + rest)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            out = prefix.rstrip()
            for key, value in doc.items():
                shown = value if isinstance(value, str) else json.dumps(value)
                piece = f"{key}={shown}"
                if len(out) + 1 + len(piece) > limit - 1:
                    return (out + " …").strip()
                out = f"{out} {piece}" if out else piece
            return out
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut) + "…"


def _request(
    target: GateTarget, method: str, path: str, body: bytes | None, with_key: bool, timeout: float
) -> tuple[int, str]:
    """(status, first BODY_CHARS of the answer); status 0 = no HTTP answer (the reason)."""
    headers = {"Modal-Key": target.token_id, "Modal-Secret": target.token_secret}
    if with_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    if body is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(  # noqa: S310 (the endpoint's own http(s) URL)
        target.url.rstrip("/") + path, data=body, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=max(timeout, 0.1)) as resp:  # noqa: S310
            return int(resp.status), resp.read(BODY_CHARS).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        text = e.read(BODY_CHARS).decode("utf-8", "replace") if e.fp is not None else ""
        return int(e.code), text
    except (OSError, ValueError) as e:  # refused, reset, timeout, bad URL
        reason = getattr(e, "reason", e)
        return 0, f"{type(e).__name__}: {reason}"


def probe_ready(target: GateTarget, timeout: float) -> tuple[int, str]:
    """`GET /ready` through the edge (proxy token only)."""
    return _request(target, "GET", "/ready", None, with_key=False, timeout=timeout)


def probe_smoke(target: GateTarget, timeout: float) -> tuple[int, str]:
    """The task's smoke request through the edge with the proxy token and the API key."""
    path, body, _what = smoke_request(target.task, target.model)
    return _request(target, "POST", path, body, with_key=True, timeout=timeout)


def describe(status: int, body: str) -> str:
    """One line for a probe's answer (a body is only context: truncated, newlines folded)."""
    text = " ".join(body.split())[:200]
    if status == 0:
        return f"got no answer ({text})"
    return f"answered {status} {text}".rstrip()


class HealthGate:
    """Looks at one app's endpoint and containers; reports progress through `progress`."""

    def __init__(
        self,
        call: ModalCall,
        app_id: str,
        environment: str,
        target: GateTarget,
        progress: Callable[[str], None],
        secrets: list[str],
    ) -> None:
        self.call = call
        self.app_id = app_id
        self.environment = environment
        self.target = target
        self.progress = progress
        self.secrets = [*secrets, *target.secrets()]
        self.every = float(os.environ.get("MODAL_GATE_PROGRESS_S", "5"))

    def verify(
        self,
        what: str,
        since: float,
        deadline_s: float,
        must_leave: tuple[float, float],
        ready_s: float | None = None,
    ) -> GateOutcome:
        """Wait until `what` (e.g. "v7") serves: no live container enqueued within
        `must_leave` = [lo, hi) (Modal's clock) is left, no crash loop of containers that
        started logging after `since`, `/ready` 200, the smoke request 200. `ready_s` (the
        service's start-up budget, `timeouts.startup_s`) bounds the wait for the first
        `/ready` 200: a version not ready by then is refused at once, not at `deadline_s`
        (start-up + request budget), which bounds the whole gate. Never raises."""
        start = time.monotonic()
        ready_by = min(ready_s, deadline_s) if ready_s else deadline_s
        try:
            return self._verify(what, since, deadline_s, must_leave, start, ready_by)
        except Exception as e:  # the gate failing is an outcome: the caller rolls back
            reason = f"the gate could not finish: {type(e).__name__}: {e}"
            return GateOutcome(
                False, "error", redact(reason, self.secrets), time.monotonic() - start
            )

    def _verify(
        self,
        what: str,
        since: float,
        deadline_s: float,
        must_leave: tuple[float, float],
        start: float,
        ready_by: float,
    ) -> GateOutcome:
        if not self.target.url:
            return GateOutcome(
                False, "no-url", "the deploy reported no endpoint URL (read-back failed)", 0.0
            )
        lo, hi = must_leave
        next_progress = start + self.every
        next_crash_check = start
        stage, reason = "containers", "nothing answered yet"
        was_ready = False  # /ready answered 200 once: the start-up is over
        # Containers live now that were enqueued before `since` are not this version's.
        earlier = {task for task, enqueued in self._containers() if enqueued and enqueued < since}
        while True:
            remaining = deadline_s - (time.monotonic() - start)
            live = self._containers()
            alive = {task for task, _ in live}
            now = time.monotonic()
            if now >= next_crash_check:
                next_crash_check = now + CRASH_CHECK_S
                ended = self._ended_since(since, alive | earlier)
                if len(ended) >= CRASH_LOOP_CONTAINERS:
                    reason = (
                        f"crash loop: {len(ended)} of {what}'s containers exited before it"
                        f" got ready ({', '.join(sorted(ended)[:3])}"
                        f"{', ...' if len(ended) > 3 else ''}); refused without waiting out"
                        " the start-up budget"
                    )
                    return self._done(False, "crash-loop", reason, start)
            leaving = [t for t, enqueued in live if enqueued and lo <= enqueued < hi]
            if leaving:
                stage = "containers"
                reason = (
                    f"{len(leaving)} container(s) of the version it replaces still serve;"
                    f" {what}'s are not ready"
                )
            else:
                # Not ready yet: a probe never runs past the start-up budget.
                left = remaining if was_ready else min(remaining, ready_by - (now - start))
                status, body = probe_ready(self.target, min(10.0, max(left, 0.5)))
                if status != 200:
                    stage, reason = "ready", f"GET /ready {describe(status, body)}"
                else:
                    was_ready = True
                    status, body = probe_smoke(self.target, max(remaining, 5.0))
                    if status == 200:
                        return self._done(True, "passed", "", start)
                    path, _body, words = smoke_request(self.target.task, self.target.model)
                    stage = "smoke"
                    reason = f"the smoke request ({words}, POST {path}) {describe(status, body)}"
            now = time.monotonic()
            if not was_ready and ready_by < deadline_s and now - start >= ready_by:
                return self._done(
                    False,
                    stage,
                    f"did not get ready within its start-up budget of {ready_by:g} s"
                    f" (timeouts.startup_s): {reason}",
                    start,
                    timed_out=True,
                )
            if now - start >= deadline_s:
                return self._done(
                    False,
                    stage,
                    f"did not serve within {deadline_s:g} s: {reason}",
                    start,
                    timed_out=True,
                )
            if now >= next_progress:
                next_progress = now + self.every
                self._report(what, stage, since, now - start, deadline_s if was_ready else ready_by)
            time.sleep(GATE_POLL_S)

    def _done(
        self, ok: bool, stage: str, reason: str, start: float, *, timed_out: bool = False
    ) -> GateOutcome:
        seconds = time.monotonic() - start
        return GateOutcome(ok, stage, redact(reason, self.secrets), seconds, timed_out)

    def _containers(self) -> list[tuple[str, float]]:
        app_id, env = self.app_id, self.environment
        return list(self.call("list containers", lambda c: _rpc.app_containers(c, app_id, env)))

    def _ended_since(self, since: float, known: set[str]) -> set[str]:
        """Containers whose first log line came after `since` and that are no longer live
        (and were not live before the version was published)."""
        app_id = self.app_id
        first = self.call("read the app's logs", lambda c: _rpc.app_log_tasks(c, app_id, since))
        return {task for task, t in first.items() if t >= since and task not in known}

    def _report(self, what: str, stage: str, since: float, elapsed: float, deadline: float) -> None:
        waits = {
            "containers": f"{what}'s containers to replace the ones serving before",
            "ready": f"{what} to answer GET /ready through the edge",
            "smoke": f"{what} to answer {smoke_words(self.target.task)} with the stack's API key",
        }.get(stage, f"{what} to serve")
        tail = self.log_tail(since, n=1)
        last = log_line_summary(tail[-1]) if tail else "(no log line yet)"
        self.progress(
            redact(
                f"health gate waiting for {waits} ({elapsed:.0f} s of {deadline:g} s);"
                f" latest container log: {last}",
                self.secrets,
            )
        )

    def log_tail(self, since: float, n: int = 20) -> list[str]:
        """The app's last log lines since `since` (best effort: [] if Modal fails)."""
        app_id = self.app_id
        try:
            lines = self.call(
                "read the app's logs",
                lambda c: _rpc.app_log_tail(c, app_id, max(since - 1.0, 0.0), n),
            )
        except Exception:  # best effort: a log tail never decides an outcome
            return []
        return [redact(str(line), self.secrets) for line in lines]
