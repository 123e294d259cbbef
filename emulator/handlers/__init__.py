"""gRPC handlers, one module per area; importing this package registers them all."""

from emulator.handlers import apps, deploy, resources, workspace

__all__ = ["apps", "deploy", "resources", "workspace"]
