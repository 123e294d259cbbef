"""Issue 32 item 13: the waits a user set bound a release that never gets ready.

A never-ready version of serving/app.py (the stand-in engine told never to get ready, the
release's `timeouts.startup_s` short) is refused once its start-up budget is spent, not at the
end of the gate's whole budget (start-up + request, what LLMService passes as
`health_gate_timeout_s`), and the rollback that follows is bounded by a fixed margin the
provider prints when the gate starts. The error carries a timeline: publish, waiting for ready,
refused, rollback, in seconds. Before: 216 s for `startup_s: 90` on the local stack (the gate
waited start-up 90 + request 120 s, then re-checked the rollback for up to the same again).

The bound asserted is the one the user configured (startup_s) plus the printed margin plus the
publish the timeline reports, with SLACK_S for the provider call around the release (Check,
Diff, the history read before the publish, the log tail): a correctness bound, not a speed
claim.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from serving.spec import ServingSpec
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError
from tests.providers.test_app_gate import APP, OLD_KEY, ServingApp, Stack, TestApp, records

STARTUP_S, REQUEST_S = 20, 120
SLACK_S = 10.0


class ShortStartServing(ServingApp):
    """serving/app.py with a 20 s start-up budget: its container gives up on an engine that
    never gets ready at 90 % of it and exits, so Modal restarts it (a crash loop after three)."""

    def _spec(self, fail: str = "", message: str = "pong") -> ServingSpec:
        raw = super()._spec(fail, message).model_dump(mode="json", exclude_none=True)
        raw["timeouts"] = {"startup_s": STARTUP_S, "request_s": REQUEST_S}
        return ServingSpec.model_validate(raw)


class ShortStartTestApp(TestApp):
    """Our serving-shaped test app whose never-ready container stays up answering /ready 503
    (an engine that loads forever): only a deadline refuses it. `timeouts` as a rendered
    ServingSpec carries them; `startup_s` is its Modal startup_timeout."""

    def spec(self, fail: str = "", message: str = "pong") -> str:
        raw = json.loads(super().spec(fail, message))
        raw["startup_s"] = STARTUP_S
        raw["timeouts"] = {"startup_s": STARTUP_S, "request_s": REQUEST_S}
        return json.dumps(raw, sort_keys=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(ShortStartTestApp(), id="stays-up-never-ready"),
        pytest.param(ShortStartServing(), id="serving-app-never-ready"),
    ],
)
def test_32_13_a_never_ready_release_is_refused_within_startup_s_plus_the_printed_margin(
    engine: Engine, emulator: EmulatorProcess, kind: TestApp
) -> None:
    stack = Stack(engine, kind)
    budget = float(STARTUP_S + REQUEST_S)  # what LLMService passes (start-up + request)
    engine.up("a", APP, stack.app(health_gate_timeout_s=budget))
    url = engine.states["a"].outputs["web_url"]

    bad = stack.app(spec_json=kind.spec(fail="never-ready"), health_gate_timeout_s=budget)
    started = time.monotonic()
    with pytest.raises(ProviderCallError) as err:
        engine.up("a", APP, bad)
    took = time.monotonic() - started
    details = err.value.message

    # The margin is printed when the gate starts (a progress line) and in the error.
    logs = engine.server.logs()
    printed = re.search(r"if refused, the rollback gets at most (\d+(?:\.\d+)?) s", logs)
    margin = float(printed.group(1)) if printed else 60.0
    publish = re.search(r"Timeline: publish (\d+\.\d) s", details)
    published_s = float(publish.group(1)) if publish else 0.0
    bound = published_s + STARTUP_S + margin + SLACK_S
    assert took <= bound, (
        f"refused after {took:.0f} s; startup_s {STARTUP_S} + rollback margin {margin:g}"
        f" + publish {published_s} + slack {SLACK_S:g} = {bound:.0f} s\n{details}"
    )
    assert printed, "the rollback margin was not printed when the gate started"
    assert f"GET /ready within {STARTUP_S} s (start-up budget, timeouts.startup_s)" in logs

    # Where the time went: publish, waiting for ready (the whole start-up budget, no more),
    # refused, the rollback (within the margin).
    line = re.search(
        r"Timeline: publish (?P<publish>\d+\.\d) s \| waiting for ready (?P<wait>\d+\.\d) s"
        rf" \(start-up budget {STARTUP_S} s: timeouts\.startup_s\) \| refused \((?P<stage>[\w-]+)\)"
        r" \| rollback to v1 (?P<rollback>\d+\.\d) s \(rollback margin (?P<margin>\d+) s\)"
        r" \| (?P<total>\d+\.\d) s in all\.",
        details,
    )
    assert line, details
    print(line.group(0))  # shown with -s: where the time went
    assert STARTUP_S <= float(line["wait"]) <= STARTUP_S + 5, line.group(0)
    assert float(line["rollback"]) <= float(line["margin"]) == margin, line.group(0)
    assert f"did not get ready within its start-up budget of {STARTUP_S} s" in details

    # Rolled back: the known-good version answers again, the records say so.
    assert "Rolled back to v1 (last known good), live as v3, which answered" in details
    assert stack.call(url, "/v1/completions", OLD_KEY) == 200
    assert records(emulator)["llm-iac.gate.v2"] == "failed"
    engine.destroy("a")
