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
from pathlib import Path, PurePosixPath

from emulator.runtime.materialize import PathMount, outside_root_mounts
from emulator.runtime.netns import system_tool
from emulator.runtime.scratch import kill_recorded, start_time

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
    #: Its own mount and pid namespaces and root (see `command`); without them (no root or
    #: no `unshare`) it is a plain process on the machine's filesystem.
    mountns: bool = False
    #: The emulator's own files, covered in the container's root (see `command`): its state
    #: file, its data directory (every environment's volumes), the other containers' sockets.
    hidden: list[Path] = field(default_factory=list)


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
    #: The container's pid 1 (the init of its pid namespace, which forwards SIGTERM/SIGINT to
    #: the entrypoint); `pid` is the `unshare` process above it. None without namespaces.
    init_pid: int | None = None
    mountns: bool = False  # in its own mount and pid namespaces (see `command`)
    #: Without a pid namespace: the processes it started (pid -> start time), as last seen.
    descendants: dict[int, str] = field(default_factory=dict)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=8))  # last output lines

    @property
    def alive(self) -> bool:
        return self.state in ("starting", "ready", "stopping")

    @property
    def free_slots(self) -> int:
        if self.state != "ready" or self.stop_requested:
            return 0  # a container being stopped takes no new request
        return max(self.concurrency - self.in_flight, 0)


def _tool(name: str) -> str:
    """The absolute path of a system tool the container's setup runs: the container's own
    PATH (the one the script runs with) may lack /usr/sbin, where `chroot` and `ip` live."""
    return system_tool(name) or name


def command(spec: LaunchSpec, host_root: Path = Path("/")) -> tuple[list[str], Path]:
    """(argv, cwd) for the container process.

    With namespaces (`spec.mountns`: root and `unshare`, checked at start) the container gets
    its own mount and pid namespaces (and network namespace with `spec.netns`) and its own
    root: a tmpfs holding a recursive bind of each top-level entry of the machine's `/`, on
    which the container's own paths are mounted (its files at `/root` and elsewhere, its
    volumes), then `chroot`. A mount point that does not exist on the machine is created in
    that root (a new top-level directory on the tmpfs, a deeper one in an overlay of its
    deepest existing parent), never on the machine: before, `mkdir -p /weights` inside the
    mount namespace created `/weights` on the host (issue 22 item 8). Its pid 1 is a small
    shell that forwards SIGTERM/SIGINT to the entrypoint; when pid 1 ends, the kernel kills
    everything in the pid namespace, whatever session or group it moved to, and `unshare
    --kill-child` (with PR_SET_PDEATHSIG on `unshare`) ends pid 1 when the emulator dies, even
    by `kill -9` (issue 22 item 7: the serving proxy and engine outlived a crashed emulator).
    `host_root` is for tests (where the machine's top-level entries are read).
    """
    entry = [spec.python, "-m", "modal._container_entrypoint"]
    if not spec.mountns:
        return entry, spec.root / "root"
    # The script below `cd`s before it mounts: every host path in it must be absolute (the
    # emulator's --state may be relative, e.g. `--state .modal-emulator/state.sqlite3`).
    spec = dataclasses.replace(
        spec,
        root=spec.root.absolute(),
        workdir=spec.workdir.absolute(),
        volumes=[dataclasses.replace(v, host_dir=v.host_dir.absolute()) for v in spec.volumes],
    )
    q = shlex.quote
    ip, mount, chroot = (q(_tool(t)) for t in ("ip", "mount", "chroot"))
    new_root = spec.workdir / "rootfs"
    new_root.mkdir(parents=True, exist_ok=True)

    def at(path: str | PurePosixPath) -> str:  # a container path, in the new root
        return q(str(new_root) + str(path))

    steps = ["set -e"]
    if spec.netns:
        steps.append(f"{ip} link set lo up")
        # An `eth0` as Modal containers have: modal's `@web_server` wrapper reaches the user's
        # server on eth0's address (modal/_runtime/user_code_imports.py, get_ip_address(
        # b"eth0")), so a server must listen on 0.0.0.0 as on Modal. A veth pair whose peer
        # stays inside.
        steps.append(
            f"{{ {ip} link add eth0 type veth peer name eth0-peer && "
            f"{ip} addr add {CONTAINER_IP}/24 dev eth0 && {ip} link set eth0 up && "
            f"{ip} link set eth0-peer up; }} || echo 'emulator: no eth0 in this container' >&2"
        )
    steps.append(f"{mount} -t tmpfs -o mode=0755 emulator-root {q(str(new_root))}")
    for top in sorted(host_root.iterdir()):
        name = PurePosixPath("/", top.name)
        if top.is_symlink():
            steps.append(f"ln -s {q(os.readlink(top))} {at(name)}")
        elif top.is_dir():
            steps.append(f"mkdir {at(name)} && {mount} --rbind {q(str(name))} {at(name)}")
        elif top.is_file():
            steps.append(f": > {at(name)} && {mount} --bind {q(str(name))} {at(name)}")
    # The emulator's own files are covered (issue 32 item 6): a container runs as root here,
    # and through the bind of `/` it could read the state file (secret values), every
    # environment's volumes and the other containers' sockets (each one is that container's
    # identity). A directory gets an empty tmpfs, a file /dev/null. Mount sources below are
    # host paths, read outside the new root, so the container's own volumes still bind.
    hidden = [p.absolute() for p in spec.hidden]
    for path in hidden:
        cover = at(PurePosixPath(str(path)))
        if path.is_dir():
            steps.append(f"{mount} -t tmpfs -o mode=0700,size=64k emulator-hidden {cover}")
        elif path.exists():
            steps.append(f"{mount} --bind /dev/null {cover}")
    # /root is an overlay: the app's files on top of the machine's own /root (which may hold
    # the interpreter, e.g. pyenv), writes going to a per-container layer (ephemeral, like a
    # Modal container's filesystem). The machine's /root is never written.
    upper, work = spec.workdir / "upper", spec.workdir / "overlay-work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    app_root = q(str(spec.root / "root"))
    steps.append(f"mkdir -p {at('/root')}")
    steps.append(
        f"if {mount} -t overlay overlay -o lowerdir={app_root}:/root,"
        f"upperdir={q(str(upper))},workdir={q(str(work))} {at('/root')}; "
        f"then cwd=/root; else echo 'emulator: no overlay for /root; cwd is {app_root}' >&2; "
        f"cwd={app_root}; fi"
    )
    overlaid = {PurePosixPath("/root")}
    # Files the image copied outside /root (e.g. /opt/serving/spec.json), at their paths.
    layers = spec.workdir / "layers"
    path_mounts = outside_root_mounts(spec.root, host_root)
    for index, pm in enumerate(path_mounts):
        steps.append(_path_mount_step(pm, layers / str(index), at(pm.target)))
        if pm.kind == "overlay":
            overlaid.add(PurePosixPath(pm.target))
    # Volumes: a mount point missing on the machine is made in the new root, never on it.
    for index, parent in enumerate(
        volume_overlays([v.mount_path for v in spec.volumes], overlaid, host_root)
    ):
        pm = PathMount("overlay", spec.root / parent.relative_to("/"), str(parent))
        steps.append(_path_mount_step(pm, layers / f"v{index}", at(parent)))
        overlaid.add(parent)
    for vol in spec.volumes:
        target = at(PurePosixPath(vol.mount_path))
        steps.append(f"mkdir -p {target}")
        steps.append(f"{mount} --bind {q(str(vol.host_dir))} {target}")
        if vol.read_only:
            steps.append(f"{mount} -o remount,bind,ro {target}")
    # The container's own files (its unix socket above all: a socket is not reachable
    # through an overlay's lower layer) must stay the real ones under any overlay.
    workdir = PurePosixPath(str(spec.workdir))
    covered = overlaid | {PurePosixPath(str(p)) for p in hidden}
    if any(o == workdir or o in workdir.parents for o in covered):
        steps.append(f"mkdir -p {at(workdir)} && {mount} --bind {q(str(workdir))} {at(workdir)}")
    steps.append("set +e")
    # pid 1: start the entrypoint in the new root, forward SIGTERM/SIGINT to it, exit with
    # its status (when pid 1 exits, the kernel kills the rest of the pid namespace).
    inner = 'cd "$1" || exit 127; shift; exec "$@"'
    steps.append(f'{chroot} {q(str(new_root))} /bin/sh -c {q(inner)} container "$cwd" "$@" &')
    steps.append("child=$!")
    steps.append("trap 'kill -TERM $child 2>/dev/null' TERM")
    steps.append("trap 'kill -INT $child 2>/dev/null' INT")
    steps.append(
        'while :; do wait "$child"; status=$?; kill -0 "$child" 2>/dev/null || exit "$status"; done'
    )
    script = spec.workdir / "init.sh"  # a file, so that `ps` shows one short line
    script.write_text("\n".join(steps) + "\n")
    argv = [_tool("unshare")] + (["--net"] if spec.netns else [])
    argv += ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    argv += ["--propagation", "private", "--", "/bin/sh", str(script), *entry]
    return argv, spec.root / "root"


def volume_overlays(
    mount_paths: list[str], overlaid: set[PurePosixPath], host_root: Path = Path("/")
) -> list[PurePosixPath]:
    """The machine's directories to overlay so that volume mount points missing on the
    machine can be made in the overlay: for each missing path, its deepest existing parent,
    unless that is `/` (the new root's tmpfs takes it) or already under an overlay. Parents
    first; one that another covers is dropped."""
    found: set[PurePosixPath] = set()
    for raw in mount_paths:
        path = PurePosixPath(raw)
        if (host_root / path.relative_to("/")).exists():
            continue
        parent = path.parent
        while parent != PurePosixPath("/") and not (host_root / parent.relative_to("/")).is_dir():
            parent = parent.parent
        if parent == PurePosixPath("/"):
            continue
        if any(o == parent or o in parent.parents for o in overlaid):
            continue
        found.add(parent)
    return sorted(p for p in found if not any(o in p.parents for o in found))


def _path_mount_step(pm: PathMount, layer: Path, target: str) -> str:
    """One shell step showing image files (or an empty overlay) at `target` (in the new
    root); a failure is a warning, not fatal."""
    host_target = shlex.quote(pm.target)
    mount = shlex.quote(_tool("mount"))
    if pm.kind == "overlay":
        upper, work = layer / "upper", layer / "work"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        lower = (
            f"{shlex.quote(str(pm.source))}:{host_target}" if pm.source.is_dir() else host_target
        )
        step = (
            f"{mount} -t overlay overlay -o lowerdir={lower},"
            f"upperdir={shlex.quote(str(upper))},workdir={shlex.quote(str(work))} {target}"
        )
    elif pm.kind == "bind-dir":  # a new top-level directory: made in the new root's tmpfs
        step = f"mkdir -p {target} && {mount} --bind {shlex.quote(str(pm.source))} {target}"
    else:
        step = f"{mount} --bind {shlex.quote(str(pm.source))} {target}"
    warn = shlex.quote(f"emulator: cannot show the image's files at {pm.target} in this container")
    return f"{{ {step} || echo {warn} >&2; }}"


def _warn_invisible_volumes(spec: LaunchSpec, task_id: str) -> None:
    """Without a mount namespace a volume cannot appear at its path without writing to the
    machine (a link or a directory at e.g. `/weights`), which the emulator never does."""
    for vol in spec.volumes:
        log.warning(
            "container %s: volume at %s is not visible (no mount namespace: the emulator runs "
            "without root or without `unshare`); its files are in %s",
            task_id,
            vol.mount_path,
            vol.host_dir,
        )


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
    if not spec.mountns:
        _warn_invisible_volumes(spec, container.task_id)
        for pm in outside_root_mounts(spec.root):
            log.warning(
                "container %s: the image's files at %s are not visible (no mount namespace: "
                "the emulator runs without root or without `unshare`; they are under %s)",
                container.task_id,
                pm.target,
                pm.source,
            )
    argv, cwd = command(spec)
    env = dict(spec.env)
    env["MODAL_CONTAINER_ARGUMENTS_PATH"] = str(args_path)
    container.netns = spec.netns
    container.mountns = spec.mountns
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
        init = asyncio.ensure_future(_find_init(container, proc.pid)) if spec.mountns else None
        # Processes it started keep its output pipes open (and asyncio's wait() waits for
        # them): a pidfd says when the container process itself has exited.
        await _exited(proc.pid)
        kill_group(proc.pid, signal.SIGKILL)  # whatever it left behind
        if not spec.mountns:
            # ...also what it started that left its group (start_new_session): no pid
            # namespace ends those, the runtime's record of its descendants does.
            track_descendants(container, process_tree())
            if killed := kill_recorded(container.descendants):
                log.info(
                    "container %s: killed %d process(es) it started outside its group",
                    container.task_id,
                    killed,
                )
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
        if init is not None:
            init.cancel()
        container.exit_code = await proc.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pumps, 2.0)
        container.stopped_at = time.time()
        container.exited.set()
        on_exit(container)

    asyncio.get_running_loop().create_task(watch(), name=f"container-{container.task_id}")


def process_tree() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc (ppid = field 4 of stat)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int, tree: dict[int, list[int]]) -> set[int]:
    out: set[int] = set()
    todo = list(tree.get(pid, ()))
    while todo:
        child = todo.pop()
        if child not in out:
            out.add(child)
            todo.extend(tree.get(child, ()))
    return out


def track_descendants(container: Container, tree: dict[int, list[int]]) -> None:
    """Remember the container's descendants (pid -> start time), also the ones that left its
    process group or session: without a pid namespace nothing else finds them later."""
    if container.pid is None:
        return
    for pid in descendants(container.pid, tree):
        if pid not in container.descendants and (started := start_time(pid)):
            container.descendants[pid] = started


def children_of(pid: int) -> list[int]:
    """The direct children of process `pid` (Linux: /proc/PID/task/PID/children)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


async def _find_init(container: Container, pid: int) -> None:
    """The container's pid 1: `unshare --fork`'s one child (a few ms after the start)."""
    for _ in range(500):
        children = children_of(pid)
        if children:
            container.init_pid = children[0]
            return
        if container.exited.is_set():
            return
        await asyncio.sleep(0.01)


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
        if container.init_pid is None and container.mountns:
            container.init_pid = next(iter(children_of(proc.pid)), None)
        if container.init_pid is not None:
            # `unshare --fork` holds SIGTERM back from its child: the container's pid 1 gets
            # it (and forwards it to the entrypoint).
            os.kill(container.init_pid, signal.SIGTERM)
        else:
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
