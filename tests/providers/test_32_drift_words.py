"""Issue 32 item 12, the App's drift in words (pure functions of what a refresh read): a
stopped app, one Modal no longer knows, a rollback by hand, a deploy by hand, another release of
ours. The live cases run end to end in tests/standin/test_32_drift.py and
tests/providers/test_app_release.py."""

from __future__ import annotations

from components.modal._decide import Releases, deployment_tag
from components.modal._rpc import Deployment
from components.modal.app import _gone_outputs, drift_reason

SPEC, SRC = "a" * 64, "b" * 64
OURS = deployment_tag(SPEC, SRC)
RECORDED = {"spec_digest": SPEC, "source_digest": SRC, "version": 2}


def row(version: int, tag: str, rollback: int = 0) -> Deployment:
    return Deployment(version, 1000.0 + version, tag, rollback, "")


def test_stopped_and_missing_apps_are_drift_that_plans_a_redeploy() -> None:
    stopped = _gone_outputs("stopped", "ap-1", RECORDED, "tiny", "local")
    assert stopped["drift"].startswith("live app stopped by hand: ap-1 is stopped")
    assert "'tiny' in environment 'local'" in stopped["drift"]
    # Digests no release has: Diff sees a change and plans the redeploy.
    assert stopped["spec_digest"] != SPEC and stopped["source_digest"] != SRC
    assert (stopped["version"], stopped["web_url"]) == (0, "")
    missing = _gone_outputs("missing", "ap-1", RECORDED, "tiny", "")
    assert missing["drift"].startswith("live app not found: Modal knows no app ap-1")
    assert "environment '<default>'" in missing["drift"]


def test_a_live_version_that_is_not_the_states_release_says_how() -> None:
    other = deployment_tag("c" * 64, "d" * 64)
    rolled = Releases("ap-1", (row(1, other), row(2, OURS), row(3, "", rollback=1)), {})
    assert drift_reason(rolled, RECORDED).startswith(
        f"live app rolled back by hand: v3 runs v1 ({other}), not the state's release ({OURS})"
    )
    by_hand = Releases("ap-1", (row(1, OURS), row(2, "")), {})
    assert drift_reason(by_hand, RECORDED).startswith(
        "live app deployed by hand: v2 has no deployment tag of this stack"
    )
    theirs = Releases("ap-1", (row(1, OURS), row(2, other)), {})
    assert drift_reason(theirs, RECORDED).startswith(
        f"live app runs another release: v2 is {other}, not the state's release"
    )
