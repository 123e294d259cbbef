"""Long provider calls against what the engine does (pulumi/pulumi v3.272.0, read with the
search tool; the paths are in dev/pulumi_standin/server.py's and engine.py's docstrings and
docs/offline.md): no provider call has a deadline (provider_plugin.go: every call under
requestContext(), no deadline); `customTimeouts` only travel in the request's `timeout` field
(step.go Create/Update/DeleteStep.Apply; the delete's from the old state) and are not
enforced; a value Go's time.ParseDuration refuses fails the registration (source_eval.go).

Kept (issue 33 item 7): the App's release runs for minutes (deploy, then the health gate) and
bounds itself by its `custom_timeouts` input (components/modal/app.py `_custom_timeouts`);
a stand-in that cut long calls or enforced customTimeouts itself would hide whether the
release's own budget works (tests/providers/test_app_gate.py, test_33_release_core.py).

Real sockets, the SDK's real provider server, tests/standin/slowprov.py as the provider, and
small programs of their own run by `pulumi_standin.stack.run` as an `up` runs them.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pulumi_standin import Engine, Options, ProviderServer
from pulumi_standin.engine import CustomTimeouts, parse_duration
from pulumi_standin.stack import Command, run
from tests.standin.slowprov import SlowProvider

P = SlowProvider()


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv


def _program(tmp_path: Path, name: str, props: dict[str, Any], timeouts: str = "None") -> Path:
    path = tmp_path / f"prog_{name}.py"
    path.write_text(
        "import pulumi\n"
        "from tests.standin.slowprov import Slow\n"
        f"Slow({name!r}, {props!r}, opts=pulumi.ResourceOptions(custom_timeouts={timeouts}))\n"
    )
    return path


def _up(
    srv: ProviderServer,
    tmp_path: Path,
    program: Path,
    *,
    command: str = "up",
    rc: int = 0,
    verbose: bool = False,
    out: io.StringIO | None = None,
) -> str:
    out = out if out is not None else io.StringIO()
    cmd = Command(
        command,
        "local",
        tmp_path / "local.json",
        "http://127.0.0.1:9",  # no Modal here: the test provider touches nothing
        verbose=verbose,
        program=program,
    )
    got = run(cmd, out, server=srv)
    assert got == rc, out.getvalue()
    return out.getvalue()


def _calls(srv: ProviderServer, since: int, method: str) -> list[dict[str, Any]]:
    return [r.request for r in srv.records[since:] if r.method == method]


# ---- (a) no deadline; customTimeouts travel to the provider and are not enforced ----------------


def test_a_call_longer_than_the_configured_safety_timeout_is_not_cut(
    slow_server: ProviderServer,
) -> None:
    """The only deadline the stand-in has is the start-up one (the engine's plugin dial
    deadline). Made shorter than a Create, it does not cut the Create: no provider call has
    a deadline, as none has in the engine. No customTimeouts → the request's timeout is 0."""
    configured = slow_server.start_timeout
    slow_server.start_timeout = 0.5
    start = len(slow_server.records)
    t0 = time.monotonic()
    try:
        created = slow_server.create(P, {"label": "long", "sleep": 2.0}, name="long")
    finally:
        slow_server.start_timeout = configured
    assert time.monotonic() - t0 >= 2.0
    assert created.id.startswith("s-")
    (request,) = _calls(slow_server, start, "Create")
    assert "timeout" not in request  # 0 (unset) is what the engine sends without customTimeouts


def test_custom_timeouts_reach_the_request_and_nothing_enforces_them(
    slow_server: ProviderServer, tmp_path: Path
) -> None:
    """ResourceOptions(custom_timeouts=...) from a real program: Create carries `create` in
    seconds, Update `update`, Delete (a destroy, which runs no program) the stored `delete`.
    A Create that takes longer than its custom timeout finishes: the engine only passes it."""
    timeouts = "pulumi.CustomTimeouts(create='1s', update='2m', delete='1m30s')"
    start = len(slow_server.records)
    out = _up(slow_server, tmp_path, _program(tmp_path, "t", {"sleep": 1.5}, timeouts))
    assert re.search(r"\+\s+test:Slow\s+t\s+created \(\d+\.\d+s\)", out), out
    (create,) = _calls(slow_server, start, "Create")
    assert create["timeout"] == 1.0
    seconds = next(r.seconds for r in slow_server.records[start:] if r.method == "Create")
    assert seconds >= 1.5  # ran past its 1 s custom timeout, and finished
    stored = json.loads((tmp_path / "local.json").read_text())["resources"][0]
    assert stored["custom_timeouts"] == {"create": 1.0, "update": 120.0, "delete": 90.0}

    start = len(slow_server.records)
    _up(slow_server, tmp_path, _program(tmp_path, "t", {"sleep": 0.1}, timeouts))
    (update,) = _calls(slow_server, start, "Update")
    assert update["timeout"] == 120.0

    start = len(slow_server.records)
    out = _up(slow_server, tmp_path, _program(tmp_path, "t", {}), command="destroy")
    assert "Resources: - 1 deleted" in out, out
    (delete,) = _calls(slow_server, start, "Delete")
    assert delete["timeout"] == 90.0


def test_a_custom_timeout_go_cannot_parse_fails_the_registration(
    slow_server: ProviderServer, tmp_path: Path
) -> None:
    """source_eval.go generateTimeoutInSeconds: time.ParseDuration, so "1d" is refused with
    "unable to parse customTimeout Value 1d" and nothing is created."""
    start = len(slow_server.records)
    program = _program(tmp_path, "d", {}, "pulumi.CustomTimeouts(create='1d')")
    out = _up(slow_server, tmp_path, program, rc=1)
    assert "unable to parse customTimeout Value 1d" in out, out
    assert out.count("error: ") == 1
    assert _calls(slow_server, start, "Create") == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("0", 0.0), ("-2m", -120.0)],
)
def test_durations_parse_as_go_parses_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1d", "", "10", "1h 2m", "m", ".s"])
def test_durations_go_refuses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="unable to parse customTimeout Value"):
        parse_duration(text)


def test_the_delete_of_a_replaced_one_carries_its_own_stored_timeout(
    slow_server: ProviderServer,
) -> None:
    """step.go DeleteStep.Apply sends `s.old.CustomTimeouts.Delete`: the old half's."""
    engine = Engine(slow_server)
    engine.up("r", P, {"label": "r"}, options=Options(custom_timeouts=CustomTimeouts(delete=7)))
    start = len(slow_server.records)
    engine.destroy("r")
    (delete,) = _calls(slow_server, start, "Delete")
    assert delete["timeout"] == 7.0
