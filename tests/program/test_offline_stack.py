"""`scripts/offline_stack.py` (the offline stand-in for `pulumi preview --diff` / `up` /
`destroy`, NOT the Pulumi engine) run as a command against the Modal emulator.

One lifecycle of the committed `local` stack: preview of a fresh stack (9 creates, cost
outputs known, provider outputs unknown, nothing sent to Modal), up (real outputs: the App's
web URL, the proxy token id; secrets as [secret]; the state file holds them encrypted only),
preview again (9 unchanged, zero mutating RPCs), a preview with one key rotated and one
revoked (the key replaced, the other deleted, the digest secret shown as [secret], the App
updated), a wrong passphrase refused, destroy (the emulator keeps only its `main`
environment). A preview needs no emulator at all (Check and Diff never call Modal).
Protected cache volumes (`protectCaches`) are neither replaced nor destroyed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pulumi_standin.statefile import SecretBox, open_tree
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import iter_secret_strings, scan_for_leaks
from tests.program.runner import PROJECT_ROOT
from tests.providers.helpers import mutating_calls

pytestmark = pytest.mark.slow
SCRIPT = PROJECT_ROOT / "scripts" / "offline_stack.py"
PASSPHRASE = "offline-stack-test-passphrase"  # not the outer PULUMI_CONFIG_PASSPHRASE
TYPES = [
    "modal:Environment",
    "modal:ProxyAuthToken",
    "modal:SpendAlert",
    "modal:Volume",
    "modal:Secret",
    "modal:App",
    "llm:ApiKey",
]


def _run(emu: EmulatorProcess, state: Path, *args: str, rc: int = 0, **env: str) -> str:
    """Runs the script like the Makefile does; returns stdout (asserting exit code `rc`)."""
    full_env = emu.subprocess_env({"OFFLINE_STACK_PASSPHRASE": PASSPHRASE, **env})
    full_env.pop("PYTHONPATH", None)  # the script must find the project by itself
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--stack", "local", "--state", str(state)],
        cwd=PROJECT_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == rc, f"{args}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _outputs(text: str) -> dict[str, str]:
    """`name: value` lines of the Outputs block (scalars only)."""
    block = text.split("Outputs:\n", 1)[1]
    found = re.findall(r"^    (\w+)\s*: (\S.*)$", block, flags=re.M)
    return {k: v for k, v in found}


def _plan_rows(text: str) -> list[tuple[str, str, str, str]]:
    """(symbol, type, name, word) per resource row (not the provider's progress lines shown on
    a resource's line while its call runs: `... tiny-app   creating | info: ...`)."""
    rows = re.findall(
        r"^  (\+-|\+ |~ |- |  ) (\S+:\S+)\s+(\S+)\s+(\w+)\b(?! \|)",
        text.split("Outputs:")[0],
        re.M,
    )
    return [(s.strip(), t, n, w) for s, t, n, w in rows]


def test_preview_up_noop_destroy(emulator: EmulatorProcess, tmp_path: Path) -> None:
    state = tmp_path / "local.json"

    # ---- preview of a fresh stack: the plan, the costs, nothing sent to Modal --------------
    before = emulator.rpc_counts()
    plan = _run(emulator, state, "preview")
    assert "NOT the Pulumi engine" in plan
    rows = _plan_rows(plan)
    assert len(rows) == 9 and {r[0] for r in rows} == {"+"}, plan
    assert {r[1] for r in rows} == set(TYPES)
    assert "Resources: + 9 to create" in plan
    outs = _outputs(plan)
    # one T4 with vLLM's derived requests (6 cores, 12 GiB) all month: $707.27
    worst = round((0.59 + 6 * 0.0000131 * 3600 + 12 * 0.00000222 * 3600) * 730, 2)
    assert outs["monthly_cost_worst_usd"] == str(worst)
    assert outs["monthly_budget_usd"] == "750"
    assert outs["environment"] == '"local"'
    assert outs["endpoint_url"] == "output<unknown>"  # computed by the App at up
    for secret in ("api_keys", "proxy_token_secret", "gateway_config"):
        assert outs[secret] == "[secret]"
    assert mutating_calls(before, emulator.rpc_counts()) == {}
    assert not state.exists()

    # ---- up: real provider outputs, secrets hidden, state encrypted ---------------------------
    applied = _run(emulator, state, "up")
    assert "Resources: + 9 created" in applied
    modal = emulator.state()
    app = next(a for a in modal["apps"] if a["name"] == "tiny")
    outs = _outputs(applied)
    endpoint = json.loads(outs["endpoint_url"])
    # the App's real URL: the emulator's edge port for the endpoint Modal would name
    # https://<workspace>-local--tiny-server.modal.run (mocks would give "mock-workspace")
    ports = {f"http://127.0.0.1:{p}": label for label, p in emulator.edge_ports().items()}
    assert endpoint in ports and "tiny" in ports[endpoint]
    assert json.loads(outs["proxy_token_id"]) in {t["id"] for t in modal["proxy_tokens"]}
    assert f'"app_id": "{app["id"]}"' in applied
    assert outs["proxy_token_secret"] == "[secret]" and outs["api_keys"] == "[secret]"
    assert os.stat(state).st_mode & 0o077 == 0

    # The state holds the generated keys and the token secret, encrypted: decrypt them with the
    # script's own code, then look for them everywhere an operator looks.
    doc = json.loads(state.read_text())
    salt = base64.b64decode(doc["encryption"]["salt"])
    box = SecretBox(PASSPHRASE, salt)
    secrets: list[str] = []
    for r in doc["resources"]:
        opened: Any = open_tree(r["outputs"], box, r["name"])
        secrets += [s for s in iter_secret_strings(opened) if len(s) >= 8]
    assert any(s.startswith("sk-") for s in secrets) and any(s.startswith("ws-") for s in secrets)

    # ---- preview again: no change, no mutating RPC -----------------------------------------------
    before = emulator.rpc_counts()
    again = _run(emulator, state, "preview")
    assert "Resources: 9 unchanged" in again
    assert {r[0] for r in _plan_rows(again)} == {""}
    assert _outputs(again)["endpoint_url"] == json.dumps(endpoint)
    assert mutating_calls(before, emulator.rpc_counts()) == {}

    # ---- for this run only: one key rotated, one revoked -> key replaced, key deleted, secret
    # diff hidden, App updated; nothing applied --------------------------------------------------
    before = emulator.rpc_counts()
    rotated = _run(
        emulator,
        state,
        "preview",
        "--config",
        'apiKeyRotation={"gateway": "2026-12-01"}',
        "--config",
        'modal-llm:apiKeyNames=["gateway"]',
    )
    changed = {(s, n) for s, _, n, _ in _plan_rows(rotated) if s}
    assert changed == {
        ("+-", "tiny-key-gateway"),
        ("-", "tiny-key-dev"),
        ("~", "tiny-api-keys"),
        ("~", "tiny-app"),
    }
    assert '~ rotation: "" => "2026-12-01"' in rotated and "~ values: [secret]" in rotated
    assert "Resources: ~ 2 to update, +- 1 to replace, - 1 to delete, 5 unchanged" in rotated
    assert mutating_calls(before, emulator.rpc_counts()) == {}

    # ---- a wrong passphrase stops before anything runs ---------------------------------------
    wrong = subprocess.run(
        [sys.executable, str(SCRIPT), "up", "--stack", "local", "--state", str(state)],
        cwd=PROJECT_ROOT,
        env={**emulator.subprocess_env(), "OFFLINE_STACK_PASSPHRASE": "not-the-one"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert wrong.returncode == 1 and "cannot decrypt with this passphrase" in wrong.stderr

    surfaces = {
        "preview": plan,
        "up": applied,
        "preview-again": again,
        "preview-rotated": rotated,
        "wrong-passphrase": wrong.stdout + wrong.stderr,
        "state-file": state.read_text(),
    }

    # ---- destroy: reverse order, the emulator left without the stack's objects --------------
    destroyed = _run(emulator, state, "destroy")
    surfaces["destroy"] = destroyed
    assert "Resources: - 9 deleted" in destroyed
    created = [name for _, _, name, _ in _plan_rows(applied)]  # dependency order
    assert [name for _, _, name, _ in _plan_rows(destroyed)] == created[::-1]
    assert created.index("local-environment") < created.index("tiny-app")
    modal = emulator.state()
    assert [e["name"] for e in modal["environments"]] == ["main"]
    assert modal["secrets"] == [] and modal["volumes"] == [] and modal["proxy_tokens"] == []
    assert [a for a in modal["apps"] if a.get("state") != "stopped"] == []
    assert json.loads(state.read_text())["resources"] == []

    assert scan_for_leaks(surfaces, secrets) == []


def test_preview_needs_no_emulator(tmp_path: Path) -> None:
    """`make plan` in CI: a preview runs Check and Diff only, so nothing has to listen."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # closed once the block ends
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MODAL_SERVER_URL"] = f"http://127.0.0.1:{closed_port}"
    state = tmp_path / "local.json"
    cmd = [sys.executable, str(SCRIPT), "preview", "--stack", "local", "--state", str(state)]
    proc = subprocess.run(
        cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Resources: + 9 to create" in proc.stdout
    assert not state.exists()
    up = subprocess.run(
        [*cmd[:2], "up", *cmd[3:]],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert up.returncode == 1 and "no Modal emulator answers at" in up.stderr
    assert not state.exists()


def test_protected_caches_are_neither_replaced_nor_destroyed(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    """protectCaches (prod's setting) protects the cache volumes: a change that would replace
    them and a destroy both stop before touching anything, as in Pulumi."""
    state = tmp_path / "local.json"
    protect = ("--config", "protectCaches=true")
    assert "Resources: + 9 created" in _run(emulator, state, "up", *protect)

    moved = _run(emulator, state, "preview", *protect, "--config", "environment=elsewhere", rc=1)
    # The engine's own words (step_generator.go: `new.Protect && old.Protect`).
    assert "unable to replace resource" in moved
    assert "as it is currently marked for protection" in moved

    before = emulator.rpc_counts()
    refused = _run(emulator, state, "destroy", rc=1)
    assert "protected resources (" in refused and "nothing deleted" in refused
    assert "unable to delete resource" in refused  # step.go DeleteStep.Apply's message
    assert "tiny-hf-cache" in refused and "tiny-engine-cache" in refused
    assert mutating_calls(before, emulator.rpc_counts()) == {}
    assert len(json.loads(state.read_text())["resources"]) == 9

    # Protection removed by the program (an up with the committed config), then destroy works.
    assert "Resources: 9 unchanged" in _run(emulator, state, "up")
    assert "Resources: - 9 deleted" in _run(emulator, state, "destroy")
    modal = emulator.state()
    assert modal["volumes"] == [] and [e["name"] for e in modal["environments"]] == ["main"]
