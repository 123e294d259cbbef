"""Issue 33 item 3: the release core decides without I/O (components/modal/_decide.py).

Every branch the release takes, as a table of what was observed and what the gate found ->
the decision; no emulator, no Modal, no clock. The end-to-end tests of the same branches
(tests/providers/test_app_release.py, test_app_gate.py) run them against the emulator."""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.modal._decide import (
    FAILED,
    PASSED,
    UNVERIFIED,
    Commit,
    Decision,
    GateOutcome,
    Observed,
    Policy,
    Published,
    Record,
    Releases,
    RollBack,
    Stop,
    UndoCreate,
    Verdict,
    decide,
    gate_result,
    is_new,
    policy,
    recheck_record,
    records_of,
    skip_gate,
    startup_budget,
    with_records,
)
from components.modal._rpc import Deployment
from components.modal.defaults import GATE_TIMEOUT_S, MAX_RECORDS, ROLLBACK_MARGIN_S
from tests.harness.emulator import PROJECT_ROOT

DIGESTS = {"spec_digest": "a" * 64, "source_digest": "b" * 64}
TAG = "spec.aaaaaaaaaaaa.src.bbbbbbbbbbbb"


def knobs(gate: bool = True, keep: bool = True, env: str = "main") -> Policy:
    props = {"name": "svc", "environment": env, "health_gate": gate}
    return policy(props, "update", DIGESTS, keep_on_failure=keep)


def history(*versions: int, records: dict[int, str] | None = None, app: str = "ap-1") -> Releases:
    rows = tuple(Deployment(v, float(v), TAG, 0, "c0ffee") for v in versions)
    tags = {Record(v, o).key: o for v, o in (records or {}).items()}
    return Releases(app, rows, tags)


def new(version: int, app: str = "ap-1", *, is_new: bool = True) -> Published:
    return Published(app, version, float(version), "https://svc", is_new, TAG, "c0ffee")


PASS = GateOutcome(True, "passed", "", 1.5)
REFUSED = GateOutcome(False, "smoke", "answered 500", 3.0)
TIMED_OUT = GateOutcome(False, "ready", "did not get ready", 20.0, timed_out=True)
CRASH = GateOutcome(False, "crash-loop", "3 containers exited", 2.0)
ERROR = GateOutcome(False, "error", "the gate could not finish", 0.1)
OFF = GateOutcome(True, "off", "health_gate is off: not verified", 0.0)
UNCHANGED = GateOutcome(True, "unchanged", "v3 already passed its gate", 0.0)
GOOD = {1: PASSED, 2: PASSED}

#: (case, observed, the gate's outcome, the decision).
TABLE: list[tuple[str, Observed, GateOutcome | None, Decision]] = [
    # ---- the gate passed (or did not need to look) -> commit ----
    (
        "passed: recorded passed, the new version is the known-good one",
        Observed(knobs(), history(1, 2, records=GOOD), new(3)),
        PASS,
        Commit(3, PASSED, 3, 2, Verdict("passed", 3, 1.5)),
    ),
    (
        "gate off: recorded unverified, the known-good version stays the last passed",
        Observed(knobs(gate=False), history(1, 2, records=GOOD), new(3)),
        OFF,
        Commit(3, UNVERIFIED, 2, 2, Verdict("off", 3, 0.0)),
    ),
    (
        "gate off, no history: nothing known good, nothing to roll back to",
        Observed(knobs(gate=False), None, new(1)),
        OFF,
        Commit(1, UNVERIFIED, 0, 0, Verdict("off", 1, 0.0)),
    ),
    (
        "unchanged (nothing new published, it had passed): recorded passed again",
        Observed(knobs(), history(1, 2, 3, records={3: PASSED}), new(3, is_new=False)),
        UNCHANGED,
        Commit(3, PASSED, 3, 0, Verdict("unchanged", 3, 0.0)),
    ),
    (
        "rollback target equal to the new version: no rollback line",
        Observed(knobs(), history(1, 2, records={2: PASSED}), new(2, is_new=False)),
        PASS,
        Commit(2, PASSED, 2, 0, Verdict("passed", 2, 1.5)),
    ),
    (
        "ungated, what is live could not be read back: it stands, nothing recorded",
        Observed(knobs(gate=False), history(1, 2, records=GOOD), new(0), read_error="boom"),
        GateOutcome(False, "error", "boom", 0.0),
        Commit(0, "", 0, 2, Verdict("off")),
    ),
    # ---- the gate refused an update -> roll back to the last known good ----
    # every way the gate refuses (smoke 5xx, start-up budget spent, crash loop, an exception
    # or a Modal error inside the gate) is the same decision
    *[
        (
            f"refused ({refused.stage}): roll back to the newest passed version",
            Observed(knobs(), history(1, 2, records=GOOD), new(3)),
            refused,
            RollBack(2, failed=3),
        )
        for refused in (REFUSED, TIMED_OUT, CRASH, ERROR)
    ],
    (
        "never to a failed version: back to the last passed, over newer failed ones",
        Observed(knobs(), history(1, 2, 3, records={1: PASSED, 2: FAILED, 3: FAILED}), new(4)),
        REFUSED,
        RollBack(1, failed=4),
    ),
    (
        "no passed record: the version serving before is the fallback",
        Observed(knobs(), history(1, 2), new(3)),
        REFUSED,
        RollBack(2, failed=3),
    ),
    (
        "the publish answered but its history could not be read (gated): blind rollback",
        Observed(knobs(), history(1, 2, records=GOOD), new(0), read_error="boom"),
        GateOutcome(False, "error", "boom", 0.0),
        RollBack(2, failed=0),
    ),
    # ---- nothing to roll back to, or nothing of ours before -> stop what was made ----
    (
        "no known-good version (the one before failed too): stop the new app",
        Observed(knobs(), history(1, 2, records={2: FAILED}), new(3)),
        REFUSED,
        UndoCreate("ap-1", why="no earlier version passed its gate (v2)", failed=3),
    ),
    (
        "a create (nothing served before): stop the new app",
        Observed(knobs(keep=False), None, new(1)),
        REFUSED,
        UndoCreate("ap-1", failed=1),
    ),
    (
        "an adopted create's app was replaced by a new app: stop the new one",
        Observed(knobs(), history(1, 2, records=GOOD, app="ap-old"), new(1, app="ap-new")),
        REFUSED,
        UndoCreate("ap-new", failed=1),
    ),
    (
        "nothing new on a create of its own lost release: left, recorded failed",
        Observed(knobs(keep=False), history(1), new(1, is_new=False)),
        REFUSED,
        Stop(
            "Nothing new was published: v1 is what served before this release; left as it is"
            " (now recorded as failed, so no rollback goes to it).",
            failed=1,
        ),
    ),
    (
        "nothing new published and the version serving fails now: left, recorded failed",
        Observed(knobs(), history(1, 2, records=GOOD), new(2, is_new=False)),
        REFUSED,
        Stop(
            "Nothing new was published: v2 is what served before this release; left as it is"
            " (now recorded as failed, so no rollback goes to it).",
            failed=2,
        ),
    ),
    # ---- the publish failed (its answer lost or not) ----
    (
        "a failed create publish, nothing found under the name: undo the create",
        Observed(knobs(keep=False), None, None, publish_error="E."),
        None,
        UndoCreate(""),
    ),
    (
        "a failed update publish, nothing new in the history: vN keeps serving",
        Observed(knobs(), history(1, 2, records=GOOD), None, publish_error="E."),
        None,
        Stop("E. Nothing was published: v2 (checked in Modal's history just now) keeps serving."),
    ),
    (
        "a failed create publish that could not be checked: the stop command",
        Observed(knobs(keep=False), None, None, publish_error="E.", look_error="L"),
        None,
        Stop(
            "E. Whether it reached Modal could not be checked (L): look for it with"
            " `modal app list -e main` and stop it (`modal app stop svc -e main`) before"
            " rerunning.",
            command="modal app stop svc -e main",
        ),
    ),
    (
        "a failed update publish that could not be checked: the rollback command",
        Observed(knobs(), history(1, 2, records=GOOD), None, publish_error="E.", look_error="L"),
        None,
        Stop(
            "E. Whether it published a new version could not be checked (L): run `modal app"
            " history svc -e main`; if a version newer than v2 is there, it passed no gate:"
            " `modal app rollback svc v2 -e main`.",
            command="modal app rollback svc v2 -e main",
        ),
    ),
    (
        "... and with nothing to roll back to: the stop command",
        Observed(
            knobs(env=""), history(1, records={1: FAILED}), None, publish_error="E.", look_error="L"
        ),
        None,
        Stop(
            "E. Whether it published a new version could not be checked (L): run `modal app"
            " history svc`; if a version newer than v1 is there, it passed no gate:"
            " `modal app stop svc`.",
            command="modal app stop svc",
        ),
    ),
]


@pytest.mark.parametrize(
    ("observed", "outcome", "decision"),
    [case[1:] for case in TABLE],
    ids=[case[0] for case in TABLE],
)
def test_decide(observed: Observed, outcome: GateOutcome | None, decision: Decision) -> None:
    assert decide(observed, outcome) == decision


#: (case, observed, what the gate is spared: its outcome, or None when it must look).
SKIPS: list[tuple[str, Observed, GateOutcome | None]] = [
    ("gate on, a new version: look", Observed(knobs(), history(1), new(2)), None),
    ("gate off: not verified", Observed(knobs(gate=False), history(1), new(2)), OFF),
    (
        "nothing new and it had passed: unchanged",
        Observed(knobs(), history(1, 2, 3, records={3: PASSED}), new(3, is_new=False)),
        UNCHANGED,
    ),
    (
        "nothing new and it had failed: look again",
        Observed(knobs(), history(1, 2, 3, records={3: FAILED}), new(3, is_new=False)),
        None,
    ),
    (
        "no version read: an error outcome",
        Observed(knobs(), history(1), new(0)),
        GateOutcome(False, "error", "the published version could not be read", 0.0),
    ),
    (
        "history unreadable after the publish: that error",
        Observed(knobs(), history(1), new(0), read_error="boom"),
        GateOutcome(False, "error", "boom", 0.0),
    ),
]


@pytest.mark.parametrize(("observed", "skipped"), [c[1:] for c in SKIPS], ids=[c[0] for c in SKIPS])
def test_skip_gate(observed: Observed, skipped: GateOutcome | None) -> None:
    assert skip_gate(observed) == skipped


def test_a_rollback_recheck_is_recorded_by_how_it_ended() -> None:
    assert recheck_record(PASS) == PASSED
    assert recheck_record(TIMED_OUT) == UNVERIFIED  # out of margin: a cold start may be slow
    assert recheck_record(REFUSED) == FAILED


def test_policy_bounds_the_gate_and_the_rollback() -> None:
    spec = '{"timeouts": {"startup_s": 90, "request_s": 120}}'
    base = {"name": "svc", "environment": "main", "health_gate": True, "spec_json": spec}
    p = policy(base, "update", DIGESTS)
    assert (p.gate_deadline, p.ready_s, p.rollback_margin) == (GATE_TIMEOUT_S, 90.0, 60.0)
    assert (p.tag, p.task, p.label) == (TAG, "chat", "'svc' in environment 'main'")
    bounded = policy({**base, "custom_timeouts": {"update": 100}}, "update", DIGESTS)
    assert (bounded.gate_deadline, bounded.ready_s, bounded.rollback_margin) == (50.0, 50.0, 45.0)
    assert startup_budget({"spec_json": '{"timeouts": {"startup_s": true}}'}) == 0.0
    assert ROLLBACK_MARGIN_S == 60.0


def test_records_keep_their_wire_format_and_bound() -> None:
    """`llm-iac.gate.v<N>` = outcome, as existing stacks' apps hold them; others untouched."""
    tags = {"llm-iac.gate.v3": "passed", "llm-iac.gate.vx": "x", "team": "ml"}
    assert records_of(tags) == {3: PASSED}
    many = {v: FAILED for v in range(4, 4 + MAX_RECORDS + 5)}
    merged = with_records(tags, many)
    assert merged["team"] == "ml" and merged["llm-iac.gate.vx"] == "x"
    assert merged["llm-iac.gate.v3"] == "passed"  # the newest passed is always kept
    assert len(records_of(merged)) == MAX_RECORDS + 1


@pytest.mark.parametrize(
    ("verdict", "sentence"),
    [
        (
            Verdict("passed", 3, 1.25),
            "passed: v3 answered /ready and a one-token chat completion in 1.2 s",
        ),
        (
            Verdict("passed", 3, 1.0, "embedding"),
            "passed: v3 answered /ready and an embedding in 1.0 s",
        ),
        (Verdict("off", 3), "off: health_gate is false, v3 not verified"),
        (Verdict("off"), "off: health_gate is false, not verified"),
        (Verdict("unchanged", 3), "unchanged: v3 (nothing new to publish) had passed its gate"),
        (Verdict("failed", 4, read_by_refresh=True), "failed: v4 (the release record on the app)"),
        (
            Verdict("unrecorded", 4, read_by_refresh=True),
            "unrecorded: v4 has no release record (deployed outside Pulumi?)",
        ),
        (Verdict("stopped", read_by_refresh=True), "stopped: nothing serves (read by refresh)"),
    ],
)
def test_the_gate_result_is_rendered_from_its_verdict(verdict: Verdict, sentence: str) -> None:
    assert gate_result(verdict) == sentence


def test_a_publish_is_new_unless_the_same_app_kept_its_version() -> None:
    before = history(1, 2)
    assert is_new(None, "ap-1", 1)  # nothing served before
    assert is_new(before, "ap-2", 1)  # another app under the name
    assert is_new(before, "ap-1", 3)  # a newer version
    assert not is_new(before, "ap-1", 2)  # the deploy published nothing new


def test_the_core_imports_neither_modal_nor_pulumi_nor_a_clock() -> None:
    """The core decides from its arguments alone: importing it pulls in no Modal client, no
    Pulumi, and it names no clock, file or network call."""
    code = (
        "import sys, components.modal._decide\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('modal', 'modal_proto', 'grpclib', 'pulumi', 'urllib3', 'socket', 'subprocess')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    source = (PROJECT_ROOT / "components" / "modal" / "_decide.py").read_text()
    for call in ("time.", "open(", "os.", "print(", "_rpc.app_", "sleep("):
        assert call not in source, call
