"""The emulator's state, one module per area; `State` bundles them over one Store."""

from __future__ import annotations

from collections.abc import Callable

from emulator.models.apps import DEFAULT_HEARTBEAT_TIMEOUT, App, Apps
from emulator.models.artifacts import Blobs, Images, Mounts
from emulator.models.dicts import Dicts
from emulator.models.environments import Environments
from emulator.models.functions import check_web_label
from emulator.models.secrets import Secrets
from emulator.models.service_users import ServiceUsers
from emulator.models.tokens import ProxyTokens
from emulator.models.volumes import Volumes
from emulator.store import Store
from emulator.urls import WebUrl, web_url


class State:
    """Every model over one store; `reset()` empties it and re-creates the default env."""

    def __init__(
        self,
        store: Store,
        workspace: str,
        default_environment: str = "main",
        heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.environments = Environments(store, default_environment)
        self.secrets = Secrets(store, self.environments)
        self.volumes = Volumes(store, self.environments)
        self.tokens = ProxyTokens(store, self.environments)
        self.dicts = Dicts(store, self.environments)  # in memory (dev/emulator/models/dicts.py)
        self.service_users = ServiceUsers(store, self.environments)
        self.apps = Apps(store, self.environments, heartbeat_timeout)
        self.images = Images(store)
        self.blobs = Blobs(store)
        self.mounts = Mounts(store, self.blobs)
        #: Set when an edge serves the endpoints: maps Modal's URL pattern to the local URL.
        self.url_mapper: Callable[[str], str] | None = None
        self.environments.ensure_default()

    def check_function_references(
        self,
        image_id: str,
        mount_ids: list[str],
        secret_ids: list[str],
        volume_ids: list[str],
    ) -> None:
        """NOT_FOUND (naming the object) unless every object a function uses exists."""
        if image_id:
            self.images.get(image_id)
        for mount_id in mount_ids:
            self.mounts.check_exists(mount_id)
        for secret_id in secret_ids:
            self.secrets.get(secret_id)
        for volume_id in volume_ids:
            self.volumes.get(volume_id)

    def web_url(
        self, app: App, function_name: str, label: str = "", dev_suffix: str = ""
    ) -> WebUrl:
        """The web URL of `function_name` in `app` (see dev/emulator/urls.py for the pattern).

        A custom `label` must be a valid DNS label; apps that are not deployed get `-dev`
        (or `dev_suffix`, the client's MODAL_DEV_SUFFIX) after the label.
        """
        if label:
            check_web_label(label)
        env = self.environments.get(app.env_id)
        dev = (dev_suffix or "dev") if app.state in ("ephemeral", "detached") else ""
        app_label = app.name or app.description or app.id
        url = web_url(self.workspace, env.webhook_suffix, app_label, function_name, label, dev)
        if self.url_mapper is not None:
            return WebUrl(self.url_mapper(url.url), url.truncated, url.has_unique_hash, url.url)
        return url

    def reset(self) -> None:
        self.store.reset()
        self.dicts.reset()
        self.service_users.reset()
        self.environments.ensure_default()


__all__ = ["State"]
