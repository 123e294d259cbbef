"""Test-facing names of the engine stand-in; the code lives in the `pulumi_standin` package.

Kept so tests keep importing `from tests.harness.provider_server import Engine, ...`.

TRANSITION, NOT THE ENGINE: `Engine.import_` here is the old harness import, which sends the
program's inputs to Read. The real engine reads with URN, type and ID only (pulumi/pulumi
v3.272.0 pkg/resource/deploy/step.go, ImportStep.Apply), which the SDK's dynamic-provider
server cannot serve, so `import_` of a dynamic resource cannot work under the real CLI:
`pulumi_standin.Engine.import_` does it the engine's way and fails there. This override exists
only until tests/providers stop using import (they move to each resource's `adopt` input);
then delete `Engine` below and re-export `pulumi_standin.Engine`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pulumi_standin
from pulumi_standin import (
    MUTATING_METHODS,
    PROJECT_ROOT,
    UNKNOWN,
    CheckFailed,
    CheckOutcome,
    Created,
    DiffOutcome,
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


class Engine(pulumi_standin.Engine):
    """`pulumi_standin.Engine` with the OLD, non-faithful `import_` (see the module doc)."""

    def import_(
        self,
        name: str,
        provider: ProviderRef,
        id_: str,
        inputs: Mapping[str, Any],
        *,
        secret_outputs: Iterable[str] = (),
        options: Options = Options(),  # noqa: B008 (frozen)
    ) -> ResourceState:
        """NOT what the engine does: Read by id WITH the program's inputs (so `__provider`
        reaches the SDK server), then Check + Diff must be clean."""
        so = tuple(secret_outputs)
        r = self.server.read(provider, id_, inputs=inputs, name=name, secret_outputs=so)
        if not r.id:
            raise ImportFailed(name, id_, "resource not found")
        read_inputs = r.inputs if r.inputs is not None else dict(inputs)
        chk = self.server.check(provider, inputs, read_inputs, name=name)
        if chk.failures:
            raise CheckFailed(name, chk.failures)
        d = self.server.diff(
            provider, r.id, r.outputs, chk.inputs, old_inputs=read_inputs, name=name
        )
        if d.changes != "none":
            raise ImportFailed(
                name, id_, f"inputs differ from the live resource (replaces={d.replaces})"
            )
        st = ResourceState(name, provider, r.id, chk.inputs, r.outputs, so)
        self.states[name] = st
        self.log.append(f"import {name} {id_}")
        return st


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
    "ProtectedError",
    "ProviderCallError",
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
