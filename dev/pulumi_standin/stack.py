"""A stack run: the program under mocks, its dynamic resources through the engine stand-in.

`python -m pulumi_standin {preview,up,refresh,destroy,output} --stack S` (scripts/offline_stack.py
and the Makefile's plan/offline-up/offline-down call this). The real program (`__main__.py`)
runs under the SDK's mock monitor with the stack's real config (program.stack_config); each
dynamic resource it registers goes through `Engine` (engine.py) and the SDK's real
dynamic-provider server (server.py); the providers' outputs go back to the program, so
dependents see real ids and URLs and the stack outputs are the real ones. The state file
(statefile.py) is written after every step.

Engine behaviour kept here (pulumi/pulumi v3.272.0):
- pending deletes left by a failed replace are deleted first (step_generator.go,
  GeneratePendingDeletes); deletes of resources the program no longer registers and of the
  old halves of replaces come after every registration (GenerateDeletes);
- after the first failed step no new step starts (the step executor cancels the deployment;
  steps in flight finish); the error is printed once, the state keeps every applied step;
- Ctrl-C: the step in flight finishes and is saved, nothing new starts, one message, exit 130;
- `--target URN` (or the resource name): other resources keep their state untouched and an
  untargeted new resource is not created (its inputs stand in for its outputs);
- `destroy` with a protected resource refuses before deleting anything (a destroy's preview
  fails on the protected delete before the update starts);
- `customTimeouts` reach the provider in the request's `timeout` field only (engine.py);
  no provider call has a deadline (server.py);
- what the provider prints while a call runs is shown at once, on the resource's own line
  (`print_progress`); the engine forwards the same lines live, as diagnostics of the stack
  (docs/offline.md says how the two displays differ);
- a failed provider call shows the provider's exception whole (`ProviderCallError.message`),
  its traceback in `<state>.last-error.txt` (or inline with `--verbose`).
Not modelled: see docs/standin.md.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

import pulumi
import yaml
from pulumi.runtime import rpc

from pulumi_standin import _sigint
from pulumi_standin.display import (
    DYNAMIC_PREFIX,
    Step,
    diff_lines,
    emit,
    print_outputs,
    print_progress,
    print_step,
    show_output,
    summary,
)
from pulumi_standin.engine import (
    CheckFailed,
    CustomTimeouts,
    Engine,
    EngineError,
    Options,
    ProtectedError,
    protect_delete_message,
)
from pulumi_standin.program import (
    DYNAMIC,
    PROJECT,
    PROJECT_ROOT,
    ProgramRun,
    RecordingMonitor,
    project_name,
    run_program,
    stack_config,
)
from pulumi_standin.server import OutputLine, ProviderCallError, ProviderServer
from pulumi_standin.statefile import NOT_THE_ENGINE, StandinError, StateFile
from pulumi_standin.values import Secret, strip_secrets, to_harness, to_program

#: Test-only fault injection for command runs: "OP:NAME" makes the step OP (create, update,
#: delete) of resource NAME fail before the provider is called; "interrupt:OP:NAME" delivers
#: a Ctrl-C there instead.
FAULT_ENV = "PULUMI_STANDIN_FAULT"


class Cancelled(Exception):
    """A step not started because the deployment was already failing or interrupted."""


class InjectedFault(Exception):
    """The failure FAULT_ENV asked for."""


class Interrupt:
    """Ctrl-C the engine's way: the first one lets the step in flight finish and starts no new
    one (the CLI's graceful cancellation); a second one stops at once (KeyboardInterrupt).

    A KeyboardInterrupt raised at a random point would land inside the SDK, which holds it
    until every outstanding registration has run (pulumi/runtime/stack.py run_pulumi_func),
    so the first Ctrl-C only sets `event`; every step checks it before it starts.
    """

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupt]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, _sigint.handler_for(self.event))
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def check(self) -> None:
        """Between two steps of the main thread: stop if Ctrl-C was pressed."""
        if self.event.is_set():
            raise KeyboardInterrupt


@dataclass
class Command:
    command: str  # preview | up | refresh | destroy | output
    stack: str
    state_path: Path
    url: str
    show_secrets: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    output_name: str | None = None
    #: `output --json`: the value (or every output) as one JSON document, as `pulumi stack
    #: output --json` prints it (secrets "[secret]" unless --show-secrets).
    output_json: bool = False
    #: Show a failed provider call's whole traceback inline (else only its file is named).
    verbose: bool = False
    #: The Pulumi program (tests run a program of their own; the command line sets it to
    #: `project_dir/__main__.py`).
    program: Path = PROJECT_ROOT / "__main__.py"
    #: The project directory (`--cwd DIR`, like `pulumi -C DIR`): Pulumi.yaml, the stack file,
    #: the provider server's working directory.
    project_dir: Path = PROJECT_ROOT
    #: Refresh every resource of the state before the preview / up / destroy (the engine's
    #: `UpdateOptions.Refresh`). The command line sets it as the CLI does (`refresh_option`:
    #: `--refresh`, else Pulumi.yaml's `options: refresh: always`); callers of `run` say it.
    refresh: bool = False
    #: The refresh was asked with `--refresh` (else it came from Pulumi.yaml): for the banner.
    refresh_flag: bool = False


# ---- refresh as part of an operation -------------------------------------------------------


def refresh_option(project_dir: Path, flag: str | None) -> bool:
    """Whether this operation refreshes first, decided as the CLI decides it
    (pulumi/pulumi pkg/cmd/pulumi/operations/io.go `getRefreshOption`, called by up.go,
    preview.go and destroy.go): an explicit `--refresh[=BOOL]` wins (strconv.ParseBool's
    spellings; anything else: "unable to determine value for --refresh"); else the project's
    `options: refresh: always` (sdk/go/common/workspace/project.go `ProjectOptions.Refresh`,
    "the ability to always run a refresh as part of a pulumi update / preview / destroy"; the
    project schema allows only the value "always", project.json); else no refresh."""
    if flag is not None:
        value = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
        value |= {"0": False, "f": False, "F": False, "FALSE": False, "false": False}
        value |= {"False": False}
        if flag not in value:
            raise StandinError("unable to determine value for --refresh")
        return value[flag]
    raw = yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}
    options = raw.get("options") or {}
    return isinstance(options, dict) and options.get("refresh") == "always"


@dataclass
class Refreshed:
    """What a refresh found: its steps (for display) and, per resource that drifted, why."""

    steps: list[Step] = field(default_factory=list)
    #: name -> the drift in words: the provider's `drift` output when it gives one, else the
    #: output keys the Read changed, or that the Read found nothing.
    drift: dict[str, str] = field(default_factory=dict)


def drift_words(old_outputs: Mapping[str, Any], new_outputs: Mapping[str, Any] | None) -> str:
    """Why a resource drifted, in words (pure): gone, the provider's own `drift` output (a
    convention of this project's providers: the App says "live app stopped by hand: ..."),
    else which outputs the Read changed."""
    if new_outputs is None:
        return "gone: the provider's Read found nothing (deleted outside Pulumi)"
    reason = new_outputs.get("drift")
    if isinstance(reason, str) and reason:
        return reason
    keys = sorted(
        k
        for k in set(old_outputs) | set(new_outputs)
        if strip_secrets(old_outputs.get(k)) != strip_secrets(new_outputs.get(k))
    )
    return f"changed outside Pulumi: {', '.join(keys)}" if keys else ""


def refresh_states(
    cmd: Command,
    engine: Engine,
    out: TextIO,
    interrupt: Interrupt,
    *,
    verb: str,
    show_sames: bool = True,
    changed_op: str = "update",
) -> Refreshed:
    """Read every (targeted) resource of the state back, as the engine's refresh does before an
    operation with `Refresh` set (pkg/resource/deploy/deployment_executor.go `Execute`: "Before
    doing anything else, optionally refresh each resource in the base checkpoint", then
    `refresh()`: a RefreshStep per old resource, only the targets with --target; step.go
    RefreshStep.Apply: Read with the old inputs and outputs, an empty answer = gone, removed
    from the base state by `rebuildBaseState`). In an `up` / `destroy` each refreshed state is
    saved (engine.on_change); in a preview it is not (the DIY backend makes no SnapshotManager
    for a dry run: pkg/backend/diy/backend.go `apply`, "We only need a snapshot manager if
    we're doing an update"), yet the plan is made against the refreshed state. Each step is
    printed with the outputs it changed and the drift's reason."""
    found = Refreshed()
    for name in list(engine.states):
        st = engine.states[name]
        if not _targeted(cmd, name, st.urn):
            continue
        interrupt.check()
        before_inputs, before_outputs = dict(st.inputs), dict(st.outputs)
        t0 = time.perf_counter()
        result = engine.refresh(name)
        # A Read that changed the state: `pulumi refresh` shows it as an update of the state
        # ("updated"); before an operation it is a refresh step of its own ("refreshed", not
        # to be read as the operation's update); a gone one is deleted from the state.
        op = changed_op if result == "update" else result
        step = Step(name, st.type, op, seconds=time.perf_counter() - t0)
        if result == "update":
            now = engine.states[name]
            step.lines = [f"{line} (input)" for line in diff_lines(before_inputs, now.inputs)]
            step.lines += diff_lines(before_outputs, now.outputs)
            reason = drift_words(before_outputs, now.outputs)
        elif result == "delete":
            reason = drift_words(before_outputs, None)
        else:
            reason = ""
        if reason:
            found.drift[name] = reason
            step.note = f"[{verb}: {reason}]"
        if show_sames or result != "same" or reason:
            print_step(step, out, done=True)
        found.steps.append(step)
    return found


def refresh_first(cmd: Command, engine: Engine, out: TextIO, interrupt: Interrupt) -> Refreshed:
    """The refresh an operation runs first when `cmd.refresh` (nothing when the state is
    empty): one header line, the resources that changed, one summary line."""
    if not cmd.refresh or not any(_targeted(cmd, n, s.urn) for n, s in engine.states.items()):
        return Refreshed()
    why = "--refresh" if cmd.refresh_flag else "Pulumi.yaml options.refresh: always"
    out.write(f"Refreshing first ({why}): every resource read back from Modal\n")
    found = refresh_states(
        cmd, engine, out, interrupt, verb="drift", show_sames=False, changed_op="refresh"
    )
    drifted = len(found.drift)
    out.write(
        f"  refreshed {len(found.steps)} resource{'s' if len(found.steps) != 1 else ''}:"
        f" {drifted or 'none'} drifted\n\n"
    )
    return found


# ---- the mocks that drive the engine -------------------------------------------------------


class StepMocks(pulumi.runtime.Mocks):
    """Mocks whose answers come from the real providers through the engine stand-in.

    apply=False (preview): Check + Diff only; a resource that changes is answered with its
    checked inputs (its computed outputs stay unknown, as in a Pulumi preview).
    apply=True (up): the step is applied; the answer is the provider's real outputs.
    """

    def __init__(
        self,
        engine: Engine,
        apply: bool,
        out: TextIO | None,
        targets: tuple[str, ...] = (),
        interrupt: Interrupt | None = None,
    ) -> None:
        self.interrupt = interrupt or Interrupt()
        self.engine = engine
        self.apply = apply
        self.out = out
        self.targets = set(targets)
        self.lock = threading.Lock()  # the SDK registers from executor threads
        self.steps: list[Step] = []
        self.registered: set[str] = set()  # names the program registered in this run
        self.request_options: dict[tuple[str, str], tuple[str, Options]] = {}
        self.error: BaseException | None = None
        self.stopping = False
        #: name -> why a refresh before this run found it drifted (shown on its plan line).
        self.drift: dict[str, str] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        if not args.custom:
            return None, {}
        with self.lock:
            if self.interrupt.requested:
                self.stopping = True
                raise Cancelled(f"'{args.name}' not started: Ctrl-C")
            if self.stopping:
                raise Cancelled(f"'{args.name}' not started: the deployment was stopped")
            try:
                return self._step(args)
            except BaseException as exc:
                self.stopping = True  # no new step after a failure, as the engine does
                if self.error is None:
                    self.error = exc
                raise

    def _step(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        inputs = dict(args.inputs)
        blob = rpc.unwrap_rpc_secret(inputs.pop("__provider"))
        news = to_harness(inputs)
        urn, opts = self.request_options.get((args.typ, args.name), ("", Options()))
        short_type = args.typ.removeprefix(DYNAMIC)
        engine = self.engine
        old = engine.states.get(args.name)
        if args.name in self.registered:
            raise StandinError(
                f"two resources named '{args.name}': this stand-in keys its state by name"
            )
        self.registered.add(args.name)
        t0 = time.perf_counter()
        if self.targets and args.name not in self.targets and urn not in self.targets:
            # Not targeted: the old state stays as it is; a new resource is not created.
            self.steps.append(Step(args.name, short_type, "skip"))
            if old is not None:
                return old.id, to_program(old.outputs)
            return "", to_program(news)
        replaces: list[str] = []
        if self.apply:
            op = engine.up(args.name, blob, news, options=opts, type_=short_type, urn=urn)
            st = engine.states[args.name]
            result_id, outputs, checked = st.id, st.outputs, st.inputs
            if op == "replace" and engine.last_diff is not None:
                replaces = list(engine.last_diff.replaces)
        else:
            op, diff, checked = engine.plan(args.name, blob, news, options=opts)
            replaces = list(diff.replaces) if diff is not None and op == "replace" else []
            if op == "same":
                assert old is not None
                result_id, outputs = old.id, old.outputs
            else:  # what a preview hands the program: the checked inputs
                result_id, outputs = (old.id if old and op == "update" else ""), checked
        step = Step(args.name, short_type, op, replaces=replaces)
        step.seconds = time.perf_counter() - t0
        if args.name in self.drift:
            step.note = f"[drift: {self.drift[args.name]}]"
        if old is not None and op in ("update", "replace"):
            step.lines = diff_lines(old.inputs, checked)
        self.steps.append(step)
        if self.apply and self.out is not None:
            print_step(step, self.out, done=True)
        return result_id, to_program(outputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


def monitor_for(mocks: pulumi.runtime.Mocks) -> RecordingMonitor:
    """A RecordingMonitor that hands each custom resource's URN and options to StepMocks."""

    class OptionsMonitor(RecordingMonitor):
        def RegisterResource(self, request: Any) -> Any:
            if request.custom and isinstance(mocks, StepMocks):
                ct = request.customTimeouts
                try:  # source_eval.go RegisterResource: a bad value fails the registration
                    timeouts = CustomTimeouts.parse(ct.create, ct.update, ct.delete, ct.read)
                except ValueError as exc:
                    error = EngineError(f"resource '{request.name}': {exc}")
                    with mocks.lock:
                        mocks.stopping = True
                        if mocks.error is None:
                            mocks.error = error
                    raise error from None
                mocks.request_options[(request.type, request.name)] = (
                    self.make_urn(request.parent, request.type, request.name),
                    Options(
                        secret_outputs=tuple(request.additionalSecretOutputs),
                        protect=bool(request.protect),
                        retain_on_delete=bool(request.retainOnDelete),
                        ignore_changes=tuple(request.ignoreChanges),
                        delete_before_replace=bool(request.deleteBeforeReplace),
                        custom_timeouts=timeouts,
                    ),
                )
            return super().RegisterResource(request)

    return OptionsMonitor(mocks)


# ---- setup ------------------------------------------------------------------------------


def project_of(project_dir: Path) -> str:
    """The project name of `project_dir` (this repository's: PROJECT, as always)."""
    return PROJECT if project_dir == PROJECT_ROOT else project_name(project_dir)


def resolve_server_url(stack: str, flag: str | None, project_dir: Path = PROJECT_ROOT) -> str:
    raw = yaml.safe_load((project_dir / f"Pulumi.{stack}.yaml").read_text()) or {}
    url = (
        flag
        or os.environ.get("MODAL_SERVER_URL")
        or (raw.get("config") or {}).get("modal:serverUrl")
    )
    if not url:
        raise StandinError(
            f"stack '{stack}': no emulator URL. Pass --server-url http://127.0.0.1:PORT or"
            " export MODAL_SERVER_URL (start one with: make emulator)."
        )
    host = urlparse(url).hostname or ""
    loopback = host == "localhost"
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    if not loopback:
        raise StandinError(
            f"server URL {url} is not on loopback: this stand-in only drives the local Modal"
            " emulator. Use the Pulumi CLI for real Modal."
        )
    return str(url)


def require_emulator(url: str) -> None:
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", port), timeout=2):
            return
    except OSError as exc:
        raise StandinError(
            f"no Modal emulator answers at {url} ({exc}). Start one: make emulator"
            f" (or .venv/bin/python -m emulator serve --port {port})"
        ) from None


def secure_keys(stack: str, project_dir: Path = PROJECT_ROOT) -> list[str]:
    raw = yaml.safe_load((project_dir / f"Pulumi.{stack}.yaml").read_text()) or {}
    return [
        k
        for k, v in (raw.get("config") or {}).items()
        if isinstance(v, dict) and set(v) == {"secure"}
    ]


@contextlib.contextmanager
def provider_server(
    stack: str,
    url: str,
    config: Mapping[str, str],
    secret_keys: list[str],
    project_dir: Path = PROJECT_ROOT,
) -> Iterator[ProviderServer]:
    env = {k: v for k, v in os.environ.items() if k not in ("MODAL_ENVIRONMENT", "MODAL_PROFILE")}
    env["MODAL_SERVER_URL"] = url
    env.setdefault("MODAL_TOKEN_ID", "ak-local-emulator")  # the emulator accepts any token
    env.setdefault("MODAL_TOKEN_SECRET", "as-local-emulator")
    server_config = {k: Secret(v) if k in secret_keys else v for k, v in config.items()}
    # The engine starts the provider in the project directory (`pulumi -C DIR`); components/
    # comes from the repository's editable install there (pyproject.toml).
    server = ProviderServer(
        env=env, config=server_config, project=project_of(project_dir), stack=stack, cwd=project_dir
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def explain(
    exc: BaseException, *, traceback_file: Path | None = None, verbose: bool = False
) -> str:
    """One operator-facing message for a failure. A provider's: which resource and call, then
    the provider's exception WHOLE (its first line and every line after it, nothing cut), then
    where its traceback is (`traceback_file`), or the traceback itself with `verbose`."""
    if isinstance(exc, CheckFailed):
        reasons = "; ".join(f"{prop}: {why}" for prop, why in exc.failures)
        return f"resource '{exc.name}': the provider's Check refused the inputs: {reasons}"
    if isinstance(exc, ProviderCallError):
        return provider_failure(exc, traceback_file=traceback_file, verbose=verbose)
    if isinstance(exc, pulumi.RunError | EngineError | StandinError | InjectedFault):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def provider_failure(
    exc: ProviderCallError, *, traceback_file: Path | None = None, verbose: bool = False
) -> str:
    who = "the provider"
    if exc.name:
        short = exc.type.removeprefix(DYNAMIC_PREFIX)
        who = f"resource '{exc.name}'" + (f" ({short})" if short else "")
    lines = [f"{who}: {exc.method} failed ({exc.code.name}):"]
    lines += [f"  {line}" if line else "" for line in exc.message.split("\n")]
    if exc.details.strip() != exc.message:
        if verbose:
            lines.append("The provider's traceback:")
            lines += [f"  {line}" if line else "" for line in exc.details.strip().split("\n")]
        elif traceback_file is not None:
            lines.append(
                f"The provider's traceback: {shown_path(traceback_file)} (or rerun with --verbose)"
            )
    return "\n".join(lines)


def traceback_path(state_path: Path) -> Path:
    """Where a failed provider call's traceback goes: beside the state file
    (`.pulumi-offline/<stack>.last-error.txt` by default)."""
    return state_path.with_name(state_path.stem + ".last-error.txt")


def failure_text(cmd: Command, exc: BaseException) -> str:
    """`explain(exc)`; a provider's traceback is written to `traceback_path` first (mode 0600,
    replaced by the next failure)."""
    path: Path | None = None
    if isinstance(exc, ProviderCallError) and exc.details.strip() != exc.message:
        path = traceback_path(cmd.state_path)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} stack '{cmd.stack}',"
                    f" {cmd.command}: resource '{exc.name or '?'}', provider {exc.method}"
                    f" failed with {exc.code.name}:\n\n{exc.details.rstrip()}\n"
                )
        if not path.exists():
            path = None
    return explain(exc, traceback_file=path, verbose=cmd.verbose)


def progress_printer(out: TextIO) -> Callable[[OutputLine], None]:
    """`ProviderServer.on_output` for a command: each line the provider prints, at once, on the
    line of the resource whose call is in flight."""

    def show(line: OutputLine) -> None:
        call = line.call
        if call is None:
            print_progress("", "", "", line.text, out)
        else:
            print_progress(call.method, call.type, call.name, line.text, out)

    return show


def fault_hook(spec: str | None) -> Callable[[str, str], None] | None:
    """The before_step hook FAULT_ENV asks for (None when unset)."""
    if not spec:
        return None
    interrupt = spec.startswith("interrupt:")
    op, _, name = spec.removeprefix("interrupt:").partition(":")

    def hook(step_op: str, step_name: str) -> None:
        if (step_op, step_name) != (op, name):
            return
        if interrupt:
            import _thread

            _thread.interrupt_main()  # a Ctrl-C arriving while this step runs
            return
        raise InjectedFault(f"injected failure ({FAULT_ENV}={spec}) before {op} of '{name}'")

    return hook


# ---- commands -----------------------------------------------------------------------------


def run(
    cmd: Command,
    out: TextIO,
    *,
    before_step: Callable[[str, str], None] | None = None,
    server: ProviderServer | None = None,
    interrupt: Interrupt | None = None,
) -> int:
    """Run one command; returns the exit code. `server`: an already started provider server
    for this stack (tests share one); `before_step`: see Engine.before_step; `interrupt`: the
    Ctrl-C flag (the command line's is installed before the SDK is imported)."""
    if cmd.command in ("up", "destroy", "refresh", "output") or cmd.state_path.exists():
        # Resolve the passphrase before anything runs: a missing one must change nothing.
        StateFile(cmd.state_path, cmd.stack).box  # noqa: B018
    if cmd.command == "output":
        return show_stack_output(cmd, out)
    config, secret_keys = stack_config(
        cmd.stack, {**cmd.overrides, "modal:serverUrl": cmd.url}, project_dir=cmd.project_dir
    )
    with contextlib.ExitStack() as stack:
        interrupt = stack.enter_context((interrupt or Interrupt()).installed())
        if server is None:
            server = stack.enter_context(
                provider_server(cmd.stack, cmd.url, config, secret_keys, cmd.project_dir)
            )
        stack.enter_context(_showing_output(server, out))
        engine = Engine(server, defer_replaced_deletes=True, before_step=before_step)
        state = StateFile.load(cmd.state_path, cmd.stack, engine)
        if cmd.command in ("up", "destroy", "refresh"):
            engine.on_change = lambda: state.save(engine)
        if cmd.command == "destroy":
            return destroy(cmd, engine, state, out, interrupt)
        if cmd.command == "refresh":
            return refresh(cmd, engine, state, out, interrupt)
        return deploy(cmd, engine, state, config, secret_keys, out, interrupt)
    return 0  # pragma: no cover (ExitStack does not swallow)


@contextlib.contextmanager
def _showing_output(server: ProviderServer, out: TextIO) -> Iterator[None]:
    previous = server.on_output
    server.on_output = progress_printer(out)
    try:
        yield
    finally:
        server.on_output = previous


def deploy(
    cmd: Command,
    engine: Engine,
    state: StateFile,
    config: dict[str, str],
    secret_keys: list[str],
    out: TextIO,
    interrupt: Interrupt,
) -> int:
    apply = cmd.command == "up"
    verb = "Updating" if apply else "Previewing update of"
    out.write(f"{verb} stack '{cmd.stack}': {NOT_THE_ENGINE}\n")
    out.write(f"  emulator: {cmd.url}   state: {shown_path(cmd.state_path)}\n\n")
    mocks = StepMocks(engine, apply=apply, out=out, targets=cmd.targets, interrupt=interrupt)
    pending = [
        s for s in engine.pending_deletes if not cmd.targets or _targeted(cmd, s.name, s.urn)
    ]
    try:
        interrupt.check()
        # deployment_executor.go Execute: the refresh comes "before doing anything else".
        mocks.drift = refresh_first(cmd, engine, out, interrupt).drift
        for st in pending:  # GeneratePendingDeletes: left by a failed replace, first
            step = Step(st.name, st.type, "delete", note="(pending delete of a replaced one)")
            if apply:
                interrupt.check()
                t0 = time.perf_counter()
                engine._delete(st)
                engine.pending_deletes.remove(st)
                state.save(engine)
                step.seconds = time.perf_counter() - t0
                print_step(step, out, done=True)
            mocks.steps.append(step)
        run_result: ProgramRun = run_program(
            cmd.stack,
            config,
            secret_keys,
            mocks=mocks,
            preview=not apply,
            program=cmd.program,
            project=project_of(cmd.project_dir),
            monitor_factory=monitor_for,
        )
        gone = [
            n
            for n in reversed(list(engine.states))
            if n not in mocks.registered and _targeted(cmd, n, engine.states[n].urn)
        ]
        for name in gone:
            st = engine.states[name]
            step = Step(name, st.type or "?", "delete")
            if apply:
                interrupt.check()
                t0 = time.perf_counter()
                engine.destroy(name)
                step.seconds = time.perf_counter() - t0
                print_step(step, out, done=True)
            elif st.protect:
                raise ProtectedError(protect_delete_message(engine.urn(st)))
            mocks.steps.append(step)
        if apply:
            interrupt.check()
            engine.finish()  # the old halves of this run's replaces
        interrupt.check()
    except KeyboardInterrupt:
        return _stopped(cmd, mocks, engine, state, out, apply, interrupted=True)
    except BaseException as exc:
        if mocks.error is None:
            mocks.error = exc
        return _stopped(cmd, mocks, engine, state, out, apply, interrupted=interrupt.requested)
    if not apply:
        for step in mocks.steps:
            print_step(step, out, done=False)
    out.write("\n")
    print_outputs(run_result.outputs, cmd.show_secrets, out, only_known=False)
    out.write("\n" + summary(mocks.steps, done=apply) + "\n")
    if apply:
        state.outputs = to_harness(run_result.outputs)
        state.save(engine)
    return 0


def _targeted(cmd: Command, name: str, urn: str) -> bool:
    return not cmd.targets or name in cmd.targets or urn in cmd.targets


def _stopped(
    cmd: Command,
    mocks: StepMocks,
    engine: Engine,
    state: StateFile,
    out: TextIO,
    apply: bool,
    interrupted: bool,
) -> int:
    """One message for a failed or interrupted run; the state keeps every applied step."""
    mocks.stopping = True
    with mocks.lock:  # a step in flight finishes (and is saved) first
        if apply:
            state.save(engine)
    if interrupted:
        emit(out, "\ninterrupted (Ctrl-C): the step in flight finished, no new step started.\n")
    else:
        error = mocks.error or RuntimeError("unknown failure")
        emit(out, f"\nerror: {failure_text(cmd, error)}\n")
    if apply:
        kept = len(engine.states) + len(engine.pending_deletes)
        noun = "resource" if kept == 1 else "resources"
        if any(s.op not in ("same", "skip") for s in mocks.steps):
            out.write(
                f"The state file keeps what was applied ({kept} {noun}); run up again to"
                " continue from there.\n"
            )
        else:  # e.g. a config error: the program stopped before its first resource
            out.write(f"Nothing was applied; the state file is as it was ({kept} {noun}).\n")
    return 130 if interrupted else 1


def refresh(
    cmd: Command, engine: Engine, state: StateFile, out: TextIO, interrupt: Interrupt
) -> int:
    out.write(f"Refreshing stack '{cmd.stack}': {NOT_THE_ENGINE}\n\n")
    steps: list[Step] = []
    try:
        steps = refresh_states(cmd, engine, out, interrupt, verb="drift").steps
    except KeyboardInterrupt:
        out.write("\ninterrupted (Ctrl-C): the state keeps what was refreshed.\n")
        return 130
    except (EngineError, ProviderCallError, StandinError) as exc:
        emit(out, f"\nerror: {failure_text(cmd, exc)}\n")
        return 1
    out.write("\n" + summary(steps, done=True) + "\n")
    return 0


def destroy(
    cmd: Command, engine: Engine, state: StateFile, out: TextIO, interrupt: Interrupt
) -> int:
    out.write(f"Destroying stack '{cmd.stack}': {NOT_THE_ENGINE}\n\n")
    try:  # destroy.go takes the same refresh option (getRefreshOption); gone ones drop out
        refresh_first(cmd, engine, out, interrupt)
    except KeyboardInterrupt:
        out.write("\ninterrupted (Ctrl-C) while refreshing: nothing deleted.\n")
        return 130
    except (EngineError, ProviderCallError, StandinError) as exc:
        emit(out, f"\nerror: {failure_text(cmd, exc)}\n")
        out.write("Nothing was deleted; rerun destroy with --refresh=false to skip the refresh.\n")
        return 1
    doomed = [
        st
        for st in [*engine.pending_deletes, *reversed(list(engine.states.values()))]
        if _targeted(cmd, st.name, st.urn)
    ]
    protected = [st for st in doomed if st.protect]
    if protected:  # the destroy's preview fails on these before anything is deleted
        for st in protected:
            out.write(f"error: {protect_delete_message(engine.urn(st))}\n")
        names = ", ".join(st.name for st in protected)
        out.write(
            f"\nprotected resources ({names}): nothing deleted. Remove the protection in the"
            " program's config (e.g. protectCaches: false), run up, then destroy.\n"
        )
        return 1
    steps: list[Step] = []
    try:
        for st in doomed:
            interrupt.check()
            t0 = time.perf_counter()
            if st.pending_delete:
                engine._delete(st)
                engine.pending_deletes.remove(st)
                state.save(engine)
            else:
                engine.destroy(st.name)
            step = Step(st.name, st.type or "?", "delete", seconds=time.perf_counter() - t0)
            print_step(step, out, done=True)
            steps.append(step)
    except KeyboardInterrupt:
        out.write("\ninterrupted (Ctrl-C): the state keeps every resource not deleted yet.\n")
        return 130
    except (EngineError, ProviderCallError, StandinError, InjectedFault) as exc:
        emit(out, f"\nerror: {failure_text(cmd, exc)}\n")
        out.write("The state file keeps every resource not deleted yet; fix it and rerun.\n")
        return 1
    if not cmd.targets:
        state.outputs = {}
    if state.path.exists():
        state.save(engine)
    out.write("\n" + summary(steps, done=True) + "\n")
    return 0


def show_stack_output(cmd: Command, out: TextIO) -> int:
    """`pulumi stack output [NAME] [--show-secrets] [--json]` from the state of the last up."""
    import json

    state = StateFile.load(cmd.state_path, cmd.stack)
    outputs = to_program(state.outputs)
    if cmd.output_name is not None and cmd.output_name not in outputs:
        raise StandinError(
            f"stack '{cmd.stack}' has no output '{cmd.output_name}' (it has:"
            f" {', '.join(sorted(outputs)) or 'none; run up first'})"
        )
    if cmd.output_json:
        shown = {k: show_output(v, cmd.show_secrets) for k, v in outputs.items()}
        doc = shown if cmd.output_name is None else shown[cmd.output_name]
        out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return 0
    if cmd.output_name is not None:
        value = show_output(outputs[cmd.output_name], cmd.show_secrets)
        if isinstance(value, str):
            out.write(value + ("" if value.endswith("\n") else "\n"))
        else:
            out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
        return 0
    print_outputs(outputs, cmd.show_secrets, out)
    return 0
