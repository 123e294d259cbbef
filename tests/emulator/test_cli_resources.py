"""The real `modal` CLI against the emulator: secrets, volumes, environments.

Kept (issue 33 item 7): as the developer flow (docs/emulator.md's walkthrough uses the `modal`
CLI), and the Secret provider writes whole as `modal secret create --force` does (modal 1.6.4
modal/cli/secret.py `create`; docs/providers.md).
"""

from __future__ import annotations

import json

from tests.emulator.helpers import cli_batch, json_out, modal_cli
from tests.harness.emulator import EmulatorProcess


def test_secret_create_list_delete_with_the_modal_binary(emulator: EmulatorProcess) -> None:
    modal_cli(emulator, "secret", "create", "llm-secret", "HF_TOKEN=abc", "OTHER=1")
    dup = modal_cli(emulator, "secret", "create", "llm-secret", "HF_TOKEN=x", check=False)
    assert dup.returncode == 1
    assert "already exists" in dup.stdout + dup.stderr

    listed = modal_cli(emulator, "secret", "list", "--json")
    assert [s["name"] for s in json.loads(listed.stdout)] == ["llm-secret"]
    state = emulator.state()
    assert [(s["name"], s["env_id"]) for s in state["secrets"]] == [
        ("llm-secret", state["environments"][0]["id"])
    ]
    assert "abc" not in json.dumps(state), "secret values must never appear in the state dump"

    modal_cli(emulator, "secret", "delete", "llm-secret", "-y")
    assert emulator.state()["secrets"] == []
    counts = emulator.rpc_counts()
    assert counts["SecretDelete"] == 1
    assert counts["SecretList"] == 1


def test_secret_force_overwrite_and_environment_scoping(emulator: EmulatorProcess) -> None:
    results = cli_batch(
        emulator,
        ["secret", "create", "s1", "A=1", "B=2"],
        ["secret", "create", "s1", "C=3", "--force"],
        ["environment", "create", "staging"],
        ["secret", "create", "s1", "X=1", "-e", "staging"],
        ["secret", "list", "--json"],
        ["secret", "list", "--json", "-e", "staging"],
        ["secret", "delete", "s1", "-y", "-e", "staging"],
        ["secret", "delete", "nope", "-y"],
        ["secret", "delete", "nope", "-y", "--allow-missing"],
    )
    assert [r["exit_code"] for r in results] == [0, 0, 0, 0, 0, 0, 0, 1, 0], results
    assert [s["name"] for s in json_out(results[4])] == ["s1"]
    assert [s["name"] for s in json_out(results[5])] == ["s1"]
    assert results[7]["error_type"] == "NotFoundError"
    assert "'nope' not found in environment 'main'" in results[7]["error"]
    secrets = emulator.state()["secrets"]
    assert [s["name"] for s in secrets] == ["s1"]  # only main's remains


def test_volume_create_list_rename_delete(emulator: EmulatorProcess) -> None:
    results = cli_batch(
        emulator,
        ["volume", "create", "models"],
        ["volume", "create", "cache"],
        ["volume", "create", "models"],
        ["volume", "rename", "cache", "cache2", "-y"],
        ["volume", "rename", "cache2", "models", "-y"],
        ["volume", "list", "--json"],
        ["volume", "delete", "models", "-y"],
        ["volume", "list", "--json"],
    )
    codes = [r["exit_code"] for r in results]
    assert codes == [0, 0, 1, 0, 1, 0, 0, 0], results
    assert results[2]["error_type"] == "AlreadyExistsError"
    assert results[4]["error_type"] == "AlreadyExistsError"
    assert sorted(v["name"] for v in json_out(results[5])) == ["cache2", "models"]
    assert [v["name"] for v in json_out(results[7])] == ["cache2"]
    assert [v["name"] for v in emulator.state()["volumes"]] == ["cache2"]


def test_environment_create_list_update_delete(emulator: EmulatorProcess) -> None:
    results = cli_batch(
        emulator,
        ["environment", "create", "staging"],
        ["environment", "create", "prod"],
        ["environment", "create", "prod"],
        ["environment", "create", "bad name"],
        ["environment", "update", "staging", "--set-name", "stage2", "--set-web-suffix", "stg"],
        ["environment", "list", "--json"],
        ["environment", "delete", "prod", "-y"],
        ["environment", "delete", "main", "-y"],
        ["environment", "list", "--json"],
    )
    codes = [r["exit_code"] for r in results]
    assert codes == [0, 0, 1, 1, 0, 0, 0, 1, 0], results
    assert results[2]["error_type"] == "AlreadyExistsError"
    assert results[3]["error_type"] == "InvalidError"
    assert results[7]["error_type"] == "ConflictError"  # FAILED_PRECONDITION: default env
    listed = {e["name"]: e["web_suffix"] for e in json_out(results[5])}
    assert listed == {"main": "", "stage2": "stg", "prod": "prod"}
    assert [e["name"] for e in json_out(results[8])] == ["main", "stage2"]
