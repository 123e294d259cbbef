"""8 concurrent clients (each with its own connection) creating and listing in parallel."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import modal
from modal.exception import AlreadyExistsError

from tests.harness.emulator import EmulatorProcess

WORKERS = 8
SECRETS_EACH = 10
VOLUMES_EACH = 3


def test_eight_parallel_clients_leave_exact_state(modal_env: EmulatorProcess) -> None:
    barrier = threading.Barrier(WORKERS)

    def worker(i: int) -> tuple[int, bool, str]:
        client = modal.Client.from_credentials(
            modal_env.token_id or "", modal_env.token_secret or ""
        )
        barrier.wait()
        for j in range(SECRETS_EACH):
            modal.Secret.objects.create(f"w{i}-s{j}", {"K": str(j)}, client=client)
        for j in range(VOLUMES_EACH):
            modal.Volume.objects.create(f"w{i}-v{j}", client=client)
        seen = {s.name for s in modal.Secret.objects.list(client=client)}
        assert {f"w{i}-s{j}" for j in range(SECRETS_EACH)} <= seen
        try:  # everyone races for the same name: exactly one wins
            modal.Secret.objects.create("shared", {"WINNER": str(i)}, client=client)
            won = True
        except AlreadyExistsError:
            won = False
        vol = modal.Volume.from_name("shared-vol", create_if_missing=True, client=client)
        vol.hydrate()
        return i, won, vol.object_id

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(worker, range(WORKERS)))

    assert sum(won for _, won, _ in results) == 1
    assert len({vol_id for _, _, vol_id in results}) == 1
    state = modal_env.state()
    expected_secrets = {f"w{i}-s{j}" for i in range(WORKERS) for j in range(SECRETS_EACH)}
    assert sorted(s["name"] for s in state["secrets"]) == sorted(expected_secrets | {"shared"})
    expected_volumes = {f"w{i}-v{j}" for i in range(WORKERS) for j in range(VOLUMES_EACH)}
    assert sorted(v["name"] for v in state["volumes"]) == sorted(expected_volumes | {"shared-vol"})
    listed = modal.Secret.objects.list()
    assert len(listed) == WORKERS * SECRETS_EACH + 1
    assert modal_env.rpc_counts()["SecretGetOrCreate"] == WORKERS * (SECRETS_EACH + 1)
