"""Engine-protocol harness: drive a Pulumi dynamic provider exactly the way the engine does.

The Pulumi engine runs dynamic providers as a plugin: `<venv python> -u -m pulumi.dynamic
<engine-address>` with cwd = the program directory and env PULUMI_PROJECT/PULUMI_STACK/
PULUMI_CONFIG, reads the port from the first stdout line, then talks gRPC
(pulumirpc.ResourceProvider). `ProviderServer` does the same against the installed SDK
(3.272.0), so providers are tested through the real server code: dill (de)serialization of the
`__provider` blob, property (de)serialization, error propagation, config delivery.

What it reproduces from the engine:
- start-up: GetPluginInfo, CheckConfig (UNIMPLEMENTED is accepted), then
  `Configure(args=<stack config "project:key" → value>, acceptSecrets=True)`; the SDK answers
  acceptSecrets=False, so the harness strips every secret marker from later requests;
- `__provider` = `pulumi.dynamic.dynamic.serialize_provider(provider)` (the SDK's own function)
  added to every request; unknown values (preview) are sent as the engine's sentinel;
- outputs come back re-marked secret the engine's way: a key is secret when the provider
  wrapped it (`wrap_rpc_secret`), when the same-named input contained a secret, or when it is
  listed in `secret_outputs` (the resource's `additional_secret_outputs`);
- Diff/Update receive the OLD OUTPUTS as `olds` (plus `old_inputs`), Read gets old outputs in
  `properties` on refresh and only `inputs` on import.

The SDK server ignores the engine address argument (it logs nothing to the engine), so no
engine gRPC service is needed; the harness passes an address nobody listens on.

Python API (values in dicts are plain Python; wrap secret inputs in `Secret(value)`; pass
`UNKNOWN` for a value not known during preview; `__provider` never appears in results):

    with ProviderServer(env=emu.subprocess_env(), config={"modal:serverUrl": url}) as srv:
        p = SecretProvider()    # or its base64 blob, or inputs["__provider"] recorded by mocks
        chk = srv.check(p, {"name": "k", "values": Secret({"A": "1"}), "environment": "main"})
        chk.failures                              # [(property, reason), ...]
        created = srv.create(p, chk.inputs)       # Created(id, outputs) — outputs keep Secret()
        d = srv.diff(p, created.id, created.outputs, new_inputs)
        d.changes, d.replaces, d.delete_before_replace   # "none" | "some" | "unknown", [...], bool
        outs = srv.update(p, created.id, created.outputs, new_inputs)
        r = srv.read(p, created.id, state=outs, inputs=new_inputs)   # Read(id, outputs, inputs)
        srv.delete(p, created.id, outs)

    engine = Engine(srv)                          # a tiny engine: state + step decisions
    engine.up("key", p, inputs)                   # -> "create" | "same" | "update" | "replace"
    engine.preview("key", p, inputs)              # same decision, nothing applied
    engine.refresh("key")                         # -> "same" | "update" (drift) | "delete" (gone)
    engine.import_("key", p, "st-123", inputs)    # Read by id, then Check+Diff must be "none"
    engine.destroy("key")
    lifecycle(engine, "key", p, inputs, update_inputs)   # up, refresh, no-op diff, update, destroy
    engine.stored_state()                         # the state as the engine writes it

Resources whose secret outputs rely on `additional_secret_outputs` pass them as
`secret_outputs=(...)` to `up`/`create`/`update`/`read` (mocks do not expose resource options).
`scan_for_leaks(srv.leak_surfaces(engine), secret_values)` lists the surfaces that contain a
secret (plain, JSON-escaped or base64).

Failures raise `ProviderCallError` (method, gRPC code, details = the provider's traceback).
Everything is recorded in `srv.records`; `srv.leak_surfaces()` returns every text an operator
could see — outputs/checked inputs as the engine keeps them, raw responses (wire secrets left
out), the provider's stdout/stderr, error details, check failures, the engine's stored state
(secret values replaced by ciphertext) and the decoded `__provider` blobs — for leak scans.
Requests are recorded too (`srv.requests_text()`), but they necessarily hold plaintext inputs,
as they do under the real engine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import dill
import grpc
from google.protobuf import empty_pb2, struct_pb2
from google.protobuf.json_format import MessageToDict, SerializeToJsonError
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from tests.harness.emulator import PROJECT_ROOT

UNKNOWN = rpc.UNKNOWN
PROVIDER_KEY = "__provider"
DEFAULT_PROJECT = "modal-llm-iac"
DEFAULT_STACK = "test"

_SIG = rpc._special_sig_key
_SECRET_SIG = rpc._special_secret_sig


#: A provider instance, its `__provider` blob (base64 string), or the blob in the secret
#: envelope mocks record (`inputs["__provider"]` of a dynamic resource under set_mocks).
ProviderRef = ResourceProvider | str | Mapping[str, Any]


@dataclass(frozen=True)
class Secret:
    """A value the program marked secret (`pulumi.Output.secret`)."""

    value: Any

    def __repr__(self) -> str:
        return "Secret(<redacted>)"


class ProviderCallError(Exception):
    """A provider RPC failed; `details` is what the engine would show (the traceback)."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed with {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


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


# ---- value conversion ----------------------------------------------------------------------


def contains_secret(value: Any) -> bool:
    if isinstance(value, Secret):
        return True
    if isinstance(value, Mapping):
        return any(contains_secret(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(contains_secret(v) for v in value)
    return False


def strip_secrets(value: Any) -> Any:
    """What the engine sends a provider that answered acceptSecrets=False: plain values."""
    if isinstance(value, Secret):
        return strip_secrets(value.value)
    if isinstance(value, Mapping):
        return {k: strip_secrets(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strip_secrets(v) for v in value]
    return value


def reveal(value: Any) -> Any:
    """Plain value with every Secret wrapper removed (for assertions in tests)."""
    return strip_secrets(value)


def _to_struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({k: _wire(v) for k, v in props.items() if v is not None})
    return s


def _wire(value: Any) -> Any:
    if isinstance(value, Secret):  # only used for Configure (acceptSecrets=True there)
        return {_SIG: _SECRET_SIG, "value": _wire(value.value)}
    if isinstance(value, Mapping):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_wire(v) for v in value]
    return value


def _from_wire(value: Any) -> Any:
    """Struct JSON → Python, turning wire secrets into Secret (engine: KeepSecrets=true)."""
    if isinstance(value, dict):
        if value.get(_SIG) == _SECRET_SIG:
            return Secret(_from_wire(value.get("value")))
        return {k: _from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_wire(v) for v in value]
    return value


def _pb_value(v: Any) -> Any:
    if isinstance(v, struct_pb2.Struct):
        return {k: _pb_value(x) for k, x in v.items()}
    if isinstance(v, struct_pb2.ListValue):
        return [_pb_value(x) for x in v]
    return v


def _struct_to_py(s: struct_pb2.Struct) -> dict[str, Any]:
    try:
        raw = MessageToDict(s)
    except ValueError:  # NaN/inf have no JSON form; walk the Struct instead
        raw = _pb_value(s)
    out = _from_wire(raw)
    assert isinstance(out, dict)
    return out


def stored_form(value: Any) -> Any:
    """How the engine persists a value: secrets become opaque ciphertext."""
    if isinstance(value, Secret):
        return {"ciphertext": "<encrypted>"}
    if isinstance(value, Mapping):
        return {k: stored_form(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [stored_form(v) for v in value]
    return value


# ---- the server ------------------------------------------------------------------------------


class ProviderServer:
    """One `python -m pulumi.dynamic` process, driven over gRPC like the engine drives it.

    Args:
        config: stack config, keys "namespace:key" (e.g. "modal:tokenId"); values are strings
            (objects as JSON), `Secret(...)` for secret config.
        env: environment of the provider process (default: os.environ); the harness adds
            PULUMI_PROJECT, PULUMI_STACK and PULUMI_CONFIG like the engine does.
        cwd: the program directory (default: the project root).
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
        timeout: float = 300.0,
    ) -> None:
        self.config = dict(config or {})
        self.env = dict(env if env is not None else os.environ)
        self.project = project
        self.stack = stack
        self.cwd = Path(cwd) if cwd is not None else PROJECT_ROOT
        self.python = python
        self.timeout = timeout
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
        self.port = 0
        self.plugin_info: dict[str, Any] = {}
        self.configure_response: dict[str, Any] = {}

    # ---- process lifecycle --------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> ProviderServer:
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
        cmd = [self.python, "-u", "-m", "pulumi.dynamic", "127.0.0.1:9"]
        out = open(self.stdout_path, "wb")  # noqa: SIM115 (kept open for the child's lifetime)
        err = open(self.stderr_path, "wb")  # noqa: SIM115
        self._proc = subprocess.Popen(
            cmd, cwd=self.cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
        )
        out.close()
        err.close()
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
        self._channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self._stub = provider_pb2_grpc.ResourceProviderStub(self._channel)
        self._handshake()
        return self

    def _handshake(self) -> None:
        info = self._call("GetPluginInfo", empty_pb2.Empty())
        self.plugin_info = MessageToDict(info)
        try:
            self._call("CheckConfig", provider_pb2.CheckRequest(urn=self._provider_urn()))
        except ProviderCallError as e:
            if e.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
        args = _to_struct(self.config)
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
            provider = self._loaded.get(blob) or dill.loads(base64.b64decode(blob))
            self._loaded[blob] = provider
        token = getattr(provider, "type_token", None)
        return str(token) if token else "pulumi-python:dynamic:Resource"

    def _call(self, method: str, request: Any) -> Any:
        if self._stub is None:
            raise RuntimeError("provider server not started")
        rec = Record(method, _to_dict(request))
        self.records.append(rec)
        t0 = time.perf_counter()
        try:
            resp = getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            rec.seconds = time.perf_counter() - t0
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            details = e.details() if hasattr(e, "details") else str(e)
            rec.error = f"{code.name}: {details}"
            raise ProviderCallError(method, code, details or "") from None
        rec.seconds = time.perf_counter() - t0
        rec.response = _to_dict(resp)
        return resp

    def _props(self, provider: ProviderRef, props: Mapping[str, Any] | None) -> struct_pb2.Struct:
        plain = strip_secrets({k: v for k, v in (props or {}).items() if k != PROVIDER_KEY})
        plain[PROVIDER_KEY] = self.blob(provider)
        return _to_struct(plain)

    @staticmethod
    def _outputs(
        struct: struct_pb2.Struct,
        inputs: Mapping[str, Any] | None,
        secret_outputs: Iterable[str] = (),
    ) -> dict[str, Any]:
        outs = _struct_to_py(struct)
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
        inputs = _struct_to_py(resp.inputs)
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
    ) -> Created:
        typ = self.type_token(provider)
        resp = self._call(
            "Create",
            provider_pb2.CreateRequest(
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                properties=self._props(provider, inputs),
                timeout=self.timeout,
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
    ) -> ReadOutcome:
        """Refresh (state = old outputs) or import/get (state None, inputs = program inputs)."""
        typ = self.type_token(provider)
        resp = self._call(
            "Read",
            provider_pb2.ReadRequest(
                id=id_,
                urn=self.urn(typ, name),
                name=name,
                type=typ,
                properties=self._props(provider, state) if state is not None else None,
                inputs=self._props(provider, inputs) if inputs is not None else None,
            ),
        )
        outs = self._outputs(resp.properties, inputs, secret_outputs) if resp.id else {}
        new_inputs = None
        if resp.HasField("inputs") and resp.id:
            new_inputs = _struct_to_py(resp.inputs)
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
    ) -> dict[str, Any]:
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
                timeout=self.timeout,
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
    ) -> None:
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
                timeout=self.timeout,
            ),
        )

    # ---- leak scanning --------------------------------------------------------------------
    def requests_text(self) -> str:
        return "\n".join(json.dumps(r.request, sort_keys=True) for r in self.records)

    def leak_surfaces(self, engine: Engine | None = None) -> dict[str, str]:
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
                    _redact_wire_secrets(raw), sort_keys=True
                )
        surfaces["provider-logs"] = self.logs()
        for j, b in enumerate(sorted(self.blobs)):
            surfaces[f"__provider[{j}]"] = base64.b64decode(b).decode("latin-1")
        if engine is not None:
            surfaces["engine-state"] = json.dumps(engine.stored_state(), sort_keys=True)
            surfaces["engine-log"] = "\n".join(engine.log)
        return surfaces


def _to_dict(message: Any) -> dict[str, Any]:
    """A message as a dict for the records; NaN/inf (no JSON form) are kept as their repr."""
    try:
        return dict(MessageToDict(message, preserving_proto_field_name=True))
    except (SerializeToJsonError, ValueError):
        return {"_text": str(message)}


def _redact_wire_secrets(value: Any) -> Any:
    """JSON of a response with every wire secret replaced (the engine encrypts those)."""
    if isinstance(value, dict):
        if value.get(_SIG) == _SECRET_SIG:
            return {"ciphertext": "<encrypted>"}
        return {k: _redact_wire_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_wire_secrets(v) for v in value]
    return value


def scan_for_leaks(surfaces: Mapping[str, str], secrets: Iterable[str]) -> list[str]:
    """Names of surfaces containing any secret value (plain or base64/JSON-escaped)."""
    found = []
    needles = [s for s in secrets if s]
    for name, text in surfaces.items():
        for s in needles:
            forms = {s, json.dumps(s)[1:-1], base64.b64encode(s.encode()).decode()}
            if any(f in text for f in forms):
                found.append(f"{name} contains secret {s[:3]}…")
    return found


# ---- a tiny engine ---------------------------------------------------------------------------


@dataclass
class ResourceState:
    """What the engine's state file holds for one resource."""

    name: str
    provider: ProviderRef
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    secret_outputs: tuple[str, ...] = ()


@dataclass
class Engine:
    """Step decisions the way `pulumi up/preview/refresh/import/destroy` make them.

    One resource at a time (no dependency graph): enough to drive a provider through every
    kind of step. `log` records each step ("create key", "replace key [values]", ...).
    """

    server: ProviderServer
    states: dict[str, ResourceState] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def _checked(
        self, name: str, provider: ProviderRef, inputs: Mapping[str, Any]
    ) -> dict[str, Any]:
        old = self.states.get(name)
        chk = self.server.check(provider, inputs, old.inputs if old else None, name=name)
        if chk.failures:
            raise CheckFailed(name, chk.failures)
        return chk.inputs

    def plan(
        self, name: str, provider: ProviderRef, inputs: Mapping[str, Any]
    ) -> tuple[str, DiffOutcome | None, dict[str, Any]]:
        """(step, diff, checked inputs) for registering `name` with `inputs`."""
        checked = self._checked(name, provider, inputs)
        old = self.states.get(name)
        if old is None:
            return "create", None, checked
        d = self.server.diff(
            provider, old.id, old.outputs, checked, old_inputs=old.inputs, name=name
        )
        if d.changes == "none":
            return "same", d, checked
        if d.replaces:
            return "replace", d, checked
        return "update", d, checked

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
    ) -> str:
        step, d, checked = self.plan(name, provider, inputs)
        so = tuple(secret_outputs)
        old = self.states.get(name)
        if step == "create":
            c = self.server.create(provider, checked, name=name, secret_outputs=so)
            self.states[name] = ResourceState(name, provider, c.id, checked, c.outputs, so)
        elif step == "update":
            assert old is not None
            outs = self.server.update(
                provider,
                old.id,
                old.outputs,
                checked,
                old_inputs=old.inputs,
                name=name,
                secret_outputs=so,
            )
            self.states[name] = ResourceState(name, provider, old.id, checked, outs, so)
        elif step == "replace":
            assert old is not None and d is not None
            if d.delete_before_replace:
                self.server.delete(provider, old.id, old.outputs, old_inputs=old.inputs, name=name)
                c = self.server.create(provider, checked, name=name, secret_outputs=so)
            else:  # create-before-delete: the new one exists before the old one goes
                c = self.server.create(provider, checked, name=name, secret_outputs=so)
                self.server.delete(provider, old.id, old.outputs, old_inputs=old.inputs, name=name)
            self.states[name] = ResourceState(name, provider, c.id, checked, c.outputs, so)
        detail = f" {d.replaces}" if d is not None and d.replaces else ""
        self.log.append(f"{step} {name}{detail}")
        return step

    def refresh(self, name: str) -> str:
        st = self.states[name]
        r = self.server.read(
            st.provider,
            st.id,
            state=st.outputs,
            inputs=st.inputs,
            name=name,
            secret_outputs=st.secret_outputs,
        )
        if not r.id:
            del self.states[name]
            self.log.append(f"refresh delete {name}")
            return "delete"
        new_inputs = r.inputs if r.inputs is not None else st.inputs
        changed = strip_secrets(r.outputs) != strip_secrets(st.outputs) or r.id != st.id
        self.states[name] = ResourceState(
            name, st.provider, r.id, new_inputs, r.outputs, st.secret_outputs
        )
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
    ) -> ResourceState:
        """`import` resource option: Read by id (no old state), then the program's inputs must
        Check and Diff clean against what was read, else the import fails like in Pulumi."""
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

    def destroy(self, name: str) -> None:
        st = self.states[name]  # a failed delete leaves the resource in state, as in Pulumi
        self.server.delete(st.provider, st.id, st.outputs, old_inputs=st.inputs, name=name)
        del self.states[name]
        self.log.append(f"delete {name}")

    def stored_state(self) -> dict[str, Any]:
        """The state as the engine would write it (secrets encrypted)."""
        return {
            n: {
                "id": s.id,
                "inputs": stored_form(s.inputs),
                "outputs": stored_form(s.outputs),
            }
            for n, s in self.states.items()
        }


class CheckFailed(Exception):
    def __init__(self, name: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(f"check failed for {name}: {failures}")
        self.failures = failures


class ImportFailed(Exception):
    def __init__(self, name: str, id_: str, why: str) -> None:
        super().__init__(f"import of {name} ({id_}) failed: {why}")


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


def iter_secret_strings(value: Any) -> Iterator[str]:
    """Every string inside Secret wrappers of `value` (what a leak scan looks for)."""
    if isinstance(value, Secret):
        yield from _strings(value.value)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from iter_secret_strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from iter_secret_strings(v)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


__all__ = [
    "PROJECT_ROOT",
    "UNKNOWN",
    "CheckFailed",
    "CheckOutcome",
    "Created",
    "DiffOutcome",
    "Engine",
    "ImportFailed",
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
