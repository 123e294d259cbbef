"""Admission: ``--max-in-flight`` shared fairly between keys (issue 32 item 14).

Before, the pool was one count for all keys: one key's 256 open streams gave every other key
429 ``proxy at capacity`` for as long as they ran. In-flight streams cannot be taken back (an
engine request that started must run to its end), so fairness is decided at admission:

- **Free pool, nobody waiting**: any key is admitted (up to its own limit). A key may use the
  whole pool while no other key wants a slot: no slot is kept idle "just in case".
- **Full pool** (or other keys waiting): a request from a key *below* its fair share waits up
  to ``--fair-wait-s`` for the next slot that comes free (429 after that); a request from a
  key *at or above* its share is answered 429 at once. While a below-share request waits, no
  at-or-above-share request takes a free slot, so the slots that the big key's streams give
  back go to the waiting keys first, until each has its share.
- **Fair share** = ``max_in_flight // active keys`` (at least 1), where a key is active while it
  has requests in flight or waiting (the asking key counts itself). A key waits for at most
  ``share - in flight`` slots at once (the queue is bounded: it could use no more), and the
  pool never holds more waiters than slots.
- **A key's own limit** (``--key-max-in-flight NAME=N``; the spec's
  ``proxy.key_max_in_flight``): that key never holds more than N slots, free pool or not (429
  ``key_at_limit`` at once).

This is option (a) of the issue's two (a queue for below-share keys) rather than (b), a reserve
of slots kept free for keys that might come: (b) leaves the reserve idle whenever one key is
alone, and still cannot admit a newcomer once the big key has taken up to the reserve; (a)
keeps the whole pool usable and gives newcomers the slots as they come free. What neither
can do: admit a newcomer while every slot is held by streams that do not end (a stream is
never cut to make room); the newcomer then gets 429 after ``--fair-wait-s``.

The counts live in one flat array: ``[total, waiting, active keys, in-flight per key...,
waiting per key...]``; with ``--workers N`` it is a ``multiprocessing`` ``RawArray`` in shared
memory under the workers' one lock (serving/proxy/workers.py), so every worker sees every
key's slots and waiters; with one process a plain list, no lock. The common case (a free slot,
nobody waiting, the key under its own limit) is a few comparisons, as the one count was.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["ADMITTED", "KEY_LIMIT", "OVER_SHARE", "QUEUED", "Admission", "Counts"]

# What ``Admission.take`` decided.
ADMITTED = 0  # a slot was taken
QUEUED = 1  # the pool is full and the key is below its share: it waits (counted as waiting)
OVER_SHARE = 2  # the pool is full (or others wait) and the key is at or above its share: 429
KEY_LIMIT = 3  # the key holds its own limit: 429

_TOTAL, _WAITING, _ACTIVE = 0, 1, 2
_HEAD = 3
_T = TypeVar("_T")
LOCK_TIMEOUT_S = 1.0  # the lock is held for microseconds; longer: a worker died in it


class Counts(Protocol):
    """A flat array of ints (a list, or a ctypes array in shared memory)."""

    def __getitem__(self, index: int) -> int: ...
    def __setitem__(self, index: int, value: int) -> None: ...
    def __len__(self) -> int: ...


def cells_needed(keys: int) -> int:
    """The array length ``Admission`` needs for ``keys`` keys."""
    return _HEAD + 2 * keys


class Admission:
    """In-flight slots per key, fairly shared (see the module's docstring).

    ``names``: the key names in ``SERVING_API_KEYS`` order (every worker parses the same JSON,
    so an index names the same key in every process). ``limits``: a key's own limit, else the
    pool. ``cells``/``lock``: shared memory and its lock (``--workers``); None: this process
    alone."""

    def __init__(
        self,
        pool: int,
        names: Sequence[str],
        limits: dict[str, int] | None = None,
        cells: Counts | None = None,
        lock: Any = None,
    ) -> None:
        limits = limits or {}
        self.pool = pool
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.limits = [min(pool, limits.get(name, pool)) for name in self.names]
        keys = len(self.names)
        self._cells: Counts = cells if cells is not None else [0] * cells_needed(keys)
        if len(self._cells) != cells_needed(keys):
            raise ValueError(f"admission needs {cells_needed(keys)} cells for {keys} keys")
        self._lock = lock
        self._count = _HEAD  # in-flight of key i: cells[_HEAD + i]
        self._wait = _HEAD + keys  # waiting of key i: cells[_HEAD + keys + i]
        # Once per request each: one process takes no lock and makes one call, not two.
        self.take: Callable[[int], int] = self._take
        self.give_back: Callable[[int], None] = self._give_back
        if lock is not None:
            self.take = functools.partial(self._locked, self._take, stuck=OVER_SHARE)
            self.give_back = functools.partial(self._locked, self._give_back, stuck=None)

    # -- reading (no lock: one aligned int each, for metrics and messages) -----------------
    @property
    def total(self) -> int:
        return int(self._cells[_TOTAL])

    @property
    def waiting(self) -> int:
        return int(self._cells[_WAITING])

    def held(self, i: int) -> int:
        return int(self._cells[self._count + i])

    def share(self, i: int) -> int:
        """Key ``i``'s fair share now (it counts itself as active)."""
        cells = self._cells
        active = cells[_ACTIVE]
        if not (cells[self._count + i] or cells[self._wait + i]):
            active += 1
        return min(self.limits[i], max(1, self.pool // max(1, active)))

    # -- changing (under the lock with --workers) ------------------------------------------
    # ``take(i)``: a new request of key ``i``: ADMITTED (a slot is its), QUEUED (it waits,
    # counted in ``waiting``: ``retry`` or ``leave`` next), OVER_SHARE or KEY_LIMIT (429 now).
    # ``give_back(i)``: an admitted request of key ``i`` ended, its slot is free.

    def _locked(self, step: Callable[[int], _T], i: int, stuck: _T) -> _T:
        """``step(i)`` under the workers' lock; ``stuck`` when it cannot be had within
        ``LOCK_TIMEOUT_S`` (a worker died holding it: the main process is stopping all)."""
        lock = self._lock
        if not lock.acquire(True, LOCK_TIMEOUT_S):
            return stuck
        try:
            return step(i)
        finally:
            lock.release()

    def _take(self, i: int) -> int:
        cells = self._cells
        held = cells[self._count + i]
        limit = self.limits[i]
        if held >= limit:  # its own limit; or, with none, it holds the whole pool
            return KEY_LIMIT if limit < self.pool else OVER_SHARE
        total = cells[_TOTAL]
        if total < self.pool and not cells[_WAITING]:  # the common case
            return self._admit(i, held, total)
        w = self._wait + i
        share = self.share(i)
        if held >= share:
            return OVER_SHARE
        if total < self.pool:  # others wait, but this key is below its share too: it may
            return self._admit(i, held, total)
        if held + cells[w] >= share or cells[_WAITING] >= self.pool:
            return OVER_SHARE  # enough of its requests wait already for what it may use
        if not held and not cells[w]:
            cells[_ACTIVE] += 1
        cells[w] += 1
        cells[_WAITING] += 1
        return QUEUED

    def _admit(self, i: int, held: int, total: int) -> int:
        cells = self._cells
        cells[self._count + i] = held + 1
        cells[_TOTAL] = total + 1
        if not held and not cells[self._wait + i]:
            cells[_ACTIVE] += 1
        return ADMITTED

    def retry(self, i: int) -> int:
        """A waiting request of key ``i`` tries again: ADMITTED (no longer waiting), KEY_LIMIT
        (no longer waiting: its own limit was reached meanwhile by its other requests), or
        QUEUED (still waiting)."""
        return self._retry(i) if self._lock is None else self._locked(self._retry, i, QUEUED)

    def _retry(self, i: int) -> int:
        cells = self._cells
        c, w = self._count + i, self._wait + i
        held = cells[c]
        total = cells[_TOTAL]
        if total >= self.pool:
            return QUEUED
        if held >= self.limits[i]:  # its own limit (below the pool: the pool has room)
            self._unwait(i)
            return KEY_LIMIT
        # A free slot: this waiter takes it if its key is below its share, or if every
        # request waiting is its key's (nobody below their share is passed over).
        if held < self.share(i) or cells[_WAITING] == cells[w]:
            cells[w] -= 1
            cells[_WAITING] -= 1
            cells[c] = held + 1
            cells[_TOTAL] = total + 1
            return ADMITTED
        return QUEUED

    def leave(self, i: int) -> None:
        """A waiting request of key ``i`` gives up (timed out, or its client left)."""
        if self._lock is None:
            self._unwait(i)
        else:
            self._locked(self._unwait, i, None)

    def _unwait(self, i: int) -> None:
        cells = self._cells
        cells[self._wait + i] -= 1
        cells[_WAITING] -= 1
        self._drop_if_idle(i)

    def _give_back(self, i: int) -> None:
        cells = self._cells
        cells[self._count + i] -= 1
        cells[_TOTAL] -= 1
        self._drop_if_idle(i)

    def _drop_if_idle(self, i: int) -> None:
        """Key ``i`` is active no more once it holds and waits for nothing."""
        cells = self._cells
        if not cells[self._count + i] and not cells[self._wait + i]:
            cells[_ACTIVE] -= 1
