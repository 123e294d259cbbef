"""What a container is built from: its files (mounts), its environment, its volumes.

Images are not built (docs/emulator.md): a container runs on the emulator's own interpreter.
What the client uploaded is laid out on disk the way Modal lays it out in the container's
filesystem, under one directory per distinct set of mounts (content-addressed, reused):

- the function's mounts (`function_def.mount_ids`: the app's source, `add_local_*` files);
- every image layer's context mount (`add_local_file(..., copy=True)` sends `COPY . /`).

Paths under `/root` (Modal's working directory, where the app module lives) are what the
container sees at `/root` (bound there in its mount namespace, or its cwd without one).
Files an image copies to absolute paths elsewhere (e.g. `add_local_file(f, "/opt/app/x.json",
copy=True)`, a Dockerfile `COPY` to `/opt`) are shown at those paths too, in the container's
mount namespace only (`outside_root_mounts`); without one they are not visible (a warning).
The environment is the image chain's `ENV` lines (base first), then the secrets (later ones
win, as in Modal), then the runtime's own MODAL_* variables.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from modal_proto import api_pb2

from emulator.models import State

log = logging.getLogger("emulator.runtime")


def image_chain(state: State, image_id: str) -> list[str]:
    """Image ids from the bottom layer up to `image_id` (first base first, no repeats)."""
    seen: list[str] = []

    def walk(iid: str) -> None:
        if not iid or iid in seen:
            return
        try:
            image = state.images.get(iid)
        except Exception:
            return
        for base in image.base_ids:
            walk(base)
        seen.append(iid)

    walk(image_id)
    return seen


def parse_env_line(command: str) -> dict[str, str]:
    """`ENV A=1 B="two words"` or `ENV A value` → {"A": "1", ...}; other lines → {}."""
    head, _, rest = command.strip().partition(" ")
    if head.upper() != "ENV" or not rest.strip():
        return {}
    try:
        parts = shlex.split(rest)
    except ValueError:
        return {}
    if parts and "=" not in parts[0]:
        return {parts[0]: " ".join(parts[1:])}
    out: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


def image_env(state: State, image_id: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for iid in image_chain(state, image_id):
        for command in state.images.get(iid).commands:
            env.update(parse_env_line(command))
    return env


def mount_ids_for(state: State, fn: api_pb2.Function) -> list[str]:
    """Image context mounts (bottom layer first), then the function's own mounts."""
    ids: list[str] = []
    for iid in image_chain(state, fn.image_id):
        image = state.images.get(iid)
        copies_root = any(c.strip().split()[:3] == ["COPY", ".", "/"] for c in image.commands)
        if image.context_mount_id and copies_root:
            ids.append(image.context_mount_id)
        elif image.context_mount_id:
            log.warning(
                "image %s: context mount copied somewhere other than '/' is not laid out for "
                "containers (only `COPY . /` is)",
                iid,
            )
    return ids + list(fn.mount_ids)


def materialize(state: State, roots_dir: Path, mount_ids: list[str]) -> Path:
    """A directory holding every mount's files at their container paths; built once per set."""
    key = hashlib.sha256("\n".join(mount_ids).encode()).hexdigest()[:20]
    root = roots_dir / key
    if (root / ".complete").exists():
        return root
    tmp = roots_dir / f".{key}.{os.getpid()}.tmp"
    (tmp / "root").mkdir(parents=True, exist_ok=True)
    for mount_id in mount_ids:
        mount = state.mounts.get(mount_id)
        for f in mount.files:
            rel = f.filename.lstrip("/")
            if not rel or ".." in Path(rel).parts:
                log.warning("mount %s: skipping unsafe path %r", mount_id, f.filename)
                continue
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(state.mounts.read_file(f.sha256))
            os.chmod(target, (f.mode & 0o777) or 0o644)
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(root)
    except OSError:  # built concurrently by another container start: keep the first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return root


def container_env(state: State, fn: api_pb2.Function) -> dict[str, str]:
    """Image ENV lines, then each secret's values in the order the function lists them."""
    env = image_env(state, fn.image_id) if fn.image_id else {}
    for secret_id in fn.secret_ids:
        env.update(state.secrets.values_for_container(secret_id))
    return env


# Never shown over: the kernel's own filesystems, and /root (its own overlay in containers.py).
_RESERVED_TOPS = frozenset({"proc", "sys", "dev", "root"})


@dataclass(frozen=True)
class PathMount:
    """One mount that shows image files outside /root at their container paths.

    kind "overlay": `source` (the materialised directory) over the machine's directory
    `target` (an overlay: the machine's files stay visible below, writes go to a per-container
    layer); "bind-file": `source` bound over an existing file `target`; "bind-dir": `source`
    bound at `target`, a directory that does not exist on the machine, created as an empty
    mount point (only when its parent is `/`: an overlay over `/` itself is never made).
    """

    kind: str
    source: Path
    target: str


def _files_outside_root(root: Path) -> list[PurePosixPath]:
    out: list[PurePosixPath] = []
    for top in sorted(root.iterdir()):
        if top.name in ("root", ".complete"):
            continue
        if top.is_file():
            out.append(PurePosixPath("/", top.name))
            continue
        for dirpath, _dirs, files in os.walk(top):
            rel = Path(dirpath).relative_to(root)
            out.extend(PurePosixPath("/", *rel.parts, name) for name in sorted(files))
    return out


def outside_root_mounts(root: Path, host_root: Path = Path("/")) -> list[PathMount]:
    """The mounts that show `root`'s files outside /root at their absolute container paths.

    Each file goes where the image put it: at the deepest directory that exists on the machine
    an overlay (so that directory's own files stay visible), or over the machine's file of the
    same path a file bind, or, for a new top-level directory, a bind of the whole directory.
    An overlay above another mount makes the other one redundant. `host_root` is for tests.
    """
    overlays: set[PurePosixPath] = set()
    top_dirs: set[PurePosixPath] = set()
    file_binds: set[PurePosixPath] = set()
    for path in _files_outside_root(root):
        if path.parts[1] in _RESERVED_TOPS:
            log.warning("image file %s: not shown in containers (reserved path)", path)
            continue
        on_host = host_root / path.relative_to("/")
        if on_host.is_file():
            file_binds.add(path)
            continue
        if on_host.exists():
            log.warning("image file %s: the machine has a directory there; not shown", path)
            continue
        parent = path.parent
        while parent != PurePosixPath("/") and not (host_root / parent.relative_to("/")).is_dir():
            parent = parent.parent
        if parent == PurePosixPath("/"):
            top_dirs.add(PurePosixPath("/", path.parts[1]))
        else:
            overlays.add(parent)

    def covered(path: PurePosixPath, by: set[PurePosixPath]) -> bool:
        return any(other != path and other in path.parents for other in by)

    overlays = {o for o in overlays if not covered(o, overlays)}
    mounts = [PathMount("bind-dir", root / d.relative_to("/"), str(d)) for d in sorted(top_dirs)]
    mounts += [PathMount("overlay", root / o.relative_to("/"), str(o)) for o in sorted(overlays)]
    for f in sorted(file_binds):
        if not covered(f, overlays) and f not in overlays:
            mounts.append(PathMount("bind-file", root / f.relative_to("/"), str(f)))
    return mounts
