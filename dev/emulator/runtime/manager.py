"""The runtime: runs what is deployed, scales it like Modal, and stops it.

One `Pool` per function that has (or may get) containers. A reconcile loop compares the pools
with the deployed state (each deployed app's current version: function ids and definition
ids) and, every AUTOSCALE_INTERVAL:

- starts `min_containers` at deploy and keeps them up (a crashed one is replaced);
- starts a container when work waits and none has a free slot (a cold start), up to
  `max_containers` (hard) and the emulator-wide `--max-containers` cap;
- stops containers idle for longer than `scaledown_window` (above `min_containers`);
- kills a container that is not ready within its startup timeout (its waiters fail);
- on a changed definition (a redeploy or a rollback), starts the new version's containers and
  stops the old ones only once the new ones are ready (rolling, as Modal's default
  `deployment_strategy="rolling"`); the edge keeps routing to old ready containers meanwhile;
- stops every container of an app that was stopped (or deleted with its environment).

Kinds of pool: "server" (`@app.server`: HTTP straight to the container's port) and
"function" (everything that takes inputs: `.remote()`/`.map()`/`.spawn()` calls and
schedules). Web endpoints of the ASGI/WSGI/web_server kind are not run (see docs/emulator.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modal_proto import api_pb2

from emulator.errors import NotFound
from emulator.ids import new_id
from emulator.models import State
from emulator.models.apps import App, Definition
from emulator.runtime import containers as ct
from emulator.runtime import netns, schedules, scratch
from emulator.runtime.calls import Calls
from emulator.runtime.logs import INFO, LogStore
from emulator.runtime.materialize import container_env, materialize, mount_ids_for

log = logging.getLogger("emulator.runtime")

AUTOSCALE_INTERVAL = 0.2
RECONCILE_INTERVAL = 2.0
#: How often the ledger of container processes is brought up to date (scratch.py).
LEDGER_INTERVAL = 1.0
DEFAULT_SCALEDOWN = 60.0
DEFAULT_STARTUP_TIMEOUT = 300.0
#: After a container failed to start, the pool waits 2 s before the next try, doubling per
#: consecutive failure up to a minute (a broken app does not spin a CPU); a ready container
#: resets it.
CRASH_BACKOFF = 2.0
MAX_CRASH_BACKOFF = 60.0


@dataclass
class RuntimeOptions:
    #: Where volumes and the edge's port table live (persistent with --state).
    data_dir: Path
    python: str = sys.executable
    max_containers: int = 16
    webhook_timeout: float = 150.0
    netns: bool | None = None  # None: use network namespaces when the OS allows it
    #: Mount and pid namespaces per container: None when the OS allows it, False never.
    namespaces: bool | None = None
    stop_grace: float = 10.0
    host: str = "127.0.0.1"
    #: The emulator's own files a container must not see (the state file and its -wal/-shm);
    #: the data dir and the containers' socket dir are added by the runtime.
    hidden: tuple[Path, ...] = ()


def function_of(definition: Definition) -> api_pb2.Function:
    data = api_pb2.FunctionData.FromString(definition.data)
    if data.ranked_functions:
        return data.ranked_functions[0].function
    fn = api_pb2.Function()
    fn.function_name = data.function_name
    return fn


@dataclass
class Settings:
    kind: str
    min_containers: int
    max_containers: int | None
    scaledown_window: float
    concurrency: int  # 0: unlimited (servers without max_concurrency)
    startup_timeout: float
    port: int
    requires_auth: bool

    @staticmethod
    def of(fn: api_pb2.Function) -> Settings:
        a = fn.autoscaler_settings
        has = fn.HasField("autoscaler_settings")
        min_c = a.min_containers if has and a.HasField("min_containers") else fn.warm_pool_size
        max_c: int | None = (
            a.max_containers
            if has and a.HasField("max_containers")
            else (fn.concurrency_limit or None)
        )
        down = (a.scaledown_window if has and a.scaledown_window else 0) or (
            fn.task_idle_timeout_secs or DEFAULT_SCALEDOWN
        )
        if fn.is_server:
            return Settings(
                kind="server",
                min_containers=min_c,
                max_containers=max_c,
                scaledown_window=float(down),
                concurrency=fn.max_concurrent_inputs,
                startup_timeout=float(
                    fn.http_config.startup_timeout
                    or fn.startup_timeout_secs
                    or DEFAULT_STARTUP_TIMEOUT
                ),
                port=fn.http_config.port,
                requires_auth=not fn.http_config.unauthenticated,
            )
        return Settings(
            kind="function",
            min_containers=min_c,
            max_containers=max_c,
            scaledown_window=float(down),
            concurrency=max(fn.max_concurrent_inputs, 1),
            startup_timeout=float(
                fn.startup_timeout_secs or fn.timeout_secs or DEFAULT_STARTUP_TIMEOUT
            ),
            port=0,
            requires_auth=fn.webhook_config.requires_proxy_auth,
        )


@dataclass
class Pool:
    function_id: str
    app_id: str
    env_name: str
    definition: Definition
    fn: api_pb2.Function
    settings: Settings
    containers: dict[str, ct.Container] = field(default_factory=dict)
    waiting: int = 0  # edge requests waiting for a free slot
    retired: bool = False
    backoff_until: float = 0.0
    last_failure: str = ""
    next_run: float | None = None  # scheduled functions: epoch seconds of the next run
    failures: int = 0  # consecutive failed starts
    #: Runtime autoscaler override (FunctionUpdateSchedulingParams), merged field by field
    #: over the deployed settings; a deploy that changes the definition drops it.
    override: api_pb2.AutoscalerSettings = field(default_factory=api_pb2.AutoscalerSettings)

    def back_off(self) -> None:
        """A container of this pool failed to start: wait before the next start."""
        self.failures += 1
        delay = min(CRASH_BACKOFF * 2 ** (self.failures - 1), MAX_CRASH_BACKOFF)
        self.backoff_until = time.monotonic() + delay

    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def live(self, current_only: bool = False) -> list[ct.Container]:
        return [
            c
            for c in self.containers.values()
            if c.alive
            and c.state != "stopping"
            and (not current_only or c.definition_id == self.definition.id)
        ]

    def method_for(self, url: str) -> str:
        """The class method a web URL belongs to ("" for a function's own URL)."""
        for name, md in self.fn.method_definitions.items():
            if md.web_url == url:
                return name
        return ""

    @property
    def urls(self) -> list[str]:
        urls = [self.fn.web_url] if self.fn.web_url else []
        urls += [md.web_url for md in self.fn.method_definitions.values() if md.web_url]
        return urls + list(self.fn.flash_service_urls)


class NoCapacity(Exception):
    """Every container is at max concurrency and no more may start (the edge answers 429)."""


class StartFailed(Exception):
    """The container meant for this request failed to start (the edge answers 503)."""


class Runtime:
    def __init__(self, state: State, options: RuntimeOptions) -> None:
        self.state = state
        self.options = options
        self.logs = LogStore()
        self.calls = Calls()
        self.pools: dict[str, Pool] = {}
        self.tasks: dict[str, ct.Container] = {}
        self.use_netns = options.netns if options.netns is not None else netns.supported()
        # Its own mount and pid namespaces and root for every container where allowed, on
        # either network: its paths never touch the machine's, and nothing it starts outlives
        # it or the emulator (docs/emulator.md "Hygiene").
        self.use_mountns = self.use_netns or (
            options.namespaces is not False and netns.namespaces_supported()
        )
        scratch.sweep_stale()  # what emulators killed with -9 left behind
        self._sock_dir = scratch.make_scratch_dir("modal-emu-")
        self._roots = self._sock_dir / "roots"
        self._volumes = options.data_dir / "volumes"
        self._volumes.mkdir(parents=True, exist_ok=True)
        self._servers: dict[str, Any] = {}  # task id -> grpclib Server on its unix socket
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._servicer_factory: Any = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._recorded: set[int] = set()  # the pids in the scratch dir's ledger
        #: `POST /_emulator/schedules/pause`: (environment, app, function) whose schedule fires
        #: only from the control route. An emulator switch, not a Modal feature: tests that
        #: drive a scheduled function by hand must not race its wall-clock runs. Kept by name,
        #: so it can be set before the deploy and holds across redeploys, stops and deploys.
        self.paused_schedules: set[tuple[str, str, str]] = set()
        self.edge: Any = None  # set by server.py (emulator.runtime.edge.Edge)

    # ---- lifecycle ---------------------------------------------------------------------
    def attach_servicer_factory(self, factory: Any) -> None:
        """`factory(task_id)` builds the gRPC servicer a container's unix socket serves."""
        self._servicer_factory = factory

    async def start(self) -> None:
        log.info(
            "runtime: containers run %s (cap %d), state in %s",
            ("in their own network namespace" if self.use_netns else "on the host network")
            + (
                ", each in its own mount and pid namespaces"
                if self.use_mountns
                else ", as plain processes (no mount or pid namespace: not root, or no unshare)"
            ),
            self.options.max_containers,
            self.options.data_dir,
        )
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="autoscaler")

    async def close(self) -> None:
        """Stop every container (SIGTERM, `@modal.exit`, SIGKILL after the grace period)."""
        self._closing = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        live = [c for c in self.tasks.values() if not c.exited.is_set()]
        if live:
            log.info("runtime: stopping %d container(s)", len(live))
        await asyncio.gather(*(self._stop_container(c) for c in live), return_exceptions=True)
        for server in list(self._servers.values()):
            server.close()
        self._servers.clear()
        shutil.rmtree(self._sock_dir, ignore_errors=True)

    def wake(self) -> None:
        self._wake.set()

    def _record_processes(self) -> None:
        """The ledger of container processes in the scratch dir, for the sweep of a later
        emulator if this one is killed (scratch.py). With pid namespaces it names the
        `unshare` and pid 1 of each (the kernel ends the rest with pid 1); without, every
        process each container started, as seen now or before."""
        live = [c for c in self.tasks.values() if c.pid is not None and not c.exited.is_set()]
        plain = [c for c in live if not c.mountns]
        if plain:
            tree = ct.process_tree()
            for c in plain:
                ct.track_descendants(c, tree)
        pids: set[int] = set()
        for c in live:
            pids.add(c.pid)  # type: ignore[arg-type]
            if c.init_pid is not None:
                pids.add(c.init_pid)
            pids.update(c.descendants)
        if pids != self._recorded:
            self._recorded = pids
            with contextlib.suppress(OSError):
                scratch.record_processes(self._sock_dir, pids)

    def deployments_changed(self) -> None:
        """An app was published, stopped or rolled back, or an environment deleted: follow
        the deployed state now, before the RPC answers, then let the loop scale.

        On Modal a URL answers as soon as `modal deploy` returns (with a cold start) and
        stops answering once `modal app stop` returns; reconciling only in the background
        loop left a window where a request just after the deploy got 404 (seen in CI).
        """
        try:
            self.reconcile()
        except Exception:
            log.exception("runtime: reconcile after a deployment change failed (will retry)")
        self._wake.set()

    def reset(self) -> None:
        """The state was emptied: stop every container and forget containers, calls and logs."""
        for pool in list(self.pools.values()):
            if not pool.retired:
                self._retire(pool)
        for c in self.tasks.values():
            if not c.exited.is_set():
                self._spawn_stop(c, grace=0.0)
        self.pools.clear()
        self.tasks.clear()
        self.calls.clear()
        self.logs.clear()
        self.paused_schedules.clear()

    async def _run(self) -> None:
        last_reconcile = 0.0
        last_ledger = 0.0
        woken = True
        # `close()` sets _closing before it cancels this task: Python 3.11's wait_for can
        # swallow a cancellation that arrives as the wait ends (a wake at the same moment),
        # and the loop then ran on while close() waited for it (an emulator ignoring SIGTERM).
        while not self._closing:
            try:
                # the deployed state is re-read when something woke the loop (a publish, a
                # stop, a rollback, a reset) and at least every RECONCILE_INTERVAL (apps can
                # also stop by heartbeat timeout or environment deletion)
                if woken or time.monotonic() - last_reconcile > RECONCILE_INTERVAL:
                    self.reconcile()
                    last_reconcile = time.monotonic()
                self.autoscale()
                if time.monotonic() - last_ledger > LEDGER_INTERVAL:
                    self._record_processes()
                    last_ledger = time.monotonic()
            except Exception:
                log.exception("runtime: reconcile failed (will retry)")
            woken = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), AUTOSCALE_INTERVAL)
                woken = True
            self._wake.clear()

    # ---- desired state -------------------------------------------------------------------
    def reconcile(self) -> None:
        """Pools follow the deployed apps' current versions; stopped apps lose theirs."""
        desired: dict[str, tuple[App, Definition]] = {}
        for app, layout in self.state.apps.deployed_layouts():
            for fid in layout.function_ids.values():
                def_id = layout.definition_ids.get(fid)
                try:
                    definition = (
                        self.state.apps.get_definition(def_id)
                        if def_id
                        else self.state.apps.latest_definition(fid)
                    )
                except Exception:  # noqa: S112 (a layout naming a deleted definition: skip it)
                    continue
                desired[fid] = (app, definition)
        for fid, (app, definition) in desired.items():
            pool = self.pools.get(fid)
            if pool is None or pool.retired:
                self.pools[fid] = self._new_pool(app, definition)
            elif pool.definition.id != definition.id:
                self._update_pool(pool, definition)
        for fid, pool in list(self.pools.items()):
            if fid in desired or pool.retired:
                continue
            if self._app_live(pool.app_id) and not self._deployed(pool.app_id):
                continue  # an ephemeral app (`modal run`/`serve`): kept while it lives
            self._retire(pool)

    def _app_live(self, app_id: str) -> bool:
        try:
            app = self.state.apps.get(app_id)
        except Exception:
            return False
        return app.state not in ("stopped", "stopping", "disabled")

    def _deployed(self, app_id: str) -> bool:
        try:
            return self.state.apps.get(app_id).deployed
        except Exception:
            return False

    def _new_pool(self, app: App, definition: Definition) -> Pool:
        fn = function_of(definition)
        pool = Pool(
            function_id=definition.function_id,
            app_id=app.id,
            env_name=app.env_name,
            definition=definition,
            fn=fn,
            settings=Settings.of(fn),
        )
        log.info(
            "runtime: function %s (%s, app %s) is %s",
            fn.function_name,
            definition.function_id,
            app.id,
            pool.settings.kind,
        )
        return pool

    def _update_pool(self, pool: Pool, definition: Definition) -> None:
        old_live = len(pool.live())
        pool.definition = definition
        pool.fn = function_of(definition)
        # "Subsequent deployments of the App containing this Function will reset the autoscaler
        # back to its static configuration" (modal 1.6.4 Function.update_autoscaler docstring).
        if pool.override.ListFields():
            log.info("runtime: function %s redeployed: autoscaler override dropped", definition.id)
        pool.override = api_pb2.AutoscalerSettings()
        pool.settings = Settings.of(pool.fn)
        pool.backoff_until = 0.0
        pool.failures = 0
        pool.last_failure = ""
        pool.next_run = None
        log.info(
            "runtime: function %s changed (definition %s): rolling %d container(s)",
            pool.fn.function_name,
            definition.id,
            old_live,
        )
        pool.notify()

    def _retire(self, pool: Pool) -> None:
        pool.retired = True
        log.info("runtime: function %s is no longer deployed; stopping it", pool.function_id)
        for c in list(pool.containers.values()):
            self._spawn_stop(c)
        self.calls.fail_queued(
            pool.function_id, f"App {pool.app_id} was stopped before this input ran."
        )
        self.calls.wake(pool.function_id)
        pool.notify()

    def pool_for(self, function_id: str) -> Pool:
        """The pool of a function, created on demand (e.g. `.remote()` in an ephemeral app)."""
        pool = self.pools.get(function_id)
        if pool is not None and not pool.retired:
            return pool
        definition = self.state.apps.deployed_definition(function_id)
        fn_app = self._app_of_function(function_id)
        pool = self._new_pool(fn_app, definition)
        self.pools[function_id] = pool
        return pool

    # ---- autoscaler overrides (Function.update_autoscaler / autoscaler.update) ---------------
    def static_autoscaler(self, pool: Pool) -> api_pb2.AutoscalerSettings:
        """The deployed (decorator) settings, in the shape the client reads."""
        s = Settings.of(pool.fn)
        a = pool.fn.autoscaler_settings
        return api_pb2.AutoscalerSettings(
            min_containers=s.min_containers,
            max_containers=s.max_containers or 0,
            buffer_containers=a.buffer_containers if a.HasField("buffer_containers") else 0,
            scaledown_window=int(s.scaledown_window),
        )

    def effective_autoscaler(self, pool: Pool) -> api_pb2.AutoscalerSettings:
        merged = self.static_autoscaler(pool)
        merged.MergeFrom(pool.override)  # only the fields the override set
        return merged

    def update_autoscaler(
        self, function_id: str, settings: api_pb2.AutoscalerSettings
    ) -> api_pb2.AutoscalerSettings:
        """Merge `settings` (the fields it sets) into the function's override and apply it at
        once; answers the effective settings. The pool must be deployed (KeyError if not)."""
        pool = self.pools.get(function_id)
        if pool is None or pool.retired:
            raise KeyError(function_id)
        pool.override.MergeFrom(settings)
        eff = self.effective_autoscaler(pool)
        pool.settings.min_containers = eff.min_containers
        pool.settings.max_containers = eff.max_containers or None
        pool.settings.scaledown_window = float(eff.scaledown_window)
        log.info(
            "runtime: function %s autoscaler override: min %d, max %s, scaledown %d s",
            function_id,
            eff.min_containers,
            eff.max_containers or "unbounded",
            eff.scaledown_window,
        )
        pool.notify()
        self.wake()
        return eff

    def _app_of_function(self, function_id: str) -> App:
        with self.state.store.read() as db:
            row = db.execute("SELECT app_id FROM functions WHERE id = ?", (function_id,)).fetchone()
        return self.state.apps.get(row["app_id"])

    # ---- autoscaling -----------------------------------------------------------------------
    def total_live(self) -> int:
        return sum(1 for c in self.tasks.values() if c.alive)

    def fire_schedule(self, function_id: str, reason: str = "schedule") -> str:
        """Run a function now with no arguments, as its schedule does; the call id."""
        from modal._serialization import serialize

        pool = self.pool_for(function_id)
        call = self.calls.create(function_id)
        item = api_pb2.FunctionInput(
            args=serialize(((), {})), data_format=api_pb2.DATA_FORMAT_PICKLE
        )
        if pool.fn.is_class or pool.fn.function_name.endswith(".*"):
            item.method_name = pool.fn.function_name.rsplit(".", 1)[-1]
        self.calls.add_input(call, 0, item)
        log.info("runtime: %s: %s (call %s)", pool.fn.function_name, reason, call.id)
        self.wake()
        return call.id

    def pause_schedule(self, environment: str, app: str, function: str, paused: bool) -> None:
        """Stop (or restart) the automatic runs of `function` of app `app` in `environment`
        (deployed or not yet); firing it from the control route still works."""
        key = (environment, app, function)
        if paused:
            self.paused_schedules.add(key)
        else:
            self.paused_schedules.discard(key)
        log.info(
            "runtime: %s/%s.%s: schedule %s",
            *key,
            "paused (fires only from /_emulator/schedules/run)" if paused else "resumed",
        )

    def _schedules(self, now: float | None = None) -> None:
        """Fire the deployed scheduled functions that are due (`now`: epoch seconds)."""
        now = time.time() if now is None else now
        paused = self.paused_schedules
        for pool in self.pools.values():
            if pool.retired or not pool.fn.HasField("schedule"):
                continue
            try:
                app = self.state.apps.get(pool.app_id)  # one lookup: deployed, and paused
            except NotFound:
                continue
            if not app.deployed:
                continue
            if paused and (app.env_name, app.name or "", pool.fn.function_name) in paused:
                pool.next_run = None  # on resume, the next run is counted from then: no burst
                continue
            if pool.next_run is None:
                try:
                    pool.next_run = schedules.next_run(pool.fn.schedule, now)
                except ValueError as exc:
                    log.warning("runtime: %s: bad schedule: %s", pool.fn.function_name, exc)
                    pool.next_run = float("inf")
                continue
            if now >= pool.next_run:
                pool.next_run = schedules.next_run(pool.fn.schedule, now)
                self.fire_schedule(pool.function_id)

    def autoscale(self) -> None:
        self._schedules()
        now = time.monotonic()
        for pool in list(self.pools.values()):
            if pool.retired:
                if not any(c.alive for c in pool.containers.values()):
                    self.pools.pop(pool.function_id, None)
                continue
            s = pool.settings
            current = pool.live(current_only=True)
            # startup timeout
            for c in current:
                if c.state == "starting" and now - c.last_active > s.startup_timeout:
                    c.failure = (
                        f"container {c.task_id} was not ready within the startup timeout "
                        f"({s.startup_timeout:g} s)"
                    )
                    self._log_info(c, c.failure + "; killing it")
                    pool.last_failure = c.failure
                    pool.back_off()
                    c.state = "failed"
                    self._spawn_stop(c, grace=0.0)
                    pool.notify()
            current = pool.live(current_only=True)
            demand = self._demand(pool)
            want = max(s.min_containers, demand)
            old = [c for c in pool.live() if c.definition_id != pool.definition.id]
            if old:
                want = max(want, len([c for c in old if c.state == "ready"]), 1)
            if s.max_containers is not None:
                want = min(want, s.max_containers)
            if not self.use_netns and s.kind == "server":
                # Host network: one container per fixed port at a time (docs/emulator.md). A
                # new version replaces the old one by stopping it first (no rolling).
                want = min(want, 1)
                if old and want:
                    for c in old:
                        self._spawn_stop(c)
                if self._port_holder(pool) is not None:
                    want = min(want, len(current))
            if now >= pool.backoff_until:
                while len(current) < want and self.total_live() < self.options.max_containers:
                    current.append(self._start(pool))
            ready_new = [c for c in current if c.state == "ready"]
            # rolling: old containers go once the new version serves
            if old and (len(ready_new) >= max(1, min(want, len(old))) or want == 0):
                for c in old:
                    self._spawn_stop(c)
            # scale down idle containers above min_containers
            idle = [
                c
                for c in ready_new
                if c.in_flight == 0 and now - c.last_active > s.scaledown_window
            ]
            excess = len(current) - max(s.min_containers, demand)
            for c in idle[: max(excess, 0)]:
                self._log_info(c, f"idle for {s.scaledown_window:g} s: scaling down")
                self._spawn_stop(c)

    def _port_holder(self, pool: Pool) -> ct.Container | None:
        """Host network only: a live server container (of any pool) on this pool's port."""
        for other in self.pools.values():
            if other.settings.kind != "server" or other.settings.port != pool.settings.port:
                continue
            for c in other.containers.values():
                if c.alive and (other is not pool or c.definition_id != pool.definition.id):
                    return c
        return None

    def _demand(self, pool: Pool) -> int:
        s = pool.settings
        if s.kind == "server":
            busy = sum(c.in_flight for c in pool.live(current_only=True)) + pool.waiting
            if busy == 0:
                return 0
            return math.ceil(busy / s.concurrency) if s.concurrency else 1
        queued = len(self.calls.queue(pool.function_id))
        running = sum(c.in_flight for c in pool.live(current_only=True))
        work = queued + running
        return math.ceil(work / s.concurrency) if work else 0

    # ---- containers ------------------------------------------------------------------------
    def _start(self, pool: Pool) -> ct.Container:
        task_id = new_id("task")
        c = ct.Container(
            task_id=task_id,
            app_id=pool.app_id,
            function_id=pool.function_id,
            definition_id=pool.definition.id,
            kind=pool.settings.kind,
            concurrency=pool.settings.concurrency or 1_000_000,
        )
        pool.containers[task_id] = c
        self.tasks[task_id] = c
        task = asyncio.get_running_loop().create_task(self._launch(pool, c))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return c

    def _container_args(self, pool: Pool, task_id: str) -> api_pb2.ContainerArguments:
        fn = pool.fn
        args = api_pb2.ContainerArguments(
            task_id=task_id,
            function_id=pool.function_id,
            app_id=pool.app_id,
            environment_name=pool.env_name,
        )
        args.function_def.CopyFrom(fn)
        layout = args.app_layout
        version = self.state.apps.current_version(pool.app_id)
        function_ids = dict(version.function_ids) if version else {}
        class_ids = dict(version.class_ids) if version else {}
        definition_ids = dict(version.definition_ids) if version else {}
        if pool.function_id not in function_ids.values():
            function_ids[fn.function_name] = pool.function_id
        layout.function_ids.update(function_ids)
        layout.class_ids.update(class_ids)
        seen: set[str] = set()
        for fid in function_ids.values():
            try:
                d = (
                    self.state.apps.get_definition(definition_ids[fid])
                    if fid in definition_ids
                    else self.state.apps.latest_definition(fid)
                )
            except Exception:  # noqa: S112 (no definition: the object is left out)
                continue
            if fid == pool.function_id:
                d = pool.definition
            obj = layout.objects.add(object_id=fid)
            obj.function_handle_metadata.ParseFromString(d.handle)
            seen.add(fid)
        for cid in class_ids.values():
            if cid not in seen:
                layout.objects.add(
                    object_id=cid, class_handle_metadata=api_pb2.ClassHandleMetadata()
                )
                seen.add(cid)
        for dep in fn.object_dependencies:
            if dep.object_id not in seen:
                layout.objects.add(object_id=dep.object_id)
                seen.add(dep.object_id)
        return args

    async def _launch(self, pool: Pool, c: ct.Container) -> None:
        try:
            fn = pool.fn
            root = await asyncio.to_thread(
                materialize, self.state, self._roots, mount_ids_for(self.state, fn)
            )
            env = self._base_env()
            env.update(container_env(self.state, fn))
            workdir = self._sock_dir / c.task_id
            workdir.mkdir(parents=True, exist_ok=True)
            sock = workdir / "modal.sock"
            await self._serve_socket(c.task_id, sock)
            env.update(
                {
                    "MODAL_SERVER_URL": f"unix://{sock}",
                    "MODAL_IS_REMOTE": "1",
                    "MODAL_TASK_ID": c.task_id,
                    "MODAL_ENVIRONMENT": pool.env_name,
                    "MODAL_IMAGE_ID": fn.image_id,
                    "MODAL_CLOUD_PROVIDER": "CLOUD_PROVIDER_EMULATOR",
                    "MODAL_REGION": "local",
                }
            )
            if not self.use_mountns:
                env["HOME"] = str(root / "root")
            volumes = []
            for vm in fn.volume_mounts:
                host_dir = self._volumes / vm.volume_id
                host_dir.mkdir(parents=True, exist_ok=True)
                volumes.append(ct.VolumeBind(host_dir, vm.mount_path, vm.read_only))
            spec = ct.LaunchSpec(
                task_id=c.task_id,
                workdir=workdir,
                root=root,
                env=env,
                volumes=volumes,
                netns=self.use_netns,
                mountns=self.use_mountns,
                hidden=[*self.options.hidden, self.options.data_dir, self._sock_dir],
                python=self.options.python,
                args_bytes=self._container_args(pool, c.task_id).SerializeToString(),
            )
            if c.stop_requested:
                raise RuntimeError("stopped before it started")
            await ct.launch(c, spec, self._on_line, self._on_exit)
            self._log_info(c, f"container {c.task_id} started")
            if c.kind == "server":
                asyncio.get_running_loop().create_task(self._health_check(pool, c))
        except Exception as exc:
            log.exception("runtime: container %s failed to launch", c.task_id)
            c.state = "failed"
            c.failure = f"could not start: {exc}"
            pool.last_failure = c.failure
            pool.back_off()
            c.exited.set()
            self._release_socket(c.task_id)
            pool.notify()

    def _base_env(self) -> dict[str, str]:
        python_dir = str(Path(self.options.python).parent)
        env = {
            "PATH": python_dir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONUNBUFFERED": "1",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": "/root",
        }
        for key in ("TZ", "LD_LIBRARY_PATH", "SSL_CERT_FILE"):
            if key in os.environ:
                env[key] = os.environ[key]
        return env

    async def _serve_socket(self, task_id: str, path: Path) -> None:
        from grpclib.server import Server

        server = Server([self._servicer_factory(task_id)])
        await server.start(path=str(path))
        self._servers[task_id] = server

    def _release_socket(self, task_id: str) -> None:
        server = self._servers.pop(task_id, None)
        if server is not None:
            server.close()

    async def _health_check(self, pool: Pool, c: ct.Container) -> None:
        """A server is ready once it said so (ContainerServerLifecycleReady) and its port answers.

        Modal's container never checks the port itself (measured: it reports ready when
        `@modal.enter` returns); the platform health-checks `http_config.port`.
        """
        port = pool.settings.port
        while c.state == "starting":
            if c.lifecycle_ready:
                try:
                    _reader, writer = await asyncio.wait_for(
                        netns.connect(c.pid if c.netns else None, port), 1.0
                    )
                    writer.close()
                    c.state = "ready"
                    pool.failures = 0
                    c.ready_at = time.time()
                    c.last_active = time.monotonic()
                    self._log_info(
                        c,
                        f"container {c.task_id} ready: port {port} answers "
                        f"({c.ready_at - c.created_at:.2f} s after start)",
                    )
                    pool.notify()
                    return
                except (OSError, TimeoutError):
                    pass
            await asyncio.sleep(0.02)

    def _on_line(self, c: ct.Container, fd: int, line: str) -> None:
        self.logs.add(c.app_id, c.function_id, c.task_id, fd, line)
        log.debug("container %s: %s", c.task_id, line.rstrip("\n"))

    def _log_info(self, c: ct.Container, message: str) -> None:
        log.info("runtime: %s", message)
        self.logs.add(c.app_id, c.function_id, c.task_id, INFO, message + "\n")

    def _on_exit(self, c: ct.Container) -> None:
        self._release_socket(c.task_id)
        if self.edge is not None:
            self.edge.forget(c.task_id)
        expected = c.stop_requested or self._closing
        was = c.state
        if not expected and not c.failure:
            c.failure = f"container {c.task_id} exited unexpectedly (exit code {c.exit_code})"
        c.state = "stopped" if expected and was != "failed" else "failed"
        self._log_info(
            c,
            f"container {c.task_id} exited with code {c.exit_code}"
            + ("" if expected else " (crashed: it will be replaced)"),
        )
        if not expected and c.tail:
            log.warning(
                "runtime: last output of container %s:\n  %s", c.task_id, "\n  ".join(c.tail)
            )
        pool = self.pools.get(c.function_id)
        if pool is not None:
            if not expected:
                pool.last_failure = c.failure
                if was == "starting":
                    pool.back_off()
                    others = [x for x in pool.live(current_only=True) if x.task_id != c.task_id]
                    if not others:  # nothing else can take the queued inputs: they fail
                        detail = "\n".join(c.tail)
                        self.calls.fail_queued(
                            c.function_id,
                            f"{c.failure} while starting; its last output:\n{detail}",
                        )
            pool.notify()
        self.calls.fail_task(c.task_id, c.failure or f"container {c.task_id} stopped")
        self.wake()

    def _spawn_stop(self, c: ct.Container, grace: float | None = None) -> None:
        if c.stop_requested and c.state != "failed":
            return
        c.stop_requested = True
        task = asyncio.get_running_loop().create_task(self._stop_container(c, grace))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop_container(self, c: ct.Container, grace: float | None = None) -> None:
        grace = self.options.stop_grace if grace is None else grace
        c.stop_requested = True
        if c.state in ("starting", "ready"):
            c.state = "stopping"
        if c.kind == "function" and grace > 0 and c.proc is not None:
            # a function container leaves on a kill-switch input (runs @exit), like Modal's
            self.calls.wake(c.function_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.exited.wait(), min(grace, 3.0))
        await ct.stop(c, grace)

    async def stop_task(self, task_id: str) -> None:
        c = self.tasks.get(task_id)
        if c is not None:
            await self._stop_container(c)

    # ---- what the container RPCs report --------------------------------------------------
    def container(self, task_id: str) -> ct.Container | None:
        return self.tasks.get(task_id)

    def server_ready(self, task_id: str) -> None:
        c = self.tasks.get(task_id)
        if c is not None:
            c.lifecycle_ready = True
            self._log_info(c, f"container {task_id}: @enter done (ContainerServerLifecycleReady)")

    def task_result(self, task_id: str, result: api_pb2.GenericResult) -> None:
        c = self.tasks.get(task_id)
        if c is None:
            return
        if result.status != api_pb2.GenericResult.GENERIC_STATUS_SUCCESS:
            c.failure = result.exception or "container failed"
            self._log_info(c, f"container {task_id} failed: {c.failure}")
            pool = self.pools.get(c.function_id)
            if pool is not None:
                pool.last_failure = c.failure
                pool.back_off()
                if not [x for x in pool.live(current_only=True) if x.task_id != task_id]:
                    self.calls.fail_queued(c.function_id, c.failure, result.traceback)
                pool.notify()

    # ---- what the edge asks ------------------------------------------------------------------
    def route(self, url: str) -> Pool | None:
        for pool in self.pools.values():
            if not pool.retired and url in pool.urls:
                return pool
        return None

    async def acquire(self, pool: Pool, timeout: float) -> ct.Container:
        """A ready container of `pool` with a free slot (its in_flight taken), cold-starting one.

        NoCapacity when every container is full and no more may start; StartFailed when the
        container started for this request failed (or none got ready within `timeout`).
        """
        deadline = time.monotonic() + timeout
        pool.waiting += 1
        try:
            while True:
                if pool.retired:
                    raise StartFailed("the app was stopped")
                ready = [c for c in pool.live() if c.state == "ready" and c.free_slots > 0]
                # prefer the current version, then the least busy, then the least recently used
                ready.sort(
                    key=lambda c: (
                        c.definition_id != pool.definition.id,
                        c.in_flight,
                        c.last_active,
                    )
                )
                if ready:
                    c = ready[0]
                    c.in_flight += 1
                    c.last_active = time.monotonic()
                    return c
                live = pool.live(current_only=True)
                if not live and not self.use_netns and pool.settings.kind == "server":
                    holder = self._port_holder(pool)
                    if holder is not None and holder.function_id != pool.function_id:
                        raise StartFailed(
                            f"port {pool.settings.port} is held by container {holder.task_id} "
                            f"(function {holder.function_id}): on the host network only one "
                            "container per fixed port can run; stop that app, or run the "
                            "emulator as root for a network namespace per container"
                        )
                starting = [c for c in live if c.state == "starting"]
                cap = pool.settings.max_containers
                room = (cap is None or len(live) < cap) and (
                    self.total_live() < self.options.max_containers
                )
                if not starting and not room:
                    raise NoCapacity(
                        f"all {len(live)} container(s) are at max concurrency "
                        f"({pool.settings.concurrency}) and max_containers is {cap}"
                    )
                if not starting and time.monotonic() < pool.backoff_until and pool.last_failure:
                    raise StartFailed(pool.last_failure)
                self.wake()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StartFailed(pool.last_failure or "no container got ready in time")
                changed = pool.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(remaining, 0.25))
                if (
                    pool.last_failure
                    and not [c for c in pool.live() if c.state != "failed"]
                    and time.monotonic() < pool.backoff_until
                ):
                    raise StartFailed(pool.last_failure)
        finally:
            pool.waiting -= 1

    def release(self, pool: Pool, c: ct.Container) -> None:
        c.in_flight = max(c.in_flight - 1, 0)
        c.last_active = time.monotonic()
        pool.notify()

    # ---- introspection --------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "task_id": c.task_id,
                "app_id": c.app_id,
                "function_id": c.function_id,
                "definition_id": c.definition_id,
                "kind": c.kind,
                "state": c.state,
                "pid": c.pid,
                "in_flight": c.in_flight,
                "created_at": c.created_at,
                "ready_at": c.ready_at,
                "stopped_at": c.stopped_at,
                "exit_code": c.exit_code,
                "failure": c.failure,
                "netns": c.netns,
                "mountns": c.mountns,
                "workdir": str(self._sock_dir / c.task_id),
            }
            for c in self.tasks.values()
        ]

    def tasks_of_app(self, app_id: str) -> list[ct.Container]:
        return [c for c in self.tasks.values() if c.app_id == app_id and c.alive]
