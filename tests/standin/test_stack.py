"""Stack runs of the engine stand-in (`pulumi_standin.stack`) against the emulator: the real
program under mocks, its resources through the SDK's provider server.

- an `up` that fails before any one of its steps leaves a state file that a second `up`
  continues from, with no orphan and no duplicate in the emulator (the engine's snapshot is
  written after every step: pulumi/pulumi v3.272.0 pkg/resource/deploy/step_executor.go +
  backend/snapshot.go, SnapshotManager);
- a no-op `up` makes zero provider mutations (Diff DIFF_NONE → SameStep, no provider call);
- refresh drops what is gone (step.go RefreshStep: Read answering no id), `--target` leaves
  the other resources alone, `output` prints the last up's outputs, secrets only on request.
Command-line behaviour (messages, Ctrl-C, passphrase) is in test_cli.py.

Kept (issue 33 item 7): the product's providers must leave no orphan and no duplicate when a
run stops between steps and make no call on a no-op `up`; the program's tests check that
through this stand-in, so it must persist and skip as the engine does (the sources above).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pulumi_standin import ProviderServer, Secret
from pulumi_standin.program import PROJECT, stack_config
from pulumi_standin.stack import Command, InjectedFault, run
from tests.harness.emulator import EmulatorProcess
from tests.providers.helpers import mutating_calls

pytestmark = pytest.mark.slow
FULL = {"environments": 1, "secrets": 1, "volumes": 2, "proxy_tokens": 1, "apps": 1}


@pytest.fixture(scope="module")
def local_server(_emulator_session: EmulatorProcess) -> Iterator[ProviderServer]:
    emu = _emulator_session
    config, keys = stack_config("local", {"modal:serverUrl": emu.url})
    server_config = {k: Secret(v) if k in keys else v for k, v in config.items()}
    with ProviderServer(
        env=emu.subprocess_env(), config=server_config, project=PROJECT, stack="local"
    ) as srv:
        yield srv


def _run(
    emu: EmulatorProcess,
    srv: ProviderServer,
    state: Path,
    command: str,
    *,
    rc: int = 0,
    before_step: Callable[[str, str], None] | None = None,
    **kw: Any,
) -> str:
    out = io.StringIO()
    cmd = Command(command, "local", state, emu.url, **kw)
    got = run(cmd, out, before_step=before_step, server=srv)
    assert got == rc, out.getvalue()
    return out.getvalue()


def _modal_objects(emu: EmulatorProcess) -> dict[str, int]:
    """The stack's objects in the emulator, by kind (the default `main` env left out)."""
    s = emu.state()
    return {
        "environments": sum(1 for e in s["environments"] if e["name"] != "main"),
        "secrets": len(s["secrets"]),
        "volumes": len(s["volumes"]),
        "proxy_tokens": len(s["proxy_tokens"]),
        "apps": sum(1 for a in s["apps"] if a.get("state") != "stopped"),
    }


def _state_names(state: Path) -> list[str]:
    return [r["name"] for r in json.loads(state.read_text())["resources"]]


def test_a_failed_up_continues_from_its_state_at_each_step(
    emulator: EmulatorProcess, local_server: ProviderServer, tmp_path: Path
) -> None:
    """A failure injected before each of the 9 creates in turn: the first run fails before
    its first create; every later run applies one create, then fails before the next one; the
    run after the last failure finishes. After every run the state holds exactly what exists
    in the emulator (no orphan), and each run goes on from the state the failed one left."""
    state = tmp_path / "local.json"
    done: list[str] = []
    for allowed in [0] + [1] * 9:
        creates: list[str] = []

        def fail(op: str, name: str, allowed: int = allowed, creates: list[str] = creates) -> None:
            if op == "create":
                if len(creates) == allowed:
                    raise InjectedFault(f"injected failure before create of '{name}'")
                creates.append(name)

        rc = 0 if len(done) == 8 else 1
        out = _run(emulator, local_server, state, "up", rc=rc, before_step=fail)
        if rc:
            assert out.count("error: ") == 1 and "injected failure before create of" in out
        done += creates
        kept = _state_names(state) if state.exists() else []
        assert sorted(kept) == sorted(done), out  # every applied step, nothing else
        assert len(set(done)) == len(done)  # nothing created twice
        live = json.dumps(emulator.state())
        modal = [r for r in json.loads(state.read_text())["resources"]] if state.exists() else []
        for r in modal:
            if not r["type"].startswith("llm:"):  # ApiKey lives in the state only
                assert r["id"] in live, r["name"]
        objects = _modal_objects(emulator)  # ApiKey and SpendAlert make no object of their own
        own = [r for r in modal if r["type"] not in ("llm:ApiKey", "modal:SpendAlert")]
        assert sum(objects.values()) == len(own), (objects, [r["name"] for r in own])
    assert len(done) == 9 and _modal_objects(emulator) == FULL  # no orphan, no duplicate


def test_noop_up_refresh_target_and_output(
    emulator: EmulatorProcess, local_server: ProviderServer, tmp_path: Path
) -> None:
    state = tmp_path / "local.json"
    _run(emulator, local_server, state, "up")

    # ---- a second up: every Diff is DIFF_NONE, so no Create/Update/Delete at all -----------
    calls, modal_before = len(local_server.records), emulator.rpc_counts()
    again = _run(emulator, local_server, state, "up")
    assert "Resources: 9 unchanged" in again
    made = [r.method for r in local_server.records[calls:]]
    assert made and not {"Create", "Update", "Delete"} & set(made), made
    assert mutating_calls(modal_before, emulator.rpc_counts()) == {}

    # ---- a volume deleted behind the stack's back: refresh drops it -------------------------
    doc = json.loads(state.read_text())
    vol = next(r for r in doc["resources"] if r["name"].endswith("hf-cache"))
    local_server.delete(vol["provider"], vol["id"], vol["outputs"])  # not through the engine
    refreshed = _run(emulator, local_server, state, "refresh")
    assert re.search(rf"-\s+modal:Volume\s+{vol['name']}\s+deleted", refreshed), refreshed
    assert vol["name"] not in _state_names(state)

    # ---- up --target that volume's URN: only it is created; the rest is not looked at --------
    calls = len(local_server.records)
    targeted = _run(emulator, local_server, state, "up", targets=(vol["urn"],))
    assert "Resources: + 1 created, 8 not targeted" in targeted, targeted
    assert [r.method for r in local_server.records[calls:]] == ["Check", "Create"]
    assert _modal_objects(emulator) == FULL

    # ---- stack outputs of the last up, secrets only with --show-secrets ----------------------
    hidden = _run(emulator, local_server, state, "output", output_name="proxy_token_secret")
    assert hidden == "[secret]\n"
    shown = _run(
        emulator,
        local_server,
        state,
        "output",
        output_name="proxy_token_secret",
        show_secrets=True,
    )
    assert shown.startswith("ws-") or len(shown.strip()) >= 16, shown
    assert shown.strip() not in state.read_text()  # encrypted at rest
    listing = _run(emulator, local_server, state, "output")
    assert "proxy_token_id" in listing and shown.strip() not in listing


def test_replace_whose_old_delete_fails_keeps_both_and_the_next_up_deletes_it(
    emulator: EmulatorProcess, local_server: ProviderServer, tmp_path: Path
) -> None:
    """A key rotation replaces the key create-before-delete; its old half is deleted after
    every registration (GenerateDeletes). When that delete fails, the state file keeps the new
    key and the old one marked pending delete; the next up deletes it first
    (GeneratePendingDeletes)."""
    state = tmp_path / "local.json"
    _run(emulator, local_server, state, "up")
    rotate = {"modal-llm:apiKeyRotation": '{"gateway": "2026-12-01"}'}

    def fail_old_delete(op: str, name: str) -> None:
        if (op, name) == ("delete", "tiny-key-gateway"):
            raise InjectedFault("injected failure of the old key's delete")

    out = _run(
        emulator, local_server, state, "up", rc=1, overrides=rotate, before_step=fail_old_delete
    )
    assert "replaced" in out and "error: injected failure of the old key's delete" in out
    keys = [
        r for r in json.loads(state.read_text())["resources"] if r["name"] == "tiny-key-gateway"
    ]
    assert sorted(r["pending_delete"] for r in keys) == [False, True]
    new_id = next(r["id"] for r in keys if not r["pending_delete"])

    preview = _run(emulator, local_server, state, "preview", overrides=rotate)
    assert "(pending delete of a replaced one)" in preview and "Resources: - 1 to delete" in preview
    again = _run(emulator, local_server, state, "up", overrides=rotate)
    assert re.search(r"-\s+llm:ApiKey\s+tiny-key-gateway\s+deleted .*pending delete", again)
    assert "Resources: - 1 deleted, 9 unchanged" in again, again
    keys = [
        r for r in json.loads(state.read_text())["resources"] if r["name"] == "tiny-key-gateway"
    ]
    assert [(r["id"], r["pending_delete"]) for r in keys] == [(new_id, False)]
