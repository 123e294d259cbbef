"""Fixtures for the provider tests: one provider server per module, one emulator per session.

- `provider_server` (module): a `ProviderServer` (tests/harness/provider_server.py) whose
  process env points at the session emulator, like a `pulumi up` with MODAL_* exported.
- `srv` (function): that server, after the `emulator` fixture reset the emulator; restarted if
  the emulator came back on another address.
- `engine`: a fresh `Engine` (state + step decisions) over `srv`.
- `webhook`: a loopback HTTP server recording POSTed JSON bodies.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import Engine, ProviderServer
from tests.providers.helpers import Webhook, server_env


class _Holder:
    def __init__(self) -> None:
        self.server: ProviderServer | None = None
        self.url = ""


@pytest.fixture(scope="module")
def _server_holder(_emulator_session: EmulatorProcess) -> Iterator[_Holder]:
    holder = _Holder()
    try:
        yield holder
    finally:
        if holder.server is not None:
            holder.server.close()


@pytest.fixture
def srv(emulator: EmulatorProcess, _server_holder: _Holder) -> ProviderServer:
    if (
        _server_holder.server is None
        or _server_holder.url != emulator.url
        or not _server_holder.server.alive
    ):
        if _server_holder.server is not None:
            _server_holder.server.close()
        _server_holder.server = ProviderServer(env=server_env(emulator)).start()
        _server_holder.url = emulator.url
    return _server_holder.server


@pytest.fixture
def engine(srv: ProviderServer) -> Engine:
    return Engine(srv)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    try:
        yield hook
    finally:
        hook.close()
