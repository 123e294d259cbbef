"""Pytest fixtures that put the Modal control-plane emulator under tests.

Registered for the whole suite from tests/conftest.py. Two fixtures:

- `emulator`: one emulator subprocess per test session (in-memory state), reset before each
  test, yielded as an `EmulatorProcess` (see tests/harness/emulator.py for its API:
  `.url`, `.control_url`, `.client_env()`, `.subprocess_env()`, `.reset()`, `.state()`,
  `.set_usage(env, usd)`, `.rpc_counts()`).
- `modal_env`: depends on `emulator`; monkeypatches os.environ with `client_env()` and clears
  the modal SDK's process-wide caches (the cached `Client`, the environment cache and the
  parsed `~/.modal.toml`) before and after the test, so in-process SDK calls
  (`modal.Secret.objects.create(...)`, `app.deploy()`, ...) talk to the emulator. Yields the
  same `EmulatorProcess`.

Use `modal_env_for(emu, monkeypatch)` to point the SDK at an emulator you started yourself
(for example one with a state file you kill and restart).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.harness.emulator import EmulatorProcess


@pytest.fixture(scope="session")
def _emulator_session() -> Iterator[EmulatorProcess]:
    emu = EmulatorProcess().start()
    try:
        yield emu
    finally:
        emu.close()


@pytest.fixture
def emulator(_emulator_session: EmulatorProcess) -> EmulatorProcess:
    """The session's emulator, reset to an empty workspace (only environment "main")."""
    if not _emulator_session.alive:  # a test killed it: bring it back
        _emulator_session.start()
    _emulator_session.reset()
    return _emulator_session


def reset_modal_client_caches() -> None:
    """Forget the modal SDK's cached client, environments and user config.

    The SDK reads env vars at call time (modal.config.Config.get), but caches the client built
    by `Client.from_env()` (`_Client._client_from_env`), looked-up environments
    (`modal._environments.ENVIRONMENT_CACHE`) and `~/.modal.toml` parsed at import time.
    """
    import modal.config
    from modal import _environments
    from modal.client import _Client

    client = _Client._client_from_env
    _Client._client_from_env = None
    _environments.ENVIRONMENT_CACHE.clear()
    modal.config._user_config = {}
    if client is not None:
        with contextlib.suppress(Exception):
            _close_client(client)


def _close_client(client: object) -> None:
    from modal._utils.async_utils import synchronizer

    async def _close(c: object) -> None:
        await c.close()  # type: ignore[attr-defined]

    synchronizer.create_blocking(_close)(client)


def modal_env_for(emu: EmulatorProcess, monkeypatch: pytest.MonkeyPatch) -> EmulatorProcess:
    """Point the in-process modal SDK at `emu` for the rest of the test (undone on teardown)."""
    for key, value in emu.client_env().items():
        monkeypatch.setenv(key, value)
    for key in ("MODAL_ENVIRONMENT", "MODAL_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    reset_modal_client_caches()
    return emu


@pytest.fixture
def modal_env(
    emulator: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmulatorProcess]:
    """The reset session emulator, with os.environ and the SDK's caches pointing at it."""
    modal_env_for(emulator, monkeypatch)
    try:
        yield emulator
    finally:
        reset_modal_client_caches()
