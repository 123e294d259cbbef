"""Network namespaces for containers: a private loopback per container, reached via setns.

Every real app binds a fixed port (our proxy's 8000, an engine's 8001...). Two containers of
the same server, or a container and a service of the user's, would collide on the host's
loopback. Where the OS allows it (root, `unshare` available: checked once at start), each
container runs in its own network namespace (`unshare --net`), whose only interface is its
own `lo`: fixed ports never collide and the container cannot reach the host's services.

The edge reaches a container's port without any bridge process: a socket belongs to the
network namespace it was *created* in, so a worker thread switches itself into the
container's namespace (`setns(2)` on /proc/<pid>/ns/net; it affects only the calling thread),
creates the socket, and switches back. The socket is then connected and used from the event
loop like any other (see `connect()`). The container talks to the emulator over a unix
socket on the filesystem, which crosses network namespaces.

Without that permission the fallback is the host's network: at most one container per fixed
port at a time (the runtime serialises them; see manager.py) and a port a user's service
already holds makes the container fail its health check.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import shutil
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="emulator-netns")
_own_ns_lock = threading.Lock()
_own_ns_fd: int | None = None


def _own_netns_fd() -> int:
    global _own_ns_fd
    with _own_ns_lock:
        if _own_ns_fd is None:
            _own_ns_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        return _own_ns_fd


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


def system_tool(name: str) -> str | None:
    """The absolute path of a system tool (`unshare`, `chroot`, `mount`, `ip`), also where
    PATH lacks /usr/sbin (a shell started by a script, a container's own PATH)."""
    search = os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    )
    return shutil.which(name, path=search)


def supported() -> bool:
    """True when containers can get their own network namespace here (root + unshare + ip)."""
    unshare, ip = system_tool("unshare"), system_tool("ip")
    if os.geteuid() != 0 or unshare is None or ip is None:
        return False
    try:
        done = subprocess.run(
            [
                unshare,
                "--net",
                "--mount",
                "--propagation",
                "private",
                ip,
                "link",
                "set",
                "lo",
                "up",
            ],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def namespaces_supported() -> bool:
    """True when containers can get their own mount and pid namespaces and root here (root +
    `unshare` with `--pid --fork --kill-child --mount-proc`; checked once at start)."""
    unshare = system_tool("unshare")
    if os.geteuid() != 0 or unshare is None or system_tool("chroot") is None:
        return False
    try:
        done = subprocess.run(
            [unshare, "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
             "--propagation", "private", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _socket_in(pid: int) -> socket.socket:
    own = _own_netns_fd()
    target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _setns(own)
    finally:
        os.close(target)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def connect(
    pid: int | None, port: int, host: str = "127.0.0.1", limit: int = 1 << 20
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a TCP connection to `host:port` inside the network namespace of `pid`.

    `pid=None` means the emulator's own namespace (the host-network fallback). `limit` is the
    stream's line limit (the largest head or chunk-size line `readuntil` accepts).
    """
    loop = asyncio.get_running_loop()
    if pid is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        sock = await loop.run_in_executor(_executor, _socket_in, pid)
    try:
        await loop.sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock, limit=limit)
