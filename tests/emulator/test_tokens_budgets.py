"""Proxy-auth tokens through `modal.Workspace.proxy_tokens`, budgets through raw RPCs.

Kept (issue 33 item 7): the ProxyAuthToken and SpendAlert providers
(components/modal/proxy_auth_token.py, spend_alert.py); modal 1.6.4 modal/_workspace.py
`_WorkspaceProxyTokenManager`; budgets have no client wrapper, only modal_proto/api.proto
`EnvironmentGetBudget`/`EnvironmentSetBudget`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import modal
import pytest
from modal.exception import InvalidError, NotFoundError
from modal_proto import api_pb2

from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for, reset_modal_client_caches


def _edge_allows(emu: EmulatorProcess, token_id: str, secret: str, env: str) -> bool:
    body = json.dumps({"token_id": token_id, "token_secret": secret, "environment": env})
    req = urllib.request.Request(
        emu.control_url + "/_emulator/proxy-auth",
        data=body.encode(),
        method="POST",
        headers=emu.control_headers(),
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bool(json.loads(resp.read())["allowed"])
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
        return False


def test_proxy_tokens_lifecycle_and_allowlists(modal_env: EmulatorProcess) -> None:
    """The fixtures' emulator runs with RBAC: tokens are scoped to their allowlist."""
    modal.Environment.objects.create("prod")
    tokens = modal.Workspace.from_context().proxy_tokens
    created = tokens.create("prod-webhooks")
    assert created.token_id.startswith("wk-") and created.token_secret.startswith("ws-")
    assert len(created.token_id) == 25 and len(created.token_secret) == 25

    listed = tokens.list()
    assert [(t.token_id, t.name) for t in listed] == [(created.token_id, "prod-webhooks")]
    assert not hasattr(listed[0], "token_secret")  # the secret is only returned at creation
    dump = json.dumps(modal_env.state())
    assert created.token_secret not in dump

    tokens.update(created.token_id, name="renamed")
    assert tokens.list()[0].name == "renamed"
    assert tokens.list(environment_name="prod") == []
    assert not _edge_allows(modal_env, created.token_id, created.token_secret, "prod")

    tokens.allow(created.token_id, "prod")
    scoped = tokens.list(environment_name="prod")
    assert [(t.token_id, t.scoped) for t in scoped] == [(created.token_id, True)]
    assert tokens.list(environment_name="main") == []
    assert _edge_allows(modal_env, created.token_id, created.token_secret, "prod")
    assert not _edge_allows(modal_env, created.token_id, created.token_secret, "main")
    assert not _edge_allows(modal_env, created.token_id, "ws-" + "x" * 22, "prod")

    tokens.revoke(created.token_id, "prod")
    assert tokens.list(environment_name="prod") == []
    tokens.delete(created.token_id)
    assert tokens.list() == []
    with pytest.raises(NotFoundError, match=created.token_id):
        tokens.delete(created.token_id)
    with pytest.raises(InvalidError, match="Malformed proxy token id"):
        tokens.update("not-a-token", name="x")
    counts = modal_env.rpc_counts()
    assert counts["WebhookTokenCreate"] == 1
    assert counts["WebhookTokenEnvironmentAdd"] == 1
    assert counts["WebhookTokenEnvironmentRemove"] == 1


def test_without_rbac_tokens_are_workspace_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Modal's CLI help: only on workspaces with RBAC are tokens scoped to environments."""
    with EmulatorProcess(rbac=False) as emu:
        modal_env_for(emu, monkeypatch)
        try:
            modal.Environment.objects.create("prod")
            tokens = modal.Workspace.from_context().proxy_tokens
            created = tokens.create("edge")
            assert [t.scoped for t in tokens.list()] == [False]
            for env in ("main", "prod"):  # valid everywhere without any allowlist entry
                assert _edge_allows(emu, created.token_id, created.token_secret, env)
            assert not _edge_allows(emu, created.token_id, "ws-" + "x" * 22, "main")
            tokens.allow(created.token_id, "prod")  # still recorded and listed
            assert [t.token_id for t in tokens.list(environment_name="prod")] == [created.token_id]
            assert _edge_allows(emu, created.token_id, created.token_secret, "main")
            tokens.delete(created.token_id)
            assert not _edge_allows(emu, created.token_id, created.token_secret, "main")
        finally:
            reset_modal_client_caches()


def _env_id(name: str) -> str:
    resp = raw_rpc(
        "EnvironmentGetOrCreate", api_pb2.EnvironmentGetOrCreateRequest(deployment_name=name)
    )
    return str(resp.environment_id)


def test_budget_set_get_usage_and_clear(modal_env: EmulatorProcess) -> None:
    env_id = _env_id("main")
    assert env_id.startswith("en-")
    empty = raw_rpc(
        "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
    )
    assert not empty.HasField("cycle_budget_dollars")
    assert (empty.current_cycle_usage, empty.spend_limit_reached) == (0.0, False)

    raw_rpc(
        "EnvironmentSetBudget",
        api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, cycle_budget_dollars=50.0),
    )
    modal_env.set_usage("main", 12.5)
    got = raw_rpc(
        "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
    )
    assert got.cycle_budget_dollars == 50.0
    assert got.effective_cycle_spend_limit == 50.0
    assert got.current_cycle_usage == 12.5
    assert not got.spend_limit_reached

    modal_env.set_usage("main", 50.0)
    got = raw_rpc(
        "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
    )
    assert got.spend_limit_reached

    with pytest.raises(InvalidError, match="must be >= 0"):
        raw_rpc(
            "EnvironmentSetBudget",
            api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, cycle_budget_dollars=-1),
        )
    raw_rpc(
        "EnvironmentSetBudget",
        api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, clear_budget=True),
    )
    cleared = raw_rpc(
        "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
    )
    assert not cleared.HasField("cycle_budget_dollars") and not cleared.spend_limit_reached
    assert cleared.current_cycle_usage == 50.0
    items = {e.name: e for e in modal.environments.list_environments()}
    assert items["main"].current_cycle_usage == 50.0
    # A budget of $0 means "spend nothing": reached at once, even with zero usage.
    modal_env.set_usage("main", 0.0)
    raw_rpc(
        "EnvironmentSetBudget",
        api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, cycle_budget_dollars=0.0),
    )
    zero = raw_rpc(
        "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
    )
    assert zero.HasField("cycle_budget_dollars") and zero.spend_limit_reached
    raw_rpc(
        "EnvironmentSetBudget",
        api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, clear_budget=True),
    )


def _token_env_ids(token_id: str) -> list[str]:
    resp = raw_rpc(
        "WebhookTokenEnvironmentList",
        api_pb2.WebhookTokenEnvironmentListRequest(token_id=token_id),
    )
    return list(resp.environment_ids)


def test_webhook_token_environment_list_by_token(modal_env: EmulatorProcess) -> None:
    """The allowlist of one token, as environment ids: what the SDK's allow/revoke changed."""
    modal.Environment.objects.create("prod")
    modal.Environment.objects.create("staging")
    ids = {e.name: e.environment_id for e in modal.environments.list_environments()}
    assert set(ids) == {"main", "prod", "staging"}
    tokens = modal.Workspace.from_context().proxy_tokens
    created = tokens.create("edge")
    other = tokens.create("other")
    assert _token_env_ids(created.token_id) == []

    for env in ("prod", "main", "staging"):
        tokens.allow(created.token_id, env)
    tokens.allow(other.token_id, "prod")
    assert _token_env_ids(created.token_id) == sorted([ids["main"], ids["prod"], ids["staging"]])
    assert _token_env_ids(other.token_id) == [ids["prod"]]  # per token, not workspace-wide
    assert ids["prod"] == _env_id("prod")  # the ids EnvironmentGetOrCreate answers, too

    tokens.revoke(created.token_id, "main")
    assert _token_env_ids(created.token_id) == sorted([ids["prod"], ids["staging"]])
    modal.Environment.objects.delete("staging")  # a deleted environment leaves the allowlist
    assert _token_env_ids(created.token_id) == [ids["prod"]]

    tokens.delete(created.token_id)
    with pytest.raises(NotFoundError, match=created.token_id):
        _token_env_ids(created.token_id)
    unknown = "wk-" + "A" * 22
    with pytest.raises(NotFoundError, match=unknown):
        _token_env_ids(unknown)
    with pytest.raises(InvalidError, match="Malformed proxy token id 'prod'"):
        _token_env_ids("prod")
    with pytest.raises(InvalidError, match=r"Malformed proxy token id '\(empty\)'"):
        _token_env_ids("")
    assert _token_env_ids(other.token_id) == [ids["prod"]]
    assert modal_env.rpc_counts()["WebhookTokenEnvironmentList"] == 10
