"""Process wiring: open the store, serve gRPC and HTTP on loopback, stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib.server import Server

from emulator.handlers.base import RpcCounter, ServerConfig, build_servicer
from emulator.http import ControlServer
from emulator.models import State
from emulator.models.apps import DEFAULT_HEARTBEAT_TIMEOUT
from emulator.runtime.edge import EdgeLimits
from emulator.store import Store

log = logging.getLogger("emulator")


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 8790
    http_port: int = 8791
    state_path: Path | None = None  # None: in memory
    workspace: str = "emu-workspace"
    token_id: str | None = None
    token_secret: str | None = None
    rbac: bool = False
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    runtime: bool = True  # run what is deployed (containers + edge); False: control plane only
    max_containers: int = 16
    webhook_timeout: float = 150.0
    container_network: str = "auto"  # "auto" | "netns" | "host"
    stop_grace: float = 10.0
    container_namespaces: bool = True  # False: plain processes, as without root
    edge_limits: EdgeLimits = field(default_factory=EdgeLimits)


def data_dir_for(state_path: Path | None) -> Path | None:
    """Where volumes and the edge's port table persist next to a state file (None: memory)."""
    if state_path is None:
        return None
    return state_path.with_name(state_path.name + ".d")


def ready_line(grpc_url: str, http_url: str, options: Options) -> str:
    """The one line printed on stdout once both ports accept connections."""
    where = str(options.state_path) if options.state_path else ":memory:"
    auth = "token" if options.token_id else "any-token"
    rbac = "on" if options.rbac else "off"
    runtime = "on" if options.runtime else "off"
    return (
        f"MODAL EMULATOR READY grpc={grpc_url} http={http_url} "
        f"workspace={options.workspace} state={where} auth={auth} rbac={rbac} runtime={runtime}"
    )


async def serve(options: Options) -> None:
    """Run until SIGTERM/SIGINT; always closes whatever was opened (servers, store).

    A failure to start (a taken port, a locked or incompatible state file) propagates as the
    original exception (OSError / StoreError) after the cleanup; `__main__` turns it into a
    message and a non-zero exit.
    """
    store = Store(options.state_path)
    control: ControlServer | None = None
    grpc_server: Server | None = None
    grpc_started = False
    runtime: Any = None
    edge: Any = None
    temp_data: Path | None = None
    try:
        state = State(store, options.workspace, heartbeat_timeout=options.heartbeat_timeout)
        interrupted = state.apps.stop_interrupted_deploys()
        if interrupted:
            log.warning(
                "stopped %d app(s) whose deploy was in progress when the last emulator on "
                "this state stopped (%s): deploy them again",
                len(interrupted),
                ", ".join(interrupted),
            )
        counter = RpcCounter()
        credentials = (
            (options.token_id, options.token_secret)
            if options.token_id is not None and options.token_secret is not None
            else None
        )
        if options.runtime:
            from emulator.runtime.edge import Edge
            from emulator.runtime.manager import Runtime, RuntimeOptions
            from emulator.runtime.scratch import make_scratch_dir

            data_dir = data_dir_for(options.state_path)
            if data_dir is None:
                temp_data = make_scratch_dir("modal-emulator-data-")
                data_dir = temp_data
            data_dir.mkdir(parents=True, exist_ok=True)
            data_dir.chmod(0o700)  # volumes of every environment: the emulator's alone
            runtime = Runtime(
                state,
                RuntimeOptions(
                    data_dir=data_dir,
                    max_containers=options.max_containers,
                    webhook_timeout=options.webhook_timeout,
                    netns={"auto": None, "netns": True, "host": False}[options.container_network],
                    stop_grace=options.stop_grace,
                    host=options.host,
                    namespaces=None if options.container_namespaces else False,
                    hidden=tuple(
                        options.state_path.with_name(options.state_path.name + suffix)
                        for suffix in ("", "-wal", "-shm")
                    )
                    if options.state_path is not None
                    else (),
                ),
            )
            edge = Edge(runtime, data_dir, options.host, options.edge_limits)
            runtime.edge = edge
            await edge.start()
            state.url_mapper = edge.url_for
        control = ControlServer(state, counter, options.host, options.http_port, credentials)
        if runtime is not None:
            from emulator.runtime.control import install as install_control

            install_control(control, runtime)
        http_port = await control.start()
        http_url = f"http://{options.host}:{http_port}"
        config = ServerConfig(
            workspace=options.workspace,
            http_url=http_url,
            token_id=options.token_id,
            token_secret=options.token_secret,
            rbac=options.rbac,
        )
        grpc_server = Server([build_servicer(state, config, counter, runtime)])
        if runtime is not None:
            runtime.attach_servicer_factory(
                lambda task_id: build_servicer(state, config, counter, runtime, task_id)
            )
            await runtime.start()
        await grpc_server.start(options.host, options.port)
        grpc_started = True
        inner = grpc_server._server
        sockets = list(getattr(inner, "sockets", None) or [])
        port = int(sockets[0].getsockname()[1]) if sockets else options.port
        grpc_url = f"http://{options.host}:{port}"

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        sys.stdout.write(ready_line(grpc_url, http_url, options) + "\n")
        sys.stdout.flush()
        log.info("serving Modal's control plane at %s (control surface %s)", grpc_url, http_url)
        await stop.wait()
        log.info("stopping")
    finally:
        if runtime is not None:
            await runtime.close()  # containers first: @modal.exit, then SIGKILL after grace
        if edge is not None:
            await edge.close()
        if grpc_server is not None and grpc_started:
            grpc_server.close()
            try:
                await asyncio.wait_for(grpc_server.wait_closed(), timeout=5)
            except TimeoutError:
                log.warning("gRPC connections did not close within 5 s; exiting anyway")
        if control is not None:
            await control.close()
        store.close()
        if temp_data is not None:
            shutil.rmtree(temp_data, ignore_errors=True)
        if grpc_started:
            log.info("stopped cleanly")
