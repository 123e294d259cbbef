"""The emulator's state, one module per area; `State` bundles them over one Store."""

from __future__ import annotations

from emulator.models.apps import Apps
from emulator.models.artifacts import Blobs, Images, Mounts
from emulator.models.environments import Environments
from emulator.models.secrets import Secrets
from emulator.models.tokens import ProxyTokens
from emulator.models.volumes import Volumes
from emulator.store import Store


class State:
    """Every model over one store; `reset()` empties it and re-creates the default env."""

    def __init__(self, store: Store, workspace: str, default_environment: str = "main") -> None:
        self.store = store
        self.workspace = workspace
        self.environments = Environments(store, default_environment)
        self.secrets = Secrets(store, self.environments)
        self.volumes = Volumes(store, self.environments)
        self.tokens = ProxyTokens(store, self.environments)
        self.apps = Apps(store, self.environments)
        self.images = Images(store)
        self.blobs = Blobs(store)
        self.mounts = Mounts(store, self.blobs)
        self.environments.ensure_default()

    def reset(self) -> None:
        self.store.reset()
        self.environments.ensure_default()


__all__ = ["State"]
