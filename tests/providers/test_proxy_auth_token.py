"""ProxyAuthToken provider, driven through the engine protocol against the emulator.

Read takes the allowlist from `WebhookTokenEnvironmentList`; its fallback for servers that
answer UNIMPLEMENTED is shown against an in-process emulator with that RPC removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import modal
import pytest
from grpclib.server import Server

import emulator.handlers  # noqa: F401  (registers the handlers _emulator_with swaps)
from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from emulator.handlers.base import (
    REGISTRY,
    Context,
    Handler,
    RpcCounter,
    ServerConfig,
    build_servicer,
)
from emulator.models import State
from emulator.store import Store
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    Engine,
    ProviderCallError,
    ProviderServer,
    Secret,
    lifecycle,
    reveal,
)
from tests.providers.helpers import rpc_delta, server_env

P = ProxyAuthTokenProvider()
SECRET_OUT = ("token_secret",)  # the resource's additional_secret_outputs


def inputs(
    name: str = "gateway", envs: list[str] | None = None, rotation: str = ""
) -> dict[str, object]:
    return {
        "name": name,
        "environments": envs if envs is not None else ["main"],
        "rotation": rotation,
    }


def tokens_in(env: str) -> set[str]:
    ws = modal.Workspace.from_context()
    return {t.token_id for t in ws.proxy_tokens.list(environment_name=env)}


def all_tokens() -> dict[str, str]:
    return {t.token_id: t.name for t in modal.Workspace.from_context().proxy_tokens.list()}


def test_lifecycle_secret_output_from_creation(engine: Engine, modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("dev")
    steps = lifecycle(
        engine,
        "t",
        P,
        inputs(),
        inputs("gateway-2", ["dev"]),
        secret_outputs=SECRET_OUT,
        destroy=False,
    )
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["t"]
    assert st.id.startswith("wk-") and st.outputs["token_id"] == st.id
    assert isinstance(st.outputs["token_secret"], Secret)
    assert reveal(st.outputs["token_secret"]).startswith("ws-")
    assert all_tokens() == {st.id: "gateway-2"}
    assert tokens_in("dev") == {st.id} and tokens_in("main") == set()
    engine.destroy("t")
    assert all_tokens() == {}


def test_rotation_replaces_create_before_delete(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
    old_id = engine.states["t"].id
    old_secret = reveal(engine.states["t"].outputs["token_secret"])
    assert engine.preview("t", P, inputs(rotation="2026-12")) == "replace"
    n = len(srv.records)
    assert engine.up("t", P, inputs(rotation="2026-12"), secret_outputs=SECRET_OUT) == "replace"
    calls = [r.method for r in srv.records[n:] if r.method in ("Create", "Delete")]
    assert calls == ["Create", "Delete"]  # the new token exists before the old one goes
    new = engine.states["t"]
    assert new.id != old_id and reveal(new.outputs["token_secret"]) != old_secret
    assert tokens_in("main") == {new.id}
    assert set(all_tokens()) == {new.id}


def test_drift_and_noop(engine: Engine, modal_env: EmulatorProcess) -> None:
    """Grants revoked or the token deleted behind Pulumi's back show on refresh. (There is no
    adopt/import for tokens: Modal never returns a token's secret after its creation.)"""
    ws = modal.Workspace.from_context()
    engine.up("t", P, inputs("external"), secret_outputs=SECRET_OUT)
    token_id = engine.states["t"].id
    assert engine.states["t"].outputs["allowed_environments"] == ["main"]
    before = modal_env.rpc_counts()
    assert engine.preview("t", P, inputs("external")) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}
    ws.proxy_tokens.revoke(token_id, "main")
    assert engine.refresh("t") == "update"
    assert engine.up("t", P, inputs("external"), secret_outputs=SECRET_OUT) == "update"
    assert tokens_in("main") == {token_id}
    ws.proxy_tokens.delete(token_id)
    assert engine.refresh("t") == "delete"


def test_unknown_environment_fails_create_without_leaving_a_token(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    with pytest.raises(ProviderCallError) as ei:
        engine.up("t", P, inputs(envs=["main", "nope"]))
    assert "ProxyAuthToken 'gateway'" in ei.value.details and "create failed" in ei.value.details
    assert all_tokens() == {}  # create is transactional


def test_check_failures(srv: ProviderServer) -> None:
    f = srv.check(P, {"name": "", "environments": ["en-bad"], "rotation": 3}).failures
    assert sorted(p for p, _ in f) == ["environments", "name", "rotation"]


def test_grants_added_outside_pulumi_show_on_refresh(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Review finding 13: read lists every environment the token is allowed in, not only the
    declared ones. The allowlist is read whole with one WebhookTokenEnvironmentList call, not
    by asking every environment for its tokens (that fallback is for servers without it)."""
    modal.Environment.objects.create("dev")
    modal.Environment.objects.create("staging")  # not allowed: must not show up
    engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
    modal.Workspace.from_context().proxy_tokens.allow(engine.states["t"].id, "dev")
    before = modal_env.rpc_counts()
    assert engine.refresh("t") == "update"
    read = rpc_delta(before, modal_env.rpc_counts())
    assert read.get("WebhookTokenEnvironmentList") == 1
    assert "WebhookTokenListForEnvironment" not in read  # the per-environment fallback
    assert engine.states["t"].outputs["allowed_environments"] == ["dev", "main"]
    assert engine.preview("t", P, inputs()) == "update"
    engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
    assert tokens_in("dev") == set() and tokens_in("main") == {engine.states["t"].id}


@dataclass(frozen=True)
class _OlderServer:
    """An in-process emulator: its gRPC URL, its state (for setup) and its RPC counts."""

    url: str
    state: State
    counter: RpcCounter


@contextlib.contextmanager
def _emulator_with(
    monkeypatch: pytest.MonkeyPatch, handlers: Mapping[str, Handler | None]
) -> Iterator[_OlderServer]:
    """An in-process emulator (real gRPC over loopback, RBAC on, any token accepted) with some
    RPC handlers swapped (for the test only): None removes one, so it answers UNIMPLEMENTED
    like a Modal server that predates it. It serves from its own thread and event loop
    (grpclib binds a server to the loop it is built in)."""
    for method, handler in handlers.items():
        if handler is None:
            monkeypatch.delitem(REGISTRY, method)
        else:
            monkeypatch.setitem(REGISTRY, method, handler)
    store = Store(None)
    state = State(store, "emu-workspace")
    counter = RpcCounter()
    config = ServerConfig("emu-workspace", "http://127.0.0.1:1", rbac=True)
    ready = threading.Event()
    bound: dict[str, Any] = {}

    async def serve() -> None:
        server = Server([build_servicer(state, config, counter)])
        await server.start("127.0.0.1", 0)
        stop = asyncio.Event()
        bound["port"] = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        bound["stop_event"], bound["loop"] = stop, asyncio.get_running_loop()
        ready.set()
        try:
            await stop.wait()
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), timeout=5)

    thread = threading.Thread(
        target=asyncio.run, args=(serve(),), name="older-emulator", daemon=True
    )
    thread.start()
    try:
        assert ready.wait(timeout=10), "the in-process emulator did not start within 10 s"
        yield _OlderServer(f"http://127.0.0.1:{bound['port']}", state, counter)
    finally:
        if "loop" in bound:
            bound["loop"].call_soon_threadsafe(bound["stop_event"].set)
        thread.join(timeout=10)
        store.close()


def test_read_falls_back_to_per_environment_lists_on_unimplemented(
    emulator: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server without WebhookTokenEnvironmentList (UNIMPLEMENTED): read asks every
    environment for its tokens instead and still sees grants added outside Pulumi."""
    with (
        _emulator_with(monkeypatch, {"WebhookTokenEnvironmentList": None}) as older,
        ProviderServer(env=server_env(emulator, MODAL_SERVER_URL=older.url)) as provider,
    ):
        engine = Engine(provider)
        dev = older.state.environments.create("dev")
        older.state.environments.create("staging")  # not allowed: must not show up
        engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
        token_id = engine.states["t"].id
        older.state.tokens.allow(token_id, dev.id)
        before = older.counter.snapshot()
        assert engine.refresh("t") == "update"
        read = rpc_delta(before, older.counter.snapshot())
        assert read.get("WebhookTokenEnvironmentList") == 1  # tried once, UNIMPLEMENTED
        assert read.get("WebhookTokenListForEnvironment") == 3  # main, dev, staging
        assert engine.states["t"].outputs["allowed_environments"] == ["dev", "main"]
        engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
        assert [t.id for t in older.state.tokens.list_for_environment("dev")] == []
        assert [t.id for t in older.state.tokens.list_for_environment("main")] == [token_id]


def test_read_of_a_token_deleted_during_the_read_reports_it_gone(
    emulator: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is deleted outside Pulumi between WebhookTokenList (still listed) and
    WebhookTokenEnvironmentList (NOT_FOUND): refresh must see it gone, not fail."""
    real = REGISTRY["WebhookTokenEnvironmentList"]

    def delete_then_list(ctx: Context, req: Any) -> Any:
        ctx.state.tokens.delete(req.token_id)  # what a concurrent `modal` user would do
        return real(ctx, req)

    with (
        _emulator_with(monkeypatch, {"WebhookTokenEnvironmentList": delete_then_list}) as emu,
        ProviderServer(env=server_env(emulator, MODAL_SERVER_URL=emu.url)) as provider,
    ):
        engine = Engine(provider)
        engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
        assert engine.refresh("t") == "delete"
        assert emu.state.tokens.list() == []
        assert emu.counter.snapshot().get("WebhookTokenEnvironmentList") == 1
