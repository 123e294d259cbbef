"""Modal resources as Pulumi dynamic providers: one module per resource (Args, Provider, Resource;
each field declared once in its Args, see `_schema.py`).

Type tokens are `pulumi-python:dynamic/modal:<Name>`. Credentials come from stack config
`modal:tokenId`/`modal:tokenSecret`/`modal:serverUrl` or env MODAL_TOKEN_ID/MODAL_TOKEN_SECRET/
MODAL_SERVER_URL, read when a provider runs (see `_base.py`). docs/providers.md explains each
resource's diff, read/import and delete behaviour.

The names below are imported lazily, so `python -m components.modal._deploy_runner` (one per
App deploy) does not pay for importing pulumi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: module -> the resource it holds; each module exports `<Resource>`, `<Resource>Args` and
#: `<Resource>Provider`.
_RESOURCES = {
    "app": "App",
    "environment": "Environment",
    "environment_role": "EnvironmentRole",
    "model_weights": "ModelWeights",
    "proxy_auth_token": "ProxyAuthToken",
    "secret": "Secret",
    "service_user": "ServiceUser",
    "spend_alert": "SpendAlert",
    "volume": "Volume",
}
_MODULES = {
    resource + part: module
    for module, resource in _RESOURCES.items()
    for part in ("", "Args", "Provider")
}
__all__ = sorted(_MODULES)

if TYPE_CHECKING:
    # Re-exported (`__all__` is derived from _RESOURCES above).
    from .app import App, AppArgs, AppProvider  # noqa: F401
    from .environment import Environment, EnvironmentArgs, EnvironmentProvider  # noqa: F401
    from .environment_role import EnvironmentRole, EnvironmentRoleArgs, EnvironmentRoleProvider  # noqa: F401
    from .model_weights import ModelWeights, ModelWeightsArgs, ModelWeightsProvider  # noqa: F401
    from .proxy_auth_token import ProxyAuthToken, ProxyAuthTokenArgs, ProxyAuthTokenProvider  # noqa: F401
    from .secret import Secret, SecretArgs, SecretProvider  # noqa: F401
    from .service_user import ServiceUser, ServiceUserArgs, ServiceUserProvider  # noqa: F401
    from .spend_alert import SpendAlert, SpendAlertArgs, SpendAlertProvider  # noqa: F401
    from .volume import Volume, VolumeArgs, VolumeProvider  # noqa: F401
else:

    def __getattr__(name: str) -> Any:
        module = _MODULES.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
