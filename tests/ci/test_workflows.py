"""The GitHub workflows, checked offline: schema (check-jsonschema), security (zizmor), intent.

Each tool also runs on a deliberately broken workflow, so a tool that silently accepts
everything would fail here instead of passing. Both tools are pinned dev dependencies
(pyproject.toml): a missing one is a failure, not a skip.
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
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")

BAD_WORKFLOW = """\
name: bad
on:
  pull_request_target:
permissions: write-all
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
"""


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it is a pinned dev dependency, run `make setup`")
    return found


def _load(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(), Loader=yaml.BaseLoader)  # "on" stays a string key
    assert isinstance(data, dict)
    return data


def _pulumi_step(job: dict[str, Any]) -> dict[str, Any]:
    steps = [s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@")]
    assert len(steps) == 1
    return steps[0]


def test_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"preview.yml", "deploy.yml"}


def test_no_workflow_delivers_spend_alerts() -> None:
    """Issue 14 item 7: alerts come from the spend watcher deployed into each environment
    (watchers/spend_alerts.py), not from a scheduled `pulumi up` holding prod credentials.
    The one scheduled workflow is review.yml's nightly sweep of review stacks (issue 23 part 2):
    it never runs in the dev or prod GitHub environments."""
    assert not (ROOT / ".github" / "workflows" / "spend-alerts.yml").exists()
    for path in WORKFLOWS:
        wf = _load(path)
        if "schedule" not in wf["on"]:
            continue
        assert path.name == "review.yml", f"{path.name} runs on a schedule"
        for job_name, job in wf["jobs"].items():
            assert job.get("environment") not in ("dev", "prod", "prod-plan"), job_name


def test_schema_valid() -> None:
    tool = _tool("check-jsonschema")
    cmd = [tool, "--builtin-schema", "vendor.github-workflows"]
    result = subprocess.run([*cmd, *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    tool = _tool("check-jsonschema")
    broken = tmp_path / "broken.yml"
    broken.write_text("name: broken\non: push\njobs:\n  x:\n    steps: nope\n")
    result = subprocess.run(
        [tool, "--builtin-schema", "vendor.github-workflows", str(broken)],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0


def test_zizmor_finds_nothing() -> None:
    tool = _tool("zizmor")
    result = subprocess.run(
        [tool, "--offline", "--persona=pedantic", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_zizmor_flags_a_dangerous_workflow(tmp_path: Path) -> None:
    tool = _tool("zizmor")
    wf_dir = tmp_path / ".github" / "workflows"
    wf_dir.mkdir(parents=True)
    (wf_dir / "bad.yml").write_text(BAD_WORKFLOW)
    result = subprocess.run(
        [tool, "--offline", str(wf_dir / "bad.yml")], capture_output=True, text=True
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    for audit in ("unpinned-uses", "template-injection", "dangerous-triggers"):
        assert audit in out, out


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_pinned_and_permissions_least(path: Path) -> None:
    wf = _load(path)
    assert wf.get("permissions") == {}, "top-level permissions must be {} (grant per job)"
    for job_name, job in wf["jobs"].items():
        perms = job.get("permissions")
        assert isinstance(perms, dict), f"{job_name}: job needs explicit permissions"
        assert set(perms.values()) <= {"read", "write", "none"}
        writes = {k for k, v in perms.items() if v == "write"}
        assert writes <= {"pull-requests"}, f"{job_name}: unexpected write scopes {writes}"
        if "secrets." in str(job):
            assert "environment" in job, f"{job_name}: secrets only from a GitHub environment"
        for step in job["steps"]:
            uses = step.get("uses")
            if uses:
                assert SHA_PIN.match(uses), f"{job_name}: {uses} is not pinned to a commit sha"
            if "actions/checkout" in (uses or ""):
                assert step["with"]["persist-credentials"] == "false"
            assert "${{" not in step.get("run", ""), f"{job_name}: expression inside run:"


def _runs_tests(job: dict[str, Any]) -> bool:
    return any(step.get("run") == ".ci/run" for step in job["steps"])


def test_preview_posts_dev_and_prod_diffs_on_prs() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "preview.yml")
    assert set(wf["on"]) == {"pull_request"}
    assert _runs_tests(wf["jobs"]["test"]), "PRs run the test suite"
    job = wf["jobs"]["preview"]
    assert job["strategy"]["matrix"]["stack"] == ["dev", "prod"]
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    step = _pulumi_step(job)
    assert step["with"]["command"] == "preview"
    assert step["with"]["diff"] == "true"
    assert step["with"]["comment-on-pr"] == "true"
    assert "MODAL_TOKEN" not in str(job), "previews need no Modal credentials"
    # The PR's code runs with the stack's decrypted config: never for forks, and the
    # backend secrets come from a per-stack environment (prod-preview is the protected one).
    assert job["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
    assert job["environment"] == "${{ matrix.stack }}-preview"


def test_deploy_tests_then_dev_then_prod_plan_then_approved_prod() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "deploy.yml")
    assert wf["on"] == {"push": {"branches": ["main"], "paths-ignore": ["docs/**", "**.md"]}}, (
        "docs-only pushes must not ask for a prod approval"
    )
    jobs = wf["jobs"]
    assert _runs_tests(jobs["test"])
    assert (jobs["dev"]["needs"], jobs["prod-plan"]["needs"], jobs["prod"]["needs"]) == (
        "test",
        "dev",
        "prod-plan",
    )
    for name, command, stack, env in (
        ("dev", "up", "dev", "dev"),
        ("prod-plan", "preview", "prod", "prod-plan"),
        ("prod", "up", "prod", "prod"),
    ):
        step = _pulumi_step(jobs[name])
        assert (step["with"]["command"], step["with"]["stack-name"]) == (command, stack), name
        assert jobs[name]["environment"] == env
    assert "MODAL_TOKEN" not in str(jobs["prod-plan"]), "a preview needs no Modal credentials"
    assert _pulumi_step(jobs["dev"])["with"]["upsert"] == "true"  # first deploy creates dev
    # No workflow-wide concurrency: a prod job waiting for approval must not queue dev deploys.
    assert "concurrency" not in wf
    assert jobs["dev"]["concurrency"]["group"] != jobs["prod"]["concurrency"]["group"]
    for name in ("dev", "prod"):
        assert jobs[name]["concurrency"]["cancel-in-progress"] == "false", name


def test_deploy_jobs_hold_least_privilege_identities() -> None:
    """Issue 23: only the dev and prod jobs hold a Modal token, each from its own GitHub
    environment: the access stack's `<env>-deploy` service user (contributor in that
    environment only); plans and previews hold none, and no Owner's token is kept in GitHub.
    The header says who holds what, and the access stack it points to declares them."""
    path = ROOT / ".github" / "workflows" / "deploy.yml"
    jobs = _load(path)["jobs"]
    assert {name for name, job in jobs.items() if "MODAL_TOKEN" in str(job)} == {"dev", "prod"}
    for name in ("dev", "prod"):
        env = _pulumi_step(jobs[name])["env"]
        assert env["MODAL_TOKEN_ID"] == "${{ secrets.MODAL_TOKEN_ID }}"
        assert env["MODAL_TOKEN_SECRET"] == "${{ secrets.MODAL_TOKEN_SECRET }}"
        assert jobs[name]["environment"] == name  # that environment's secret, nobody else's
    header = path.read_text().split("\nname: deploy")[0]
    for phrase in (
        "`dev-deploy` service user's",
        "contributor in the dev environment only",
        "`prod-deploy` token: contributor in prod only",
        "prod-plan main only, no reviewers, no Modal credentials at all",
        "pulumi -C access up --stack workspace",
        "modal-llm:managedByAccessStack: true",
        "`<env>-spend-watch` token",
        "No workspace Owner's token is kept in GitHub",
    ):
        assert phrase in " ".join(header.replace("#", " ").split()), phrase
    access = yaml.safe_load((ROOT / "access" / "Pulumi.workspace.yaml").read_text())
    envs = access["config"]["modal-llm-access:environments"]
    roles = {i["name"]: i["role"] for env in envs for i in env["identities"]}
    assert roles["dev-deploy"] == roles["prod-deploy"] == "contributor"
    assert roles["dev-spend-watch"] == roles["prod-spend-watch"] == "viewer"
    assert roles["dev-preview"] == roles["prod-preview"] == "none"
