"""Fault injection for tests: make the next calls of one RPC fail, before or after it ran.

A test arms a fault through the control port (`POST /_emulator/faults`, JSON
`{"method": "WebhookTokenCreate", "when": "after", "status": "UNAVAILABLE", "count": 1}`;
`{"clear": true}` disarms everything; `/_emulator/reset` does too). `when`:

- `"before"`: the RPC is answered with `status` without running (nothing was applied);
- `"after"`: the handler runs and commits, then the answer is replaced by `status`: what a
  client sees when Modal applied a request and the connection failed before the answer
  arrived (the case that makes blind retries of creates unsafe).

`"delay_s": S` (0-60) waits S seconds at that point first; with `"status": "NONE"` the call
then proceeds normally (a slow Modal, to make a client's attempt time out mid-call).

One emulator per process, so the armed faults are module state (`FAULTS`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

STATUSES = ("UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "UNKNOWN", "NONE")
WHEN = ("before", "after")


@dataclass
class Fault:
    method: str
    when: str
    status: str
    remaining: int
    delay_s: float = 0.0


class Faults:
    """Armed faults by (method, when); thread safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[tuple[str, str], Fault] = {}

    def arm(self, payload: Any) -> Fault:
        """Validate a control-port payload and arm it; ValueError names what is wrong."""
        if not isinstance(payload, dict):
            raise ValueError("expected a JSON object")
        method, when = payload.get("method"), payload.get("when", "after")
        status, count = payload.get("status", "UNAVAILABLE"), payload.get("count", 1)
        if not isinstance(method, str) or not method:
            raise ValueError("method must be an RPC name, e.g. WebhookTokenCreate")
        if when not in WHEN:
            raise ValueError(f"when must be one of {WHEN}")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise ValueError("count must be a whole number from 1 to 1000")
        delay = payload.get("delay_s", 0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 60:
            raise ValueError("delay_s must be a number of seconds from 0 to 60")
        fault = Fault(method, str(when), str(status), count, float(delay))
        with self._lock:
            self._armed[(method, fault.when)] = fault
        return fault

    def take(self, method: str, when: str) -> Fault | None:
        """The fault armed for this call (consuming one count), or None."""
        with self._lock:
            fault = self._armed.get((method, when))
            if fault is None:
                return None
            fault.remaining -= 1
            if fault.remaining <= 0:
                del self._armed[(method, when)]
            return fault

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()


FAULTS = Faults()
