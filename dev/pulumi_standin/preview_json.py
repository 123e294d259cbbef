"""`python -m pulumi_standin preview --json`: the document `pulumi preview --json` prints.

The real CLI builds it in `ShowPreviewDigest` (pulumi/pulumi pkg/backend/display/json.go; the
types are `PreviewDigest` / `PreviewStep` / `PropertyDiff` / `PreviewDiagnostic` in
sdk/pkg/display/json.go, the states `apitype.ResourceV3` serialized by
pkg/resource/stack `SerializeResource`). What this stand-in writes, field by field, and why:

- `config`: the stack's config (the prelude event's), every secret shown as `[secret]`.
- `steps`: one per resource the engine would touch, in registration order, deletes last. As in
  `ShowPreviewDigest` + `shouldShow`: `same` steps are left out (unless `protect` changed),
  except the root `pulumi:pulumi:Stack` step, which is always there; a replace is ONE step
  with op `replace` (`create-replacement` / `delete-replaced` are hidden without
  `--show-replacement-steps`). Each step: `op`, `urn`, `oldState` / `newState`
  (`ResourceV3`: urn, custom, delete, id, type, inputs, outputs, parent, protect,
  retainOnDelete; secrets massaged to the string `[secret]` by `stateForJSONOutput`, unknowns
  serialized as the placeholder `04da6b54-80e4-46f7-96ec-b56ff0331ba9`, as
  `SerializePropertyValue` does), `replaceReasons` (the provider's Diff `replaces`),
  `detailedDiff`.
- `diffReasons` / `detailedDiff`: the SDK's dynamic-provider server answers Diff with
  `changes`, `replaces` and `deleteBeforeReplace` only (pulumi/dynamic/__main__.py, SDK
  3.272.0): no `diffs`, no detailed diff. The engine passes the provider's (empty) changed keys
  through (`provider_plugin.go` Diff: `ChangedKeys: diffs`, `decodeDetailedDiff` nil without
  `hasDetailedDiff`), so for our dynamic resources the real JSON has NO `diffReasons` and
  `"detailedDiff": null`: a reader finds the changed keys by comparing `oldState.inputs` with
  `newState.inputs` (what `pulumi preview --diff` itself does without a detailed diff).
- Stack outputs: the root Stack step's `oldState.outputs` are the outputs of the last update;
  the new ones are NOT in the document (`ResourceOutputsEvent` is ignored by the digest: "we
  don't need to worry about outputs resolving"; pulumi/pulumi issue #20088: "this diff
  information is not even contained in the output of `pulumi preview --json`... Only the old
  values/outputs are listed"). So `newState` of the Stack step has no `outputs` here either.
- `diagnostics`: warnings the program logged, and the error that stopped the preview (e.g.
  "unable to replace resource ... as it is currently marked for protection"), severity
  `warning` / `error`. `changeSummary`: count per op over every resource (component
  resources and the Stack included, `same` too). `duration`: nanoseconds (Go's
  `time.Duration`).

Not the same as the real document: no `provider` references (the stand-in has no provider
resources), no `dependencies` / `propertyDependencies`, and a component resource counts as
`same` when one of its children existed before (the stand-in keeps no state for components).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import pulumi

from pulumi_standin.display import SECRET_SHOWN, emit
from pulumi_standin.engine import (
    Engine,
    Options,
    ProtectedError,
    ResourceState,
    protect_delete_message,
)
from pulumi_standin.program import DYNAMIC, PROJECT, STACK_TYPE, run_program, stack_config
from pulumi_standin.server import OutputLine
from pulumi_standin.stack import (
    Command,
    Interrupt,
    StepMocks,
    explain,
    monitor_for,
    project_of,
    provider_server,
    refresh_first,
)
from pulumi_standin.statefile import StateFile
from pulumi_standin.values import UNKNOWN, Secret, to_harness

#: pkg/resource/stack: what `SerializePropertyValue` writes for a computed (unknown) value.
UNKNOWN_PLACEHOLDER = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
PROVIDER_KEY = "__provider"


def json_value(value: Any) -> Any:
    """A property value as the digest shows it: secrets `[secret]`, unknowns the placeholder,
    whole floats as integers (Go marshals float64 3.0 as `3`)."""
    if isinstance(value, Secret):
        return SECRET_SHOWN
    if value is UNKNOWN or value == UNKNOWN or isinstance(value, pulumi.output.Unknown):
        return UNKNOWN_PLACEHOLDER
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in sorted(value.items()) if v is not None}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def resource_state(
    *,
    urn: str,
    type_: str,
    custom: bool,
    id_: str = "",
    inputs: Mapping[str, Any] | None = None,
    outputs: Mapping[str, Any] | None = None,
    parent: str = "",
    protect: bool = False,
    retain_on_delete: bool = False,
    delete: bool = False,
) -> dict[str, Any]:
    """An `apitype.ResourceV3` as JSON, `omitempty` fields left out when empty."""
    doc: dict[str, Any] = {"urn": urn, "custom": custom}
    if delete:
        doc["delete"] = True
    if id_:
        doc["id"] = id_
    doc["type"] = type_
    if inputs:
        doc["inputs"] = json_value(inputs)
    if outputs:
        doc["outputs"] = json_value(outputs)
    if parent:
        doc["parent"] = parent
    if protect:
        doc["protect"] = True
    if retain_on_delete:
        doc["retainOnDelete"] = True
    return doc


def _with_provider(values: Mapping[str, Any]) -> dict[str, Any]:
    """A dynamic resource's inputs/outputs hold its serialized provider, always secret
    (pulumi/dynamic/dynamic.py: `serialize_as_secret_always`, which components set)."""
    return {PROVIDER_KEY: Secret("<provider>"), **values}


@dataclass
class Record:
    """One custom resource's step, as the preview decided it."""

    name: str
    type: str  # full type token
    op: str
    urn: str
    old: ResourceState | None
    new_inputs: dict[str, Any] | None
    options: Options
    replaces: list[str] = field(default_factory=list)
    parent: str = ""
    #: The old half of a replace whose delete failed (`Delete: true` in the snapshot).
    pending_delete: bool = False


class RecordingStepMocks(StepMocks):
    """`StepMocks` (preview: Check + Diff only) that also keeps each step's old state and new
    inputs, which the digest needs and the text display does not."""

    def __init__(self, engine: Engine, interrupt: Interrupt, targets: tuple[str, ...]) -> None:
        super().__init__(engine, apply=False, out=None, targets=targets, interrupt=interrupt)
        self.records: dict[str, Record] = {}

    def _step(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        old = self.engine.states.get(args.name)
        result = super()._step(args)
        step = self.steps[-1]
        urn, opts = self.request_options.get((args.typ, args.name), ("", Options()))
        if step.op == "skip":
            new_inputs = dict(old.inputs) if old is not None else None
        elif step.op == "same":
            new_inputs = dict(old.inputs) if old is not None else {}
        else:  # what the preview hands the program: the checked inputs
            new_inputs = dict(to_harness(result[1]))
        self.records[args.name] = Record(
            name=args.name,
            type=args.typ,
            op="same" if step.op == "skip" else step.op,
            urn=_engine_urn(urn or (self.engine.urn(old) if old is not None else "")),
            old=old,
            new_inputs=new_inputs,
            options=opts,
            replaces=list(step.replaces),
        )
        return result


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    custom: bool


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        severity = "error" if record.levelno >= logging.ERROR else "warning"
        with contextlib.suppress(Exception):
            self.messages.append((severity, record.getMessage()))


@contextlib.contextmanager
def _captured_warnings() -> Iterator[_Warnings]:
    """What the program logs (pulumi.log.warn goes to the root logger under the SDK's mocks)
    becomes diagnostics instead of lines on stderr."""
    handler = _Warnings()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def root_stack_urn(stack: str, project: str = PROJECT) -> str:
    return f"urn:pulumi:{stack}::{project}::{STACK_TYPE}::{project}-{stack}"


def _engine_urn(urn: str) -> str:
    """The URN the engine gives: the root Stack is not part of a child's type chain (the SDK's
    MockMonitor puts it there for children of the Stack)."""
    return urn.replace(f"::{STACK_TYPE}$", "::", 1)


def _full_type(short_or_full: str) -> str:
    if not short_or_full or short_or_full.startswith(DYNAMIC) or ":" not in short_or_full:
        return short_or_full
    return DYNAMIC + short_or_full


def _custom_step(rec: Record, shown: bool) -> dict[str, Any] | None:
    if not shown:
        return None
    step: dict[str, Any] = {"op": rec.op, "urn": rec.urn}
    old = rec.old
    if old is not None:
        step["oldState"] = resource_state(
            urn=rec.urn,
            type_=rec.type,
            custom=True,
            id_=old.id,
            inputs=_with_provider(old.inputs),
            outputs=_with_provider(old.outputs),
            parent=rec.parent,
            protect=old.protect,
            retain_on_delete=old.retain_on_delete,
            delete=rec.pending_delete,
        )
    if rec.op != "delete" and rec.new_inputs is not None:
        step["newState"] = resource_state(
            urn=rec.urn,
            type_=rec.type,
            custom=True,
            id_=old.id if old is not None and rec.op in ("update", "same") else "",
            inputs=_with_provider(rec.new_inputs),
            parent=rec.parent,
            protect=rec.options.protect,
            retain_on_delete=rec.options.retain_on_delete,
        )
    if rec.op == "replace" and rec.replaces:
        step["replaceReasons"] = list(rec.replaces)
    step["detailedDiff"] = None  # dynamic providers answer no detailed diff (module docstring)
    return step


def digest(
    *,
    stack: str,
    project: str = PROJECT,
    config: Mapping[str, str],
    secret_keys: list[str],
    registrations: list[Registration],
    records: Mapping[str, Record],
    deletes: list[Record],
    old_outputs: Mapping[str, Any],
    stack_exists: bool,
    diagnostics: list[dict[str, Any]],
    duration_ns: int,
) -> dict[str, Any]:
    """The `PreviewDigest` document from what the preview decided."""
    urn = root_stack_urn(stack, project)
    steps: list[dict[str, Any]] = []
    summary: dict[str, int] = {}

    def count(op: str) -> None:
        summary[op] = summary.get(op, 0) + 1

    root_op = "same" if stack_exists else "create"
    root: dict[str, Any] = {"op": root_op, "urn": urn}
    if stack_exists:
        root["oldState"] = resource_state(
            urn=urn, type_=STACK_TYPE, custom=False, outputs=old_outputs
        )
    root["newState"] = resource_state(urn=urn, type_=STACK_TYPE, custom=False)
    root["detailedDiff"] = None
    steps.append(root)
    count(root_op)

    parents = {r.name: r.parent for r in registrations}
    for rec in records.values():
        rec.parent = parents.get(rec.name, "") or urn
    children_existing: dict[str, bool] = {}
    for rec in records.values():
        children_existing[rec.parent] = children_existing.get(rec.parent, False) or (
            rec.old is not None
        )
    for reg in registrations:
        if not reg.custom:
            existed = stack_exists and children_existing.get(reg.urn, False)
            op = "same" if existed else "create"
            count(op)
            if op != "same":
                steps.append(
                    {
                        "op": op,
                        "urn": reg.urn,
                        "newState": resource_state(
                            urn=reg.urn, type_=reg.type, custom=False, parent=reg.parent or urn
                        ),
                        "detailedDiff": None,
                    }
                )
            continue
        found = records.get(reg.name)
        if found is None:
            continue
        count(found.op)
        protect_changed = found.old is not None and found.old.protect != found.options.protect
        shown = found.op != "same" or protect_changed
        step = _custom_step(found, shown)
        if step is not None:
            steps.append(step)
    seen = {r.name for r in registrations}
    for rec in records.values():  # registered, but its RegisterResource did not return
        if rec.name not in seen:
            count(rec.op)
            step = _custom_step(rec, rec.op != "same")
            if step is not None:
                steps.append(step)
    for rec in deletes:
        count("delete")
        step = _custom_step(rec, True)
        if step is not None:
            steps.append(step)
    shown_config = {k: (SECRET_SHOWN if k in secret_keys else v) for k, v in sorted(config.items())}
    doc: dict[str, Any] = {}
    if shown_config:
        doc["config"] = shown_config
    doc["steps"] = steps
    if diagnostics:
        doc["diagnostics"] = diagnostics
    doc["duration"] = duration_ns
    doc["changeSummary"] = summary
    return doc


def _delete_record(st: ResourceState, engine: Engine, *, pending: bool) -> Record:
    return Record(
        name=st.name,
        type=_full_type(st.type),
        op="delete",
        urn=_engine_urn(engine.urn(st)),
        old=st,
        new_inputs=None,
        options=Options(protect=st.protect, retain_on_delete=st.retain_on_delete),
        pending_delete=pending,
    )


def run(cmd: Command, out: TextIO, notes: TextIO, interrupt: Interrupt | None = None) -> int:
    """`preview --json`: the digest on `out` (nothing else), provider lines on `notes`.
    Exit 0, or 1 when the preview failed (the digest still comes, with the error)."""
    started = time.monotonic()
    if cmd.state_path.exists():  # resolve the passphrase first: a missing one runs nothing
        StateFile(cmd.state_path, cmd.stack).box  # noqa: B018
    overrides = {**cmd.overrides, "modal:serverUrl": cmd.url}
    where = cmd.project_dir  # `--cwd DIR` (like `pulumi -C DIR`): DIR's project and stack file
    project = project_of(where)
    config, secret_keys = stack_config(cmd.stack, overrides, project_dir=where)
    shown_config, _ = stack_config(cmd.stack, cmd.overrides, with_defaults=False, project_dir=where)
    registrations: list[Registration] = []
    diagnostics: list[dict[str, Any]] = []
    failed = False
    with contextlib.ExitStack() as stack:
        interrupt = stack.enter_context((interrupt or Interrupt()).installed())
        server = stack.enter_context(
            provider_server(cmd.stack, cmd.url, config, secret_keys, where)
        )

        def show(line: OutputLine) -> None:
            who = f"{line.call.name}: " if line.call is not None and line.call.name else ""
            emit(notes, f"  .. provider | {who}{line.text}\n")

        server.on_output = show
        engine = Engine(server, defer_replaced_deletes=True)
        state = StateFile.load(cmd.state_path, cmd.stack, engine)
        stack_exists = bool(engine.states or engine.pending_deletes or state.outputs)
        mocks = RecordingStepMocks(engine, interrupt, cmd.targets)
        deletes = [_delete_record(st, engine, pending=True) for st in engine.pending_deletes]

        def factory(m: pulumi.runtime.Mocks) -> Any:
            monitor = monitor_for(m)
            register = monitor.RegisterResource

            def recording(request: Any) -> Any:
                if request.type != STACK_TYPE:
                    registrations.append(
                        Registration(
                            type=request.type,
                            name=request.name,
                            urn=_engine_urn(
                                monitor.make_urn(request.parent, request.type, request.name)
                            ),
                            parent=_engine_urn(request.parent),
                            custom=bool(request.custom),
                        )
                    )
                return register(request)

            monitor.RegisterResource = recording  # type: ignore[method-assign]
            return monitor

        with _captured_warnings() as warnings:
            try:
                # `preview --json --refresh`: the refresh first, its lines with the notes
                # (stack.refresh_first cites the engine); the plan is against what it read.
                mocks.drift = refresh_first(cmd, engine, notes, interrupt).drift
                run_program(
                    cmd.stack,
                    config,
                    secret_keys,
                    mocks=mocks,
                    preview=True,
                    program=cmd.program,
                    project=project,
                    monitor_factory=factory,
                )
                for name in reversed(list(engine.states)):
                    if name in mocks.registered:
                        continue
                    st = engine.states[name]
                    if cmd.targets and name not in cmd.targets and st.urn not in cmd.targets:
                        continue
                    if st.protect:
                        raise ProtectedError(protect_delete_message(engine.urn(st)))
                    deletes.append(_delete_record(st, engine, pending=False))
            except BaseException as exc:  # the digest still comes, with the error in it
                if isinstance(exc, KeyboardInterrupt) or interrupt.requested:
                    message = "interrupted (Ctrl-C): the preview stopped"
                else:
                    message = explain(mocks.error or exc)
                diagnostics.append({"message": message + "\n", "severity": "error"})
                failed = True
        diagnostics[:0] = [
            {"message": text + "\n", "severity": severity} for severity, text in warnings.messages
        ]
        doc = digest(
            stack=cmd.stack,
            project=project,
            config=shown_config,
            secret_keys=secret_keys,
            registrations=registrations,
            records=mocks.records,
            deletes=deletes,
            old_outputs=state.outputs,
            stack_exists=stack_exists,
            diagnostics=diagnostics,
            duration_ns=int((time.monotonic() - started) * 1e9),
        )
    out.write(json.dumps(doc, indent=4, ensure_ascii=False) + "\n")
    return 1 if failed else 0
