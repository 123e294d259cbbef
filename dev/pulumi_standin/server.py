"""The SDK's dynamic-provider server, driven over gRPC the way the Pulumi engine drives it.

The engine runs a dynamic provider as a plugin: `<venv python> -u -m pulumi.dynamic
<engine-address>` with cwd = the program directory and env PULUMI_PROJECT/PULUMI_STACK/
PULUMI_CONFIG, reads the port from the first stdout line, then talks gRPC
(pulumirpc.ResourceProvider). `ProviderServer` does the same against the installed SDK
(3.272.0), so providers run through the real server code: dill (de)serialization of the
`__provider` blob, property (de)serialization, error propagation, config delivery.

- start-up: GetPluginInfo, CheckConfig (UNIMPLEMENTED is accepted), then
  `Configure(args=<stack config "project:key" → value>, acceptSecrets=True)`; the SDK answers
  acceptSecrets=False, so every later request carries plain values;
- `__provider` = `pulumi.dynamic.dynamic.serialize_provider(provider)` (the SDK's own function)
  added to every request, except an import's Read (`read(..., import_=True)`): the engine sends
  that one with URN, type and ID only (pkg/resource/deploy/step.go, `ImportStep.Apply`:
  `prov.Read(urn, id, nil, nil)`);
- outputs come back re-marked secret the engine's way: a key is secret when the provider
  wrapped it (`wrap_rpc_secret`), when the same-named input contained a secret, or when it is
  listed in `secret_outputs` (the resource's `additional_secret_outputs`);
- Diff/Update receive the OLD OUTPUTS as `olds` (plus `old_inputs`).

The SDK server ignores the engine address argument, so no engine gRPC service is needed. It is
started in its own session: a Ctrl-C in the terminal reaches the stand-in, which lets the
in-flight call finish (as the engine does on its first Ctrl-C), not the provider.

No deadline on any provider call, as in the engine (pulumi/pulumi v3.272.0,
sdk/go/common/resource/plugin/provider_plugin.go: Check, Diff, Create, Read, Update, Delete
all run under `p.requestContext()` = `Context.Request()` (context.go), the plugin context's
base context with a tracing span and no deadline; pkg/resource/deploy/step.go calls them with
`context.TODO()`). The resource's `customTimeouts` only travel to the provider in the request's
`timeout` field (seconds; 0 when unset): `create(..., timeout=)`, `update`, `delete`, `read`.
The engine does not enforce them, and the SDK's Python server drops the field. The one
deadline the engine has is for the plugin coming alive (plugin.go dialPlugin,
pluginRPCConnectionTimeout = 10 s); `start_timeout` (default 60 s) plays that part here: the
wait for the port line and the first RPC, nothing later.

The channel accepts what the engine's Go client accepts: status details (the provider's
traceback) up to 16 MiB (grpc-go's default client max header list size,
internal/transport/defaults.go) and messages up to 400 MiB (rpcutil.GrpcChannelOptions,
sdk/go/common/util/rpcutil/serve.go). With grpcio's defaults, an error message over 16 KiB
came back as RESOURCE_EXHAUSTED "data size exceeds hard limit" instead of the provider's text.

The provider's stdout (after the port line) and stderr are read line by line as they come
(plugin.go newPlugin: `runtrace` forwards each line of a dynamic provider,
`pulumi-resource-pulumi-python`, as an info / info#err diagnostic with no URN). They are kept
in `stdout_path` / `stderr_path` (`logs()`), and each line goes to `on_output` with the call in
flight, so a caller can show it at once, attributed to that resource. `pulumi.log.info` in a
provider lands there: the SDK server configures no engine (`pulumi/dynamic/__main__.py`
get_provider: `Settings(project=...)`, no engine address; no Handshake), so
`pulumi/log.py` prints "info: <msg>" to stderr.

    with ProviderServer(env=..., config={"modal:serverUrl": url}) as srv:
        chk = srv.check(p, {"name": "k", "values": Secret({"A": "1"})})
        created = srv.create(p, chk.inputs)       # Created(id, outputs) — outputs keep Secret()
        d = srv.diff(p, created.id, created.outputs, new_inputs)
        outs = srv.update(p, created.id, created.outputs, new_inputs)
        r = srv.read(p, created.id, state=outs, inputs=new_inputs)   # refresh
        srv.delete(p, created.id, outs)

Failures raise `ProviderCallError` (method, gRPC code, details = the provider's traceback,
`message` = the exception's own text, whole, from its first line to the end).
Every call is recorded in `srv.records`; `srv.leak_surfaces()` returns every text an operator
could see, for leak scans.
"""

from __future__ import annotations

import array
import base64
import contextlib
import fcntl
import itertools
import json
import os
import select
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import dill
import grpc
from google.protobuf import empty_pb2, struct_pb2
from google.protobuf.json_format import MessageToDict, SerializeToJsonError
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from pulumi_standin.values import (
    PROVIDER_KEY,
    Secret,
    contains_secret,
    redact_wire_secrets,
    stored_form,
    strip_secrets,
    struct_to_py,
    to_struct,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the repository: two folders up
DEFAULT_PROJECT = "modal-llm-iac"
DEFAULT_STACK = "test"
#: Read, Check, Diff never change anything; these do.
MUTATING_METHODS = frozenset({"Create", "Update", "Delete"})
#: What the engine's Go client accepts (see the module doc): status details (the provider's
#: traceback travels in them) and messages.
MAX_STATUS_DETAILS = 16 << 20
MAX_MESSAGE = 400 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_metadata_size", MAX_STATUS_DETAILS),
    ("grpc.absolute_max_metadata_size", MAX_STATUS_DETAILS),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]

#: A provider instance, its `__provider` blob (base64 string), or the blob in the secret
#: envelope mocks record (`inputs["__provider"]` of a dynamic resource under set_mocks).
ProviderRef = ResourceProvider | str | Mapping[str, Any]


# The provider server's launcher: `python -c _CHILD <module> <args>`. It dies with the
# process that started it (Linux PR_SET_PDEATHSIG, SIGTERM; elsewhere nothing): its own session
# keeps a terminal's Ctrl-C away from it, so without this a stand-in killed outright would
# leave the server running. Set here, after exec, not in a `preexec_fn`: a preexec_fn makes
# Python fork (not vfork), which runs grpcio's fork handlers in the child, and grpcio 1.8x's
# restarted poller then aborts the child before exec ("epoll_wait error: Bad file
# descriptor", exit -6; grpc/grpc#43055), seen here once in ~10 full test runs.
_CHILD = """
import ctypes, os, runpy, signal, sys
parent = int(os.environ.pop("PULUMI_STANDIN_PARENT_PID", "0") or 0)
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
if parent and os.getppid() != parent:
    sys.exit("pulumi stand-in: the process that started this provider server is gone")
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


class ProviderCallError(Exception):
    """A provider RPC failed; `details` is what the engine would show (the traceback).

    `message` is the provider's exception as raised: its first line (`module.Type: text`) and
    every line after it, without the traceback's frames (`exception_message`). `name` / `type`
    are the resource's, when the request named one."""

    def __init__(
        self,
        method: str,
        code: grpc.StatusCode,
        details: str,
        *,
        name: str = "",
        type_: str = "",
    ) -> None:
        super().__init__(f"{method} failed with {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details
        self.name = name
        self.type = type_

    @property
    def message(self) -> str:
        return exception_message(self.details)


_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_TRACEBACK = "Traceback (most recent call last):"


def exception_message(details: str) -> str:
    """The raised exception's text out of a Python traceback (`traceback.format_exc()`, what
    the SDK's server aborts a failed call with): from the exception line of the last chained
    traceback to the end, whole. Frames are the lines indented under a `Traceback (most recent
    call last):` header; a chained traceback starts after one of the two separators Python
    prints. Text that is not a traceback comes back as it is (stripped)."""
    lines = details.strip("\n").split("\n")
    if not lines or lines[0] != _TRACEBACK:
        return details.strip()
    start = 0  # the header of the traceback whose exception was raised last
    for i in range(1, len(lines) - 3):
        if (
            lines[i] in _CHAINED
            and lines[i - 1] == ""
            and lines[i + 1] == ""
            and lines[i + 2] == _TRACEBACK
            and lines[i + 3].startswith("  ")
        ):
            start = i + 2
    body = _message_start(lines, start)
    if body is None:
        return details.strip()
    return "\n".join(lines[body:]).strip("\n")


def _message_start(lines: list[str], header: int) -> int | None:
    """Index of the exception line after the frames under `lines[header]`."""
    for j in range(header + 1, len(lines)):
        if lines[j] and not lines[j].startswith(" "):
            return j
    return None


@dataclass(frozen=True)
class Call:
    """A provider call in flight: the RPC and the resource it is for."""

    method: str
    name: str
    type: str


@dataclass(frozen=True)
class OutputLine:
    """One line the provider process wrote, and the call in flight then (None: none, or more
    than one, so it cannot be attributed)."""

    stream: str  # "stdout" | "stderr"
    text: str
    call: Call | None


@dataclass
class CheckOutcome:
    inputs: dict[str, Any]
    failures: list[tuple[str, str]]


@dataclass
class DiffOutcome:
    changes: str  # "none" | "some" | "unknown"
    replaces: list[str]
    delete_before_replace: bool


@dataclass
class Created:
    id: str
    outputs: dict[str, Any]


@dataclass
class ReadOutcome:
    id: str
    outputs: dict[str, Any]
    inputs: dict[str, Any] | None


@dataclass
class Record:
    method: str
    request: dict[str, Any]
    response: dict[str, Any] | None = None
    error: str | None = None
    seconds: float = 0.0


# ---- the server ------------------------------------------------------------------------------


class ProviderServer:
    """One `python -m pulumi.dynamic` process, driven over gRPC like the engine drives it.

    Args:
        config: stack config, keys "namespace:key" (e.g. "modal:tokenId"); values are strings
            (objects as JSON), `Secret(...)` for secret config.
        env: environment of the provider process (default: os.environ); the harness adds
            PULUMI_PROJECT, PULUMI_STACK and PULUMI_CONFIG like the engine does.
        cwd: the program directory (default: the project root).
        start_timeout: seconds to wait for the server to print its port and answer its first
            RPC (the engine's plugin dial deadline). Provider calls get no deadline.
        on_output: called with each line the provider prints (after the port line), as it
            comes, from a reader thread; may be set or replaced at any time.
    """

    def __init__(
        self,
        *,
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        project: str = DEFAULT_PROJECT,
        stack: str = DEFAULT_STACK,
        cwd: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        start_timeout: float = 60.0,
        on_output: Callable[[OutputLine], None] | None = None,
    ) -> None:
        self.config = dict(config or {})
        self.env = dict(env if env is not None else os.environ)
        self.project = project
        self.stack = stack
        self.cwd = Path(cwd) if cwd is not None else PROJECT_ROOT
        self.python = python
        self.start_timeout = start_timeout
        self.on_output = on_output
        self.records: list[Record] = []
        self.blobs: set[str] = set()
        #: What the engine would keep or show from each call (secrets as ciphertext).
        self.visible: list[tuple[str, Any]] = []
        self._blob_cache: dict[int, tuple[ResourceProvider, str]] = {}
        self._loaded: dict[str, ResourceProvider] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="provider-server-")
        self.stdout_path = Path(self._tmp.name) / "stdout.log"
        self.stderr_path = Path(self._tmp.name) / "stderr.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None
        self._stub: provider_pb2_grpc.ResourceProviderStub | None = None
        self._lock = threading.Lock()
        self._inflight: dict[int, Call] = {}
        self._call_ids = itertools.count()
        self._pumps: list[threading.Thread] = []
        self._busy = {"stdout": threading.Lock(), "stderr": threading.Lock()}
        self.port = 0
        self.plugin_info: dict[str, Any] = {}
        self.configure_response: dict[str, Any] = {}

    # ---- process lifecycle --------------------------------------------------------------
    def start(self, timeout: float | None = None) -> ProviderServer:
        timeout = self.start_timeout if timeout is None else timeout
        env = dict(self.env)
        env["PULUMI_PROJECT"] = self.project
        env["PULUMI_STACK"] = self.stack
        env["PULUMI_CONFIG"] = json.dumps(
            {
                k: json.dumps(strip_secrets(v))
                if not isinstance(strip_secrets(v), str)
                else strip_secrets(v)
                for k, v in self.config.items()
            }
        )
        env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(
            [k for k, v in self.config.items() if isinstance(v, Secret)]
        )
        env.pop("PYTHONPATH", None)  # the engine does not set it: cwd makes the program importable
        # An address nobody listens on: the SDK's server never dials the engine.
        cmd = [self.python, "-u", "-c", _CHILD, "pulumi.dynamic", "127.0.0.1:9"]
        env["PULUMI_STANDIN_PARENT_PID"] = str(os.getpid())
        self.stdout_path.write_bytes(b"")
        self.stderr_path.write_bytes(b"")
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C goes to the stand-in, which lets calls finish
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._pumps = [
            threading.Thread(
                target=self._pump,
                args=(pipe, path, stream),
                name=f"provider-{stream}",
                daemon=True,
            )
            for pipe, path, stream in (
                (self._proc.stdout, self.stdout_path, "stdout"),
                (self._proc.stderr, self.stderr_path, "stderr"),
            )
        ]
        for pump in self._pumps:
            pump.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            first = self.stdout_path.read_text(errors="replace").split("\n", 1)
            if len(first) == 2 and first[0].strip().isdigit():
                self.port = int(first[0].strip())
                break
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"provider server exited with {self._proc.returncode} before printing its"
                    f" port; stderr:\n{self.logs()[-3000:]}"
                )
            time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError(f"provider server printed no port within {timeout}s")
        self._channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=CHANNEL_OPTIONS)
        self._stub = provider_pb2_grpc.ResourceProviderStub(self._channel)
        self._handshake(max(deadline - time.monotonic(), 1.0))
        return self

    def _pump(self, pipe: IO[bytes], path: Path, stream: str) -> None:
        """Copy one of the provider's output streams to its log file and to `on_output`, line
        by line as they come (the first stdout line is the port, not output). What it has read
        it handles under the stream's lock (`_drain` relies on that)."""
        fd = pipe.fileno()
        first = stream == "stdout"
        pending = b""
        busy = self._busy[stream]
        with open(path, "ab") as log:
            while True:
                select.select([fd], [], [])  # readable: data, or EOF
                with busy:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    log.write(chunk)
                    log.flush()
                    *lines, pending = (pending + chunk).split(b"\n")
                    for raw in lines:
                        if first:
                            first = False
                            continue
                        self._forward(stream, raw)
            if pending:
                self._forward(stream, pending)
        pipe.close()

    def _forward(self, stream: str, raw: bytes) -> None:
        listener = self.on_output
        text = raw.decode(errors="replace").rstrip("\r")
        if listener is None or not text.strip():
            return
        with self._lock:
            calls = list(self._inflight.values())
        call = calls[0] if len(calls) == 1 else None
        with contextlib.suppress(Exception):  # a display problem must not stop the pump
            listener(OutputLine(stream, text, call))

    def _drain(self, limit: float = 1.0) -> None:
        """Wait until the pumps have handled what the provider wrote so far: a call's output is
        in the pipe before its answer, so after this it is in the logs and went to `on_output`
        while the call still counted as in flight (so it is attributed to it). Nothing unread
        in a pipe (FIONREAD) and its pump's lock free means all of it was handled."""
        if self._proc is None:
            return
        deadline = time.monotonic() + limit
        for stream, pipe in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
            while pipe is not None and not pipe.closed and time.monotonic() < deadline:
                try:
                    unread = _unread(pipe.fileno())
                except (OSError, ValueError):
                    break
                if unread == 0:
                    with self._busy[stream]:  # a chunk read just before: handled once free
                        pass
                    break
                time.sleep(0.001)

    def _handshake(self, first_deadline: float) -> None:
        # The one deadline: the plugin coming alive (plugin.go dialPlugin).
        info = self._call("GetPluginInfo", empty_pb2.Empty(), deadline=first_deadline)
        self.plugin_info = MessageToDict(info)
        try:
            self._call("CheckConfig", provider_pb2.CheckRequest(urn=self._provider_urn()))
        except ProviderCallError as e:
            if e.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
        args = to_struct(self.config)
        variables = {
            k: (v if isinstance(v, str) else json.dumps(v))
            for k, v in ((k, strip_secrets(v)) for k, v in self.config.items())
        }
        resp = self._call(
            "Configure",
            provider_pb2.ConfigureRequest(
                variables=variables, args=args, acceptSecrets=True, acceptResources=True
            ),
        )
        self.configure_response = MessageToDict(resp, preserving_proto_field_name=True)

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for pump in self._pumps:
            pump.join(2)  # EOF once the process is gone (a leftover child could hold it)
        self._pumps = []

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> ProviderServer:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def logs(self) -> str:
        """The provider process's stdout + stderr so far."""
        text = ""
        for p in (self.stdout_path, self.stderr_path):
            with contextlib.suppress(FileNotFoundError):
                text += p.read_text(errors="replace")
        return text

    # ---- plumbing ---------------------------------------------------------------------------
    def _provider_urn(
        self, typ: str = "pulumi:providers:pulumi-python", name: str = "default"
    ) -> str:
        return f"urn:pulumi:{self.stack}::{self.project}::{typ}::{name}"

    def urn(self, typ: str, name: str) -> str:
        return f"urn:pulumi:{self.stack}::{self.project}::{typ}::{name}"

    def blob(self, provider: ProviderRef) -> str:
        """The `__provider` value for `provider`, made by the SDK's serialize_provider."""
        if isinstance(provider, Mapping):  # the secret envelope recorded under mocks
            provider = str(rpc.unwrap_rpc_secret(dict(provider)))
        if isinstance(provider, str):
            self.blobs.add(provider)
            return provider
        cached = self._blob_cache.get(id(provider))
        if cached is not None and cached[0] is provider:
            return cached[1]
        blob = serialize_provider(provider)
        self._blob_cache[id(provider)] = (provider, blob)
        self.blobs.add(blob)
        return blob

    def type_token(self, provider: ProviderRef) -> str:
        """`pulumi-python:dynamic/<module>:<Name>` from the provider's `type_token` attribute
        (blobs are loaded with dill to find it), else the generic dynamic type."""
        if not isinstance(provider, ResourceProvider):
            blob = self.blob(provider)
            # The blob is the program's own (or our state file's): the engine hands it to
            # the same dill.loads in the provider process.
            provider = self._loaded.get(blob) or dill.loads(base64.b64decode(blob))  # noqa: S301
            self._loaded[blob] = provider
        token = getattr(provider, "type_token", None)
        return str(token) if token else "pulumi-python:dynamic:Resource"

    def _call(self, method: str, request: Any, *, deadline: float | None = None) -> Any:
        """One RPC. `deadline` (seconds) only for the start-up check: the engine calls
        Check/Diff/Create/Read/Update/Delete with no deadline (see the module doc)."""
        if self._stub is None:
            raise RuntimeError("provider server not started")
        rec = Record(method, _to_dict(request))
        self.records.append(rec)
        name = str(getattr(request, "name", "") or "")
        type_ = str(getattr(request, "type", "") or "")
        key = next(self._call_ids)
        with self._lock:
            self._inflight[key] = Call(method, name, type_)
        t0 = time.perf_counter()
        try:
            resp = getattr(self._stub, method)(
                request, timeout=deadline, wait_for_ready=deadline is not None
            )
        except grpc.RpcError as e:
            rec.seconds = time.perf_counter() - t0
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            details = e.details() if hasattr(e, "details") else str(e)
            rec.error = f"{code.name}: {details}"
            raise ProviderCallError(method, code, details or "", name=name, type_=type_) from None
        else:
            rec.seconds = time.perf_counter() - t0
        finally:
            self._drain()  # what it printed: logged, and shown while it still counts as in flight
            with self._lock:
                self._inflight.pop(key, None)
        rec.response = _to_dict(resp)
        return resp

    def _props(self, provider: ProviderRef, props: Mapping[str, Any] | None) -> struct_pb2.Struct:
        plain = strip_secrets({k: v for k, v in (props or {}).items() if k != PROVIDER_KEY})
        plain[PROVIDER_KEY] = self.blob(provider)
        return to_struct(plain)

    @staticmethod
    def _outputs(
        struct: struct_pb2.Struct,
        inputs: Mapping[str, Any] | None,
        secret_outputs: Iterable[str] = (),
    ) -> dict[str, Any]:
        outs = struct_to_py(struct)
        outs.pop(PROVIDER_KEY, None)
        marked = set(secret_outputs)
        for key, value in (inputs or {}).items():
            if contains_secret(value):
                marked.add(key)
        for key in marked:
            if key in outs and not isinstance(outs[key], Secret):
                outs[key] = Secret(outs[key])
        return outs

    # ---- the provider protocol --------------------------------------------------------------
    def check(
        self,
        provider: ProviderRef,
        news: Mapping[str, Any],
        olds: Mapping[str, Any] | None = None,
        *,
        name: str = "r",
    ) -> CheckOutcome:
        typ = self.type_token(provider)
        resp = self._call(
            "Check",
            provider_pb2.CheckRequest(
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                olds=self._props(provider, olds) if olds is not None else struct_pb2.Struct(),
                news=self._props(provider, news),
            ),
        )
        inputs = struct_to_py(resp.inputs)
        inputs.pop(PROVIDER_KEY, None)
        # The engine keeps the program's secretness on checked inputs.
        for key, value in news.items():
            if contains_secret(value) and key in inputs and not isinstance(inputs[key], Secret):
                inputs[key] = Secret(inputs[key])
        failures = [(f.property, f.reason) for f in resp.failures]
        self.visible.append(("Check", {"inputs": stored_form(inputs), "failures": failures}))
        return CheckOutcome(inputs, failures)

    def diff(
        self,
        provider: ProviderRef,
        id_: str,
        olds: Mapping[str, Any],
        news: Mapping[str, Any],
        *,
        old_inputs: Mapping[str, Any] | None = None,
        name: str = "r",
    ) -> DiffOutcome:
        typ = self.type_token(provider)
        resp = self._call(
            "Diff",
            provider_pb2.DiffRequest(
                id=id_,
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                olds=self._props(provider, olds),
                news=self._props(provider, news),
                old_inputs=self._props(provider, old_inputs) if old_inputs is not None else None,
            ),
        )
        changes = {
            provider_pb2.DiffResponse.DIFF_NONE: "none",
            provider_pb2.DiffResponse.DIFF_SOME: "some",
            provider_pb2.DiffResponse.DIFF_UNKNOWN: "unknown",
        }[resp.changes]
        outcome = DiffOutcome(changes, list(resp.replaces), bool(resp.deleteBeforeReplace))
        self.visible.append(("Diff", outcome.__dict__))
        return outcome

    def create(
        self,
        provider: ProviderRef,
        inputs: Mapping[str, Any],
        *,
        name: str = "r",
        secret_outputs: Iterable[str] = (),
        timeout: float = 0.0,
    ) -> Created:
        """`timeout`: the resource's customTimeouts.create in seconds (0: none), sent in the
        request as the engine sends it (step.go CreateStep.Apply); nothing enforces it."""
        typ = self.type_token(provider)
        resp = self._call(
            "Create",
            provider_pb2.CreateRequest(
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                properties=self._props(provider, inputs),
                timeout=timeout,
                preview=False,
            ),
        )
        outs = self._outputs(resp.properties, inputs, secret_outputs)
        self.visible.append(("Create", {"id": resp.id, "outputs": stored_form(outs)}))
        return Created(resp.id, outs)

    def read(
        self,
        provider: ProviderRef,
        id_: str,
        *,
        state: Mapping[str, Any] | None = None,
        inputs: Mapping[str, Any] | None = None,
        name: str = "r",
        secret_outputs: Iterable[str] = (),
        import_: bool = False,
        timeout: float = 0.0,
    ) -> ReadOutcome:
        """Refresh (`state` = old outputs, `inputs` = old inputs), or, with `import_=True`, the
        engine's import Read: URN, type and ID only, no properties, no inputs, hence no
        `__provider` (pulumi/pulumi v3.272.0 pkg/resource/deploy/step.go, ImportStep.Apply
        calls `prov.Read(... ID: s.new.ImportID ...)` with neither inputs nor state).
        `timeout`: the resource's customTimeouts.read in seconds (0: none), sent in the request
        only; nothing enforces it."""
        typ = self.type_token(provider)
        if import_:
            request = provider_pb2.ReadRequest(
                id=id_, urn=self.urn(typ, name), name=name, type=typ, timeout=timeout
            )
        else:
            request = provider_pb2.ReadRequest(
                id=id_,
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                properties=self._props(provider, state) if state is not None else None,
                inputs=self._props(provider, inputs) if inputs is not None else None,
                timeout=timeout,
            )
        resp = self._call("Read", request)
        outs = self._outputs(resp.properties, inputs, secret_outputs) if resp.id else {}
        new_inputs = None
        if resp.HasField("inputs") and resp.id:
            new_inputs = struct_to_py(resp.inputs)
            new_inputs.pop(PROVIDER_KEY, None)
            for key, value in (inputs or {}).items():
                if contains_secret(value) and key in new_inputs:
                    new_inputs[key] = Secret(strip_secrets(new_inputs[key]))
        self.visible.append(
            (
                "Read",
                {"id": resp.id, "outputs": stored_form(outs), "inputs": stored_form(new_inputs)},
            )
        )
        return ReadOutcome(resp.id, outs, new_inputs)

    def update(
        self,
        provider: ProviderRef,
        id_: str,
        olds: Mapping[str, Any],
        news: Mapping[str, Any],
        *,
        old_inputs: Mapping[str, Any] | None = None,
        name: str = "r",
        secret_outputs: Iterable[str] = (),
        timeout: float = 0.0,
    ) -> dict[str, Any]:
        """`timeout`: customTimeouts.update in seconds (0: none), in the request only."""
        typ = self.type_token(provider)
        resp = self._call(
            "Update",
            provider_pb2.UpdateRequest(
                id=id_,
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                olds=self._props(provider, olds),
                news=self._props(provider, news),
                old_inputs=self._props(provider, old_inputs) if old_inputs is not None else None,
                timeout=timeout,
                preview=False,
            ),
        )
        outs = self._outputs(resp.properties, news, secret_outputs)
        self.visible.append(("Update", {"outputs": stored_form(outs)}))
        return outs

    def delete(
        self,
        provider: ProviderRef,
        id_: str,
        state: Mapping[str, Any],
        *,
        old_inputs: Mapping[str, Any] | None = None,
        name: str = "r",
        timeout: float = 0.0,
    ) -> None:
        """`timeout`: the OLD state's customTimeouts.delete in seconds (0: none), as the engine
        sends it (step.go DeleteStep.Apply: `s.old.CustomTimeouts.Delete`), in the request only."""
        typ = self.type_token(provider)
        self._call(
            "Delete",
            provider_pb2.DeleteRequest(
                id=id_,
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                properties=self._props(provider, state),
                old_inputs=self._props(provider, old_inputs) if old_inputs is not None else None,
                timeout=timeout,
            ),
        )

    # ---- leak scanning --------------------------------------------------------------------
    def mutations(self) -> list[Record]:
        """The Create/Update/Delete calls made so far (a no-op run makes none)."""
        return [r for r in self.records if r.method in MUTATING_METHODS]

    def requests_text(self) -> str:
        return "\n".join(json.dumps(r.request, sort_keys=True) for r in self.records)

    def leak_surfaces(self, engine: Any = None) -> dict[str, str]:
        """Every operator-visible text: what the engine keeps or shows from each call (outputs
        and checked inputs re-marked secret, diffs, check failures), the raw responses (wire
        secrets left out), error details, the provider's stdout/stderr, the decoded
        `__provider` blobs, and the engine's stored state and step log."""
        surfaces: dict[str, str] = {}
        for i, (method, value) in enumerate(self.visible):
            surfaces[f"{i}:{method}"] = json.dumps(value, sort_keys=True, default=str)
        for i, r in enumerate(self.records):
            if r.error is not None:
                surfaces[f"{i}:{r.method}:error"] = r.error
            if r.response is not None:
                # The raw answer, stricter than what the engine keeps: wire secrets are the
                # only thing left out. (Check echoes the inputs it was sent, which the engine
                # re-marks secret; that echo is covered by the "Check" visible entry.)
                raw = {
                    k: v
                    for k, v in r.response.items()
                    if not (r.method == "Check" and k == "inputs")
                }
                surfaces[f"{i}:{r.method}:response"] = json.dumps(
                    redact_wire_secrets(raw), sort_keys=True
                )
        surfaces["provider-logs"] = self.logs()
        for j, b in enumerate(sorted(self.blobs)):
            surfaces[f"__provider[{j}]"] = base64.b64decode(b).decode("latin-1")
        if engine is not None:
            surfaces["engine-state"] = json.dumps(engine.stored_state(), sort_keys=True)
            surfaces["engine-log"] = "\n".join(engine.log)
        return surfaces


def _unread(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD)."""
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int(buf[0])


def _to_dict(message: Any) -> dict[str, Any]:
    """A message as a dict for the records; NaN/inf (no JSON form) are kept as their repr."""
    try:
        return dict(MessageToDict(message, preserving_proto_field_name=True))
    except (SerializeToJsonError, ValueError):
        return {"_text": str(message)}
