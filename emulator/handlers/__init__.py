"""gRPC handlers, one module per area; importing this package registers them all."""

from emulator.handlers import (
    apps,
    containers,
    deploy,
    dicts,
    resources,
    service_users,
    workspace,
)

__all__ = ["apps", "containers", "deploy", "dicts", "resources", "service_users", "workspace"]
