"""Fixtures for the real-Modal tests (credentials and skip rules: support.py).

- `real_server` (session): one `python -m pulumi.dynamic` provider server (the same harness the
  emulator tests use) whose env carries the real token and no emulator URL.
- `throwaway_environment` (session): an Environment resource `iac-test-<random>` created with
  `force_delete=True` (so its teardown also removes anything a failed test left inside it) and
  destroyed when the session ends; the teardown then checks Modal no longer has it.

Both skip (with what to set) when the opt-in credentials are missing, so nothing is started.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from components.modal.environment import EnvironmentProvider
from tests.harness.provider_server import Engine, ProviderServer
from tests.real_modal.support import destroying, is_gone, provider_env, real_credentials

ENV_KEY = "environment"


@dataclass
class ThrowawayEnvironment:
    """The session's environment: its name, inputs and the Engine holding its state."""

    name: str
    engine: Engine
    inputs: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderServer]:
    creds = real_credentials()
    home = tmp_path_factory.mktemp("real-modal")
    env = provider_env(creds, str(home / "no-modal.toml"))
    server = ProviderServer(env=env, stack="real-modal-test").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def throwaway_environment(real_server: ProviderServer) -> Iterator[ThrowawayEnvironment]:
    provider = EnvironmentProvider()
    name = f"iac-test-{secrets.token_hex(4)}"
    inputs: dict[str, Any] = {"name": name, "force_delete": True}
    last: tuple[str, dict[str, Any]] | None = None
    with destroying(real_server) as engine:
        assert engine.up(ENV_KEY, provider, inputs) == "create"
        env = ThrowawayEnvironment(name, engine, inputs)
        yield env
        st = engine.states.get(ENV_KEY)
        last = (st.id, st.outputs) if st is not None else None
    if last is not None:  # destroyed by `destroying`: Modal must not know it any more
        assert is_gone(real_server, provider, last[0], last[1], inputs), (
            f"environment {name} ({last[0]}) still exists on Modal after its destroy:"
            f" delete it with `modal environment delete {name}`"
        )
