"""Container output, kept for `modal app logs` and the SDK's log streaming (AppGetLogs).

Each line a container writes on stdout/stderr becomes one entry tagged with its app,
function and container (task) ids. Entries are numbered; a reader asks for "everything after
entry N" and waits (up to its timeout) for more, which is how the client's AppGetLogs loop
works (it resends `last_entry_id`). The newest MAX_ENTRIES are kept in memory; they do not
survive an emulator restart (Modal keeps logs for days: a documented difference).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

MAX_ENTRIES = 100_000
STDOUT = 1
STDERR = 2
INFO = 3


@dataclass(frozen=True)
class LogEntry:
    entry_id: int
    app_id: str
    function_id: str
    task_id: str
    fd: int
    data: str
    timestamp: float


class LogStore:
    def __init__(self) -> None:
        self._entries: deque[LogEntry] = deque(maxlen=MAX_ENTRIES)
        self._next = 1
        self._changed = asyncio.Event()

    def add(self, app_id: str, function_id: str, task_id: str, fd: int, data: str) -> None:
        entry = LogEntry(self._next, app_id, function_id, task_id, fd, data, time.time())
        self._next += 1
        self._entries.append(entry)
        self._changed.set()
        self._changed = asyncio.Event()

    def since(
        self, after: int, app_id: str = "", function_id: str = "", task_id: str = ""
    ) -> list[LogEntry]:
        return [
            e
            for e in self._entries
            if e.entry_id > after
            and (not app_id or e.app_id == app_id)
            and (not function_id or e.function_id == function_id)
            and (not task_id or e.task_id == task_id)
        ]

    async def wait(self, timeout: float) -> None:
        """Return when an entry is added, or after `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def clear(self) -> None:
        self._entries.clear()
