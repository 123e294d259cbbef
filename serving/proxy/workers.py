"""``--workers N``: N proxy processes on one port, like the engine's ``--api-server-count``.

Why: a burst of requests (256 streams ending together, the next 256 arriving together) is
served one request at a time by one process (~150-200 us of CPU each), so the burst's last
request waited 30-50 ms; N processes take the burst in parallel (docs/proxy.md, "Workers").

- **Binding**: the main process binds the port with SO_REUSEPORT (it holds it, not listening:
  that reserves the port, checks it can be bound, and resolves ``--port 0``), then starts N
  worker processes that each bind the same port with SO_REUSEPORT and listen; the kernel
  spreads new connections across the listening sockets (a connection stays with the worker
  that accepted it).
- **Workers**: each runs the same server as one process does (serving/proxy/runner.py): its
  own event loop, engine connection pool, /health poller and request-id prefix.
- **One in-flight limit**: ``SharedInFlight``, the admission counts (total, per key, waiting;
  serving/proxy/admission.py) in shared memory under a lock; admission takes a slot
  (fairly between keys, whichever worker holds the slots) and ``ProxyApp._end`` gives it
  back. The one cost per request N = 1 does not pay: an uncontended lock (a
  ``sem_trywait``) twice.
- **One /metrics**: each worker writes its metrics' state (JSON) to its own file in a private
  directory every ``PUBLISH_S`` (only when it changed) and when its engine readiness
  changes; the worker that answers /metrics sums its live state and the others' files
  (``Metrics.merged``); ``proxy_in_flight`` is read from the shared counter.
- **Supervision**: the main process forwards SIGTERM/SIGINT to the workers (each drains as
  one process does), and when a worker dies unexpectedly it logs which, with its exit code
  and what to do, stops the others and exits 1. Workers get SIGTERM when the main process
  dies (Linux ``PR_SET_PDEATHSIG``), so none is left behind. The metrics directory of a main
  process killed by SIGKILL is removed by the next one to start (``sweep_stale_boards``).

``--workers 1`` uses none of this: the CLI serves in its own process as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from serving.proxy.admission import Admission, cells_needed
from serving.proxy.app import ProxyApp, ProxyConfig
from serving.proxy.keys import ENV_VAR, KeyRing
from serving.proxy.logs import configure_logging, event_log, log_event
from serving.proxy.metrics import Metrics
from serving.proxy.runner import bind, run_uvicorn, tune_gc

PUBLISH_S = 0.5  # a worker's metrics reach the others' /metrics at most this late
STOP_GRACE_S = 40.0  # after SIGTERM: the workers' 30 s drain, then SIGKILL for what is left


class SharedInFlight(NamedTuple):
    """The in-flight counts of all workers, per key (admission.Admission's cells), in shared
    memory, under one lock (``--workers``): every worker admits against the same slots,
    per-key counts and waiting requests."""

    cells: Any  # a multiprocessing RawArray("q", admission.cells_needed(keys))
    lock: Any  # a multiprocessing Lock


class WorkerShare:
    """What one worker shares with the others: the in-flight count and its metrics."""

    def __init__(self, index: int, count: int, in_flight: SharedInFlight, board: str) -> None:
        self.index = index
        self.count = count
        self.in_flight = in_flight
        self.board = Path(board)
        self._metrics: Metrics | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._published = b""

    def _file(self, index: int) -> Path:
        return self.board / f"worker-{index}.json"

    def start(self, metrics: Metrics) -> None:
        """Publish ``metrics`` now and every ``PUBLISH_S`` (call from the worker's loop)."""
        self._metrics = metrics
        self.publish()
        self._timer = asyncio.get_running_loop().call_later(PUBLISH_S, self._tick)

    def _tick(self) -> None:
        try:
            self.publish()
        except Exception:  # never let publishing stop: /metrics would freeze
            event_log.exception("publishing this worker's metrics failed")
        self._timer = asyncio.get_running_loop().call_later(PUBLISH_S, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(OSError):
            self.publish()

    def publish(self) -> None:
        """Write this worker's metrics state to its file, if it changed (atomically: the
        others read a whole old or a whole new file)."""
        if self._metrics is None:
            return
        data = json.dumps(self._metrics.state(), separators=(",", ":")).encode()
        if data == self._published:
            return
        path = self._file(self.index)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self._published = data

    def render(self, own: Metrics, admission: Admission) -> bytes:
        """/metrics for the whole proxy: ``own`` (live) plus the other workers' last published
        states, summed; ``proxy_in_flight`` and ``proxy_waiting`` from the shared admission
        counts; ``proxy_engine_ready`` 1 only when every worker has published and sees the
        engine ready."""
        states: list[dict[str, Any]] = [own.state()]
        complete = True
        for index in range(self.count):
            if index == self.index:
                continue
            try:
                states.append(json.loads(self._file(index).read_bytes()))
            except (OSError, ValueError):
                complete = False  # not published yet (starting)
        total = Metrics.merged(states)
        total.in_flight = admission.total
        total.waiting = admission.waiting
        total.engine_ready = total.engine_ready and complete
        return total.render()


@dataclass
class WorkerPlan:
    """What a worker process needs (pickled to it by multiprocessing)."""

    index: int
    count: int
    config: ProxyConfig  # this worker's: its share of --max-buffered-bytes
    host: str
    port: int
    access_log: bool
    in_flight: SharedInFlight
    board: str
    parent_pid: int


def worker_config(config: ProxyConfig, workers: int) -> ProxyConfig:
    """A worker's settings: the buffer budget split evenly (each key's share of it then follows
    from the worker's budget); ``ValueError`` when a worker's part is below
    ``--max-body-bytes`` (one largest body must fit in every worker)."""
    share = config.max_buffered_bytes // workers
    if share < config.max_body_bytes:
        raise ValueError(
            f"--max-buffered-bytes {config.max_buffered_bytes} is split over --workers "
            f"{workers}: {share} bytes each, less than --max-body-bytes "
            f"{config.max_body_bytes} (one largest body must fit in a worker's part); raise "
            f"--max-buffered-bytes to at least {workers * config.max_body_bytes} or lower "
            "--workers or --max-body-bytes"
        )
    return dataclasses.replace(config, max_buffered_bytes=share)


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM to this worker when the main process dies (Linux): no orphan keeps the port."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the line above
        raise SystemExit(1)


def worker_main(plan: WorkerPlan) -> None:
    """A worker process: the proxy's server on its own SO_REUSEPORT socket."""
    _die_with_parent(plan.parent_pid)
    configure_logging(plan.access_log, shared_stream=True)
    keys = KeyRing.from_json(os.environ.get(ENV_VAR))  # checked by the main process already
    share = WorkerShare(plan.index, plan.count, plan.in_flight, plan.board)
    app = ProxyApp(plan.config, keys, share)
    sock = bind(plan.host, plan.port, reuse_port=True)
    log_event(logging.WARNING, "proxy_worker_started", worker=plan.index, pid=os.getpid())
    tune_gc()
    run_uvicorn(app, plan.config, sock, plan.access_log, shared_stream=True)
    logging.shutdown()  # flush the last access lines


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


# The metrics directory of a `--workers N` proxy: BOARD_PREFIX, its main process's pid, "-",
# mkdtemp's random part. The main process removes its own when it stops; one that was
# SIGKILLed cannot, so each new main process removes those of main processes gone.
BOARD_PREFIX = "serving-proxy-metrics-"


def boards_parent() -> str:
    """Where the metrics directories go: /dev/shm (tmpfs) when writable, else the temp dir."""
    shm = "/dev/shm"  # noqa: S108 - tmpfs; mkdtemp makes a private (0700) directory in it
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def sweep_stale_boards(parent: str) -> list[str]:
    """Remove the metrics directories in `parent` whose main process no longer exists (one
    SIGKILLed before it could clean up); returns their names. A directory of a live process,
    of another user, or not named as ours is left alone."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            pid_text, sep, _ = entry.name.removeprefix(BOARD_PREFIX).partition("-")
            if not (entry.name.startswith(BOARD_PREFIX) and sep and pid_text.isdigit()):
                continue
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            try:
                os.kill(int(pid_text), 0)
                continue  # alive (or another user's process of that pid): not ours to judge
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def run_workers(config: ProxyConfig, workers: int, host: str, port: int, access_log: bool) -> int:
    """The main process of ``--workers N``: start the workers, supervise them, forward
    SIGTERM/SIGINT; returns the exit status (0: stopped by a signal, every worker exited 0;
    1: a worker died, or did not stop cleanly)."""
    # "spawn": each worker starts a fresh interpreter and builds its own app. Forking this
    # process would copy its log flusher thread's state and locks mid-use (a fork copies no
    # threads), and forkserver's extra server process buys nothing for N long-lived workers.
    ctx = multiprocessing.get_context("spawn")
    per_worker = worker_config(config, workers)
    holder = bind(host, port, reuse_port=True)  # never listens: reserves the port
    port = holder.getsockname()[1]
    boards = boards_parent()
    sweep_stale_boards(boards)
    board = tempfile.mkdtemp(prefix=f"{BOARD_PREFIX}{os.getpid()}-", dir=boards)
    keys = KeyRing.from_json(os.environ.get(ENV_VAR))  # checked by the caller (__main__)
    in_flight = SharedInFlight(ctx.RawArray("q", cells_needed(len(keys.names))), ctx.Lock())
    procs: list[Any] = []
    state = {"stopping": False, "deadline": float("inf")}

    def stop_all(sig: signal.Signals = signal.SIGTERM) -> None:
        if not state["stopping"]:
            state["stopping"] = True
            state["deadline"] = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            if proc.exitcode is None and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    def on_signal(sig: int, frame: object) -> None:
        stop_all()  # SIGINT too is passed on as SIGTERM: each worker drains

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failed = False
    codes: dict[str, int | None] = {}
    try:
        for index in range(workers):
            plan = WorkerPlan(index, workers, per_worker, host, port, access_log, in_flight,
                              board, os.getpid())  # fmt: skip
            proc = ctx.Process(target=worker_main, args=(plan,), name=f"proxy-worker-{index}")
            proc.daemon = True  # terminated by multiprocessing if this process exits early
            proc.start()
            procs.append(proc)
            if state["stopping"]:  # a signal came while starting: pass it on to all
                stop_all()
                break
        pending = {proc.sentinel: (index, proc) for index, proc in enumerate(procs)}
        while pending:
            for sentinel in multiprocessing.connection.wait(list(pending), timeout=1.0):
                index, proc = pending.pop(sentinel)
                proc.join()
                code = codes[str(index)] = proc.exitcode
                if not state["stopping"]:
                    failed = True
                    log_event(
                        logging.ERROR, "proxy_worker_died", worker=index, pid=proc.pid,
                        exit_code=code, why=_describe(code),
                        action="stopping the other workers and exiting 1, so that the "
                        "container restarts the proxy; the worker's last log lines above say "
                        "why it stopped (a traceback, a bind error); killed by SIGKILL with "
                        "no such line usually means the kernel's OOM killer: give the "
                        "container more memory or run fewer --workers",
                    )  # fmt: skip
                    stop_all()
                elif code not in (0, -signal.SIGTERM):
                    # -SIGTERM: stopped before its handler was installed (it served nothing)
                    failed = True
                    log_event(
                        logging.ERROR, "proxy_worker_stop_failed", worker=index, pid=proc.pid,
                        exit_code=code, why=_describe(code),
                    )  # fmt: skip
            if pending and time.monotonic() > state["deadline"]:
                failed = True
                log_event(
                    logging.ERROR, "proxy_workers_killed", workers=sorted(i for i, _ in
                                                                       pending.values()),
                    why=f"still running {STOP_GRACE_S:g} s after SIGTERM",
                )  # fmt: skip
                stop_all(signal.SIGKILL)
                state["deadline"] = float("inf")
    finally:
        if any(proc.exitcode is None for proc in procs):  # only on an error of this process
            stop_all(signal.SIGKILL)
        holder.close()
        shutil.rmtree(board, ignore_errors=True)
    status = 1 if failed else 0
    log_event(logging.WARNING, "proxy_stopped", exit_codes=codes, exit_status=status)
    return status
