"""HTTP probes of the App health gate (issue 11): what a gateway would send, through the edge.

A deployed serving endpoint sits behind Modal's proxy auth (`Modal-Key` / `Modal-Secret`, the
stack's proxy-auth token) and our serving proxy (`Authorization: Bearer <API key>`). The gate
asks `GET /ready` (200 once the engine is ready; serving/proxy/app.py) and then one smoke
completion, `POST /v1/completions` with `max_tokens: 1`, which proves that the whole path a
user takes answers with the stack's CURRENT key (after a key rotation, the new key).

Stdlib only (urllib): the provider process must not grow a dependency for two requests. No
secret is ever part of what these functions return: answers are truncated bodies and status
codes, and callers redact them once more before they reach a log line or an error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

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


def ready(target: GateTarget, timeout: float) -> tuple[int, str]:
    """`GET /ready` through the edge (proxy token only)."""
    return _request(target, "GET", "/ready", None, with_key=False, timeout=timeout)


def smoke(target: GateTarget, timeout: float) -> tuple[int, str]:
    """One-token completion through the edge with the proxy token and the API key."""
    body = json.dumps({"model": target.model, "prompt": SMOKE_PROMPT, "max_tokens": 1}).encode()
    return _request(target, "POST", "/v1/completions", body, with_key=True, timeout=timeout)


def describe(status: int, body: str) -> str:
    """One line for a probe's answer (a body is only context: truncated, newlines folded)."""
    text = " ".join(body.split())[:200]
    if status == 0:
        return f"got no answer ({text})"
    return f"answered {status} {text}".rstrip()
