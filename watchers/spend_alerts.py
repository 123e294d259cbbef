"""The spend watcher: a scheduled Modal function that posts crossed budget thresholds.

Deployed into each environment by the stack (`ServingEnvironment`, through the `App`
resource, like serving/app.py); container code only: it imports neither components/ nor
pulumi. Deploy by hand with

    SERVING_SPEC=watch.json SERVING_APP_NAME=spend-watch modal deploy watchers/spend_alerts.py

where watch.json is {"environment": NAME, "environment_id": "en-...", "thresholds": [0.5, 1.0],
"secret": SECRET NAME, "dict": DICT NAME, "period_minutes": 15}. The spec is baked into the
image ENV (SPEND_WATCH_SPEC), so the container reads the same spec the deploy did.

Every run (every `period_minutes`, or `modal run`/the emulator's schedule route):
1. reads the environment's usage and budget (`EnvironmentGetBudget`, the RPC the SpendAlert
   provider uses; not called by the public 1.6.4 SDK, so its semantics are inferred: see
   docs/providers.md) with the watcher token from the secret (SPEND_WATCH_TOKEN_ID/SECRET:
   a service user with the `viewer` role in this environment), else with the container's own
   identity;
2. computes the crossed thresholds (usage >= t * budget; with a budget of 0 every threshold
   once usage > 0), as the SpendAlert provider reports them;
3. POSTs each crossed threshold not yet delivered to SPEND_ALERT_WEBHOOK_URL (from the
   secret) as JSON {"environment", "threshold", "budget_usd", "usage_usd",
   "effective_limit_usd", "limit_reached", "text"} (`text` is what Slack's incoming webhooks
   show);
4. remembers each threshold in the Dict (key "alerted") right after its 2xx answer, so one is
   posted once; a failed post is not remembered and is retried by the next run. A threshold
   that usage fell back under (a new billing cycle) is forgotten, so it can alert again.
A run with a failed post ends with an error (after remembering what went through), so the
failure shows in the app's logs and call history; neither error nor logs name the webhook URL
or the token.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import modal

SPEC_ENV = "SPEND_WATCH_SPEC"
WEBHOOK_ENV = "SPEND_ALERT_WEBHOOK_URL"
TOKEN_ID_ENV = "SPEND_WATCH_TOKEN_ID"  # noqa: S105 (an env var name)
TOKEN_SECRET_ENV = "SPEND_WATCH_TOKEN_SECRET"  # noqa: S105 (an env var name)
ALERTED_KEY = "alerted"
POST_TIMEOUT_S = 10.0


def load_spec() -> dict[str, Any]:
    """The watch spec: the image ENV in a container, the SERVING_SPEC file at deploy time."""
    text = os.environ.get(SPEC_ENV)
    if text is None:
        path = os.environ.get("SERVING_SPEC")
        if not path:
            raise SystemExit(
                "SERVING_SPEC must name the watch spec JSON file (see watchers/spend_alerts.py)"
            )
        text = Path(path).read_text()
    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise SystemExit("the watch spec must be a JSON object")
    return spec


SPEC = load_spec()
app = modal.App(
    os.environ.get("SERVING_APP_NAME", "spend-watch"),
    image=modal.Image.debian_slim().env({SPEC_ENV: json.dumps(SPEC, sort_keys=True)}),
)


def crossed(thresholds: list[float], budget: float, usage: float) -> list[float]:
    """The thresholds (fractions of the budget) that `usage` has reached."""
    return sorted(t for t in thresholds if usage >= t * budget and (budget > 0 or usage > 0))


def message(env: str, t: float, budget: float, usage: float, limit: float, reached: bool) -> str:
    text = (
        f"Modal environment '{env}' has used ${usage:,.2f} of its ${budget:,.2f} monthly budget"
        f" ({t:.0%} threshold crossed)."
    )
    if reached:
        text += " The budget is reached: Modal stops the environment's work."
    return text


def post(url: str, payload: dict[str, Any]) -> str:
    """POST `payload` as JSON; "" on a 2xx answer, else why not (never the URL)."""
    req = urllib.request.Request(  # noqa: S310 (the stack checks the scheme)
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=POST_TIMEOUT_S) as resp:  # noqa: S310
            return "" if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return type(e).__name__


async def read_budget(env_id: str) -> Any:
    """`EnvironmentGetBudgetResponse` of the environment, read with the watcher token when
    the secret holds one (least privilege), else with the container's own client."""
    from modal.client import _Client
    from modal_proto import api_pb2

    req = api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
    token_id, token_secret = os.environ.get(TOKEN_ID_ENV), os.environ.get(TOKEN_SECRET_ENV)
    if not (token_id and token_secret):
        return await (await _Client.from_env())._stub.EnvironmentGetBudget(req)
    client = await _Client.from_credentials(token_id, token_secret)
    try:
        return await client._stub.EnvironmentGetBudget(req)
    finally:
        await client.close()


@app.function(
    schedule=modal.Period(minutes=int(SPEC.get("period_minutes", 15))),
    secrets=[modal.Secret.from_name(str(SPEC.get("secret", "spend-watch")))],
    timeout=300,
)
async def watch() -> dict[str, Any]:
    env = str(SPEC.get("environment") or "")
    status = await read_budget(str(SPEC["environment_id"]))
    if not status.HasField("cycle_budget_dollars"):
        print(f"spend watch '{env}': no budget set, nothing to watch", flush=True)
        return {"crossed": [], "sent": [], "failed": []}
    budget = float(status.cycle_budget_dollars)
    usage = float(status.current_cycle_usage)
    limit = float(status.effective_cycle_spend_limit)
    reached = bool(status.spend_limit_reached)
    now = crossed([float(t) for t in SPEC.get("thresholds") or []], budget, usage)

    memory = modal.Dict.from_name(str(SPEC.get("dict", "spend-watch")), create_if_missing=True)
    before = [float(t) for t in (await memory.get.aio(ALERTED_KEY)) or []]
    alerted = [t for t in before if t in now]  # usage fell under the others: forget them
    if alerted != before:
        await memory.put.aio(ALERTED_KEY, alerted)
    url = os.environ.get(WEBHOOK_ENV, "")
    sent: list[float] = []
    failed: list[str] = []
    for t in now:
        if t in alerted:
            continue
        if not url:
            failed.append(f"{t:g}: no {WEBHOOK_ENV} in the secret")
            continue
        payload = {
            "environment": env,
            "threshold": t,
            "budget_usd": budget,
            "usage_usd": usage,
            "effective_limit_usd": limit,
            "limit_reached": reached,
            "text": message(env, t, budget, usage, limit, reached),
        }
        problem = post(url, payload)
        if problem:
            failed.append(f"{t:g}: {problem}")
            continue
        alerted.append(t)
        await memory.put.aio(ALERTED_KEY, sorted(alerted))  # remembered once delivered
        sent.append(t)
    print(
        f"spend watch '{env}': usage ${usage:.2f} of ${budget:.2f}; crossed {now}, sent {sent},"
        f" not delivered {failed or 'none'}",
        flush=True,
    )
    if failed:
        raise RuntimeError(
            f"spend watch '{env}': {len(failed)} alert(s) not delivered to the webhook"
            f" ({'; '.join(failed)}); the next run retries them"
        )
    return {"crossed": now, "sent": sent, "failed": failed}
