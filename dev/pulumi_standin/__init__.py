"""The project's one stand-in for the Pulumi engine (for machines without the Pulumi CLI).

- `server.ProviderServer`: the SDK's real dynamic-provider server (`python -m pulumi.dynamic`,
  cwd = project root), driven over gRPC the way the engine drives it;
- `engine.Engine`: step decisions and their order (create/update/replace/delete, protect,
  retain_on_delete, ignore_changes, pending deletes, import, refresh), each point citing the
  pulumi/pulumi v3.272.0 source it mirrors;
- `program.run_program`: `__main__.py` under the SDK's mock monitor with a stack's real config;
- `stack` / `cli`: preview, up, refresh, destroy, stack output against the Modal emulator, with
  an encrypted state file written after every step (`python -m pulumi_standin`).

What the real engine does, what this does, and the test that checks it: docs/standin.md.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pulumi_standin.engine import (
        CheckFailed,
        Engine,
        EngineError,
        ImportFailed,
        Options,
        ProtectedError,
        ResourceState,
        lifecycle,
    )
    from pulumi_standin.server import (
        MUTATING_METHODS,
        PROJECT_ROOT,
        CheckOutcome,
        Created,
        DiffOutcome,
        ProviderCallError,
        ProviderRef,
        ProviderServer,
        ReadOutcome,
        Record,
    )
    from pulumi_standin.values import (
        UNKNOWN,
        Secret,
        contains_secret,
        iter_secret_strings,
        reveal,
        scan_for_leaks,
        stored_form,
        strip_secrets,
        to_harness,
        to_program,
    )

#: name -> module: imported on first use, so `python -m pulumi_standin` can install its
#: Ctrl-C handler (dev/pulumi_standin/_sigint.py) before the SDK loads.
_LAZY = {
    "CheckFailed": "pulumi_standin.engine",
    "CheckOutcome": "pulumi_standin.server",
    "Created": "pulumi_standin.server",
    "DiffOutcome": "pulumi_standin.server",
    "Engine": "pulumi_standin.engine",
    "EngineError": "pulumi_standin.engine",
    "ImportFailed": "pulumi_standin.engine",
    "MUTATING_METHODS": "pulumi_standin.server",
    "Options": "pulumi_standin.engine",
    "PROJECT_ROOT": "pulumi_standin.server",
    "ProtectedError": "pulumi_standin.engine",
    "ProviderCallError": "pulumi_standin.server",
    "ProviderRef": "pulumi_standin.server",
    "ProviderServer": "pulumi_standin.server",
    "ReadOutcome": "pulumi_standin.server",
    "Record": "pulumi_standin.server",
    "ResourceState": "pulumi_standin.engine",
    "Secret": "pulumi_standin.values",
    "UNKNOWN": "pulumi_standin.values",
    "contains_secret": "pulumi_standin.values",
    "iter_secret_strings": "pulumi_standin.values",
    "lifecycle": "pulumi_standin.engine",
    "reveal": "pulumi_standin.values",
    "scan_for_leaks": "pulumi_standin.values",
    "stored_form": "pulumi_standin.values",
    "strip_secrets": "pulumi_standin.values",
    "to_harness": "pulumi_standin.values",
    "to_program": "pulumi_standin.values",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pulumi_standin' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "MUTATING_METHODS",
    "PROJECT_ROOT",
    "UNKNOWN",
    "CheckFailed",
    "CheckOutcome",
    "Created",
    "DiffOutcome",
    "Engine",
    "EngineError",
    "ImportFailed",
    "Options",
    "ProtectedError",
    "ProviderCallError",
    "ProviderRef",
    "ProviderServer",
    "ReadOutcome",
    "Record",
    "ResourceState",
    "Secret",
    "contains_secret",
    "iter_secret_strings",
    "lifecycle",
    "reveal",
    "scan_for_leaks",
    "stored_form",
    "strip_secrets",
    "to_harness",
    "to_program",
]
