"""gRPC handlers, one module per area; importing this package registers them all."""

from emulator.handlers import (
    apps,
    autoscaler,
    containers,
    deploy,
    dicts,
    resources,
    service_users,
    workspace,
)

__all__ = [
    "apps",
    "autoscaler",
    "containers",
    "deploy",
    "dicts",
    "resources",
    "service_users",
    "workspace",
]
