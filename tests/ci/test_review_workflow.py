"""The review-stack workflow (.github/workflows/review.yml), checked offline.

Schema and zizmor run over every workflow in tests/ci/test_workflows.py; here: the intent.
The route step's shell is RUN with each kind of event (a fork's PR, the label added, removed,
a push, close, the schedule), the admin step's shell is RUN with a recording `gh` (what it puts
in pr-N's own environment), and the deploy job's step that writes the hand-over is RUN, so they
are checked as they behave, not only as they read. What each job that runs the PR's code can
reach (issue 32 item 8) is checked secret by secret.
"""

from __future__ import annotations

import json
import re
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
#: The environments whose secrets a PR's code may hold: its own, made by the admin job.
PR_ENV = "review-pr-${{ github.event.pull_request.number }}"
#: What a job running the PR's code may hold: its own hand-over and the review backend's token.
PR_SECRETS = {"REVIEW_HANDOFF", "PULUMI_ACCESS_TOKEN"}
#: What it may never hold: dev's passphrase, a passphrase or key shared by every PR, the root
#: key the per-PR passphrases derive from, the admin's tokens.
FORBIDDEN = {
    "PULUMI_CONFIG_PASSPHRASE",
    "REVIEW_PULUMI_CONFIG_PASSPHRASE",
    "REVIEW_HANDOFF_KEY",
    "REVIEW_STATE_KEY",
    "REVIEW_ACCESS_PASSPHRASE",
    "REVIEW_GITHUB_ADMIN_TOKEN",
    "REVIEW_PULUMI_ACCESS_TOKEN",
    "REVIEW_ADMIN_MODAL_TOKEN_ID",
    "REVIEW_ADMIN_MODAL_TOKEN_SECRET",
}

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


def _secrets(job: dict[str, Any]) -> set[str]:
    return set(re.findall(r"secrets\.([A-Za-z0-9_]+)", json.dumps(job)))


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
    branch; the jobs that check out the PR's head hold no Modal token; the deploy job writes
    its hand-over before the PR's code is checked out."""
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
    deploy = jobs["deploy"]
    assert deploy["environment"] == PR_ENV
    steps = deploy["steps"]
    keyed = [i for i, s in enumerate(steps) if "secrets.REVIEW_HANDOFF" in str(s)]
    first_checkout = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith(
        "actions/checkout@"))  # fmt: skip
    assert keyed and max(keyed) < first_checkout, "the hand-over is written before the PR's code"
    up = _step(deploy, "pulumi up")
    assert "--handoff" in up["run"] and "review_stack.py up" in up["run"]
    # The comment job: the only writer, base-branch code, no secret.
    comment = jobs["comment"]
    assert "secrets." not in str(comment) and "environment" not in comment
    assert all("ref" not in c.get("with", {}) for c in _checkouts(comment))


def test_destroy_on_close_and_the_sweep(wf: dict[str, Any]) -> None:
    jobs = wf["jobs"]
    admin = _step(jobs["admin"], "Access stack pr-N")["run"]
    assert "access-up --pr" in admin and "--state-key-env REVIEW_STATE_KEY" in admin
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
    release = _step(jobs["release"], "pulumi destroy")["run"]
    assert "review_stack.py access-destroy" in release
    assert '-X DELETE \\\n    "repos/$REPO/environments/review-pr-$pr"' in release  # its env too
    post = _step(jobs["comment"], "Render and post")["run"]
    assert review_comment.MARKER in post and "PATCH" in post and "POST" in post
    assert '"github-actions[bot]"' in post  # never someone else's comment with the marker
    assert "--closed" in post and "--failed deploy" in post


def test_what_the_prs_code_can_reach(wf: dict[str, Any]) -> None:
    """Issue 32 item 8. The jobs that run a PR's code (`plan`, `deploy`; `teardown` runs the
    providers the PR's code pickled into its state) hold that PR's own hand-over and the review
    backend's token at most: no passphrase of dev, none shared by every PR, no root key, no
    admin token. dev's passphrase is only in `dev-copy`, which runs base-branch code."""
    jobs = wf["jobs"]
    for name in ("plan", "deploy", "teardown"):
        held = _secrets(jobs[name])
        assert not held & FORBIDDEN, (name, held & FORBIDDEN)
        assert held <= PR_SECRETS, (name, held)
        assert "PULUMI_CONFIG_PASSPHRASE" not in json.dumps(jobs[name]), name  # from the hand-over
    plan = jobs["plan"]
    assert _secrets(plan) == set() and "environment" not in plan
    assert "vars.PULUMI_BACKEND_URL" not in json.dumps(plan)  # dev's backend: not even its URL
    assert plan["needs"] == ["route", "dev-copy"]
    assert "--base-copy" in _step(plan, "pulumi preview")["run"]
    assert jobs["deploy"]["environment"] == PR_ENV
    assert jobs["teardown"]["environment"] == "review-pr-${{ matrix.pr }}"
    # No secret that every PR shares is left anywhere in the workflow.
    everywhere = set().union(*(_secrets(j) for j in jobs.values()))
    assert not everywhere & {"REVIEW_PULUMI_CONFIG_PASSPHRASE", "REVIEW_HANDOFF_KEY"}
    # dev's passphrase: the dev-copy job only, base-branch code, running dev-export only.
    with_dev = {n for n, j in jobs.items() if "PULUMI_CONFIG_PASSPHRASE" in _secrets(j)}
    assert with_dev == {"dev-copy"}
    copy = jobs["dev-copy"]
    assert copy["environment"].split()[0] == "review-dev-export"
    assert all("ref" not in c.get("with", {}) for c in _checkouts(copy))
    runs = [s["run"] for s in copy["steps"] if "run" in s]
    assert runs[-1].startswith(".venv/bin/python scripts/review_stack.py dev-export")
    # The root key and the GitHub admin token: the admin jobs only.
    for key in ("REVIEW_STATE_KEY", "REVIEW_GITHUB_ADMIN_TOKEN"):
        assert {n for n, j in jobs.items() if key in _secrets(j)} <= {"admin", "release"}, key


FAKE_GH = r"""#!/usr/bin/env python3
import json, os, sys
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with open(os.environ["GH_LOG"], "a") as fh:
    call = {"argv": sys.argv[1:], "stdin": stdin, "token": os.environ.get("GH_TOKEN", "")}
    fh.write(json.dumps(call) + "\n")
if "--jq" in sys.argv:  # the branch policies the environment has
    print("main")
"""

FAKE_PYTHON = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
path = args[args.index("--handoff") + 1]
with open(path, "w") as fh:
    json.dump({"environment": "pr-7", "deploy_token": "ak-d7:as-HANDOFF-SECRET",
               "proxy_token": "wk-p7:ws-proxy", "passphrase": "0" * 64}, fh)
"""


def test_the_admin_job_gives_each_pr_its_own_environment(
    wf: dict[str, Any], tmp_path: Path
) -> None:
    """The admin step's shell, RUN with a recording `gh` and a stand-in for review_stack.py:
    pr-7's environment `review-pr-7`, usable from the default branch only, gets pr-7's
    hand-over and the review backend's token, each from stdin (never argv), with the admin's
    GitHub token; the hand-over file is gone afterwards."""
    step = _step(wf["jobs"]["admin"], "Access stack pr-N")
    work = tmp_path / "work"
    (work / ".venv" / "bin").mkdir(parents=True)
    (work / ".venv" / "bin" / "python").write_text(FAKE_PYTHON)
    (work / ".venv" / "bin" / "python").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    out = tmp_path / "github_output"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "GH_LOG": str(tmp_path / "gh.jsonl"),
        "RUNNER_TEMP": str(tmp_path),
        "GITHUB_OUTPUT": str(out),
        "ACTION": "up",
        "PR": "7",
        "HEAD_REPO": "acme/llm",
        "BASE_REPO": "acme/llm",
        "DEFAULT_BRANCH": "main",
        "PULUMI_ACCESS_TOKEN": "pul-REVIEW-BACKEND-TOKEN",
        "REVIEW_GITHUB_ADMIN_TOKEN": "ghs-ADMIN-TOKEN",
        "GH_TOKEN": "ghs-run-token",
    }
    done = subprocess.run(["bash", "-c", step["run"]], cwd=work, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [json.loads(line) for line in (tmp_path / "gh.jsonl").read_text().splitlines()]
    api = "repos/acme/llm/environments/review-pr-7"
    put = [c for c in calls if c["argv"][:4] == ["api", "-X", "PUT", api]]
    assert len(put) == 1 and json.loads(put[0]["stdin"])["deployment_branch_policy"] == {
        "protected_branches": False,
        "custom_branch_policies": True,
    }
    assert any(c["argv"][:4] == ["api", "-X", "POST", f"{api}/deployment-branch-policies"]
               and "name=main" in c["argv"] for c in calls)  # fmt: skip
    sets = {c["argv"][2]: c for c in calls if c["argv"][:2] == ["secret", "set"]}
    assert set(sets) == {"REVIEW_HANDOFF", "PULUMI_ACCESS_TOKEN"}
    for call in sets.values():
        assert call["argv"][call["argv"].index("--env") + 1] == "review-pr-7"
        assert call["token"] == "ghs-ADMIN-TOKEN"
    assert "as-HANDOFF-SECRET" in sets["REVIEW_HANDOFF"]["stdin"]
    assert sets["PULUMI_ACCESS_TOKEN"]["stdin"] == "pul-REVIEW-BACKEND-TOKEN"
    argv = json.dumps([c["argv"] for c in calls])
    assert "HANDOFF-SECRET" not in argv and "REVIEW-BACKEND-TOKEN" not in argv
    assert not (tmp_path / "handoff" / "pr-7.json").exists()
    assert out.read_text().strip() == "prs=[7]"


def test_the_deploy_job_writes_the_handoff_it_is_given(wf: dict[str, Any], tmp_path: Path) -> None:
    handoff = review_stack.Handoff(
        "pr-7", "ak-deploy7abc:as-secret7-xyz", "wk-proxy7abc:ws-proxysecret7", "a" * 64
    )
    step = _step(wf["jobs"]["deploy"], "Write the hand-over")
    env = {
        "PATH": "/usr/bin:/bin",
        "RUNNER_TEMP": str(tmp_path),
        "REVIEW_HANDOFF": handoff.to_json(),
    }
    done = subprocess.run(["bash", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    opened = review_stack.read_handoff(tmp_path / "handoff.json")
    assert opened == handoff and "secret" not in repr(opened) and "a" * 64 not in repr(opened)
    assert (tmp_path / "handoff.json").stat().st_mode & 0o077 == 0
    # The teardown's: no hand-over (no access stack) writes no file.
    (tmp_path / "handoff.json").unlink()
    step = _step(wf["jobs"]["teardown"], "Write the hand-over")
    done = subprocess.run(["bash", "-c", step["run"]], env={**env, "REVIEW_HANDOFF": ""},
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and not (tmp_path / "handoff.json").exists()
