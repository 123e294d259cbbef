"""Long provider calls, what a provider prints while one runs, and how a failed one is shown,
each against what the engine does (pulumi/pulumi v3.272.0, read with the search tool; the
paths are in dev/pulumi_standin/server.py's and engine.py's docstrings and docs/offline.md):

- no provider call has a deadline (provider_plugin.go: every call under requestContext(), no
  deadline); `customTimeouts` only travel in the request's `timeout` field (step.go
  Create/Update/DeleteStep.Apply; the delete's from the old state) and are not enforced;
  a value Go's time.ParseDuration refuses fails the registration (source_eval.go);
- a dynamic provider's stdout/stderr lines are forwarded as they come (plugin.go runtrace);
  the stand-in shows each at once on the line of the resource whose call is in flight;
- a failed call's error is the provider's traceback (the SDK server aborts with
  traceback.format_exc()); the stand-in prints the exception whole and first, the traceback
  in a file (or inline with --verbose), and takes status details as large as the engine's
  Go client does (16 MiB).

Real sockets, the SDK's real provider server, tests/standin/slowprov.py as the provider, and
small programs of their own run by `pulumi_standin.stack.run` as an `up` runs them.
"""

from __future__ import annotations

import io
import json
import re
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pulumi_standin import Engine, Options, ProviderServer
from pulumi_standin.engine import CustomTimeouts, parse_duration
from pulumi_standin.server import exception_message
from pulumi_standin.stack import Command, run, traceback_path
from tests.standin.slowprov import SlowProvider, error_message

P = SlowProvider()


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv


class TimedOut(io.StringIO):
    """Stdout that notes when each write came and how often it was flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[float, str]] = []
        self.flushes = 0

    def write(self, s: str) -> int:
        self.writes.append((time.monotonic(), s))
        return super().write(s)

    def flush(self) -> None:
        self.flushes += 1
        super().flush()

    def when(self, needle: str) -> float:
        return next(t for t, s in self.writes if needle in s)


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


# ---- (b) a failed call: the provider's exception whole and first --------------------------------


@pytest.mark.parametrize("lines", [40, 600])  # 600: ~40 KiB, over grpcio's 16 KiB default
def test_a_provider_error_is_shown_whole_and_first(
    slow_server: ProviderServer, tmp_path: Path, lines: int
) -> None:
    program = _program(tmp_path, "bad", {"fail_lines": lines, "depth": 40})
    out = _up(slow_server, tmp_path, program, rc=1)
    error = out[out.index("error: ") :]
    first, *rest = error.split("\n")
    assert first == "error: resource 'bad' (test:Slow): Create failed (UNKNOWN):", error[:300]
    expected = f"tests.standin.slowprov.SlowProviderError: {error_message('bad', lines)}"
    shown = "\n".join(line.removeprefix("  ") for line in rest[: lines + 1])
    assert shown == expected  # the first line and every line after it, in order, uncut
    assert 'File "' not in out and "Traceback" not in out  # no frames in the output
    where = traceback_path(tmp_path / "local.json")
    assert f"The provider's traceback: {where}" in out
    saved = where.read_text()
    assert "Traceback (most recent call last):" in saved and "in _deep" in saved
    assert "[Previous line repeated" in saved  # 40 frames deep: Python folds the repeats
    assert saved.rstrip().endswith(expected.rstrip())
    assert where.stat().st_mode & 0o077 == 0


def test_verbose_shows_the_traceback_after_the_error(
    slow_server: ProviderServer, tmp_path: Path
) -> None:
    program = _program(tmp_path, "bad", {"fail_lines": 3, "depth": 5})
    out = _up(slow_server, tmp_path, program, rc=1, verbose=True)
    message = out.index("SlowProviderError: Slow 'bad'")
    frames = out.index("The provider's traceback:\n  Traceback (most recent call last):")
    assert message < frames and "in _deep" in out[frames:]


def test_the_exception_of_a_chained_traceback_is_the_last_one_raised() -> None:
    def fail() -> None:
        empty: dict[str, int] = {}
        try:
            empty["key"]
        except KeyError as exc:
            message = "outer\nsecond line\n  | Traceback (most recent call last):"
            raise RuntimeError(message) from exc

    try:
        fail()
    except RuntimeError:
        details = traceback.format_exc()
    assert "KeyError" in details
    assert exception_message(details) == (
        "RuntimeError: outer\nsecond line\n  | Traceback (most recent call last):"
    )
    assert exception_message("not a traceback\n") == "not a traceback"


# ---- (c) what the provider prints reaches the output while the call runs ------------------------


def test_progress_lines_are_shown_while_the_create_runs(
    slow_server: ProviderServer, tmp_path: Path
) -> None:
    """The provider reports "p1" at once, "p2" after 0.75 s, then answers at 1.5 s. Both lines
    are on the stand-in's output, on the resource's line, flushed, well before the step's
    "created" line (which is written when the Create has answered). A line printed just
    before the answer is still shown on the resource's line, and before "created"."""
    out = TimedOut()
    props = {"sleep": 1.5, "progress": ["p1", "p2"], "done": "answering"}
    _up(slow_server, tmp_path, _program(tmp_path, "g", props), out=out)
    text = out.getvalue()
    assert re.search(r"\+\s+test:Slow\s+g\s+creating \| info: Slow 'g': p1\n", text), text
    assert re.search(r"\+\s+test:Slow\s+g\s+creating \| stdout: p2\n", text), text
    assert re.search(r"\+\s+test:Slow\s+g\s+creating \| stdout: answering\n", text), text
    assert text.index("stdout: answering") < text.index(" created (")
    done = out.when(" created (")
    assert out.when("Slow 'g': p1") <= done - 1.0  # shown as it came, not at the end
    assert out.when("stdout: p2") <= done - 0.3
    assert out.flushes >= 3
