"""Log setup for the proxy process: JSON lines on stderr, written in small batches.

A request's access line is formatted at once but reaches stderr within ``max_delay_s``
(default 0.2 s) together with its neighbours: one write per batch instead of one per request
(each write is a syscall on the hot path). A background thread flushes the batch on time even
when traffic stops; ``close()`` (at exit) flushes what is left.

With ``--workers N`` several processes write to the same stderr: a write to a pipe is atomic
only up to ``PIPE_BUF`` (4096) bytes, so there each batch goes out in writes of whole lines
of at most that size (``max_write``), and no line of one process is cut by another's.
"""

from __future__ import annotations

import json
import logging
import select
import sys
import threading
from typing import Any, TextIO

event_log = logging.getLogger("serving.proxy")


def log_event(level: int, event: str, **fields: Any) -> None:
    """One JSON line on the proxy's event log: ``{"event": event, **fields}``."""
    event_log.log(level, json.dumps({"event": event, **fields}))


class BatchingStreamHandler(logging.Handler):
    """Buffer formatted records; write them together every ``max_delay_s`` or ``max_lines``."""

    def __init__(
        self, stream: TextIO, max_delay_s: float = 0.2, max_lines: int = 512, max_write: int = 0
    ) -> None:
        super().__init__()
        self.stream = stream
        self.max_write = max_write  # > 0: no write longer than this (whole lines; see above)
        self.max_delay_s = max_delay_s
        self.max_lines = max_lines
        self._lines: list[str] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="log-flusher", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
            if len(self._lines) >= self.max_lines or record.levelno >= logging.WARNING:
                self.flush()
        except Exception:
            self.handleError(record)

    def append_line(self, line: str) -> None:
        """Queue an already formatted line (the proxy's access-log fast path)."""
        assert self.lock is not None
        with self.lock:
            self._lines.append(line)
            full = len(self._lines) >= self.max_lines
        if full:
            self.flush()

    def flush(self) -> None:
        assert self.lock is not None  # created by Handler.__init__
        with self.lock:
            if not self._lines:
                return
            lines, self._lines = self._lines, []
        try:
            if self.max_write:
                for chunk in _chunks(lines, self.max_write):
                    self.stream.write(chunk)
                    self.stream.flush()
            else:
                self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone (process exiting): nothing useful left to do

    def _flusher(self) -> None:
        while not self._closed.wait(self.max_delay_s):
            self.flush()

    def close(self) -> None:
        self._closed.set()
        self.flush()
        super().close()


def _chunks(lines: list[str], limit: int) -> list[str]:
    """``lines`` joined into strings of whole lines, each ending in a newline and at most
    ``limit`` bytes long (a longer line alone: it cannot be split)."""
    out: list[str] = []
    group: list[str] = []
    size = 0
    for line in lines:
        n = (len(line) if line.isascii() else len(line.encode())) + 1
        if group and size + n > limit:
            out.append("\n".join(group) + "\n")
            group, size = [], 0
        group.append(line)
        size += n
    if group:
        out.append("\n".join(group) + "\n")
    return out


def configure_logging(
    access_log: bool, stream: TextIO | None = None, shared_stream: bool = False
) -> None:
    """Route ``serving.proxy`` (events) and ``serving.proxy.access`` (one JSON line per
    request) to stderr as bare JSON lines. ``shared_stream``: other processes write to the
    same stderr (``--workers``): writes of whole lines, at most ``PIPE_BUF`` bytes each."""
    handler = BatchingStreamHandler(
        stream or sys.stderr, max_write=select.PIPE_BUF if shared_stream else 0
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("serving.proxy")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.INFO)
    access = logging.getLogger("serving.proxy.access")
    access.setLevel(logging.INFO if access_log else logging.WARNING)
    logging.raiseExceptions = False
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
