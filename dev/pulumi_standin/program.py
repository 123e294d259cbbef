"""Run the real Pulumi program (`__main__.py`) under the SDK's mock monitor (`set_mocks`).

What it gives tests: every resource registration as the engine would receive it (type, name,
URN, parent, dependencies, protect/retainOnDelete, additional secret outputs, inputs including
the dynamic `__provider` blob) and the stack's exported outputs, secrets still marked.

Config comes from the real `Pulumi.<stack>.yaml` (`stack_config()`), the way the CLI hands it
to a program: the project's declared defaults (`Pulumi.yaml` `config:`) merged in for keys the
stack does not set, every value a string (booleans "true"/"false", arrays and objects as JSON,
others as written), `secure:` values replaced by plaintext test values and listed as secret
keys (the mocks cannot decrypt them). Secret-ness comes from the stack file only, as the CLI
does: a key is secret when its value is `secure:`, never because of its name (a clear-text
`modal-llm:hfToken` reaches the program as a plain value, and the program refuses it).

The mocks answer each dynamic resource with its inputs plus plausible outputs
(`fake_outputs`), so components can wire outputs into other inputs; they never call a
provider (the end-to-end test does that through the provider server).

A program that fails (config error, a provider error raised from the mocks, Ctrl-C) ends
with its exception only: the registrations still pending are cancelled and awaited before the
event loop closes, so asyncio prints no "Task was destroyed but it is pending!".
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import json
import logging
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pulumi
import yaml
from pulumi.runtime import mocks as pmocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.stack import run_in_stack

from pulumi_standin.values import Secret, to_harness, to_program

# The repository (Pulumi.yaml, __main__.py): dev/pulumi_standin/program.py is two folders down.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROJECT = "modal-llm"
DYNAMIC = "pulumi-python:dynamic/"
STACK_TYPE = "pulumi:pulumi:Stack"

#: Plaintext stand-ins for the secrets a real stack sets with `pulumi config set --secret`.
TEST_SECRETS: dict[str, str] = {
    f"{PROJECT}:hfToken": "hf_test_token_value_0123456789",
    f"{PROJECT}:alertWebhookUrl": "https://hooks.example.test/alert-0123456789",
}


class StackFileError(ValueError):
    """A stack or project file that cannot be read: one line naming the file, line and column."""


def load_stack_file(path: Path) -> dict[str, Any]:
    """The mapping in a `Pulumi.<stack>.yaml` (or `Pulumi.yaml`), or StackFileError with ONE line.

    A YAML syntax error (a tab where indentation is expected, an unclosed quote, ...) is
    reported as `FILE:LINE:COLUMN: what the YAML parser found`, 1-based as editors count, not as
    the parser's traceback; a file whose top level or `config:` is not a mapping likewise."""
    name = path.name
    try:
        text = path.read_text()
    except OSError as exc:
        raise StackFileError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        what = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        start = exc.context_mark
        if exc.problem and exc.context and start is not None and start is not mark:
            what += f" ({exc.context} at {start.line + 1}:{start.column + 1})"
        lines = text.splitlines()
        line = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
        if "'\\t'" in what or (mark is not None and "\t" in line[: mark.column + 1]):
            what += " (a tab: YAML indents with spaces only)"
        raise StackFileError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise StackFileError(f"{name}: invalid YAML: {' '.join(str(exc).split())}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise StackFileError(f"{name}: the top level must be a mapping (config: ...)")
    config = raw.get("config")
    if config is not None and not isinstance(config, dict):
        raise StackFileError(f"{name}: `config:` must be a mapping of key: value")
    return raw


def server_url_problem(url: object) -> str | None:
    """Why `url` cannot be the Modal emulator's URL (`modal:serverUrl`), or None.

    The stand-in drives the local emulator only: one `http://` (or `https://`) URL with a host
    and, if given, a numeric port. What modal 1.6.4's client would do with anything else is
    fail late (`_utils/grpc_utils.py` create_channel raises "Unknown scheme" for ftp://, and a
    non-numeric port fails in urlparse), which the providers then retry for minutes."""
    if not isinstance(url, str) or not url.strip():
        return "must be a URL such as http://127.0.0.1:8790"
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or '(none)'!r} is not http or https"
    if not parts.hostname:
        return "has no host"
    try:
        port = parts.port
    except ValueError:
        raw_port = parts.netloc.rpartition(":")[2]
        return f"port {raw_port!r} is not a number from 1 to 65535"
    if port == 0:
        return "port 0 is not a port a client can reach"
    return None


@dataclass
class Registration:
    """One RegisterResource call as the mocks saw it."""

    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    protect: bool
    retain_on_delete: bool
    additional_secret_outputs: list[str]
    ignore_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool = False
    id: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def short_type(self) -> str:
        return self.type.removeprefix(DYNAMIC)


@dataclass
class ProgramRun:
    """Everything one program run registered and exported."""

    resources: list[Registration]
    outputs: dict[str, Any]  # stack exports; secret ones still wrapped (rpc.is_rpc_secret)

    def of_type(self, short_type: str) -> list[Registration]:
        return [r for r in self.resources if r.short_type == short_type]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.resources if r.urn == urn)

    def output(self, name: str) -> Any:
        """An export's plain value (secret marker removed)."""
        return rpc.unwrap_rpc_secret(self.outputs[name])

    def is_secret(self, name: str) -> bool:
        return rpc.is_rpc_secret(self.outputs[name])


def fake_outputs(typ: str, name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Outputs a real provider would add to its inputs, shaped as the contracts say."""
    short = typ.removeprefix(DYNAMIC)
    outs = {k: v for k, v in inputs.items() if k != "__provider"}
    if short == "modal:Environment":
        outs.update(environment_id=f"en-{name}", web_suffix=inputs.get("web_suffix") or "")
    elif short == "modal:Secret":
        values = inputs.get("values") or {}
        values = rpc.unwrap_rpc_secret(values)
        outs.update(secret_id=f"st-{name}", key_names=sorted(values), values_digest="0" * 64)
    elif short == "modal:Volume":
        outs.update(volume_id=f"vo-{name}")
    elif short == "modal:ProxyAuthToken":
        outs.update(token_id=f"wk-{name}", token_secret=rpc.wrap_rpc_secret(f"ws-{name}-secret"))
    elif short == "modal:SpendAlert":
        outs.update(
            current_usage_usd=0.0,
            effective_limit_usd=inputs.get("monthly_budget_usd"),
            limit_reached=False,
            thresholds_crossed=[],
        )
    elif short == "modal:App":
        app = inputs.get("name")
        outs.update(
            app_id=f"ap-{name}",
            web_url=f"https://mock-workspace--{app}.modal.run",
            version=1,
            spec_digest="1" * 64,
            source_digest="2" * 64,
        )
    elif short == "llm:ApiKey":
        outs.update(key=rpc.wrap_rpc_secret(f"sk-test-{name}"), digest="sha256:" + "3" * 64)
    return outs


class ProgramMocks(pulumi.runtime.Mocks):
    """Answers every registration with `fake_outputs` (or a caller-supplied function)."""

    def __init__(
        self, outputs: Callable[[str, str, Mapping[str, Any]], dict[str, Any]] = fake_outputs
    ) -> None:
        self._outputs = outputs

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        if not args.custom:
            return None, {}
        return f"{args.name}-id", self._outputs(args.typ, args.name, args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


class RecordingMonitor(pmocks.MockMonitor):
    """MockMonitor that keeps each registration request and the stack's registered outputs."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.registrations: list[Registration] = []
        self.stack_outputs: dict[str, Any] = {}

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type == STACK_TYPE:
            return response
        self.registrations.append(
            Registration(
                urn=response.urn,
                type=request.type,
                name=request.name,
                parent=request.parent,
                custom=bool(request.custom),
                inputs=rpc.deserialize_properties(request.object),
                dependencies=list(request.dependencies),
                property_dependencies={
                    k: list(v.urns) for k, v in request.propertyDependencies.items()
                },
                protect=bool(request.protect),
                retain_on_delete=bool(request.retainOnDelete),
                additional_secret_outputs=list(request.additionalSecretOutputs),
                ignore_changes=list(request.ignoreChanges),
                delete_before_replace=bool(request.deleteBeforeReplace),
                id=response.id,
                outputs=rpc.deserialize_properties(response.object),
            )
        )
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        if "::" + STACK_TYPE + "::" in request.urn:
            self.stack_outputs = rpc.deserialize_properties(request.outputs)
        return super().RegisterResourceOutputs(request)


def _cli_string(value: Any) -> str:
    """A config value as the CLI hands it to the program."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def project_here(start: Path | None = None) -> Path:
    """The project the current directory is in, as the Pulumi CLI finds it without `--cwd`:
    the directory itself or its nearest parent holding a Pulumi.yaml (pulumi/pulumi
    sdk/go/common/workspace/paths.go `DetectProjectPathFrom`, which walks up the parents).
    Not there (run from outside any project): this repository, PROJECT_ROOT. So a copy of the
    checkout (a PR's) runs its own program with the dev tools installed from another one."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "Pulumi.yaml").is_file():
            return folder
    return PROJECT_ROOT


def project_name(project_dir: Path = PROJECT_ROOT) -> str:
    """The `name:` of `project_dir/Pulumi.yaml` (the config namespace and URN project)."""
    return str(load_stack_file(project_dir / "Pulumi.yaml").get("name") or PROJECT)


def project_defaults(project_dir: Path = PROJECT_ROOT) -> dict[str, Any]:
    """`project:key` -> default, for every key Pulumi.yaml declares with a default."""
    project = load_stack_file(project_dir / "Pulumi.yaml")
    name = project["name"]
    return {
        (key if ":" in key else f"{name}:{key}"): decl["default"]
        for key, decl in (project.get("config") or {}).items()
        if isinstance(decl, dict) and "default" in decl
    }


def stack_config(
    stack: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    drop: tuple[str, ...] = (),
    with_defaults: bool = True,
    project_dir: Path = PROJECT_ROOT,
) -> tuple[dict[str, str], list[str]]:
    """The config map of `Pulumi.<stack>.yaml` as the CLI passes it, plus its secret keys.

    `overrides` replace or add keys (full `project:key` names, Python values; `{"secure": ...}`
    for a placeholder secret, `Secret(value)` for a secret with that value); `drop` removes
    keys. `secure:` values become plaintext test values (TEST_SECRETS, else
    `test-secret-for-<key>`) marked secret; nothing else is secret.
    With `with_defaults`, Pulumi.yaml's declared defaults fill in the keys left unset, as the
    CLI does before it starts the program. `project_dir`: the project (`pulumi -C DIR`).
    """
    raw = load_stack_file(project_dir / f"Pulumi.{stack}.yaml")
    values: dict[str, Any] = dict(raw.get("config") or {})
    values.update(overrides or {})
    config: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in values.items():
        if key in drop:
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            config[key] = TEST_SECRETS.get(key, f"test-secret-for-{key}")
            secret_keys.append(key)
        elif isinstance(value, Secret):  # set for this run as `pulumi config set --secret`
            config[key] = _cli_string(value.value)
            secret_keys.append(key)
        else:
            config[key] = _cli_string(value)
    if with_defaults:
        for key, default in project_defaults(project_dir).items():
            if key not in config and key not in drop:
                config[key] = _cli_string(default)
    return config, secret_keys


def run_program(
    stack: str,
    config: Mapping[str, str],
    secret_keys: list[str] | None = None,
    *,
    mocks: pulumi.runtime.Mocks | None = None,
    preview: bool = False,
    program: Path = PROJECT_ROOT / "__main__.py",
    project: str = PROJECT,
    monitor_factory: Callable[[pulumi.runtime.Mocks], RecordingMonitor] = RecordingMonitor,
) -> ProgramRun:
    """Run the program once under mocks and return what it registered and exported.

    `monitor_factory` builds the monitor (a `RecordingMonitor` subclass can see each request,
    resource options included, before the mocks answer it). Exceptions raised by the program
    (config errors included) propagate to the caller.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # before set_mocks: every RPC task must live on this loop
    try:
        _forget_previous_run()
        pulumi.runtime.set_all_config(dict(config), list(secret_keys or []))
        the_mocks = mocks or ProgramMocks()
        monitor = monitor_factory(the_mocks)
        # set_mocks registers a root Stack of its own unless one exists: give it a placeholder
        # so it does not, then let run_in_stack create the Stack that records the exports.
        settings.ROOT.set(_PlaceholderRoot())  # type: ignore[arg-type]
        pulumi.runtime.set_mocks(
            the_mocks, project=project, stack=stack, preview=preview, monitor=monitor
        )
        settings.ROOT.set(None)

        def program_body() -> None:
            runpy.run_path(str(program))

        try:
            loop.run_until_complete(run_in_stack(program_body))
        except BaseException:
            loop.set_exception_handler(_quiet_after_failure)
            _cancel_pending(loop)
            raise
    finally:
        _forget_previous_run()
        # Leave the process as other tests expect it: no root, no config, a usable loop.
        settings.ROOT.set(None)
        pulumi.runtime.set_all_config({}, [])
        loop.close()
        _new_spare_loop()
    return ProgramRun(resources=monitor.registrations, outputs=monitor.stack_outputs)


class _PlaceholderRoot:
    """Stands in for a root resource while set_mocks configures the runtime."""


def _forget_previous_run() -> None:
    """Drop the SDK's outstanding RPCs and outputs of an earlier run in this process: after a
    failed run they belong to its closed loop, and the next run's wait_for_rpcs would wait on
    them ("Event loop is closed"). `pulumi.runtime.test` clears the same two."""
    settings.SETTINGS.rpc_manager.clear()
    with settings.SETTINGS.lock:
        settings.SETTINGS.outputs.clear()


_spare: list[asyncio.AbstractEventLoop] = []


def _new_spare_loop() -> None:
    """A usable current loop for whoever runs next (other code may hold it, so it is never
    closed here); the last one is closed at exit, not left to the garbage collector, whose
    __del__ of a loop fails once the interpreter is shutting down."""
    loop = asyncio.new_event_loop()
    _spare[:] = [loop]
    asyncio.set_event_loop(loop)


@atexit.register
def _close_spare_loop() -> None:
    """Close every loop still open at exit: the spare one, and any that an earlier spare or
    the SDK left to the garbage collector (a loop collected during interpreter shutdown prints
    "Exception ignored in BaseEventLoop.__del__ ... Invalid file descriptor: -1")."""
    loops = [*_spare, *(o for o in gc.get_objects() if isinstance(o, asyncio.BaseEventLoop))]
    _spare.clear()
    for loop in loops:
        if not loop.is_closed() and not loop.is_running():
            loop.close()


_AFTERMATH = (
    "Future exception was never retrieved",
    "Task exception was never retrieved",
    "Task was destroyed but it is pending!",
)


def _quiet_after_failure(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """After the program failed, the futures that carried that failure to other resources are
    dropped unread; asyncio would print each one with a traceback. Everything else is shown."""
    if str(context.get("message", "")) in _AFTERMATH:
        return
    loop.default_exception_handler(context)


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and await what the failed program left pending, so none is destroyed pending."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        quiet = logging.getLogger("asyncio")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # the cancellations themselves are not news
        try:
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            quiet.setLevel(level)


__all__ = [
    "DYNAMIC",
    "PROJECT",
    "PROJECT_ROOT",
    "STACK_TYPE",
    "TEST_SECRETS",
    "ProgramMocks",
    "ProgramRun",
    "RecordingMonitor",
    "Registration",
    "StackFileError",
    "fake_outputs",
    "load_stack_file",
    "project_defaults",
    "project_here",
    "project_name",
    "run_program",
    "server_url_problem",
    "stack_config",
    "to_harness",
    "to_program",
]
