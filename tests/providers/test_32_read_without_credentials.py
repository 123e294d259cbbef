"""Pulumi.yaml's `options: refresh: always` makes every preview refresh, and the PR preview job
(.github/workflows/preview.yml) holds no Modal token by design: a Read there keeps the state as
recorded and says so, instead of failing the preview. Half a pair of credentials still fails.

Driven like the engine drives it: the SDK's provider server, a state made with credentials,
then refreshed by a second server started without any (tests/harness/provider_server.py).
"""

from __future__ import annotations

import pytest

from components.modal.secret import SecretProvider
from components.modal.volume import VolumeProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, Secret
from tests.providers.helpers import server_env


def _without_token(emu: EmulatorProcess, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in server_env(emu).items()
        if k not in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
    }
    env["HOME"] = emu.client_env()["HOME"]  # no ~/.modal.toml of the machine either
    return env | extra


def test_a_refresh_without_any_credentials_keeps_the_recorded_state_and_warns(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    # A value no random object id can contain by chance ("a1" was in "st-...UHa1" once).
    value = "secret-value-7c1e-NOT-IN-IDS"
    secret = {"name": "keys", "environment": "main", "values": Secret({"A": value})}
    assert engine.up("s", SecretProvider(), secret) == "create"
    assert engine.up("v", VolumeProvider(), {"name": "cache", "environment": "main"}) == "create"
    lines: list[str] = []
    with ProviderServer(
        env=_without_token(emulator), on_output=lambda line: lines.append(line.text)
    ) as bare:
        other = Engine(bare)
        other.states = dict(engine.states)
        assert other.refresh("s") == "same"
        assert other.refresh("v") == "same"
        assert other.states["s"].id == engine.states["s"].id
    said = "\n".join(lines)
    assert "not refreshed: no Modal credentials" in said, said
    assert value not in said


@pytest.mark.parametrize("missing", ["MODAL_TOKEN_SECRET", "MODAL_TOKEN_ID"])
def test_half_a_pair_still_fails_the_read(
    engine: Engine, emulator: EmulatorProcess, missing: str
) -> None:
    # A value no random object id can contain by chance ("a1" was in "st-...UHa1" once).
    value = "secret-value-7c1e-NOT-IN-IDS"
    secret = {"name": "keys", "environment": "main", "values": Secret({"A": value})}
    assert engine.up("s", SecretProvider(), secret) == "create"
    env = server_env(emulator)
    env.pop(missing)
    with ProviderServer(env=env) as half:
        other = Engine(half)
        other.states = dict(engine.states)
        with pytest.raises(ProviderCallError, match=missing):
            other.refresh("s")
