"""With the real Pulumi CLI (marker `pulumi_cli`, skipped where `pulumi` is not on PATH):
the local stack against the emulator, the way a developer runs it.

The project files the program needs are copied to a temporary directory with the repo's .venv
linked in, so `pulumi stack init` / `config set` (which write an `encryptionsalt` and the
emulator's URL into Pulumi.local.yaml) never dirty the repo; state goes to a temporary file
backend (`PULUMI_BACKEND_URL=file://<tmp>`, `PULUMI_CONFIG_PASSPHRASE`), plugins and
credentials to a temporary `PULUMI_HOME`. Modal credentials are the emulator's.

Steps and what is checked:
1. `pulumi preview --diff`: the plan creates exactly the program's 9 dynamic resources (by type
   and name, as the program registers them under mocks) plus its components and the Stack,
   nothing else, and shows the cost outputs with the program's figures;
2. `pulumi up --yes`: outputs as `pulumi stack output --json` shows them: `endpoint_url` is a
   web URL the emulator gave the deployed `tiny` app, the proxy token exists in the emulator,
   the secret outputs read `[secret]` (also in `up`'s own output), and no secret value (read
   with `--show-secrets`) appears in any CLI output;
3. `pulumi preview --diff --expect-no-changes` succeeds;
4. `pulumi destroy --yes` leaves the emulator empty (only `main`, no secret, volume, token or
   app in any state).
Written for CLI 3.272.0 (scripts/local-env.sh); not run on our build machines, where the CLI
cannot be installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.emulator import EmulatorProcess
from tests.program.runner import PROJECT_ROOT, ProgramRun, run_program, stack_config

NO_CLI_REASON = (
    "the Pulumi CLI is not on PATH: install pulumi 3.272.0"
    " (https://www.pulumi.com/docs/install/) to run the real preview/up/destroy"
)
# Decided at collection, so a machine without the CLI does not even start the emulator.
pytestmark = [
    pytest.mark.pulumi_cli,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("pulumi") is None, reason=NO_CLI_REASON),
]
COPIED = ("Pulumi.yaml", "Pulumi.local.yaml", "__main__.py", "components", "serving")
STACK = "local"
COST_OUTPUTS = ("monthly_cost_idle_usd", "monthly_cost_baseline_usd", "monthly_cost_worst_usd")
SECRET_OUTPUTS = (
    "proxy_token_secret",
    "api_keys",
    "all_api_keys",
    "gateway_config",
    "gateway_config_json",
)
#: `+ pulumi-python:dynamic/modal:Secret: (create)` then `[urn=...]` (the --diff display).
_STEP = re.compile(r"^\s*(?:[-+~<>=]+\s+)?(?P<type>\S+): \((?P<op>[a-z-]+)\)\s*$")
_URN = re.compile(r"^\s*\[urn=(?P<urn>\S+)\]\s*$")


def _pulumi_or_skip() -> str:
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        pytest.skip(NO_CLI_REASON)
    return pulumi


def planned_steps(diff_text: str) -> list[tuple[str, str, str]]:
    """(op, type, name) of each resource step in `pulumi preview --diff` output."""
    steps: list[tuple[str, str, str]] = []
    pending: tuple[str, str] | None = None
    for line in diff_text.splitlines():
        m = _STEP.match(line)
        if m:
            pending = (m["op"], m["type"])
            continue
        u = _URN.match(line)
        if u and pending is not None:
            urn = u["urn"]
            name = urn.rsplit("::", 1)[1]
            typ = urn.rsplit("::", 2)[1].split("$")[-1]  # the last type of the parent chain
            assert typ == pending[1], f"urn {urn} under a {pending[1]} step"
            steps.append((pending[0], typ, name))
            pending = None
    return steps


def shown_number(text: str, output: str) -> float:
    """The value the CLI printed for a numeric stack output (`name : 495.3`)."""
    m = re.search(rf"^\s*\+?\s*{output}\s*:\s*(?P<v>-?[0-9.]+(?:e[+-]?\d+)?)\s*$", text, re.M)
    assert m, f"output {output} not shown in:\n{text}"
    return float(m["v"])


def _copy_project(work: Path) -> None:
    work.mkdir()
    for name in COPIED:
        src = PROJECT_ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, work / name)
    (work / ".venv").symlink_to(PROJECT_ROOT / ".venv")


def _program_under_mocks() -> ProgramRun:
    config, secret_keys = stack_config(STACK)
    return run_program(STACK, config, secret_keys)


@pytest.mark.timeout(900)
def test_preview_up_noop_destroy_with_the_cli(tmp_path: Path, emulator: EmulatorProcess) -> None:
    pulumi = _pulumi_or_skip()
    repo_stack_file = (PROJECT_ROOT / "Pulumi.local.yaml").read_bytes()
    work = tmp_path / "project"
    _copy_project(work)
    (tmp_path / "state").mkdir()
    env = {
        **emulator.subprocess_env(),
        "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
        "PULUMI_CONFIG_PASSPHRASE": "test-only",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_HOME": str(tmp_path / "pulumi-home"),
    }
    version = subprocess.run(
        [pulumi, "version"], env=env, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    transcript: list[str] = []

    def cli(*args: str, shown: bool = True) -> str:
        """Run the CLI in the project copy; `shown=False` keeps its output out of the
        leak check (only for `--show-secrets`)."""
        result = subprocess.run(
            [pulumi, *args, "--non-interactive", "--color", "never"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if shown:
            transcript.append(result.stdout + result.stderr)
        assert result.returncode == 0, (
            f"pulumi {' '.join(args)} (CLI {version}) exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
        return result.stdout

    expected = _program_under_mocks()
    cli("stack", "init", STACK)
    cli("config", "set", "modal:serverUrl", emulator.url, "--stack", STACK)

    # ---- 1. preview: the 9 creates and the cost figures -------------------------------------
    preview = cli("preview", "--diff", "--stack", STACK)
    steps = planned_steps(preview)
    steps = [s for s in steps if not s[1].startswith("pulumi:providers:")]  # default providers
    dynamic = {(t, n) for op, t, n in steps if t.startswith("pulumi-python:dynamic/")}
    assert dynamic == {(r.type, r.name) for r in expected.resources if r.custom}, preview
    assert len(dynamic) == 9
    assert {op for op, _, _ in steps} == {"create"}, preview
    total = len(expected.resources) + 1  # + the Stack itself
    assert len(steps) == total, preview
    summary = re.search(r"\+ (\d+) to create", preview)
    assert summary and int(summary[1]) == total, preview
    for name in COST_OUTPUTS:
        assert shown_number(preview, name) == pytest.approx(expected.output(name), abs=0.01)

    # ---- 2. up: outputs from the emulator, secrets hidden -----------------------------------
    up = cli("up", "--yes", "--stack", STACK)
    for name in SECRET_OUTPUTS:
        assert re.search(rf"{name}\s*:\s*\[secret\]", up), f"{name} not shown as [secret]:\n{up}"
    outputs = json.loads(cli("stack", "output", "--json", "--stack", STACK))
    assert outputs["environment"] == "local"
    assert outputs["served_model_name"] == expected.output("served_model_name")
    for name in SECRET_OUTPUTS:
        assert outputs[name] == "[secret]", name
    for name in COST_OUTPUTS:
        assert outputs[name] == pytest.approx(expected.output(name), abs=0.01)
    state = emulator.state()
    env_id = next(e["id"] for e in state["environments"] if e["name"] == "local")
    deployed = [a for a in state["apps"] if a["env_id"] == env_id and a.get("state") != "stopped"]
    assert [a["name"] for a in deployed] == ["tiny"], deployed
    app_urls = {w["url"] for w in state["web_urls"] if w["app_id"] == deployed[0]["id"]}
    assert outputs["endpoint_url"] in app_urls, (outputs["endpoint_url"], app_urls)
    assert outputs["proxy_token_id"] in {t["id"] for t in state["proxy_tokens"]}
    revealed = json.loads(
        cli("stack", "output", "--json", "--show-secrets", "--stack", STACK, shown=False)
    )
    assert revealed["proxy_token_secret"].startswith("ws-")
    assert set(revealed["api_keys"]) == {"gateway", "dev"}
    secrets = {revealed["proxy_token_secret"], *revealed["api_keys"].values()}
    secrets |= {key for keys in revealed["all_api_keys"].values() for key in keys.values()}
    assert all(isinstance(s, str) and len(s) >= 16 for s in secrets), "unexpected secret shape"

    # ---- 3. nothing left to do ----------------------------------------------------------------
    cli("preview", "--diff", "--expect-no-changes", "--stack", STACK)

    # ---- 4. destroy: the emulator is empty again ----------------------------------------------
    cli("destroy", "--yes", "--stack", STACK)
    state = emulator.state()
    assert [e["name"] for e in state["environments"]] == ["main"]
    assert state["secrets"] == [] and state["volumes"] == [] and state["proxy_tokens"] == []
    assert [a["name"] for a in state["apps"]] == [], state["apps"]
    assert any((tmp_path / "state").iterdir())  # the file backend held the state

    # No secret value in anything the CLI printed (stack output --show-secrets aside).
    printed = "\n".join(transcript)
    leaked = sorted(s[:4] + "…" for s in secrets if s in printed)
    assert leaked == [], f"secret values printed by the CLI: {leaked}"
    assert (PROJECT_ROOT / "Pulumi.local.yaml").read_bytes() == repo_stack_file
