"""Review stacks (issue 23 part 2): scripts/review_stack.py and its comment, against one emulator.

The module shares ONE emulator and one dev stack (the tiny service of the local stack, on an
L4, deployed with the Pulumi stand-in from a copy of this checkout). Each pull request is
another copy of the checkout with its own `Pulumi.dev.yaml` change: the PR's code, run by its
own scripts/review_stack.py, as CI runs it.

- two PRs at once (threads), twice: plan (the PR's code against dev) -> up -> comment (its curl
  answers through the emulator's edge) -> a new push (plan + up again: update) -> destroy
  (round 1: `destroy`; round 2: the nightly `sweep`); then the emulator holds nothing of
  theirs: no environment pr-*, and no app, secret, volume or proxy token outside dev and main;
- the comment's cost delta for a GPU change, checked against figures computed here from
  components/cost.py's price table (not through the script or the renderer);
- the warning lines for a replace of a retainOnDelete resource and of a protected one;
- a fork's PR gets no stack; the renderer reads a real-`pulumi preview --json`-shaped document
  (tests/program/review_samples.py) and the stand-in's.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import modal
import pytest
import yaml

from components.cost import GPU_PRICES_USD_PER_HOUR, HOURS_PER_MONTH
from pulumi_standin.statefile import StateFile
from pulumi_standin.values import iter_secret_strings
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for
from tests.program import review_samples
from tests.program.runner import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
import review_comment
from review.checkout import copy_checkout

PY = sys.executable
PASSPHRASE = "review-test"  # emulator-only state
# The service below is vLLM with the spec's derived requests: 6 CPU cores, 12 GiB (docs/serving.md
# "CPU and memory"), at Modal's $0.0000131 per core-second and $0.00000222 per GiB-second.
CPU_MEMORY_USD_PER_HOUR = 6 * 0.0000131 * 3600 + 12 * 0.00000222 * 3600  # $0.378864
DEV_CONFIG: dict[str, Any] = {
    "modal-llm:environment": "dev",
    "modal-llm:engineStandin": True,
    "modal-llm:monthlyBudgetUsd": 5000,
    "modal-llm:protectCaches": True,
    "modal-llm:apiKeyNames": ["gateway", "ci"],
    "modal-llm:services": [
        {
            "name": "tiny",
            "engine": "vllm",
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "served_model_name": "smollm2-135m",
            "gpu": "L4",
            "context_length": 2048,
            "scaling": {"min_containers": 0, "max_containers": 1, "scaledown_window_s": 60},
            "timeouts": {"startup_s": 600, "request_s": 120},
        }
    ],
}


def expected_cost(gpu: str, containers: int) -> float:
    """components/cost.py's model, computed here: (GPU price + CPU + memory) x 730 h x
    containers (costOverheadPct defaults to 0)."""
    hourly = GPU_PRICES_USD_PER_HOUR[gpu] + CPU_MEMORY_USD_PER_HOUR
    return round(hourly * HOURS_PER_MONTH * containers, 2)


def write_dev(checkout: Path, config: dict[str, Any]) -> None:
    (checkout / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))


def with_service(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    new = json.loads(json.dumps(config))
    svc = new["modal-llm:services"][0]
    for key, value in changes.items():
        if key in ("min_containers", "max_containers", "scaledown_window_s"):
            svc["scaling"][key] = value
        else:
            svc[key] = value
    return new


@dataclass
class Env:
    emulator: EmulatorProcess
    base: Path
    state_dir: Path
    tmp: Path

    @property
    def url(self) -> str:
        return self.emulator.url

    def environ(self, *, owner: bool = True) -> dict[str, str]:
        """The checkout's environment; `owner`: with the emulator's own token (the workspace
        Owner's), else with no Modal token at all (a deploy step that has only its hand-over)."""
        env = self.emulator.subprocess_env(
            {"PULUMI_CONFIG_PASSPHRASE": PASSPHRASE, "PULUMI_ENGINE": "standin", "LANG": "C.UTF-8"}
        )
        env.pop("PYTHONPATH", None)  # each checkout runs its own code
        env["PATH"] = f"{Path(PY).parent}:/usr/bin:/bin"  # no pulumi CLI: the stand-in
        if not owner:
            env.pop("MODAL_TOKEN_ID", None)
            env.pop("MODAL_TOKEN_SECRET", None)
        return env

    def script(
        self, checkout: Path, *args: str, owner: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        common = [
            "--engine",
            "standin",
            "--server-url",
            self.url,
            "--state-dir",
            str(self.state_dir),
        ]
        return subprocess.run(
            [PY, "scripts/review_stack.py", *args, *common],
            cwd=checkout,
            env=self.environ(owner=owner),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def pr_checkout(self, pr: int, config: dict[str, Any]) -> Path:
        checkout = self.tmp / f"pr-{pr}-checkout"
        if not checkout.exists():
            shutil.copytree(self.base, checkout, ignore=shutil.ignore_patterns(".pulumi-offline"))
        write_dev(checkout, config)
        return checkout

    def state(self) -> dict[str, Any]:
        return self.emulator.state()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("review")
    base = copy_checkout(PROJECT_ROOT, tmp / "base")
    write_dev(base, DEV_CONFIG)
    emulator = EmulatorProcess().start()
    saved = os.environ.get("OFFLINE_STACK_PASSPHRASE")
    os.environ["OFFLINE_STACK_PASSPHRASE"] = PASSPHRASE  # stack_secrets reads the states
    try:
        e = Env(emulator=emulator, base=base, state_dir=tmp / "state", tmp=tmp)
        done = subprocess.run(
            [
                PY,
                "-m",
                "pulumi_standin",
                "up",
                "--stack",
                "dev",
                "--server-url",
                e.url,
                "--state",
                str(e.state_dir / "dev.json"),
            ],
            cwd=base,
            env=e.environ(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield e
    finally:
        emulator.stop()
        if saved is None:
            os.environ.pop("OFFLINE_STACK_PASSPHRASE", None)
        else:
            os.environ["OFFLINE_STACK_PASSPHRASE"] = saved


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _curl_block(comment: str) -> str:
    found = re.search(r"```bash\n(.*?)```", comment, re.S)
    assert found, comment
    return found.group(1)


def review_cycle(
    env: Env, pr: int, config: dict[str, Any], *, full: bool, flow: str
) -> dict[str, Any]:
    """plan -> up -> comment -> a new push (up again: an update) -> comment, as CI runs them for
    one PR. `flow`: `split` as the workflow runs it (the admin step `access-up` with the
    Owner's token, then `up --handoff` in an environment WITHOUT that token), `access` (one
    process does both), `default` (the review stack owns environment, budget and token).
    `full` (round 1) also plans (the diff and costs of the comment), runs the comment's curl
    (PR 101) and an owner's step with the hand-over's token (PR 102, refused), plans the push
    again and ends with the teardown; the light round 2 (no plan: its comment has the endpoint
    only) leaves the stacks to the sweep."""
    checkout = env.pr_checkout(pr, config)
    out = env.tmp / f"out-{pr}"
    handoff = env.tmp / f"handoff-{pr}.json"
    base_state = str(env.state_dir / "dev.json")
    ident = ["--pr", str(pr)]
    repos = ["--head-repo", "acme/llm", "--base-repo", "acme/llm"]
    render = ["comment", *ident, "--in-dir", str(out), "--reader-python", PY]
    owner = flow != "split"
    deploy = ["up", *ident, *repos, "--out-dir", str(out)]
    if flow == "split":
        _ok(env.script(checkout, "access-up", *ident, *repos, "--handoff", str(handoff)))
        deploy += ["--handoff", str(handoff)]
    elif flow == "default":
        deploy += ["--flow", "default"]
    if full:
        _ok(env.script(checkout, "plan", *ident, "--base-state", base_state, "--out-dir", str(out)))
    up = _ok(env.script(checkout, *deploy, "--head-sha", f"{pr:040x}", owner=owner))
    first = _ok(env.script(checkout, *render))
    answer = denied = ""
    if full and pr == 101:  # one PR's curl: both stacks answer the same way
        done = subprocess.run(
            ["bash", "-c", _curl_block(first)],
            cwd=checkout,
            env=env.environ(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        answer = done.stdout + done.stderr
    if full and flow == "split" and pr == 102:  # its hand-over's token makes no environment
        token = json.loads(handoff.read_text())["deploy_token"].split(":")
        denied_env = {"MODAL_TOKEN_ID": token[0], "MODAL_TOKEN_SECRET": token[1]}
        done = subprocess.run(
            [PY, "scripts/review_stack.py", "up", "--pr", str(pr + 900), *repos, "--flow",
             "default", "--engine", "standin", "--server-url", env.url, "--state-dir",
             str(env.tmp / f"denied-{pr}")],
            cwd=checkout, env={**env.environ(owner=False), **denied_env},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        denied = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    # A new push to the PR: the scale-down window changes, the stack is updated in place.
    write_dev(checkout, with_service(config, scaledown_window_s=90))
    if full:
        _ok(env.script(checkout, "plan", *ident, "--base-state", base_state, "--out-dir", str(out)))
    again = _ok(env.script(checkout, *deploy, "--head-sha", f"{pr + 1:040x}", owner=owner))
    second = _ok(env.script(checkout, *render))
    secrets = stack_secrets(env.state_dir / f"pr-{pr}.json", f"pr-{pr}")
    destroyed = ""
    if full and flow == "split":  # as the workflow: teardown (deploy token), then release
        destroyed = _ok(
            env.script(checkout, "destroy", *ident, "--handoff", str(handoff), owner=False)
        )
        destroyed += _ok(env.script(checkout, "access-destroy", *ident))
    elif full:
        destroyed = _ok(env.script(checkout, "destroy", *ident))
    return {
        "up": up,
        "again": again,
        "first": first,
        "second": second,
        "answer": answer,
        "denied": denied,
        "destroyed": destroyed,
        "secrets": secrets,
    }


def stack_secrets(state: Path, stack: str) -> list[str]:
    """Every secret value of a stand-in stack's outputs (its API keys, proxy token secret)."""
    return list(iter_secret_strings(StateFile.load(state, stack).outputs))


def leftovers(state: dict[str, Any]) -> list[str]:
    """Anything of a review stack the emulator still holds: an environment pr-*, an app,
    secret or volume outside dev and main, a proxy token or service user of a review stack."""
    envs = {e["id"]: e["name"] for e in state["environments"]}
    kept = {i for i, n in envs.items() if n in ("main", "dev")}
    found = [f"environment {n}" for n in envs.values() if n.startswith("pr-")]
    for table in ("apps", "secrets", "volumes"):
        found += [
            f"{table[:-1]} {row['name']} in {envs.get(row.get('env_id'), row.get('env_id'))}"
            for row in state[table]
            if row.get("env_id") not in kept
        ]
    found += [f"proxy token {t['name']}" for t in state["proxy_tokens"] if "-pr-" in t["name"]]
    for table in ("service_users", "service_user_roles"):
        found += [f"{table} {row}" for row in state.get(table, []) if "pr-" in json.dumps(row)]
    return found


def run_at_once(
    env: Env, cases: dict[int, tuple[str, dict[str, Any]]], *, full: bool
) -> tuple[dict[int, dict[str, Any]], list[BaseException]]:
    """One review cycle per PR, all at once (one thread each, as concurrent CI runs)."""
    results: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def run(pr: int, flow: str, config: dict[str, Any]) -> None:
        try:
            results[pr] = review_cycle(env, pr, config, full=full, flow=flow)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(pr, flow, config))
        for pr, (flow, config) in cases.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def service_users(env: Env, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The workspace's service users, as the Owner sees them (the modal SDK)."""
    modal_env_for(env.emulator, monkeypatch)
    return [su.name for su in modal.Workspace.from_context().service_users.list()]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_prs_at_once_twice_create_comment_update_destroy(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 1: both PRs as the workflow runs them (admin step, then deploy with the hand-over
    only; teardown with it, then release), ending with destroy. Round 2: the same PRs again,
    one in the default flow, one in the access flow in one process, ending with the sweep."""
    a10g, h100 = with_service(DEV_CONFIG, gpu="A10G"), with_service(DEV_CONFIG, gpu="H100")
    h100 = with_service(h100, min_containers=1)
    rounds = {
        1: {101: ("split", a10g), 102: ("split", h100)},
        2: {101: ("default", a10g), 102: ("access", h100)},
    }
    for round_, cases in rounds.items():
        results, errors = run_at_once(env, cases, full=round_ == 1)
        if errors:
            raise errors[0]
        for pr, res in results.items():
            stack = f"pr-{pr}"
            assert f"review stack {stack}: http://127.0.0.1:" in res["up"], res["up"]
            for comment in (res["first"], res["second"]):
                assert comment.startswith(review_comment.MARKER + "\n")
                assert comment.count(review_comment.MARKER) == 1
                assert f"Modal environment `{stack}`" in comment
            assert f"{pr + 1:040x}"[:12] in res["second"]
            assert "Resources: ~ " in res["again"] and " updated" in res["again"]
            assert res["secrets"], "the stack has a proxy token secret and API keys"
            for secret in res["secrets"]:
                assert secret not in res["first"] + res["second"]
            flow, config = cases[pr]
            if flow != "default":
                assert f"as pr-{pr}-deploy (contributor in {stack} only" in res["up"], res["up"]
            if round_ == 1:
                gpu = config["modal-llm:services"][0]["gpu"]
                worst = f"${expected_cost('L4', 1):,.2f} → ${expected_cost(gpu, 1):,.2f}"
                assert f"| `tiny` | L4 → {gpu} | " in res["first"] and worst in res["first"]
                # The push changed the scale-down window: the diff against dev says so.
                assert "`spec_json.scaling.scaledown_window_s` 60 → 90" in res["second"]
                assert "review stack " + stack + ": destroyed" in res["destroyed"]
                assert "access stack " + stack + ": destroyed" in res["destroyed"]
        if round_ == 1:
            assert "HTTP 200" in results[101]["answer"], results[101]["answer"]
            assert '"chat.completion"' in results[101]["answer"]
            denied = results[102]["denied"]
            assert "exit 1" in denied and "PermissionDenied" in denied, denied
        state = env.state()
        live = {e["name"] for e in state["environments"]}
        if round_ == 1:
            assert not {"pr-101", "pr-102"} & live, live
            assert leftovers(state) == []
            assert [u for u in service_users(env, monkeypatch) if u.startswith("pr-")] == []
        else:
            assert {"pr-101", "pr-102"} <= live  # swept below
            now = dt.datetime.now(dt.UTC)
            keep = env.script(
                env.base,
                "sweep",
                "--older-than-days",
                "7",
                "--now",
                (now + dt.timedelta(days=1)).isoformat(),
            )
            assert "2 review stack(s), 0 to destroy" in _ok(keep)
            swept = _ok(
                env.script(
                    env.base,
                    "sweep",
                    "--older-than-days",
                    "7",
                    "--now",
                    (now + dt.timedelta(days=8)).isoformat(),
                )
            )
            assert "2 review stack(s), 2 to destroy" in swept, swept
            assert "pr-101: last deployed 8.0 days ago" in swept
            assert "access stack pr-102: destroyed" in swept
            listed = json.loads(_ok(env.script(env.base, "list")))
            assert listed == []
            assert leftovers(env.state()) == []
            assert [u for u in service_users(env, monkeypatch) if u.startswith("pr-")] == []
    # Nothing of the review stacks stays beside the states, nor in the sweeping checkout.
    assert sorted(p.name for p in env.state_dir.iterdir()) == ["dev.json"]
    assert not list(env.base.glob("Pulumi.pr-*.yaml"))
    assert not list(env.base.glob("access/Pulumi.pr-*.yaml"))


def _plan_and_render(env: Env, pr: int, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    checkout = env.pr_checkout(pr, config)
    out = env.tmp / f"out-{pr}"
    base_state = str(env.state_dir / "dev.json")
    _ok(env.script(checkout, "plan", "--pr", str(pr), "--base-state", base_state,
                   "--out-dir", str(out)))  # fmt: skip
    # No `up`: the cost figures and warnings come from the plan; a deployed stack's outputs.
    (out / "review-outputs.json").write_text(json.dumps({"endpoint_url": "http://127.0.0.1:1"}))
    comment = _ok(env.script(checkout, "comment", "--pr", str(pr), "--in-dir", str(out)))
    return comment, json.loads((out / "preview.json").read_text())


def _warnings(comment: str) -> list[str]:
    return [line for line in comment.splitlines() if line.startswith("⚠️")]


@pytest.mark.slow
def test_comment_shows_the_cost_delta_of_a_gpu_change(env: Env) -> None:
    """The figures are computed here from the price table; the comment must show exactly them
    (dev now: one L4 at most, none kept warm; the PR: one H100 kept warm)."""
    comment, _ = _plan_and_render(env, 201, with_service(DEV_CONFIG, gpu="H100", min_containers=1))
    l4, h100 = expected_cost("L4", 1), expected_cost("H100", 1)
    assert (l4, h100) == (860.57, 3160.07)  # components/cost.py as of GPU_PRICES_AS_OF
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
        for line in comment.splitlines()
        if line.startswith("| ") and line.count("|") == 4
    }
    assert rows["`dev` now"] == ["$0.00", f"${l4:,.2f}"]
    assert rows["with this PR"] == [f"${h100:,.2f}", f"${h100:,.2f}"]
    assert rows["**difference**"] == [f"**+${h100:,.2f}**", f"**+${h100 - l4:,.2f}**"]
    assert f"| `tiny` | L4 → H100 | $0.00 → ${h100:,.2f} | ${l4:,.2f} → ${h100:,.2f} |" in comment


@pytest.mark.slow
def test_comment_warns_of_a_replace_of_retained_and_protected_resources(env: Env) -> None:
    """dev keeps its caches (protectCaches: the volumes protect + retainOnDelete, the
    environment retainOnDelete). A PR renaming the environment and dropping protectCaches
    replaces both volumes (allowed: unprotect + replace in one run) and drops the environment,
    all three left in Modal; one renaming it only is refused on the protected volume (the
    preview stops there)."""
    unprotected = dict(DEV_CONFIG, **{"modal-llm:environment": "dev-b"})
    unprotected["modal-llm:protectCaches"] = False
    comment, _ = _plan_and_render(env, 202, unprotected)
    warnings = _warnings(comment)
    for volume in ("tiny-hf-cache", "tiny-engine-cache"):
        assert (
            f"⚠️ `{volume}` (modal:Volume) would be **replaced** (replace on: environment): this"
            " PR removes its **protection** in the same run; it is **retainOnDelete**: the old"
            " object is dropped from the stack but NOT deleted in Modal (it stays there,"
            " unmanaged, with its data)."
        ) in warnings, warnings
    # The environment's resource is named after it: a rename deletes the old resource.
    assert (
        "⚠️ `dev-environment` (modal:Environment) would be **deleted**: it is"
        " **retainOnDelete**: it leaves the stack but is NOT deleted in Modal (it stays there,"
        " unmanaged)."
    ) in warnings, warnings
    assert len(warnings) == 3

    renamed = dict(DEV_CONFIG, **{"modal-llm:environment": "dev-b"})
    comment, preview = _plan_and_render(env, 203, renamed)
    assert preview["diagnostics"][-1]["severity"] == "error"
    assert "marked for protection" in preview["diagnostics"][-1]["message"]
    # Which of the two protected volumes the engine reaches first is up to the SDK's order.
    found = [
        w
        for w in _warnings(comment)
        if re.fullmatch(
            r"⚠️ `tiny-(hf|engine)-cache` \(modal:Volume\) would be \*\*replaced\*\*, but it is"
            r" \*\*protected\*\*: the preview stopped there \(`pulumi up` of `dev` would fail\)\.",
            w,
        )
    ]
    assert len(found) == 1, _warnings(comment)


def test_a_fork_gets_no_review_stack(env: Env) -> None:
    before = {e["name"] for e in env.state()["environments"]}
    done = env.script(
        env.base, "up", "--pr", "303", "--head-repo", "someone/llm", "--base-repo", "acme/llm"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no review stack for forks: PR #303 comes from someone/llm")
    assert not (env.base / "Pulumi.pr-303.yaml").exists()
    assert not (env.state_dir / "pr-303.json").exists()
    assert {e["name"] for e in env.state()["environments"]} == before


# ---- the renderer alone -------------------------------------------------------------------


def _render(preview: dict[str, Any], **extra: Any) -> str:
    c = review_comment.ReviewComment(
        pr=7,
        stack="pr-7",
        preview=preview,
        new_costs={
            "monthly_cost_idle_usd": 0,
            "monthly_cost_worst_usd": expected_cost("A10G", 1),
            "services": {
                "qwen-small": {
                    "gpu": "A10G",
                    "gpu_count": 1,
                    "monthly_cost_idle_usd": 0,
                    "monthly_cost_worst_usd": expected_cost("A10G", 1),
                }
            },
        },
        review_outputs={
            "endpoint_url": "https://acme-pr-7--qwen-small-serving.modal.run",
            "proxy_token_id": "wk-pr7",
            "served_model_name": "qwen2.5-1.5b-instruct",
            "environment": "pr-7",
            "proxy_token_secret": "[secret]",
        },
        reader=review_comment.OutputReader(kind="cli", stack="pr-7"),
        **extra,
    )
    return review_comment.render(c)


def test_renderer_reads_a_real_pulumi_preview_json() -> None:
    text = _render(review_samples.real_preview())
    assert text.startswith(review_comment.MARKER)
    # Old costs from the root Stack step's oldState.outputs (no dev outputs file given).
    assert f"| `dev` now | $0.00 | ${expected_cost('L4', 1):,.2f} |" in text
    diff = expected_cost("A10G", 1) - expected_cost("L4", 1)
    assert f"**+${diff:,.2f}**" in text
    # Changed keys found by comparing old and new inputs (no diffReasons for dynamic
    # providers), inside the JSON-string spec; unknowns and secrets never shown as values.
    assert '`spec_json.gpu` "L4" → "A10G"' in text
    assert "`environment` (known after apply)" not in text
    assert "`environment`" in text
    assert "`values` [secret]" in text  # diffReasons of a step whose values are secret
    assert "(replace on: `name`)" in text
    warnings = [line for line in text.splitlines() if line.startswith("⚠️")]
    assert len(warnings) == 2, warnings
    assert "`dev-environment` (modal:Environment) would be **replaced**" in warnings[0]
    assert (
        "`qwen-small-hf-cache` (modal:Volume) would be **replaced**, but it is **protected**"
        in warnings[1]
    )
    # The curl reads its secrets with the CLI, never shows them.
    assert "pulumi stack output proxy_token_secret --stack pr-7 --show-secrets" in text
    assert "pulumi stack output api_keys --stack pr-7 --show-secrets --json" in text
    assert "Modal-Key: wk-pr7" in text


def test_renderer_reads_replacement_steps_and_secret_values() -> None:
    """--show-replacement-steps: the two halves of a replace each warn; a value that became
    secret is shown as [secret] only; with dev's outputs given, they are the old costs."""
    doc = review_samples.with_replacement_steps()
    doc["steps"][3]["newState"]["inputs"]["extra_env"] = "[secret]"
    outputs = {**review_samples.OLD_OUTPUTS, "monthly_cost_worst_usd": 1343.2}
    text = _render(doc, dev_outputs=outputs)
    warnings = [line for line in text.splitlines() if line.startswith("⚠️")]
    assert sum("`dev-environment`" in w for w in warnings) == 2, warnings
    assert "`extra_env` [secret]" in text
    assert "f86d8c19603e6cd3" not in text
    assert "| `dev` now | $0.00 | $1,343.20 |" in text


def test_renderer_reads_the_standin_document_like_the_real_one(env: Env) -> None:
    """The stand-in's `preview --json` for a PR that changes the GPU: the same fields the real
    document has, so the same renderer output as for a real-shaped one."""
    checkout = env.pr_checkout(204, with_service(DEV_CONFIG, gpu="A10G"))
    done = subprocess.run(
        [
            PY,
            "-m",
            "pulumi_standin",
            "preview",
            "--json",
            "--stack",
            "dev",
            "--server-url",
            env.url,
            "--state",
            str(env.state_dir / "dev.json"),
        ],
        cwd=checkout,
        env=env.environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # stdout is the document and nothing else
    assert set(doc) <= {
        "config",
        "steps",
        "diagnostics",
        "duration",
        "changeSummary",
        "maybeCorrupt",
    }
    root = doc["steps"][0]
    assert root["op"] == "same" and root["urn"].endswith("::pulumi:pulumi:Stack::modal-llm-dev")
    assert root["oldState"]["outputs"]["monthly_cost_worst_usd"] == expected_cost("L4", 1)
    assert root["oldState"]["outputs"]["proxy_token_secret"] == "[secret]"
    assert "outputs" not in root["newState"]
    app = next(s for s in doc["steps"] if s["urn"].endswith("::tiny-app"))
    assert app["op"] == "update" and app["detailedDiff"] is None and "diffReasons" not in app
    assert app["newState"]["inputs"]["__provider"] == "[secret]"
    assert doc["changeSummary"]["update"] == 1 and doc["changeSummary"]["same"] >= 9
    text = _render(doc)
    assert '`spec_json.gpu` "L4" → "A10G"' in text
    assert all(s["op"] != "same" for s in doc["steps"][1:])


def test_standin_preview_json_with_cwd(tmp_path: Path) -> None:
    """`preview --json --cwd access`: the access project's document (a new stack: every step
    `create`), URNs as the engine gives them (no root Stack in a child's type chain)."""
    done = subprocess.run(
        [PY, "-m", "pulumi_standin", "preview", "--json", "--cwd", "access", "--stack", "local",
         "--state", str(tmp_path / "none.json")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    urns = [s["urn"] for s in doc["steps"]]
    assert (
        urns[0] == "urn:pulumi:local::modal-llm-access::pulumi:pulumi:Stack::modal-llm-access-local"
    )
    assert (
        "urn:pulumi:local::modal-llm-access::pulumi-python:dynamic/modal:Environment::env-local"
        in urns
    )
    assert not any("pulumi:pulumi:Stack$" in u for u in urns)
    assert set(doc["changeSummary"]) == {"create"}
    assert doc["config"]["modal-llm-access:environments"].startswith("[")


# ---- the Pulumi CLI branch, with a `pulumi` that records what it is asked ------------------

FAKE_PULUMI = """#!/usr/bin/env bash
# Records argv, the working directory and stdin; answers like the CLI for what review_stack.py
# reads (`stack ls --json`: the fields the SDK's automation API parses, `stack output --json`).
{ printf '%s\\n' "$*"; in="$(cat)"; [ -z "$in" ] || printf 'stdin=%s\\n' "$in"; } >> "$FAKE_LOG"
case "$*" in
  "up "*) printf 'token=%s\\n' "${MODAL_TOKEN_ID:-}" >> "$FAKE_LOG" ;;
  "stack ls --json"*) cat "$FAKE_STACKS" ;;
  "stack output --json"*) echo '{"endpoint_url": "https://acme-pr-5--tiny-serving.modal.run",
    "proxy_token_id": "wk-abc", "proxy_token_secret": "[secret]", "environment": "pr-5"}' ;;
esac
"""


def _fake_cli(tmp_path: Path, stacks: list[dict[str, Any]]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(FAKE_PULUMI)
    (bin_dir / "pulumi").chmod(0o755)
    (tmp_path / "stacks.json").write_text(json.dumps(stacks))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "PULUMI_"))}
    env.update(
        PATH=f"{bin_dir}:{Path(PY).parent}:/usr/bin:/bin",
        FAKE_LOG=str(tmp_path / "log"),
        FAKE_STACKS=str(tmp_path / "stacks.json"),
        HOME=str(tmp_path),
    )
    return env


def test_cli_up_sets_the_proxy_token_from_stdin_and_deploys_as_the_handoff(
    tmp_path: Path,
) -> None:
    checkout = copy_checkout(PROJECT_ROOT, tmp_path / "checkout")
    handoff = tmp_path / "handoff.json"
    handoff.write_text(json.dumps({"environment": "pr-5", "deploy_token": "ak-dep5:as-dep5secret",
                                   "proxy_token": "wk-abc:ws-proxy5secret"}))  # fmt: skip
    env = _fake_cli(tmp_path, [])
    done = subprocess.run(
        [PY, "scripts/review_stack.py", "up", "--pr", "5", "--head-repo", "acme/llm",
         "--base-repo", "acme/llm", "--handoff", str(handoff), "--out-dir", str(tmp_path / "o")],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "log").read_text().splitlines()
    cwd = f"--non-interactive --cwd {checkout}"
    assert calls == [
        f"stack select --create pr-5 {cwd}",
        f"config set --secret modal-llm:proxyToken --stack pr-5 {cwd}",
        "stdin=wk-abc:ws-proxy5secret",
        f"up --yes --stack pr-5 {cwd}",
        "token=ak-dep5",  # pulumi up ran as pr-5-deploy
        f"stack output --json --stack pr-5 {cwd}",
    ]
    argv = " ".join(c for c in calls if not c.startswith("stdin="))
    assert "ws-proxy5secret" not in argv and "as-dep5secret" not in argv
    written = yaml.safe_load((checkout / "Pulumi.pr-5.yaml").read_text())["config"]
    assert written["modal-llm:managedByAccessStack"] is True
    assert written["modal-llm:environment"] == "pr-5"
    assert written["modal-llm:monthlyBudgetUsd"] == 20
    assert written["modal-llm:services"][0]["scaling"]["min_containers"] == 0
    assert "modal-llm:proxyToken" not in written  # set encrypted by the CLI, never in clear
    assert json.loads((tmp_path / "o" / "review.json").read_text())["flow"] == "access"


def test_cli_sweep_ages_stacks_by_pulumi_stack_ls(tmp_path: Path) -> None:
    """`pulumi stack ls --json` as the SDK's automation API reads it (name, lastUpdate in
    "%Y-%m-%dT%H:%M:%S.%fZ", updateInProgress): stale, fresh, being updated, never deployed,
    not a review stack, and a PR no longer open."""
    stacks = [
        {"name": "pr-1", "current": False, "lastUpdate": "2026-11-01T10:00:00.000Z"},
        {"name": "pr-2", "current": False, "lastUpdate": "2026-11-26T10:00:00.000Z"},
        {"name": "pr-3", "current": False, "lastUpdate": "2026-11-01T10:00:00.000Z",
         "updateInProgress": True},
        {"name": "acme/modal-llm/pr-4", "current": False},
        {"name": "dev", "current": True, "lastUpdate": "2026-10-01T10:00:00.000Z"},
        {"name": "pr-6", "current": False, "lastUpdate": "2026-11-26T12:00:00.000Z"},
    ]  # fmt: skip
    env = _fake_cli(tmp_path, stacks)
    done = subprocess.run(
        [PY, "scripts/review_stack.py", "sweep", "--list-only", "--older-than-days", "7",
         "--now", "2026-11-27T10:00:00Z", "--open-prs", "1,2,3,4", "--engine", "cli"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doomed = {d["pr"]: d["why"] for d in json.loads(done.stdout)}
    assert doomed == {
        1: "last deployed 26.0 days ago (> 7)",
        4: "never deployed",
        6: "PR #6 is not open",
    }
    calls = (tmp_path / "log").read_text().splitlines()
    assert calls == [
        f"stack ls --json --non-interactive --cwd {PROJECT_ROOT}",
        f"stack ls --json --non-interactive --cwd {PROJECT_ROOT / 'access'}",
    ]
