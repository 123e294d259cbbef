"""A change of a recorded-only App input alone is an update that records it (no redeploy).

Found while restructuring (issue 33): `_record_changed` compared `gate_task` and
`custom_timeouts` as flags (`bool(new) != bool(old)`), so `chat` -> `completion`, or one
`customTimeouts` map for another, planned no update and the gate went on sending the old
task's smoke request. No Modal call: Diff never calls Modal (components/modal/_base.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.modal._source import source_digest
from components.modal.app import AppProvider, _record_only, spec_digest

APP_FILE = "tests/providers/apps/gate_app.py"
SPEC = json.dumps({"message": "pong"}, sort_keys=True)


def _olds(**kw: Any) -> dict[str, Any]:
    return {
        "name": "gate",
        "environment": "main",
        "app_file": APP_FILE,
        "spec_json": SPEC,
        "spec_digest": spec_digest(SPEC),
        "source_digest": source_digest(APP_FILE, spec_json=SPEC),
        "extra_env": {},
        "adopt": False,
        "health_gate": True,
        "health_gate_timeout_s": 60.0,
        "gate_task": "chat",
        "custom_timeouts": {},
        **kw,
    }


@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        ("gate_task", "chat", "completion"),
        ("gate_task", None, "embedding"),  # an older state without it: "chat" by default
        ("custom_timeouts", {"update": 600.0}, {"update": 900.0}),
        ("custom_timeouts", {"update": 600.0}, {"create": 600.0}),
        ("health_gate_timeout_s", 60.0, 90.0),
        ("health_gate", True, False),
        ("adopt", False, True),
    ],
)
def test_a_recorded_only_change_alone_is_an_update_without_a_deploy(
    key: str, old: Any, new: Any
) -> None:
    olds, news = _olds(**{key: old}), _olds(**{key: new})
    news.pop("source_digest")  # an input never carries the outputs' digests
    diff = AppProvider().diff("ap-1", olds, news)
    assert diff.changes and not diff.replaces, (key, old, new)
    digests = {"spec_digest": olds["spec_digest"], "source_digest": olds["source_digest"]}
    assert _record_only(olds, news, digests)


@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        ("gate_task", None, "chat"),  # the default, written out
        ("custom_timeouts", None, {}),
        ("custom_timeouts", {"update": 600}, {"update": 600.0}),
        ("health_gate_timeout_s", 60, 60.0),
    ],
)
def test_the_same_value_spelled_otherwise_is_no_change(key: str, old: Any, new: Any) -> None:
    olds, news = _olds(**{key: old}), _olds(**{key: new})
    news.pop("source_digest")
    assert not AppProvider().diff("ap-1", olds, news).changes
