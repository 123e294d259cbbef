"""The App's health gate (issue 11): the HTTP probes, and the wait, rollback or undo around them.

`GatedProvider` (the base of `AppProvider`) runs the gate after a deploy: it waits until the
new version's containers replaced the previous ones, `GET /ready` answers 200 and a smoke
completion answers 200, with progress lines meanwhile; on failure an update is rolled back
(`AppRollback`) and fails, a create's app is stopped and the create fails, and the error names
the reason, the container's last log lines and the rollback command.

A deployed serving endpoint sits behind Modal's proxy auth (`Modal-Key` / `Modal-Secret`, the
stack's proxy-auth token) and our serving proxy (`Authorization: Bearer <API key>`). The gate
asks `GET /ready` (200 once the engine is ready; serving/proxy/app.py) and then one smoke
completion, `POST /v1/completions` with `max_tokens: 1`, which proves that the whole path a
user takes answers with the stack's CURRENT key (after a key rotation, the new key).

The probes are stdlib only (urllib): the provider process must not grow a dependency for two
requests. No secret is ever part of what the probes return: answers are truncated bodies and status
codes, and callers redact them once more before they reach a log line or an error.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi

from . import _rpc
from ._base import ModalProvider, ModalProviderError, environment_name, redact

DEFAULT_GATE_TIMEOUT_S = 2400.0  # ServingSpec defaults: startup 1800 s + request 600 s
GATE_POLL_S = 0.25  # between two looks (a TaskList, then at most two HTTP requests)

SMOKE_PROMPT = "ping"
BODY_CHARS = 300


@dataclass(frozen=True)
class GateTarget:
    """Where and how the gate knocks (the secrets are kept out of repr)."""

    url: str
    token_id: str
    token_secret: str = field(repr=False)
    api_key: str = field(repr=False)
    model: str

    def secrets(self) -> list[str]:
        return [self.token_secret, self.api_key]


def _headers(target: GateTarget, with_key: bool) -> dict[str, str]:
    headers = {"Modal-Key": target.token_id, "Modal-Secret": target.token_secret}
    if with_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    return headers


def _request(
    target: GateTarget, method: str, path: str, body: bytes | None, with_key: bool, timeout: float
) -> tuple[int, str]:
    """(status, first BODY_CHARS of the answer); status 0 = no HTTP answer (the reason)."""
    headers = _headers(target, with_key)
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
    """One-token completion through the edge with the proxy token and the API key."""
    body = json.dumps({"model": target.model, "prompt": SMOKE_PROMPT, "max_tokens": 1}).encode()
    return _request(target, "POST", "/v1/completions", body, with_key=True, timeout=timeout)


def describe(status: int, body: str) -> str:
    """One line for a probe's answer (a body is only context: truncated, newlines folded)."""
    text = " ".join(body.split())[:200]
    if status == 0:
        return f"got no answer ({text})"
    return f"answered {status} {text}".rstrip()


def gate_secrets(props: Mapping[str, Any]) -> list[str]:
    """The secrets the gate sends (kept out of every message)."""
    return [str(props[k]) for k in ("gate_token_secret", "gate_api_key") if props.get(k)]


def rollback_command(name: str, env: str, previous: int) -> str:
    """`modal app rollback` back to `previous`, ready to paste ("" without one)."""
    if not previous:
        return ""
    return f"modal app rollback {name} v{previous}" + (f" -e {env}" if env else "")


class GatedProvider(ModalProvider):
    """The gate's part of the App provider: wait for a deploy to serve, or undo it."""

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        return f"'{props.get('name')}' in environment '{environment_name(props) or '<default>'}'"

    def _undo_failed_create(self, props: Mapping[str, Any]) -> str:
        """A failed create must leave nothing behind (it is not in state, so destroy would
        never stop it): a deploy can fail after Modal published the app (the answer was
        lost). No app was deployed under this name before the create, so one there now is
        this create's: stop it. Returns what to add to the error."""
        from modal import exception as mexc

        name, env = str(props["name"]), environment_name(props)

        async def go(client: Any) -> str:
            try:
                app_id = await _rpc.app_by_name(client, name, env)
            except mexc.NotFoundError:
                return ""
            if app_id:
                await _rpc.app_stop(client, app_id)
            return app_id

        try:
            stopped = self.run("clean up after a failed create", self._target(props), go)
        except ModalProviderError:
            return (
                "The deploy may have reached Modal and the clean-up could not check: look for"
                f" the app with `modal app list -e {env or '<env>'}` and stop it before rerunning."
            )
        if stopped:
            return f"The app this create had deployed ({stopped}) was stopped again."
        return "Nothing was left deployed."

    def _production_version(self, props: Mapping[str, Any], app_id: str) -> int:
        """The version serving now (highest in the deployment history; 0 if none)."""

        async def go(client: Any) -> int:
            return await _rpc.app_version(client, app_id)

        return int(self.run("read the serving version", self._target(props), go))

    def _gate_or_undo(
        self,
        props: Mapping[str, Any],
        result: dict[str, Any],
        previous: int,
        commit: str,
        action: str,
        had_previous: bool,
    ) -> dict[str, Any]:
        """Run the gate after a deploy (when on). On failure: an update (or an adopted app)
        is rolled back to `previous` and fails; a create's app is stopped and the create
        fails. Returns the gate outputs."""
        name, env = str(props["name"]), environment_name(props)
        version = int(result.get("version") or 0)
        out: dict[str, Any] = {
            "previous_version": previous,
            "commit": commit,
            "gate_result": "off (health_gate is false)",
            "gate_seconds": 0.0,
            "rollback_command": rollback_command(name, env, previous),
        }
        if not props.get("health_gate"):
            return out
        app_id = str(result["app_id"])
        timeout = float(props.get("health_gate_timeout_s") or DEFAULT_GATE_TIMEOUT_S)
        target = GateTarget(
            url=str(result.get("web_url") or result.get("gate_url") or ""),
            token_id=str(props.get("gate_token_id") or ""),
            token_secret=str(props.get("gate_token_secret") or ""),
            api_key=str(props.get("gate_api_key") or ""),
            model=str(props.get("gate_model") or ""),
        )
        deployed_at = self._deployed_at(props, app_id, version)
        ok, reason, elapsed = self._wait_serving(
            props, target, app_id, deployed_at, timeout, smoke=True, what=f"v{version}"
        )
        if ok:
            out["gate_result"] = f"passed: v{version} answered /ready and a smoke completion"
            out["gate_seconds"] = round(elapsed, 3)
            return out
        tail = self._log_tail(props, app_id, deployed_at)
        secrets = [*target.secrets(), *gate_secrets(props), self.credentials().token_secret]
        what = (
            f"App {self._target(props)}: {action} failed the health gate: v{version}"
            f" (tag {commit or '-'}) did not serve within {timeout:g} s (waited"
            f" {elapsed:.1f} s): {reason}."
        )
        if previous and had_previous and version > previous:
            undo = self._roll_back(props, target, app_id, previous, timeout)
            todo = (
                f" Fix the release (see the log), then rerun `pulumi up` (Pulumi's state keeps"
                f" the previous inputs). By hand: `{rollback_command(name, env, previous)}`."
            )
        elif previous and had_previous:
            undo = (
                f" Nothing to roll back to: the deploy published no new version (v{version}"
                " was already serving)."
            )
            todo = " Fix the release (see the log), then rerun `pulumi up`."
        else:
            undo = " " + self._undo_failed_create(props)
            todo = " Fix the release (see the log), then rerun `pulumi up`."
        logs = "\n".join(f"  | {line}" for line in tail) or "  (no log lines)"
        message = f"{what}{undo}{todo}\nThe container's last log lines:\n{logs}"
        raise ModalProviderError(redact(message, secrets))

    def _deployed_at(self, props: Mapping[str, Any], app_id: str, version: int) -> float:
        """When Modal published `version` (its clock): containers enqueued before belong to
        an older version (the test modal 1.6.4's runner uses for a recreate deploy)."""

        async def go(client: Any) -> float:
            rows = await _rpc.app_history(client, app_id)
            at = [d for v, d, _tag in rows if v == version] or [d for _v, d, _tag in rows]
            return max(at) if at else 0.0

        return float(self.run("read the deployment history", self._target(props), go))

    def _wait_serving(
        self,
        props: Mapping[str, Any],
        target: GateTarget,
        app_id: str,
        deployed_at: float,
        timeout: float,
        *,
        smoke: bool,
        what: str,
        replace_older: bool = True,
    ) -> tuple[bool, str, float]:
        """Poll until `what` serves through the edge: (if `replace_older`) no container
        enqueued before `deployed_at` left (a rolling deploy keeps the old ones serving until
        the new ones are ready), `/ready` 200, then (if `smoke`) a one-token completion 200.
        Progress every few seconds. Returns (ok, last reason, seconds waited)."""
        env = environment_name(props)
        every = float(os.environ.get("MODAL_GATE_PROGRESS_S", "5"))
        start = time.monotonic()
        next_progress = start + every
        reason = "nothing answered yet"
        stage = "containers"

        async def containers(client: Any) -> list[tuple[str, float]]:
            return await _rpc.app_containers(client, app_id, env)

        while True:
            elapsed = time.monotonic() - start
            remaining = timeout - elapsed
            if not target.url:
                return False, "the deploy reported no endpoint URL (read-back failed)", elapsed
            old: list[str] = []
            if replace_older:
                live = self.run("list containers", self._target(props), containers)
                old = [t for t, enqueued in live if enqueued and enqueued < deployed_at]
            if old:
                stage = "containers"
                reason = (
                    f"{len(old)} container(s) of the previous version still serve; {what}'s are"
                    " not ready"
                )
            else:
                status, body = probe_ready(target, min(10.0, max(remaining, 0.5)))
                if status != 200:
                    stage, reason = "ready", f"GET /ready {describe(status, body)}"
                elif not smoke:
                    return True, "", time.monotonic() - start
                else:
                    status, body = probe_smoke(target, max(remaining, 5.0))
                    if status == 200:
                        return True, "", time.monotonic() - start
                    stage = "smoke"
                    reason = (
                        "the smoke completion (POST /v1/completions, max_tokens 1)"
                        f" {describe(status, body)}"
                    )
            now = time.monotonic()
            if now - start >= timeout:
                return False, redact(reason, target.secrets()), now - start
            if now >= next_progress:
                next_progress = now + every
                self._progress(props, app_id, deployed_at, stage, what, now - start, timeout)
            time.sleep(GATE_POLL_S)

    def _progress(
        self,
        props: Mapping[str, Any],
        app_id: str,
        since: float,
        stage: str,
        what: str,
        elapsed: float,
        timeout: float,
    ) -> None:
        waits = {
            "containers": f"{what}'s containers to replace the previous version's",
            "ready": f"{what} to answer GET /ready through the edge",
            "smoke": f"{what} to answer a one-token completion with the stack's API key",
        }[stage]
        tail = self._log_tail(props, app_id, since, n=1)
        last = tail[-1][:200] if tail else "(no log line yet)"
        secrets = [*gate_secrets(props), self.credentials().token_secret]
        pulumi.log.info(
            redact(
                f"App {self._target(props)}: health gate waiting for {waits}"
                f" ({elapsed:.0f} s of {timeout:g} s); latest container log: {last}",
                secrets,
            )
        )

    def _log_tail(
        self, props: Mapping[str, Any], app_id: str, since: float, n: int = 20
    ) -> list[str]:
        """The app's last log lines since the deploy (best effort: [] if Modal fails)."""

        async def go(client: Any) -> list[str]:
            return await _rpc.app_log_tail(client, app_id, max(since - 1.0, 0.0), n)

        try:
            return list(self.run("read the app's logs", self._target(props), go))
        except ModalProviderError:
            return []

    def _roll_back(
        self,
        props: Mapping[str, Any],
        target: GateTarget,
        app_id: str,
        previous: int,
        timeout: float,
    ) -> str:
        """AppRollback to `previous`, then wait until it answers /ready again. Returns what
        to add to the error."""

        async def go(client: Any) -> float:
            return await _rpc.app_rollback(client, app_id, previous)

        try:
            rolled_at = float(
                self.run(f"roll back to v{previous}", self._target(props), go, idempotent=False)
            )
        except ModalProviderError as e:
            return (
                f" The rollback to v{previous} FAILED ({e}); the failing version may be"
                " serving: roll back by hand."
            )
        # The rolled-back definition may be the one the old containers still run (a rolling
        # deploy never replaced them): whatever answers /ready through the edge now serves.
        ok, reason, elapsed = self._wait_serving(
            props,
            target,
            app_id,
            rolled_at,
            timeout,
            smoke=False,
            what=f"v{previous}",
            replace_older=False,
        )
        if ok:
            return (
                f" Rolled back to v{previous} (Modal published it again as a new version),"
                f" which answers /ready again ({elapsed:.1f} s)."
            )
        return (
            f" Rolled back to v{previous}, but it did NOT answer again within {timeout:g} s:"
            f" {reason}. Check `modal app logs {props.get('name')}`."
        )
