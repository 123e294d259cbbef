"""The release's defaults and fixed figures, each in this one place (issue 33 item 3).

Everything else imports them: the App's inputs and `check`, the release core (`_decide.py`),
its effects (`_effects.py`), the health gate (`_gate.py`) and the stack config
(`components/config.py`, the service's `task`). Nothing here imports the project: the deploy
runner's process and the stack config may import it cheaply.

`timeouts.startup_s` itself has its one default where the stack key is declared: the
serving spec (`serving/spec.py` `Timeouts.startup_s`, 1800 s; components never import
serving/). The App reads it from the rendered spec's JSON (`_decide.startup_budget`);
GATE_TIMEOUT_S below is only the gate's budget for an App built without a service, and is
that default start-up plus the default request time.
"""

from __future__ import annotations

from typing import Final

#: What a served model does, and the gate's smoke request for it: task -> (path, in words).
SMOKE_REQUESTS: dict[str, tuple[str, str]] = {
    "chat": ("/v1/chat/completions", "a one-token chat completion"),
    "completion": ("/v1/completions", "a one-token completion"),
    "embedding": ("/v1/embeddings", "an embedding"),
}
#: The tasks a service (and the App's `gate_task`) may name.
GATE_TASKS: tuple[str, ...] = tuple(SMOKE_REQUESTS)
#: The task of a service (and an App) that names none.
GATE_TASK: Final = "chat"

#: The gate's whole budget when `health_gate_timeout_s` is not given (an App built without a
#: service; `LLMService` always passes its spec's start-up + request): serving/spec.py's
#: `Timeouts` defaults, 1800 s start-up + 600 s request.
GATE_TIMEOUT_S = 2400.0
#: The largest `health_gate_timeout_s` an App accepts (a week).
GATE_TIMEOUT_MAX_S = 7 * 86_400.0

#: The rollback margin: how long a refused release may spend rolling back (AppRollback, the
#: release records, and the re-check that the known-good version answers again) after the gate
#: refused it. Fixed and printed (issue 32 item 13): a release that never gets ready is refused
#: within its start-up budget (`timeouts.startup_s`) plus this margin (plus the publish
#: itself); customTimeouts may only shorten it. A re-check that runs out of margin says so and
#: records the version `unverified`, never `failed`.
ROLLBACK_MARGIN_S = 60.0
#: The least a rollback (or the gate under a tight customTimeouts) is given, in seconds.
MIN_STEP_S = 5.0

#: How long one deploy (the runner process: image build + publish) may take.
DEPLOY_TIMEOUT_S = 1800.0
#: A transient deploy failure (Modal unreachable) is tried this many times in all.
DEPLOY_ATTEMPTS = 2

#: Release records kept on the app (older ones are dropped, the newest `passed` always kept).
MAX_RECORDS = 32

__all__ = [
    "DEPLOY_ATTEMPTS",
    "DEPLOY_TIMEOUT_S",
    "GATE_TASK",
    "GATE_TASKS",
    "GATE_TIMEOUT_MAX_S",
    "GATE_TIMEOUT_S",
    "MAX_RECORDS",
    "MIN_STEP_S",
    "ROLLBACK_MARGIN_S",
    "SMOKE_REQUESTS",
]
