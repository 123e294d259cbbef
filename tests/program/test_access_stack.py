"""Access as code (issue 23 part 1): the access stack (access/) and service stacks in managed
mode, under mocks and live against an emulator enforcing roles (`--rbac`,
dev/emulator/models/rbac.py).

Under mocks: what the access program registers per environment (an identity with role `none`
gets a service user and no role), its outputs (credentials secret, next_steps without a
secret), its config errors with the stack file's line; the service program in managed mode
(no SpendAlert, no ProxyAuthToken, the environment adopted and retained, the proxy token from
`modal-llm:proxyToken`) and its config errors.

Live, with `python -m pulumi_standin --cwd access` as an operator runs it: the Owner's token
ups the access stack; the service stack in managed mode, deployed with the `local-deploy`
contributor token, answers through the edge with the access stack's proxy token; the same
token against `dev` and the preview identity get PERMISSION_DENIED; a rotation of
`local-deploy` keeps the old token working until the new one deploys, then the access stack's
refresh + up revokes the old one; destroying both leaves the emulator empty.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import modal
import pytest
import yaml
from pulumi.runtime import rpc

from components.config import ConfigError, parse_access_config
from pulumi_standin.program import project_name
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for
from tests.program.runner import (
    PROJECT_ROOT,
    ProgramMocks,
    fake_outputs,
    run_program,
    stack_config,
)

ACCESS = PROJECT_ROOT / "access"
NS = "modal-llm:"
TOKEN = "wk-access0000000000000:ws-access-secret-0000000000"


# ---- under mocks ---------------------------------------------------------------------------


def _access_outputs(typ: str, name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    outs = fake_outputs(typ, name, inputs)
    if typ.endswith("modal:ServiceUser"):
        outs.update(
            current_name=inputs["name"],
            names=[inputs["name"]],
            token_id=f"ak-{name}",
            token_secret=rpc.wrap_rpc_secret(f"as-{name}-secret"),
        )
    return outs


def _access_run(stack: str = "local", overrides: Mapping[str, Any] | None = None) -> Any:
    config, keys = stack_config(stack, overrides, project_dir=ACCESS)
    return run_program(
        stack,
        config,
        keys,
        mocks=ProgramMocks(_access_outputs),
        program=ACCESS / "__main__.py",
        project=project_name(ACCESS),
    )


def test_access_program_registers_each_environment() -> None:
    run = _access_run()
    assert project_name(ACCESS) == "modal-llm-access"
    types: dict[str, list[str]] = {}
    for r in run.resources:
        types.setdefault(r.short_type, []).append(r.name)
    assert sorted(types["modal:Environment"]) == ["env-dev", "env-local"]
    assert sorted(types["modal:SpendAlert"]) == ["budget-dev", "budget-local"]
    assert sorted(types["modal:ProxyAuthToken"]) == ["gateway-token-dev", "gateway-token-local"]
    assert len(types["modal:ServiceUser"]) == 6
    # role none: a service user and no role at all
    assert sorted(types["modal:EnvironmentRole"]) == [
        "role-dev-deploy",
        "role-dev-spend-watch",
        "role-local-deploy",
        "role-local-spend-watch",
    ]
    role = next(r for r in run.resources if r.name == "role-local-deploy")
    su = next(r for r in run.resources if r.name == "su-local-deploy")
    env = next(r for r in run.resources if r.name == "env-local")
    assert role.inputs["role"] == "contributor" and role.inputs["environment"] == "local"
    assert set(role.property_dependencies["service_users"]) == {su.urn}
    assert set(role.property_dependencies["environment"]) == {env.urn}
    assert "token_secret" in su.additional_secret_outputs
    budget = next(r for r in run.resources if r.name == "budget-local")
    assert budget.inputs["monthly_budget_usd"] == 750
    assert budget.inputs["thresholds"] == [0.5, 0.8, 1.0]

    assert run.is_secret("credentials") and not run.is_secret("environments")
    creds = run.output("credentials")
    assert (
        creds["local"]["identities"]["local-deploy"]
        == "ak-su-local-deploy:as-su-local-deploy-secret"
    )
    assert creds["local"]["proxy_token"] == "wk-gateway-token-local:ws-gateway-token-local-secret"
    plain = run.output("environments")
    assert plain["local"]["identities"]["local-preview"]["role"] == "none"
    assert plain["dev"]["proxy_token_id"] == "wk-gateway-token-dev"
    steps = run.output("next_steps")
    assert "secret" not in json.dumps(plain) and "as-" not in steps and "ws-" not in steps
    assert "gh secret set MODAL_TOKEN_ID --env dev" in steps
    assert "pulumi config set --secret modal-llm:alertWatchToken --stack local" in steps
    assert "pulumi config set --secret modal-llm:proxyToken --stack dev" in steps


def test_workspace_stack_file_is_valid() -> None:
    raw = yaml.safe_load((ACCESS / "Pulumi.workspace.yaml").read_text())["config"]
    envs = parse_access_config(json.dumps(raw["modal-llm-access:environments"]), stack="workspace")
    assert [e.name for e in envs] == ["dev", "prod"] and all(e.adopt for e in envs)
    roles = {i.name: i.role for e in envs for i in e.identities}
    assert roles["prod-deploy"] == "contributor" and roles["prod-spend-watch"] == "viewer"
    # the budgets are the service stacks' own (their cost guard)
    for env in envs:
        service = yaml.safe_load((PROJECT_ROOT / f"Pulumi.{env.name}.yaml").read_text())
        assert service["config"][NS + "monthlyBudgetUsd"] == env.monthly_budget_usd
        pct = service["config"][NS + "alertThresholdsPct"]
        assert [t / 100 for t in pct] == env.alert_thresholds
    project = yaml.safe_load((ACCESS / "Pulumi.yaml").read_text())
    root = yaml.safe_load((PROJECT_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "modal-llm-access"
    assert project["runtime"]["name"] == root["runtime"]["name"] == "python"
    assert (
        project["runtime"]["options"]["virtualenv"]
        == "../" + root["runtime"]["options"]["virtualenv"]
    )


def test_local_stack_file_budgets_are_the_service_stacks() -> None:
    """The local access stack's budgets mirror the service stacks' cost guard, as the
    workspace's do (Pulumi.local.yaml for `local`, Pulumi.dev.yaml for `dev`)."""
    raw = yaml.safe_load((ACCESS / "Pulumi.local.yaml").read_text())["config"]
    envs = parse_access_config(json.dumps(raw["modal-llm-access:environments"]), stack="local")
    assert [e.name for e in envs] == ["local", "dev"]
    for env in envs:
        service = yaml.safe_load((PROJECT_ROOT / f"Pulumi.{env.name}.yaml").read_text())
        assert service["config"][NS + "monthlyBudgetUsd"] == env.monthly_budget_usd


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "role: viewer",
            "role: admin",
            "modal-llm-access:environments[0].identities[1].role = 'admin' must be one of"
            " 'contributor', 'viewer' or 'none'",
        ),
        (
            "- name: dev-deploy",
            "- name: local-deploy",
            "environments[1].identities[0].name = 'local-deploy' is already"
            " environments[0].identities[0]: service users are workspace-wide",
        ),
        (
            "monthly_budget_usd: 900",
            "monthly_budget_usd: -1",
            "environments[1].monthly_budget_usd = -1 must be a number >= 0",
        ),
        (
            "alert_thresholds_pct: [50, 80, 100]",
            "alert_thresholds_pct: [0, 80]",
            "environments[0].alert_thresholds_pct = [0, 80] must be a non-empty list of whole"
            " percentages",
        ),
        (
            "role: none",
            "role: none\n          colour: red",
            "environments[0].identities[2].colour is not a known key; the keys here are"
            " expires_in_days, name, role, rotation",
        ),
        (
            "- name: dev\n",
            "- name: en-dev\n",
            "environments[1].name = 'en-dev' must not start with 'en-'",
        ),
    ],
)
def test_access_config_errors_name_the_path_and_line(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    """Each error starts with `file:line:col` of the key in the stack file (the committed file,
    one value changed), then names the path, the value and what is allowed."""
    text = (ACCESS / "Pulumi.local.yaml").read_text()
    assert old in text
    edited = text.replace(old, new, 1)
    stack_file = tmp_path / "Pulumi.local.yaml"
    stack_file.write_text(edited)
    # the line of the changed value: the last line of the replacement
    line = text[: text.index(old)].count("\n") + 1 + new.rstrip("\n").count("\n")
    envs = yaml.safe_load(edited)["config"]["modal-llm-access:environments"]
    with pytest.raises(ConfigError) as ei:
        parse_access_config(json.dumps(envs), stack="local", stack_file=stack_file)
    message = str(ei.value)
    assert message.startswith(f"Pulumi.local.yaml:{line}:"), message
    assert expected in message, message


def test_access_config_without_environments() -> None:
    with pytest.raises(ConfigError, match="modal-llm-access:environments is not set"):
        parse_access_config(None, stack="x")
    with pytest.raises(ConfigError, match=r"environments = \[\] must not be empty"):
        parse_access_config("[]", stack="x")


def _service_run(**overrides: Any) -> Any:
    extra = {NS + k: v for k, v in overrides.items()}
    config, keys = stack_config("local", extra)
    return run_program("local", config, keys)


def test_managed_mode_creates_no_owner_objects() -> None:
    from pulumi_standin.values import Secret

    run = _service_run(managedByAccessStack=True, proxyToken=Secret(TOKEN))
    types = {r.short_type for r in run.resources}
    assert "modal:SpendAlert" not in types and "modal:ProxyAuthToken" not in types
    env = run.of_type("modal:Environment")[0]
    assert env.inputs["adopt"] is True and env.retain_on_delete
    assert run.output("proxy_token_id") == "wk-access0000000000000"
    assert not run.is_secret("proxy_token_id") and run.is_secret("proxy_token_secret")
    assert run.output("proxy_token_secret") == "ws-access-secret-0000000000"
    app = run.of_type("modal:App")[0]
    assert app.inputs["gate_token_id"] == "wk-access0000000000000"
    assert rpc.is_rpc_secret(app.inputs["gate_token_secret"])
    assert "ws-access-secret-0000000000" in run.output("gateway_config")
    # default mode, for comparison: both are there
    default = {r.short_type for r in _service_run().resources}
    assert {"modal:SpendAlert", "modal:ProxyAuthToken"} <= default


def test_managed_mode_spend_watcher_reads_the_environment_id() -> None:
    from pulumi_standin.values import Secret

    run = _service_run(
        managedByAccessStack=True,
        proxyToken=Secret(TOKEN),
        alertWebhookUrl=Secret("https://hooks.example.test/x"),
    )
    watch = run.of_type("modal:SpendWatch")[0]
    spec = json.loads(watch.inputs["spec_json"])
    env = run.of_type("modal:Environment")[0]
    assert spec["environment_id"] == env.outputs["environment_id"]
    assert all("SpendAlert" not in d for d in watch.dependencies)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"managedByAccessStack": True}, "modal-llm:proxyToken is not set"),
        ({"proxyToken": "SECRET"}, "modal-llm:managedByAccessStack is not true"),
        (
            {"managedByAccessStack": True, "proxyToken": "SECRET", "proxyTokenRotation": "x"},
            "proxyTokenRotation has no effect with modal-llm:managedByAccessStack",
        ),
        ({"managedByAccessStack": "yes"}, "managedByAccessStack = 'yes' must be true or false"),
    ],
)
def test_managed_mode_config_errors(overrides: dict[str, Any], expected: str) -> None:
    from pulumi_standin.values import Secret

    given = {k: Secret(TOKEN) if v == "SECRET" else v for k, v in overrides.items()}
    with pytest.raises(Exception, match="invalid stack config") as ei:
        _service_run(**given)
    assert expected in str(ei.value) and "ws-access" not in str(ei.value)


def test_a_malformed_proxy_token_is_refused_without_showing_it() -> None:
    from pulumi_standin.values import Secret

    with pytest.raises(Exception) as ei:
        _service_run(managedByAccessStack=True, proxyToken=Secret("ak-x:as-not-a-proxy-token"))
    assert "must be '<token id>:<token secret>' of the gateway's proxy token" in str(ei.value)
    assert "as-not-a-proxy-token" not in str(ei.value)


def test_standin_cwd_previews_the_access_project(tmp_path: Path) -> None:
    """`--cwd access` reads access/Pulumi.yaml, its stack file and program; a preview writes
    no state (its default place is access/.pulumi-offline/)."""

    def preview(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pulumi_standin", "preview", *args],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    state = tmp_path / "local.json"
    done = preview("--cwd", "access", "--stack", "local", "--state", str(state))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Resources: + 16 to create" in done.stdout, done.stdout
    assert "modal:ServiceUser" in done.stdout and "modal:EnvironmentRole" in done.stdout
    assert not state.exists()
    missing = preview("--cwd", str(tmp_path), "--stack", "local")
    assert missing.returncode == 1
    assert f"error: no Pulumi.yaml in {tmp_path}: not a Pulumi project" in missing.stderr
    nostack = preview("-C", "access", "--stack", "nope")
    assert nostack.returncode == 1
    assert f"error: no stack file Pulumi.nope.yaml in {ACCESS}" in nostack.stderr


# ---- live: pulumi_standin --cwd access against an emulator enforcing roles -------------------


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorProcess]:
    emulator = EmulatorProcess(rbac=True).start()
    try:
        yield emulator
    finally:
        emulator.close()


def standin(
    emu: EmulatorProcess,
    state: Path,
    token: tuple[str, str] | None,
    *args: str,
    rc: int = 0,
) -> str:
    """`python -m pulumi_standin ARGS --state STATE --server-url URL` with that Modal token
    (None: the emulator's own, the workspace Owner's)."""
    env = emu.subprocess_env()
    env.pop("PYTHONPATH", None)
    if token is not None:
        env["MODAL_TOKEN_ID"], env["MODAL_TOKEN_SECRET"] = token
    url = [] if args[0] == "output" else ["--server-url", emu.url]
    proc = subprocess.run(
        [sys.executable, "-m", "pulumi_standin", *args, "--state", str(state), *url],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == rc, f"{args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def outputs(state: Path) -> dict[str, Any]:
    """The stack outputs of a stand-in state file, secrets revealed (what `output NAME
    --show-secrets` prints, read in this process: one subprocess less per read)."""
    from pulumi_standin.statefile import StateFile
    from pulumi_standin.values import to_program

    return dict(rpc.unwrap_rpc_secret(to_program(StateFile.load(state, "local").outputs)))


def _reveal(value: Any) -> Any:
    value = rpc.unwrap_rpc_secret(value)
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    return value


def _pair(text: str) -> tuple[str, str]:
    token_id, _, secret = text.partition(":")
    return token_id, secret


def _chat(endpoint: str, proxy_token: str, api_key: str) -> int:
    token_id, secret = _pair(proxy_token)
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(
        f"{endpoint}/v1/chat/completions",
        data=json.dumps({**body, "max_tokens": 4}).encode(),
        headers={
            "Content-Type": "application/json",
            "Modal-Key": token_id,
            "Modal-Secret": secret,
            "Authorization": f"Bearer {api_key}",
        },
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(resp.status)


@pytest.mark.slow
def test_bootstrap_managed_deploy_denials_rotation_destroy(
    emu: EmulatorProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    access, service = tmp_path / "access.json", tmp_path / "service.json"
    a = ("--cwd", "access", "--stack", "local")

    # The one-time bootstrap, with the Owner's token.
    out = standin(emu, access, None, "up", *a)
    assert "Resources: + 16 created" in out, out
    assert "as-" not in out and "ws-" not in out  # secrets never printed by up
    creds = _reveal(outputs(access)["credentials"])
    deploy = _pair(creds["local"]["identities"]["local-deploy"])
    preview = _pair(creds["local"]["identities"]["local-preview"])
    proxy = creds["local"]["proxy_token"]
    managed = ("up", "--stack", "local", "--config", "managedByAccessStack=true")
    with_token = (*managed, "--secret", f"proxyToken={proxy}")

    # The service stack, managed, with the contributor token of `local` only.
    out = standin(emu, service, deploy, *with_token)
    assert "Resources: + 7 created" in out, out
    svc = outputs(service)
    endpoint, key = svc["services"]["tiny"]["endpoint_url"], _reveal(svc["api_keys"])["gateway"]
    assert _chat(endpoint, proxy, key) == 200

    # The same token in another environment, and the preview identity: PERMISSION_DENIED.
    other = standin(
        emu, tmp_path / "dev.json", deploy, *with_token, "--config", "environment=dev", rc=1
    )
    assert "PermissionDeniedError: Service user 'local-deploy' may not call" in other, other
    assert "has no role that allows this here" in other and "`<env>-deploy` token" in other, other
    nothing = standin(emu, tmp_path / "preview.json", preview, *with_token, rc=1)
    assert "PermissionDeniedError: Service user 'local-preview'" in nothing, nothing
    dev_ids = {e["id"] for e in emu.state()["environments"] if e["name"] == "dev"}
    assert not [x for x in emu.state()["apps"] if x["env_id"] in dev_ids]

    # Rotation of local-deploy: the old token keeps deploying until the new one is used.
    envs = yaml.safe_load((ACCESS / "Pulumi.local.yaml").read_text())["config"][
        "modal-llm-access:environments"
    ]
    envs[0]["identities"][0]["rotation"] = "2026-12"
    rotated = ("--config", f"environments={json.dumps(envs)}")
    out = standin(emu, access, None, "up", *a, *rotated)
    assert re.search(r"~\s+modal:ServiceUser\s+su-local-deploy\s+updated", out), out
    assert re.search(r"~\s+modal:EnvironmentRole\s+role-local-deploy\s+updated", out), out
    creds = _reveal(outputs(access)["credentials"])
    new = _pair(creds["local"]["identities"]["local-deploy"])
    assert new != deploy
    # (a no-op `up` makes no Modal call; a refresh reads every resource, as CI's up --refresh)
    svc_refresh = ("refresh", "--stack", "local", "--config", "managedByAccessStack=true",
                   "--secret", f"proxyToken={proxy}")  # fmt: skip
    assert "7 unchanged" in standin(emu, service, deploy, *svc_refresh)  # old: still works
    out = standin(emu, access, None, "up", *a, *rotated)
    assert "16 unchanged" in out  # the new token was not used yet: both stay
    assert "previous service user local-deploy kept" in out, out
    assert "7 unchanged" in standin(emu, service, new, *svc_refresh)  # the new one is used
    assert re.search(r"~?\s+modal:ServiceUser\s+su-local-deploy\s+update", standin(
        emu, access, None, "refresh", *a, *rotated
    ))  # fmt: skip
    out = standin(emu, access, None, "up", *a, *rotated)
    assert "retire previous service user local-deploy (new token in use since" in out, out
    refused = standin(emu, service, deploy, *svc_refresh, rc=1)
    assert "UNAUTHENTICATED" in refused or "AuthError" in refused, refused
    assert "7 unchanged" in standin(emu, service, new, *svc_refresh)

    # Destroy both: the service stack with its own token, then the access stack.
    standin(emu, service, new, "destroy", "--stack", "local")
    standin(emu, access, None, "destroy", *a, *rotated)
    state = emu.state()
    assert [e["name"] for e in state["environments"]] == ["main"]
    assert state["proxy_tokens"] == []
    assert not [x for x in state["apps"] if x["state"] == "deployed"]
    modal_env_for(emu, monkeypatch)
    assert modal.Workspace.from_context().service_users.list() == []


@pytest.mark.slow
def test_a_default_mode_stack_moves_to_managed_mode(emu: EmulatorProcess, tmp_path: Path) -> None:
    """The documented switch of a stack that ran in default mode (docs/program.md, Access):
    access stack with adopt, the service stack's first managed up with the Owner's token (it
    drops its SpendAlert and ProxyAuthToken), the access stack's refresh + up (its budget set
    again); from then on the contributor token deploys and destroys."""
    emu.reset()
    access, service = tmp_path / "access.json", tmp_path / "service.json"
    out = standin(emu, service, None, "up", "--stack", "local")
    assert "Resources: + 9 created" in out, out
    envs = [
        {
            "name": "local",
            "monthly_budget_usd": 500,
            "adopt": True,
            "identities": [{"name": "local-deploy", "role": "contributor"}],
        }
    ]
    a = ("--cwd", "access", "--stack", "local", "--config", f"environments={json.dumps(envs)}")
    assert "Resources: + 5 created" in standin(emu, access, None, "up", *a)
    creds = _reveal(outputs(access)["credentials"])
    deploy, proxy = (
        _pair(creds["local"]["identities"]["local-deploy"]),
        creds["local"]["proxy_token"],
    )
    managed = ("--stack", "local", "--config", "managedByAccessStack=true",
               "--secret", f"proxyToken={proxy}")  # fmt: skip

    out = standin(emu, service, None, "up", *managed)  # once, with the Owner's token
    assert re.search(r"-\s+modal:SpendAlert\s+local-spend-alert\s+deleted", out), out
    assert re.search(r"-\s+modal:ProxyAuthToken\s+local-proxy-token\s+deleted", out), out

    def budget() -> Any:
        return next(e for e in emu.state()["environments"] if e["name"] == "local")["budget_usd"]

    assert budget() is None  # the dropped SpendAlert put back what it found: no budget
    standin(emu, access, None, "refresh", *a)
    assert "+ 1 created" in standin(emu, access, None, "up", *a)  # the budget, set again
    assert budget() == 500
    assert [t["id"] for t in emu.state()["proxy_tokens"]] == [_pair(proxy)[0]]

    assert "7 unchanged" in standin(emu, service, deploy, "refresh", *managed)
    assert "7 unchanged" in standin(emu, service, deploy, "up", *managed)
    assert "- 7 deleted" in standin(emu, service, deploy, "destroy", "--stack", "local")
    assert "- 5 deleted" in standin(emu, access, None, "destroy", *a)
    state = emu.state()
    # adopted by the access stack, retained by the service stack: released, not deleted
    assert sorted(e["name"] for e in state["environments"]) == ["local", "main"]
    assert state["proxy_tokens"] == [] and not [
        x for x in state["apps"] if x["state"] == "deployed"
    ]
