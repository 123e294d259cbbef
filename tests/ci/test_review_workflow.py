"""The review-stack workflow (.github/workflows/review.yml), checked offline.

Schema and zizmor run over every workflow in tests/ci/test_workflows.py; here: the intent.
The route step's shell is RUN with each kind of event (a fork's PR, the label added, removed,
a push, close, the schedule), and the deploy job's step that opens the hand-over is RUN on what
scripts/review_stack.py seals, so both are checked as they behave, not only as they read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "review.yml"
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
HEAD_SHA = "${{ github.event.pull_request.head.sha }}"
ADMIN_SECRETS = ("secrets.REVIEW_ADMIN_MODAL_TOKEN_ID", "secrets.REVIEW_ADMIN_MODAL_TOKEN_SECRET")

sys.path.insert(0, str(ROOT / "scripts"))
import review_comment  # noqa: E402
import review_stack  # noqa: E402


@pytest.fixture(scope="module")
def wf() -> dict[str, Any]:
    data = yaml.load(WORKFLOW.read_text(), Loader=yaml.BaseLoader)  # "on" stays a string key
    assert isinstance(data, dict)
    return data


def _checkouts(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]


def _step(job: dict[str, Any], name_start: str) -> dict[str, Any]:
    found = [s for s in job["steps"] if s.get("name", "").startswith(name_start)]
    assert len(found) == 1, [s.get("name") for s in job["steps"]]
    return found[0]


def test_triggers_label_push_close_and_a_nightly_sweep(wf: dict[str, Any]) -> None:
    on = wf["on"]
    assert set(on) == {"pull_request_target", "schedule", "workflow_dispatch"}
    assert set(on["pull_request_target"]["types"]) == {
        "labeled",
        "unlabeled",
        "synchronize",
        "reopened",
        "closed",
    }
    (cron,) = on["schedule"]
    minute, hour, dom, month, dow = cron["cron"].split()
    assert (dom, month, dow) == ("*", "*", "*") and minute.isdigit() and hour.isdigit()
    assert on["workflow_dispatch"]["inputs"]["older_than_days"]["default"] == "7"
    # One run per PR at a time, never cancelling a running up or destroy.
    assert wf["concurrency"] == {
        "group": "review-${{ github.event.pull_request.number || 'sweep' }}",
        "cancel-in-progress": "false",
    }


def test_permissions_least_and_actions_pinned(wf: dict[str, Any]) -> None:
    assert wf["permissions"] == {}
    writers = set()
    for name, job in wf["jobs"].items():
        perms = job["permissions"]
        assert isinstance(perms, dict), name
        assert set(perms) <= {"contents", "pull-requests"}, name
        assert perms.get("contents", "read") == "read", name
        if perms.get("pull-requests") == "write":
            writers.add(name)
        for step in job["steps"]:
            uses = step.get("uses")
            if uses:
                assert SHA_PIN.match(uses), f"{name}: {uses} not pinned to a commit"
            if uses and uses.startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] == "false", name
            assert "${{" not in step.get("run", ""), f"{name}: expression inside run:"
    assert writers == {"comment"}, "only the comment job may write (to the PR)"
    # The same pins as the other workflows for the actions they share.
    preview = (ROOT / ".github" / "workflows" / "preview.yml").read_text()
    for uses in re.findall(r"uses: (\S+@[0-9a-f]{40})", WORKFLOW.read_text()):
        action = uses.split("@")[0]
        if action in preview:
            assert uses in preview, f"{uses}: preview.yml pins {action} elsewhere"


def test_every_job_waits_for_the_route_and_forks_get_none(wf: dict[str, Any]) -> None:
    jobs = wf["jobs"]
    for name, job in jobs.items():
        if name == "route":
            continue
        needs = job["needs"] if isinstance(job["needs"], list) else [job["needs"]]
        assert "route" in needs, name
        assert "needs.route.outputs.action" in job["if"], name
    route = jobs["route"]
    assert "secrets." not in str(route) and not _checkouts(route)


def _route(event: str, action: str = "", label: str = "", has_label: bool = False,
           head: str = "acme/llm", tmp: Path | None = None) -> str:  # fmt: skip
    """Run the route step's shell with an event's values; the action it chose."""
    wf = yaml.load(WORKFLOW.read_text(), Loader=yaml.BaseLoader)
    step = wf["jobs"]["route"]["steps"][0]
    assert tmp is not None
    out = tmp / "out"
    out.write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        "GITHUB_OUTPUT": str(out),
        "EVENT": event,
        "ACTION": action,
        "LABEL": label,
        "HAS_LABEL": "true" if has_label else "false",
        "HEAD_REPO": head,
        "BASE_REPO": "acme/llm",
    }
    done = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (line,) = out.read_text().splitlines()
    return line.removeprefix("action=")


@pytest.mark.parametrize(
    ("event", "action", "label", "has_label", "head", "expected"),
    [
        ("pull_request_target", "labeled", "preview-env", True, "acme/llm", "up"),
        ("pull_request_target", "labeled", "preview-env", True, "someone/llm", "none"),
        ("pull_request_target", "synchronize", "", True, "someone/llm", "none"),
        ("pull_request_target", "closed", "", True, "someone/llm", "none"),
        ("pull_request_target", "labeled", "bug", True, "acme/llm", "none"),
        ("pull_request_target", "synchronize", "", True, "acme/llm", "up"),
        ("pull_request_target", "synchronize", "", False, "acme/llm", "none"),
        ("pull_request_target", "reopened", "", True, "acme/llm", "up"),
        ("pull_request_target", "closed", "", True, "acme/llm", "destroy"),
        ("pull_request_target", "closed", "", False, "acme/llm", "none"),
        ("pull_request_target", "unlabeled", "preview-env", False, "acme/llm", "destroy"),
        ("pull_request_target", "unlabeled", "bug", True, "acme/llm", "none"),
        ("schedule", "", "", False, "", "sweep"),
        ("workflow_dispatch", "", "", False, "", "sweep"),
    ],
)
def test_route(
    tmp_path: Path,
    event: str,
    action: str,
    label: str,
    has_label: bool,
    head: str,
    expected: str,
) -> None:
    assert _route(event, action, label, has_label, head, tmp_path) == expected


def test_the_admin_token_never_meets_the_prs_code(wf: dict[str, Any]) -> None:
    """The Owner's/Manager's token is in `review-admin` jobs only, which check out the base
    branch; the jobs that check out the PR's head hold no Modal token; the deploy job's
    hand-over key is used once, before the PR's code is checked out."""
    jobs = wf["jobs"]
    with_admin = {n for n, j in jobs.items() if any(s in str(j) for s in ADMIN_SECRETS)}
    assert with_admin == {"admin", "release"}
    for name in with_admin:
        assert jobs[name]["environment"].startswith("review-admin"), name
        assert all("ref" not in c.get("with", {}) for c in _checkouts(jobs[name])), name
    pr_code = {n for n, j in jobs.items() if any(c.get("with", {}).get("ref") == HEAD_SHA
                                                 for c in _checkouts(j))}  # fmt: skip
    assert pr_code == {"plan", "deploy"}
    for name in pr_code:
        assert "MODAL_TOKEN" not in str(jobs[name]), name
        assert jobs[name]["environment"].split()[0] in ("dev-preview", "review-deploy"), name
    deploy = jobs["deploy"]
    assert deploy["environment"].startswith("review-deploy")
    steps = deploy["steps"]
    keyed = [i for i, s in enumerate(steps) if "REVIEW_HANDOFF_KEY" in str(s)]
    first_checkout = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith(
        "actions/checkout@"))  # fmt: skip
    assert keyed and max(keyed) < first_checkout, "the key is used before the PR's code lands"
    up = _step(deploy, "pulumi up")
    assert "--handoff" in up["run"] and "review_stack.py up" in up["run"]
    assert "secrets.REVIEW_HANDOFF_KEY" not in str(up)
    # The comment job: the only writer, base-branch code, no secret.
    comment = jobs["comment"]
    assert "secrets." not in str(comment) and "environment" not in comment
    assert all("ref" not in c.get("with", {}) for c in _checkouts(comment))


def test_destroy_on_close_and_the_sweep(wf: dict[str, Any]) -> None:
    jobs = wf["jobs"]
    admin = _step(jobs["admin"], "Access stack pr-N")["run"]
    assert "access-up --pr" in admin and "--seal-key-env REVIEW_HANDOFF_KEY" in admin
    assert 'sweep --list-only --older-than-days "$DAYS"' in admin
    assert "--open-prs" in admin and "gh pr list" in admin
    days = _step(jobs["admin"], "Access stack pr-N")["env"]["DAYS"]
    assert days == "${{ inputs.older_than_days || vars.REVIEW_MAX_AGE_DAYS || '7' }}"
    for name in ("teardown", "release"):
        assert "'destroy'" in jobs[name]["if"] and "'sweep'" in jobs[name]["if"], name
    assert jobs["teardown"]["strategy"]["matrix"]["pr"] == (
        "${{ fromJSON(needs.admin.outputs.prs) }}"
    )
    assert "review_stack.py destroy" in _step(jobs["teardown"], "pulumi destroy")["run"]
    assert jobs["release"]["needs"] == ["route", "admin", "teardown"]  # after the teardown
    assert "review_stack.py access-destroy" in _step(jobs["release"], "pulumi destroy")["run"]
    post = _step(jobs["comment"], "Render and post")["run"]
    assert review_comment.MARKER in post and "PATCH" in post and "POST" in post
    assert '"github-actions[bot]"' in post  # never someone else's comment with the marker
    assert "--closed" in post and "--failed deploy" in post


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_deploy_job_opens_what_the_admin_job_seals(
    wf: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handoff = review_stack.Handoff(
        "pr-7", "ak-deploy7abc:as-secret7-xyz", "wk-proxy7abc:ws-proxysecret7"
    )
    (tmp_path / "handoff").mkdir()
    monkeypatch.setenv("REVIEW_HANDOFF_KEY", "k3y-for-this-test")
    review_stack.write_handoff(tmp_path / "handoff" / "pr-7.enc", handoff, "REVIEW_HANDOFF_KEY")
    sealed = (tmp_path / "handoff" / "pr-7.enc").read_bytes()
    assert b"as-secret7" not in sealed and sealed.startswith(b"Salted__")
    assert (tmp_path / "handoff" / "pr-7.enc").stat().st_mode & 0o077 == 0
    step = _step(wf["jobs"]["deploy"], "Open the hand-over")
    env = {"PATH": "/usr/bin:/bin", "RUNNER_TEMP": str(tmp_path), "PR": "7",
           "REVIEW_HANDOFF_KEY": "k3y-for-this-test"}  # fmt: skip
    done = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    opened = review_stack.read_handoff(tmp_path / "handoff.json")
    assert opened == handoff and "secret" not in repr(opened)
    assert (tmp_path / "handoff.json").stat().st_mode & 0o077 == 0
    assert not (tmp_path / "handoff").exists()
    # With another key it does not open.
    (tmp_path / "handoff").mkdir()
    (tmp_path / "handoff" / "pr-7.enc").write_bytes(sealed)
    (tmp_path / "handoff.json").unlink()
    bad = subprocess.run(["bash", "-c", step["run"]], env={**env, "REVIEW_HANDOFF_KEY": "other"},
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0
    with pytest.raises(review_stack.ReviewError):
        review_stack.read_handoff(tmp_path / "handoff" / "pr-7.enc", "REVIEW_HANDOFF_KEY_UNSET")
