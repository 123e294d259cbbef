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
