"""Read the model's weights into the page cache while the engine's Python imports.

A cold container spends its first ~20 s in the engine's imports (vLLM 0.26.0 on an H200: 17-22 s
to its argument parsing, docs/gpu.md runs AJ-AM) with the disk idle, then loads the weights from
files nobody has read yet (1.35-1.43 GiB/s through mmap'd page faults: 10.5-11 s for 15 GiB).
Reading them from the container's start with a few threads puts them in the page cache before
the engine asks (8.4-9.6 s after the launch), and the engine's load then takes 2.0-2.5 s (runs
AK-AM, the harness's copy of this reader). vLLM's own `--safetensors-load-strategy prefetch`
(0.26.0 model_executor/model_loader/weight_utils.py `_prefetch_all_checkpoints`) starts only
when the weights are loaded, after the imports, one thread per file.

It runs where the weights are files in the container: the weights Volume's directory
(`weights:` in the spec), a local directory given as `model`, or the hub cache's snapshot of
`model` when an earlier container left one there. It is skipped, with one log line saying why,
when the files would not fit in the memory the container may use (a read that the page cache
cannot keep only evicts what it read first), and off with SERVING_WEIGHTS_PREFETCH=0.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger("serving.engine")

PREFETCH_ENV = "SERVING_WEIGHTS_PREFETCH"  # "0" / "off" / "false": no prefetch
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
READERS = 4  # 1.6-1.8 GiB/s on the H200 machine's disk with 4 (runs AK-AM)
BLOCK = 16 << 20
# At most this share of the memory the container may use goes to the weights' pages: the
# engine's own processes need the rest.
MEMORY_SHARE = 0.8


def weight_files(root: Path) -> list[Path]:
    """The checkpoint files under root (sorted: the order the engine loads shards in)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def hub_snapshot(model: str, hf_home: Path) -> Path | None:
    """The newest snapshot directory of `model` in the hub cache (`HF_HOME/hub`), if any
    (huggingface_hub's layout: hub/models--ORG--NAME/snapshots/<revision>/)."""
    snapshots = hf_home / "hub" / f"models--{model.replace('/', '--')}" / "snapshots"
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def weights_dir(model_source: str, hf_home: Path) -> Path | None:
    """Where the engine will read the weights from as files now, if it can be known."""
    local = Path(model_source)
    if local.is_absolute() and local.is_dir():
        return local
    return hub_snapshot(model_source, hf_home)


def memory_available() -> int | None:
    """Bytes this container may still use: the cgroup's limit less its usage, or MemAvailable
    when there is no limit; None when neither can be read."""
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text())
            return max(0, int(limit) - used)
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class WeightsPrefetch(threading.Thread):
    """Read each file once, in BLOCK-sized reads, `readers` threads over the files' ranges."""

    def __init__(self, files: list[Path], readers: int = READERS, block: int = BLOCK) -> None:
        super().__init__(name="weights-prefetch", daemon=True)
        self.files, self.readers, self.block = files, readers, block
        self.total = sum(f.stat().st_size for f in files)
        self.bytes = 0
        self.seconds: float | None = None
        self.error: str | None = None

    def _read(self, path: Path, start: int, end: int) -> int:
        view = memoryview(bytearray(self.block))
        got = 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while start + got < end:
                n = os.preadv(fd, [view[: min(self.block, end - start - got)]], start + got)
                if n <= 0:
                    break
                got += n
        finally:
            os.close(fd)
        return got

    def run(self) -> None:
        t0 = time.monotonic()
        jobs = []
        for f in self.files:
            size = f.stat().st_size
            step = max(self.block, -(-size // self.readers))
            jobs += [(f, lo, min(size, lo + step)) for lo in range(0, size, step)]
        try:
            with ThreadPoolExecutor(self.readers) as pool:
                self.bytes = sum(pool.map(lambda job: self._read(*job), jobs))
        except OSError as exc:  # the engine reads the files anyway: say so and stop here
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("weights prefetch: stopped (%s); the engine reads the rest", self.error)
            return
        self.seconds = time.monotonic() - t0
        gib = self.bytes / 2**30
        log.info(
            "weights prefetch: done, %.1f GiB in %.1f s (%.2f GiB/s)",
            gib, self.seconds, gib / max(self.seconds, 1e-6),
        )  # fmt: skip


def start_prefetch(
    model_source: str, hf_home: Path, available: int | None = None
) -> WeightsPrefetch | None:
    """Start reading the weights into the page cache, or say in one line why not."""
    if os.environ.get(PREFETCH_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        log.info("weights prefetch: off (%s=%s)", PREFETCH_ENV, os.environ[PREFETCH_ENV])
        return None
    root = weights_dir(model_source, hf_home)
    files = weight_files(root) if root is not None else []
    if not files:
        log.info("weights prefetch: skipped, no weight files of %s here yet", model_source)
        return None
    reader = WeightsPrefetch(files)
    room = memory_available() if available is None else available
    if room is not None and reader.total > room * MEMORY_SHARE:
        log.info(
            "weights prefetch: skipped, %.1f GiB of weights would not stay in the page cache "
            "(%.1f GiB of memory left to this container)", reader.total / 2**30, room / 2**30,
        )  # fmt: skip
        return None
    log.info(
        "weights prefetch: reading %.1f GiB in %d files under %s with %d readers",
        reader.total / 2**30, len(files), root, reader.readers,
    )  # fmt: skip
    reader.start()
    return reader
