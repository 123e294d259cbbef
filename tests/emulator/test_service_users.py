"""Service users through the real SDK and CLI: a token with the viewer role in one environment
reads that environment's budget, not another's, and cannot set it (what the spend watcher's
token needs). The whole role matrix: tests/emulator/test_rbac_roles.py.

Kept (issue 33 item 7): the spend watcher's token (components/modal/service_user.py,
watchers/spend_alerts.py); modal 1.6.4 modal/_workspace.py service users.
"""

from __future__ import annotations

import modal
import pytest
from modal.client import _Client
from modal.exception import AuthError, NotFoundError
from modal_proto import api_pb2

from tests.emulator.helpers import modal_cli
from tests.harness.emulator import EmulatorProcess


async def _read_budget(token_id: str, token_secret: str, env_id: str) -> float:
    client = await _Client.from_credentials(token_id, token_secret)
    try:
        resp = await client._stub.EnvironmentGetBudget(
            api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
        )
        return float(resp.current_cycle_usage)
    finally:
        await client.close()


async def _set_budget(token_id: str, token_secret: str, env_id: str) -> None:
    client = await _Client.from_credentials(token_id, token_secret)
    try:
        await client._stub.EnvironmentSetBudget(
            api_pb2.EnvironmentSetBudgetRequest(environment_id=env_id, cycle_budget_dollars=1.0)
        )
    finally:
        await client.close()


def test_a_viewer_service_user_reads_only_its_environments_budget(
    modal_env: EmulatorProcess,
) -> None:
    from modal._utils.async_utils import synchronizer
    from modal.exception import Error as ModalError

    read = synchronizer.create_blocking(_read_budget)
    write = synchronizer.create_blocking(_set_budget)
    modal.Environment.objects.create("dev")
    ids = {e["name"]: e["id"] for e in modal_env.state()["environments"]}
    modal_env.set_usage("dev", 3.5)

    ws = modal.Workspace.from_context()
    token = ws.service_users.create("spend-watch-dev", expires_in=None)
    assert token.token_id.startswith("ak-") and token.token_secret.startswith("as-")
    with pytest.raises(ModalError, match="no access to environment"):  # no role yet
        read(token.token_id, token.token_secret, ids["dev"])
    out = modal_cli(
        modal_env, "workspace", "service-users", "set-role", "spend-watch-dev", "dev", "viewer"
    ).stdout
    assert "Viewer" in out
    assert ws.service_users.info("spend-watch-dev").environment_roles == {"dev": "viewer"}
    assert read(token.token_id, token.token_secret, ids["dev"]) == 3.5
    with pytest.raises(ModalError, match="no access to environment"):
        read(token.token_id, token.token_secret, ids["main"])
    with pytest.raises(ModalError, match="may not call EnvironmentSetBudget"):
        write(token.token_id, token.token_secret, ids["dev"])
    with pytest.raises(AuthError, match="service user 'spend-watch-dev'"):  # a wrong secret
        read(token.token_id, "as-wrong", ids["dev"])
    assert token.token_secret not in str(modal_env.state())
    ws.service_users.set_role("spend-watch-dev", "dev", role="no-access")
    with pytest.raises(ModalError, match="no access"):
        read(token.token_id, token.token_secret, ids["dev"])
    assert [s.name for s in ws.service_users.list()] == ["spend-watch-dev"]
    ws.service_users.delete("spend-watch-dev")
    with pytest.raises(NotFoundError):
        ws.service_users.info("spend-watch-dev")
