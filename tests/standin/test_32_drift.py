"""Issue 32 item 12: `make up` heals drift by itself, `make plan` shows it and why.

The local stack as a user runs it (`make up` without the Pulumi CLI: the stand-in engine,
tests/program/live_stack.py), then the app stopped by hand with the real `modal` CLI
(`modal app stop`, what the issue's user did). Pulumi.yaml sets `options: refresh: always`,
which the Pulumi CLI reads (pulumi/pulumi pkg/cmd/pulumi/operations/io.go getRefreshOption)
and the stand-in honours: `make plan` reads every resource back first and shows the App's
update with the reason ("live app stopped by hand"); `make up` alone redeploys it and its
endpoint answers again (make up's own check: a chat completion through the edge); a second
`make up` changes nothing; `make refresh` exists and finds nothing more to change.
Before: `make plan` said `9 unchanged`, `make up` `9 unchanged` and then failed with HTTP 404
("app ... is stopped").

Kept (issue 33 item 7): the subject is the product's drift healing (the App provider's `read`
and the plan's reason), end to end as `make up` runs it; the stand-in only carries it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.program.live_stack import LiveStack
from tests.program.runner import PROJECT_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    stack = LiveStack(tmp_path_factory.mktemp("drift"))
    try:
        result = stack.up()
        assert result.returncode == 0, f"make up failed:\n{result.stdout}\n{result.stderr}"
        yield stack
    finally:
        if stack.emulator_pid() is not None:
            stack.down()
        stack.kill_leftovers()


def modal_cli(live: LiveStack, *args: str) -> str:
    """The real `modal` CLI against the stack's emulator, as a user runs it by hand."""
    env = {
        **live.env,
        "MODAL_SERVER_URL": f"http://127.0.0.1:{live.port}",
        "MODAL_TOKEN_ID": "ak-local-emulator",
        "MODAL_TOKEN_SECRET": "as-local-emulator",
    }
    done = subprocess.run(
        [sys.executable, "-m", "modal", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def app_line(out: str) -> str:
    """The plan's (or the up's) line of the App resource."""
    lines = [ln for ln in out.splitlines() if re.match(r"\s+\S*\s+modal:App\s+tiny-app\s", ln)]
    assert lines, out
    return lines[-1]


@pytest.mark.timeout(600)
def test_32_12_an_app_stopped_by_hand_is_planned_with_its_reason_and_healed_by_up(
    live: LiveStack,
) -> None:
    modal_cli(live, "app", "stop", "tiny", "-e", "local", "-y")

    plan = live.make("plan")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    line = app_line(plan.stdout)
    planned = r"~\s+modal:App\s+tiny-app\s+update \[drift: live app stopped by hand"
    assert re.search(planned, line), plan.stdout
    assert "Resources: ~ 1 to update, 8 unchanged" in plan.stdout, plan.stdout

    healed = live.up()  # make up alone: no separate refresh
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "live app stopped by hand" in app_line(healed.stdout), healed.stdout
    assert "Resources: ~ 1 updated, 8 unchanged" in healed.stdout, healed.stdout
    # make up's own check: a chat completion through the edge answered (else it fails).
    assert re.search(r"Service tiny: \S+ answers through the edge", healed.stdout), healed.stdout

    again = live.up()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Resources: 9 unchanged" in again.stdout and "none drifted" in again.stdout, again.stdout

    refreshed = live.make("refresh")
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    assert "Resources: 9 unchanged" in refreshed.stdout, refreshed.stdout


@pytest.mark.timeout(600)
def test_32_12_a_rollback_by_hand_is_planned_with_its_reason_and_healed_by_up(
    live: LiveStack,
) -> None:
    """A second release (v2: one setting changed, as a one-run `--config`), then `modal app
    rollback tiny` by hand: the plan names the rollback, `up` alone deploys the state's release
    again and the endpoint answers, a second `up` changes nothing."""
    import json

    import yaml

    services = yaml.safe_load((PROJECT_ROOT / "Pulumi.local.yaml").read_text())["config"][
        "modal-llm:services"
    ]
    services[0]["scaling"]["scaledown_window_s"] += 1
    tweak = ("--config", f"services={json.dumps(services)}")
    second = live.standin("up", *tweak)
    assert second.returncode == 0 and "Resources: ~ 1 updated" in second.stdout, second.stdout
    before = live.outputs()["services"]["tiny"]["deployed_version"]

    modal_cli(live, "app", "rollback", "tiny", f"v{before - 1}", "-e", "local")

    plan = live.standin("preview", *tweak)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    rolled = (
        r"~\s+modal:App\s+tiny-app\s+update"
        rf" \[drift: live app rolled back by hand: v{before + 1} runs v{before - 1}"
    )
    assert re.search(rolled, app_line(plan.stdout)), plan.stdout
    assert "Resources: ~ 1 to update, 8 unchanged" in plan.stdout, plan.stdout

    healed = live.standin("up", *tweak)
    assert healed.returncode == 0 and "Resources: ~ 1 updated, 8 unchanged" in healed.stdout, (
        healed.stdout
    )
    tiny = live.outputs()["services"]["tiny"]
    assert tiny["deployed_version"] == before + 2 and tiny["gate_result"].startswith("passed:")

    again = live.standin("up", *tweak)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Resources: 9 unchanged" in again.stdout and "none drifted" in again.stdout, again.stdout
