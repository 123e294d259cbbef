"""One container: a child process running modal's own container entrypoint.

`python -m modal._container_entrypoint` (the pinned modal client, unchanged) is started with
what Modal's workers give it (reference: shared/reference/modal-container-runtime.md,
measured; modal-labs/modal-client test/container_test.py `_run_container` does the same):
MODAL_CONTAINER_ARGUMENTS_PATH (a serialized ContainerArguments), MODAL_SERVER_URL (here a
unix socket of the emulator's, one per container so every RPC is known to come from it),
MODAL_IS_REMOTE=1 and MODAL_TASK_ID. No token is handed to it (a container's client sends
none).

Process hygiene: the container is the leader of its own process group (everything it starts
is in it); a stop sends SIGTERM to the container process only (so `@modal.exit` runs and can
stop its own children, as on Modal), then SIGKILL to the whole group after the grace period.
When the container process exits for any reason (even `kill -9`), whatever is left in its
group is killed. PR_SET_PDEATHSIG makes the kernel kill the container if the emulator itself
dies without cleaning up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import os
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from emulator.runtime.materialize import PathMount, outside_root_mounts

log = logging.getLogger("emulator.runtime")

PR_SET_PDEATHSIG = 1
#: The address of `eth0` inside every container's own network namespace.
CONTAINER_IP = "10.200.0.2"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class VolumeBind:
    host_dir: Path
    mount_path: str
    read_only: bool = False


@dataclass
class LaunchSpec:
    """Everything needed to start one container process."""

    task_id: str
    workdir: Path  # per-container: arguments file, unix socket
    root: Path  # materialised files; root/"root" is what the container sees at /root
    env: dict[str, str]
    volumes: list[VolumeBind]
    netns: bool
    python: str = sys.executable
    args_bytes: bytes = b""


@dataclass
class Container:
    """A running (or finished) container and what the runtime tracks about it."""

    task_id: str
    app_id: str
    function_id: str
    definition_id: str
    kind: str  # "server" | "function"
    concurrency: int
    state: str = "starting"  # starting -> ready -> stopping -> stopped | failed
    pid: int | None = None
    created_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    stopped_at: float | None = None
    last_active: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    lifecycle_ready: bool = False
    failure: str = ""
    exit_code: int | None = None
    stop_requested: bool = False
    proc: asyncio.subprocess.Process | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    netns: bool = False
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=8))  # last output lines

    @property
    def alive(self) -> bool:
        return self.state in ("starting", "ready", "stopping")

    @property
    def free_slots(self) -> int:
        if self.state != "ready" or self.stop_requested:
            return 0  # a container being stopped takes no new request
        return max(self.concurrency - self.in_flight, 0)


def command(spec: LaunchSpec) -> tuple[list[str], Path]:
    """(argv, cwd) for the container process."""
    entry = [spec.python, "-m", "modal._container_entrypoint"]
    if not spec.netns:
        return entry, spec.root / "root"
    # The script below `cd`s before it mounts: every host path in it must be absolute (the
    # emulator's --state may be relative, e.g. `--state .modal-emulator/state.sqlite3`).
    spec = dataclasses.replace(
        spec,
        root=spec.root.absolute(),
        workdir=spec.workdir.absolute(),
        volumes=[dataclasses.replace(v, host_dir=v.host_dir.absolute()) for v in spec.volumes],
    )
    steps = ["ip link set lo up"]
    # An `eth0` as Modal containers have: modal's `@web_server` wrapper reaches the user's
    # server on eth0's address (modal/_runtime/user_code_imports.py, get_ip_address(b"eth0")),
    # so a server must listen on 0.0.0.0 as on Modal. A veth pair whose peer stays inside.
    steps.append(
        "{ ip link add eth0 type veth peer name eth0-peer && "
        f"ip addr add {CONTAINER_IP}/24 dev eth0 && ip link set eth0 up && "
        "ip link set eth0-peer up; } || echo 'emulator: no eth0 in this container' >&2"
    )
    # /root is an overlay: the app's files on top of the machine's own /root (which may hold
    # the interpreter, e.g. pyenv), writes going to a per-container layer (ephemeral, like a
    # Modal container's filesystem). The machine's /root is never written.
    upper, work = spec.workdir / "upper", spec.workdir / "overlay-work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    app_root = shlex.quote(str(spec.root / "root"))
    steps.append(
        f"if mount -t overlay overlay -o lowerdir={app_root}:/root,"
        f"upperdir={shlex.quote(str(upper))},workdir={shlex.quote(str(work))} /root; "
        f"then cd /root; else echo 'emulator: no overlay for /root; cwd is {app_root}' >&2; "
        f"cd {app_root}; fi"
    )
    # Files the image copied outside /root (e.g. /opt/serving/spec.json), at their paths.
    for index, pm in enumerate(outside_root_mounts(spec.root)):
        steps.append(_path_mount_step(pm, spec.workdir / "layers" / str(index)))
    for vol in spec.volumes:
        target = shlex.quote(vol.mount_path)
        steps.append(f"mkdir -p {target}")
        steps.append(f"mount --bind {shlex.quote(str(vol.host_dir))} {target}")
        if vol.read_only:
            steps.append(f"mount -o remount,bind,ro {target}")
    steps.append('exec "$@"')
    script = " && ".join(steps)
    argv = ["unshare", "--net", "--mount", "--propagation", "private", "--"]
    argv += ["/bin/sh", "-c", script, "container", *entry]
    return argv, spec.root / "root"


def _path_mount_step(pm: PathMount, layer: Path) -> str:
    """One shell step showing image files at `pm.target`; a failure is a warning, not fatal."""
    src, target = shlex.quote(str(pm.source)), shlex.quote(pm.target)
    if pm.kind == "overlay":
        upper, work = layer / "upper", layer / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        mount = (
            f"mount -t overlay overlay -o lowerdir={src}:{target},"
            f"upperdir={shlex.quote(str(upper))},workdir={shlex.quote(str(work))} {target}"
        )
    elif pm.kind == "bind-dir":  # a new top-level directory: an empty mount point is made
        mount = f"mkdir -p {target} && mount --bind {src} {target}"
    else:
        mount = f"mount --bind {src} {target}"
    warn = shlex.quote(f"emulator: cannot show the image's files at {pm.target} in this container")
    return f"{{ {mount} || echo {warn} >&2; }}"


def _fallback_volume_links(spec: LaunchSpec) -> None:
    """Without a mount namespace a volume appears at its path through a symlink, if free."""
    for vol in spec.volumes:
        path = Path(vol.mount_path)
        if path.is_symlink() and path.resolve() == vol.host_dir.resolve():
            continue
        if path.exists() or path.is_symlink():
            log.warning(
                "volume path %s exists on this machine; without a mount namespace the "
                "container sees that path, not the volume (run the emulator as root)",
                path,
            )
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(vol.host_dir, target_is_directory=True)
        except OSError as exc:
            log.warning("volume path %s: cannot link it to %s: %s", path, vol.host_dir, exc)


async def launch(
    container: Container,
    spec: LaunchSpec,
    on_line: Callable[[Container, int, str], None],
    on_exit: Callable[[Container], None],
) -> None:
    """Start the process; stream its output to `on_line`; call `on_exit` when it ends."""
    spec.workdir.mkdir(parents=True, exist_ok=True)
    args_path = spec.workdir / "container_arguments.bin"
    args_path.write_bytes(spec.args_bytes)
    if not spec.netns:
        _fallback_volume_links(spec)
        for pm in outside_root_mounts(spec.root):
            log.warning(
                "container %s: the image's files at %s are not visible (no mount namespace on "
                "the host network; they are under %s)",
                container.task_id,
                pm.target,
                pm.source,
            )
    argv, cwd = command(spec)
    env = dict(spec.env)
    env["MODAL_CONTAINER_ARGUMENTS_PATH"] = str(args_path)
    container.netns = spec.netns
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    container.proc = proc
    container.pid = proc.pid
    log.info(
        "container %s started (pid %d) for function %s",
        container.task_id,
        proc.pid,
        container.function_id,
    )

    async def pump(stream: asyncio.StreamReader | None, fd: int) -> None:
        if stream is None:
            return
        while True:
            try:
                line = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):
                line = await stream.read(1 << 16)
            if not line:
                return
            text = line.decode("utf-8", errors="replace")
            container.tail.append(text.rstrip("\n"))
            on_line(container, fd, text)

    async def watch() -> None:
        pumps = asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
        netns = asyncio.ensure_future(_own_netns_of(proc.pid)) if spec.netns else None
        # Processes it started keep its output pipes open (and asyncio's wait() waits for
        # them): a pidfd says when the container process itself has exited.
        await _exited(proc.pid)
        kill_group(proc.pid, signal.SIGKILL)  # whatever it left behind
        if netns is not None:
            # ...also what left its process group (e.g. started with start_new_session, as
            # serving/engine.py starts the proxy): everything in the container's network
            # namespace is the container's, and a container's end is the end of all of it,
            # as on Modal. Without this, such a process outlives the emulator itself.
            ns = netns.result() if netns.done() else None
            netns.cancel()
            if ns is not None and (killed := kill_netns(ns)):
                log.info(
                    "container %s: killed %d process(es) it left in its network namespace",
                    container.task_id,
                    killed,
                )
        container.exit_code = await proc.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pumps, 2.0)
        container.stopped_at = time.time()
        container.exited.set()
        on_exit(container)

    asyncio.get_running_loop().create_task(watch(), name=f"container-{container.task_id}")


def _netns_of(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


async def _own_netns_of(pid: int) -> str | None:
    """The network namespace container process `pid` moved into (`unshare --net`), or None.

    `unshare` creates it just after the process starts: poll until the link differs from
    the emulator's own (a few ms), for at most 5 s.
    """
    own = _netns_of("self")
    for _ in range(500):
        ns = _netns_of(pid)
        if ns is None:
            return None
        if ns != own:
            return ns
        await asyncio.sleep(0.01)
    return None


def kill_netns(ns: str) -> int:
    """SIGKILL every process whose network namespace is `ns`; how many there were."""
    killed = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _netns_of(entry) == ns:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


async def _exited(pid: int) -> None:
    """Return once process `pid` has exited (it may still be a zombie)."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def kill_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop(container: Container, grace: float) -> None:
    """SIGTERM the container process (`@modal.exit` runs), SIGKILL its group after `grace`."""
    container.stop_requested = True
    if container.state in ("starting", "ready"):
        container.state = "stopping"
    proc = container.proc
    if proc is None or container.exited.is_set():
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(container.exited.wait(), grace)
    except TimeoutError:
        log.warning(
            "container %s did not exit %.0f s after SIGTERM; killing it", container.task_id, grace
        )
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(container.exited.wait(), 5)
