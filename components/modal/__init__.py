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

_MODULES = {
    "App": "app",
    "AppArgs": "app",
    "AppProvider": "app",
    "Environment": "environment",
    "EnvironmentArgs": "environment",
    "EnvironmentProvider": "environment",
    "EnvironmentRole": "environment_role",
    "EnvironmentRoleArgs": "environment_role",
    "EnvironmentRoleProvider": "environment_role",
    "ModelWeights": "model_weights",
    "ModelWeightsArgs": "model_weights",
    "ModelWeightsProvider": "model_weights",
    "ProxyAuthToken": "proxy_auth_token",
    "ProxyAuthTokenArgs": "proxy_auth_token",
    "ProxyAuthTokenProvider": "proxy_auth_token",
    "Secret": "secret",
    "SecretArgs": "secret",
    "SecretProvider": "secret",
    "ServiceUser": "service_user",
    "ServiceUserArgs": "service_user",
    "ServiceUserProvider": "service_user",
    "SpendAlert": "spend_alert",
    "SpendAlertArgs": "spend_alert",
    "SpendAlertProvider": "spend_alert",
    "Volume": "volume",
    "VolumeArgs": "volume",
    "VolumeProvider": "volume",
}

__all__ = [
    "App",
    "AppArgs",
    "AppProvider",
    "Environment",
    "EnvironmentArgs",
    "EnvironmentProvider",
    "EnvironmentRole",
    "EnvironmentRoleArgs",
    "EnvironmentRoleProvider",
    "ModelWeights",
    "ModelWeightsArgs",
    "ModelWeightsProvider",
    "ProxyAuthToken",
    "ProxyAuthTokenArgs",
    "ProxyAuthTokenProvider",
    "Secret",
    "SecretArgs",
    "SecretProvider",
    "ServiceUser",
    "ServiceUserArgs",
    "ServiceUserProvider",
    "SpendAlert",
    "SpendAlertArgs",
    "SpendAlertProvider",
    "Volume",
    "VolumeArgs",
    "VolumeProvider",
]

if TYPE_CHECKING:
    from .app import App, AppArgs, AppProvider
    from .environment import Environment, EnvironmentArgs, EnvironmentProvider
    from .environment_role import EnvironmentRole, EnvironmentRoleArgs, EnvironmentRoleProvider
    from .model_weights import ModelWeights, ModelWeightsArgs, ModelWeightsProvider
    from .proxy_auth_token import ProxyAuthToken, ProxyAuthTokenArgs, ProxyAuthTokenProvider
    from .secret import Secret, SecretArgs, SecretProvider
    from .service_user import ServiceUser, ServiceUserArgs, ServiceUserProvider
    from .spend_alert import SpendAlert, SpendAlertArgs, SpendAlertProvider
    from .volume import Volume, VolumeArgs, VolumeProvider
else:

    def __getattr__(name: str) -> Any:
        module = _MODULES.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
