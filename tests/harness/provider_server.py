"""Test-facing names of the engine stand-in; the code lives in the `pulumi_standin` package.

Kept so tests keep importing `from tests.harness.provider_server import Engine, ...`.
`Engine.import_` is the engine's import (Read with URN, type and ID only: pulumi/pulumi
v3.272.0 pkg/resource/deploy/step.go, ImportStep.Apply), which fails for dynamic resources as
it does under the real CLI; resources that can pre-exist are taken over with their `adopt`
input instead (docs/providers.md).
"""

from __future__ import annotations

from pulumi_standin import (
    MUTATING_METHODS,
    PROJECT_ROOT,
    UNKNOWN,
    CheckFailed,
    CheckOutcome,
    Created,
    DiffOutcome,
    Engine,
    ImportFailed,
    Options,
    ProtectedError,
    ProviderCallError,
    ProviderRef,
    ProviderServer,
    ReadOutcome,
    Record,
    ResourceState,
    Secret,
    iter_secret_strings,
    lifecycle,
    reveal,
    scan_for_leaks,
    stored_form,
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
    "iter_secret_strings",
    "lifecycle",
    "reveal",
    "scan_for_leaks",
    "stored_form",
]
