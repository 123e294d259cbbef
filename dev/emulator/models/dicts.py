"""Dicts: named key/value maps scoped to an environment (the minimum `modal.Dict` needs).

Keys and values are the client's serialized bytes (modal 1.6.4 `modal/dict.py` sends
`serialize(key)` / `serialize(value)` in `DictEntry`s and deserializes what comes back), so
they are stored as given and compared byte for byte, as Modal's server cannot do otherwise
with pickled payloads.

Unlike the other models, Dicts live in memory (moto-style), not in the SQLite state file: they
are emptied by a reset and do not survive an emulator restart, and deleting an environment
makes its Dicts unreachable (a lookup resolves the environment first). Adding a table to the
state file would change its schema version (dev/emulator/store.py), which every existing state
file would then fail.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from emulator.errors import AlreadyExists, InvalidArgument, NotFound
from emulator.ids import check_id, check_name, new_id
from emulator.models.common import Creation
from emulator.models.environments import Environments
from emulator.store import Store


@dataclass
class Dict:
    id: str
    env_id: str
    env_name: str
    name: str | None
    created_at: float
    data: dict[bytes, bytes] = field(default_factory=dict)


class Dicts:
    def __init__(self, store: Store, environments: Environments) -> None:
        self.store = store
        self.environments = environments
        self._lock = threading.Lock()
        self._by_id: dict[str, Dict] = {}

    def get_or_create(self, name: str, environment: str, creation: Creation) -> Dict:
        """Look up / create per `creation` (modal/dict.py: from_name sends create-if-missing
        or unspecified = lookup; `Dict.objects.create` sends fail-if-exists; `ephemeral`
        sends an anonymous one)."""
        with self.store.read() as db:
            env = self.environments.resolve(environment, db)
        with self._lock:
            if creation is Creation.ANONYMOUS:
                return self._insert(env.id, env.name, None)
            check_name("Dict", name)
            if creation is Creation.OVERWRITE:
                raise InvalidArgument(
                    f"Dict {name!r}: CREATE_OVERWRITE_IF_EXISTS is not supported."
                )
            found = next(
                (d for d in self._by_id.values() if d.env_id == env.id and d.name == name), None
            )
            if found is None:
                if creation is Creation.LOOKUP:
                    raise NotFound(f"Dict {name!r} not found in environment {env.name!r}.")
                return self._insert(env.id, env.name, name)
            if creation is Creation.FAIL_IF_EXISTS:
                raise AlreadyExists(f"Dict {name!r} already exists in environment {env.name!r}.")
            return found

    def _insert(self, env_id: str, env_name: str, name: str | None) -> Dict:
        d = Dict(new_id("dict"), env_id, env_name, name, time.time())
        self._by_id[d.id] = d
        return d

    def get(self, dict_id: str) -> Dict:
        check_id("dict", dict_id)
        with self._lock:
            d = self._by_id.get(dict_id)
        if d is None:
            raise NotFound(f"Dict {dict_id} not found.")
        try:
            self.environments.get(d.env_id)
        except NotFound:
            with self._lock:
                self._by_id.pop(dict_id, None)  # its environment was deleted
            raise NotFound(f"Dict {dict_id} not found (its environment was deleted).") from None
        return d

    def read(self, dict_id: str, key: bytes) -> bytes | None:
        d = self.get(dict_id)
        with self._lock:
            return d.data.get(key)

    def update(self, dict_id: str, items: list[tuple[bytes, bytes]], if_not_exists: bool) -> bool:
        """Put every item; with `if_not_exists`, nothing is written when any key exists
        (modal/dict.py `put(skip_if_exists=True)` reads `created`). True if written."""
        d = self.get(dict_id)
        with self._lock:
            if if_not_exists and any(k in d.data for k, _ in items):
                return False
            d.data.update(items)
            return True

    def pop(self, dict_id: str, key: bytes) -> bytes | None:
        d = self.get(dict_id)
        with self._lock:
            return d.data.pop(key, None)

    def delete(self, dict_id: str) -> None:
        self.get(dict_id)
        with self._lock:
            self._by_id.pop(dict_id, None)

    def reset(self) -> None:
        with self._lock:
            self._by_id.clear()
