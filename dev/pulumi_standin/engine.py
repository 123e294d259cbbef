"""Step decisions and their order, the way `pulumi preview/up/refresh/destroy` make them.

`Engine` keys resources by name and drives each through a `ProviderServer`. Where the real
engine (pulumi/pulumi v3.272.0) is specific, this follows it; each point names the source and a
test in tests/standin/test_engine.py checks it:

- register: ignore_changes copies the old input values over the program's before Check
  (step_generator.go, processIgnoreChanges); Check(olds = old inputs, news); no old state →
  Create; else Diff(olds = old OUTPUTS, news, old_inputs); DIFF_NONE → same; replaces →
  replace; else update.
- replace: protected in both the old state and the program → refused with the engine's
  message before anything runs (step_generator.go: `new.Protect && old.Protect`); with
  delete_before_replace (from the provider's Diff or the resource option) the old one is
  deleted first; otherwise the new one is created first and the old one is kept, marked
  pending-delete (`Delete: true` in the snapshot), and deleted after every registration of
  the deployment (step_generator.go GenerateDeletes); a pending-delete left by a failed delete
  is retried at the start of the next deployment (GeneratePendingDeletes). A failed delete of
  the old one keeps the new one.
- delete: a protected resource is refused with the engine's message; retain_on_delete drops
  it from the state without calling the provider (step.go, DeleteStep.Apply).
- import: Read with URN, type and ID only (step.go, ImportStep.Apply). The SDK's
  dynamic-provider server then finds no `__provider` and fails, so a dynamic resource cannot be
  imported; a Read answer without inputs fails with the engine's "provider does not support
  importing resources" message; an empty answer with "resource '<id>' does not exist"; a Diff
  that is not empty with "inputs to import do not match the existing resource".
- state: `on_change()` runs after every step that changed it, so a failed `up` keeps what it
  applied and a second `up` continues from there.
- customTimeouts: parsed as the engine parses them (source_eval.go RegisterResource →
  generateTimeoutInSeconds: Go's time.ParseDuration, in seconds; "unable to parse customTimeout
  Value <v>" otherwise) and only handed to the provider in the request's `timeout` field:
  Create gets the new state's `create`, Update the new state's `update`, Delete the OLD state's
  `delete` (step.go CreateStep/UpdateStep/DeleteStep.Apply), refresh's Read the old state's
  `read` (pulumi/pulumi#23459: "passed to providers"). The engine neither sets a deadline nor
  cancels a step when one runs out (provider_plugin.go: every call under requestContext(), no
  deadline), so neither does this; they are kept in the state like the engine's
  `CustomTimeouts` (a SameStep writes the program's new ones).

`before_step(op, name)` runs before each Create/Update/Delete: a fault-injection hook for tests
(it may raise). Not modelled: a dependency graph and parallel steps (the program registers in
dependency order and steps run one at a time), aliases, plugin providers, pending operations
of an engine that crashed mid-call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pulumi_standin.server import (
    DiffOutcome,
    ProviderCallError,
    ProviderRef,
    ProviderServer,
    ReadOutcome,
)
from pulumi_standin.values import stored_form, strip_secrets


class EngineError(Exception):
    """A step the engine refuses or that failed; the message is what the engine prints."""


class CheckFailed(EngineError):
    def __init__(self, name: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(f"check failed for {name}: {failures}")
        self.name = name
        self.failures = failures


class ImportFailed(EngineError):
    def __init__(self, name: str, id_: str, why: str) -> None:
        super().__init__(f"import of {name} ({id_}) failed: {why}")
        self.name = name
        self.why = why


class ProtectedError(EngineError):
    """The engine's refusal to delete or replace a protected resource."""


# Go's time.ParseDuration units, in seconds (µ as U+00B5 and U+03BC, as Go accepts both).
_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_ELEMENT = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]+)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string ("30m", "1h30m", "1.5s", "-2m"), as the engine parses a
    customTimeouts value (time.ParseDuration). Raises ValueError with the engine's message
    (source_eval.go generateTimeoutInSeconds) for anything Go refuses, "1d" included."""
    error = ValueError(f"unable to parse customTimeout Value {text}")
    rest = text
    sign = 1.0
    if rest[:1] in ("-", "+"):
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise error
    total = 0.0
    pos = 0
    while pos < len(rest):
        m = _ELEMENT.match(rest, pos)
        if m is None or not (m.group(1) or m.group(2)) or m.group(3) not in _UNITS:
            raise error
        whole, frac, unit = m.group(1), m.group(2) or "", m.group(3)
        total += float(f"{whole or '0'}.{frac or '0'}") * _UNITS[unit]
        pos = m.end()
    return sign * total


@dataclass(frozen=True)
class CustomTimeouts:
    """A resource's customTimeouts in seconds (0: not set), as `resource.CustomTimeouts` in the
    engine's state. Passed to the provider, never enforced (see the module doc)."""

    create: float = 0.0
    update: float = 0.0
    delete: float = 0.0
    read: float = 0.0

    @classmethod
    def parse(
        cls, create: str = "", update: str = "", delete: str = "", read: str = ""
    ) -> CustomTimeouts:
        """From the RegisterResourceRequest strings; empty ones are not set (the engine only
        parses the ones that are not empty)."""
        return cls(*(parse_duration(v) if v else 0.0 for v in (create, update, delete, read)))

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if v}


@dataclass
class ResourceState:
    """What the engine's state file holds for one resource."""

    name: str
    provider: ProviderRef
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    secret_outputs: tuple[str, ...] = ()
    type: str = ""
    protect: bool = False
    retain_on_delete: bool = False
    #: The old half of a create-before-delete replace, still to be deleted (`Delete: true`).
    pending_delete: bool = False
    urn: str = ""
    custom_timeouts: CustomTimeouts = CustomTimeouts()


@dataclass(frozen=True)
class Options:
    """Resource options of one registration (`RegisterResourceRequest` fields)."""

    secret_outputs: tuple[str, ...] = ()
    protect: bool = False
    retain_on_delete: bool = False
    ignore_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False
    custom_timeouts: CustomTimeouts = CustomTimeouts()


def protect_replace_message(urn: str) -> str:
    # pulumi/pulumi v3.272.0 pkg/resource/deploy/step_generator.go (generateSteps)
    return (
        f'unable to replace resource "{urn}"\nas it is currently marked for protection. To'
        " unprotect the resource, remove the `protect` flag from the resource in your Pulumi"
        " program and run `pulumi up`"
    )


def protect_delete_message(urn: str) -> str:
    # pulumi/pulumi v3.272.0 pkg/resource/deploy/step.go (DeleteStep.Apply)
    return (
        f'unable to delete resource "{urn}"\nas it is currently marked for protection. To'
        " unprotect the resource, either remove the `protect` flag from the resource in your"
        f" Pulumi program and run `pulumi up`, or use the command:\n`pulumi state unprotect {urn}`"
    )


@dataclass
class Engine:
    """A tiny engine over one provider server: state, step decisions, their order."""

    server: ProviderServer
    states: dict[str, ResourceState] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    #: Old halves of replaces still to delete, oldest first (`Delete: true` in the snapshot).
    pending_deletes: list[ResourceState] = field(default_factory=list)
    #: Called after every change of `states`/`pending_deletes` (persist the state file).
    on_change: Callable[[], None] | None = None
    #: Called before each Create/Update/Delete with (op, name); tests inject failures here.
    before_step: Callable[[str, str], None] | None = None
    #: Engine order: the old half of a create-before-delete replace is deleted after every
    #: registration (`finish()`); False deletes it at once (single-resource tests).
    defer_replaced_deletes: bool = False
    last_diff: DiffOutcome | None = None

    # ---- plumbing -----------------------------------------------------------------------
    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _before(self, op: str, name: str) -> None:
        if self.before_step is not None:
            self.before_step(op, name)

    def urn(self, st: ResourceState) -> str:
        return st.urn or self.server.urn(st.type or self.server.type_token(st.provider), st.name)

    # ---- registration ---------------------------------------------------------------------
    def plan(
        self,
        name: str,
        provider: ProviderRef,
        inputs: Mapping[str, Any],
        *,
        options: Options = Options(),
    ) -> tuple[str, DiffOutcome | None, dict[str, Any]]:
        """(step, diff, checked inputs) for registering `name` with `inputs`; nothing applied."""
        old = self.states.get(name)
        news = dict(inputs)
        if old is not None:
            for key in options.ignore_changes:  # processIgnoreChanges: old value wins
                if key in old.inputs:
                    news[key] = old.inputs[key]
                else:
                    news.pop(key, None)
        chk = self.server.check(provider, news, old.inputs if old else None, name=name)
        if chk.failures:
            raise CheckFailed(name, chk.failures)
        self.last_diff = None
        if old is None:
            return "create", None, chk.inputs
        d = self.server.diff(
            provider, old.id, old.outputs, chk.inputs, old_inputs=old.inputs, name=name
        )
        self.last_diff = d
        if d.changes == "none":
            return "same", d, chk.inputs
        if d.replaces:
            if old.protect and options.protect:
                raise ProtectedError(protect_replace_message(self.urn(old)))
            return "replace", d, chk.inputs
        return "update", d, chk.inputs

    def preview(self, name: str, provider: ProviderRef, inputs: Mapping[str, Any]) -> str:
        step, _, _ = self.plan(name, provider, inputs)
        self.log.append(f"preview {step} {name}")
        return step

    def up(
        self,
        name: str,
        provider: ProviderRef,
        inputs: Mapping[str, Any],
        *,
        secret_outputs: Iterable[str] = (),
        options: Options | None = None,
        type_: str = "",
        urn: str = "",
    ) -> str:
        """Register `name`: plan, then apply the step. Returns "create" | "same" | "update" |
        "replace"."""
        opts = options or Options(secret_outputs=tuple(secret_outputs))
        so = opts.secret_outputs or tuple(secret_outputs)
        step, d, checked = self.plan(name, provider, inputs, options=opts)
        old = self.states.get(name)
        timeouts = opts.custom_timeouts

        def new_state(id_: str, outs: dict[str, Any]) -> ResourceState:
            return ResourceState(
                name,
                provider,
                id_,
                checked,
                outs,
                so,
                type_ or (old.type if old else ""),
                opts.protect,
                opts.retain_on_delete,
                urn=urn or (old.urn if old else ""),
                custom_timeouts=timeouts,
            )

        if step == "create":
            self._before("create", name)
            c = self.server.create(
                provider, checked, name=name, secret_outputs=so, timeout=timeouts.create
            )
            self.states[name] = new_state(c.id, c.outputs)
            self._changed()
        elif step == "same":
            assert old is not None
            if (old.protect, old.retain_on_delete, old.secret_outputs, old.custom_timeouts) != (
                opts.protect,
                opts.retain_on_delete,
                so,
                timeouts,
            ):  # a SameStep still writes the new options into the state
                self.states[name] = new_state(old.id, old.outputs)
                self._changed()
        elif step == "update":
            assert old is not None
            self._before("update", name)
            outs = self.server.update(
                provider,
                old.id,
                old.outputs,
                checked,
                old_inputs=old.inputs,
                name=name,
                secret_outputs=so,
                timeout=timeouts.update,
            )
            self.states[name] = new_state(old.id, outs)
            self._changed()
        else:  # replace
            assert old is not None and d is not None
            # Unprotect + replace in one run is allowed (step_generator.go: "we don't look
            # at old.Protect here"): the old half is deleted under the program's new flag.
            old.protect = opts.protect
            if d.delete_before_replace or opts.delete_before_replace:
                self._delete(old)  # the old one first; a failure leaves it in the state
                del self.states[name]
                self._changed()
                self._before("create", name)
                c = self.server.create(
                    provider, checked, name=name, secret_outputs=so, timeout=timeouts.create
                )
                self.states[name] = new_state(c.id, c.outputs)
                self._changed()
            else:  # create-before-delete: the new one exists before the old one goes
                self._before("create", name)
                c = self.server.create(
                    provider, checked, name=name, secret_outputs=so, timeout=timeouts.create
                )
                old.pending_delete = True
                self.pending_deletes.append(old)
                self.states[name] = new_state(c.id, c.outputs)
                self._changed()
                if not self.defer_replaced_deletes:
                    self.delete_pending()
        detail = f" {d.replaces}" if d is not None and d.replaces else ""
        self.log.append(f"{step} {name}{detail}")
        return step

    # ---- deletes ----------------------------------------------------------------------------
    def _delete(self, st: ResourceState) -> None:
        """DeleteStep.Apply: refuse protected, skip the provider for retain_on_delete."""
        if st.protect:
            raise ProtectedError(protect_delete_message(self.urn(st)))
        if st.retain_on_delete:
            return
        self._before("delete", st.name)
        self.server.delete(
            st.provider,
            st.id,
            st.outputs,
            old_inputs=st.inputs,
            name=st.name,
            timeout=st.custom_timeouts.delete,  # the OLD state's (DeleteStep.Apply)
        )

    def delete_pending(self) -> None:
        """Delete the old halves of replaces, newest first; a failure keeps them pending."""
        for st in reversed(list(self.pending_deletes)):
            self._delete(st)
            self.pending_deletes.remove(st)
            self._changed()
            self.log.append(f"delete-replaced {st.name}")

    def destroy(self, name: str) -> None:
        st = self.states[name]  # a failed delete leaves the resource in state, as in Pulumi
        self._delete(st)
        del self.states[name]
        self._changed()
        self.log.append(f"delete {name}")

    def finish(self) -> None:
        """End of a deployment: the deferred deletes of replaced resources."""
        self.delete_pending()

    # ---- refresh / import ---------------------------------------------------------------------
    def refresh(self, name: str) -> str:
        """Read with the old outputs and inputs: "same" | "update" (drift) | "delete" (gone)."""
        st = self.states[name]
        r = self.server.read(
            st.provider,
            st.id,
            state=st.outputs,
            inputs=st.inputs,
            name=name,
            secret_outputs=st.secret_outputs,
            timeout=st.custom_timeouts.read,
        )
        if not r.id:
            del self.states[name]
            self._changed()
            self.log.append(f"refresh delete {name}")
            return "delete"
        new_inputs = r.inputs if r.inputs is not None else st.inputs
        changed = strip_secrets(r.outputs) != strip_secrets(st.outputs) or r.id != st.id
        st.id, st.inputs, st.outputs = r.id, new_inputs, r.outputs
        if changed:
            self._changed()
        step = "update" if changed else "same"
        self.log.append(f"refresh {step} {name}")
        return step

    def import_(
        self,
        name: str,
        provider: ProviderRef,
        id_: str,
        inputs: Mapping[str, Any],
        *,
        secret_outputs: Iterable[str] = (),
        options: Options = Options(),
    ) -> ResourceState:
        """The `import` resource option, as ImportStep.Apply runs it (see the module doc)."""
        so = tuple(secret_outputs)
        try:
            r: ReadOutcome = self.server.read(
                provider, id_, name=name, secret_outputs=so, import_=True
            )
        except ProviderCallError as exc:
            # The provider's exception, whole (not the traceback's last line only).
            raise ImportFailed(name, id_, f"Read failed: {exc.message}") from exc
        typ = self.server.type_token(provider)
        if not r.id:
            raise ImportFailed(name, id_, f"resource '{id_}' does not exist")
        if r.inputs is None:
            package = typ.split(":", 1)[0]
            raise ImportFailed(
                name,
                id_,
                "provider does not support importing resources; please try updating the"
                f" '{package}' plugin",
            )
        news = dict(inputs)
        for key in options.ignore_changes:
            if key in r.inputs:
                news[key] = r.inputs[key]
        chk = self.server.check(provider, news, r.inputs, name=name)
        if chk.failures:
            raise CheckFailed(name, chk.failures)
        d = self.server.diff(provider, r.id, r.outputs, chk.inputs, old_inputs=r.inputs, name=name)
        if d.changes != "none":
            raise ImportFailed(
                name,
                id_,
                f"inputs to import do not match the existing resource (replaces={d.replaces})",
            )
        st = ResourceState(
            name,
            provider,
            r.id,
            chk.inputs,
            r.outputs,
            so,
            typ,
            options.protect,
            custom_timeouts=options.custom_timeouts,
        )
        self.states[name] = st
        self._changed()
        self.log.append(f"import {name} {id_}")
        return st

    def stored_state(self) -> dict[str, Any]:
        """The state as the engine would write it (secrets encrypted)."""
        return {
            n: {"id": s.id, "inputs": stored_form(s.inputs), "outputs": stored_form(s.outputs)}
            for n, s in self.states.items()
        }


def lifecycle(
    engine: Engine,
    name: str,
    provider: ProviderRef,
    inputs: Mapping[str, Any],
    update_inputs: Mapping[str, Any] | None = None,
    *,
    secret_outputs: Iterable[str] = (),
    destroy: bool = True,
) -> list[str]:
    """up → refresh → no-op preview → (up with update_inputs) → destroy; returns the steps.

    A healthy provider yields ["create", "same", "same", <"update"|"replace">, "delete"].
    """
    steps = [engine.up(name, provider, inputs, secret_outputs=secret_outputs)]
    steps.append(engine.refresh(name))
    steps.append(engine.preview(name, provider, inputs))
    if update_inputs is not None:
        steps.append(engine.up(name, provider, update_inputs, secret_outputs=secret_outputs))
    if destroy:
        engine.destroy(name)
        steps.append("delete")
    return steps
