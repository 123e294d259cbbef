"""Offline stand-in for `pulumi preview --diff`, `pulumi up` and `pulumi destroy`.

THIS IS NOT THE PULUMI ENGINE. It is built from the project's test harness, for machines
without the Pulumi CLI (our build machines, CI), and it only talks to the Modal emulator:

    .venv/bin/python scripts/offline_stack.py preview --stack local [--state FILE]
    .venv/bin/python scripts/offline_stack.py up      --stack local [--show-secrets]
    .venv/bin/python scripts/offline_stack.py destroy --stack local
    (+ `--config KEY=VALUE` to override one config value for this run only, never saved)

How it works:
- the real program (`__main__.py`) runs under `pulumi.runtime.set_mocks` with the stack's real
  `Pulumi.<stack>.yaml` (tests/program/runner.py), `preview` in dry-run mode;
- each dynamic resource the program registers is driven through the SDK's real dynamic-provider
  server (`python -m pulumi.dynamic`, tests/harness/provider_server.py: `ProviderServer` +
  `Engine`) the way the engine does: Check, then Diff against the stored state, then
  Create/Update/replace (`up`), or nothing (`preview`: Check and Diff only). The mocks hand the
  provider's real outputs back to the program, so dependents see real ids and URLs and the
  stack outputs `up` prints are the real ones. The SDK registers a resource only once its
  inputs resolved, so this is dependency order;
- resources in the state that the program no longer registers are deleted after that, newest
  first; `destroy` deletes everything in reverse creation order;
- the emulator is the one named by `--server-url`, else env MODAL_SERVER_URL, else the stack's
  `modal:serverUrl` (it becomes `modal:serverUrl` for the program and the providers). Only a
  loopback URL is accepted: deploy to real Modal with the Pulumi CLI.

State: one JSON file per stack (default `.pulumi-offline/<stack>.json`, not Pulumi's format),
written after every step. Secret values (API keys, the proxy token secret, secret inputs) are
encrypted, never stored in clear: key = PBKDF2-HMAC-SHA256(passphrase, per-file salt, 200,000
rounds); each value is XORed with an HMAC-SHA256 counter-mode keystream and authenticated
with HMAC-SHA256 (encrypt-then-MAC, stdlib only: no AES library is installed here). The
passphrase comes from OFFLINE_STACK_PASSPHRASE, else PULUMI_CONFIG_PASSPHRASE, else, for the
`local` stack only, "local-emulator" (the default of scripts/local-env.sh: the local stack
holds emulator-only keys). A wrong passphrase stops before anything runs.

What it does NOT do (use the Pulumi CLI for these): no Pulumi backend or checkpoint format, no
`secure:` config decryption (a stack file with `secure:` values is refused by `up`; `preview`
shows it with placeholder values), no refresh, import, targets, aliases or plugin providers,
no parallelism, no component resources or the Stack in the plan (only the dynamic resources),
no real Modal. The program's own checks (config, budget guard) run exactly as under Pulumi.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:  # run as `python scripts/offline_stack.py`
    sys.path.insert(0, str(PROJECT_ROOT))

import pulumi  # noqa: E402
import yaml  # noqa: E402
from pulumi.output import Unknown  # noqa: E402
from pulumi.runtime import rpc  # noqa: E402

from tests.harness.provider_server import (  # noqa: E402
    UNKNOWN,
    CheckFailed,
    DiffOutcome,
    Engine,
    ProviderCallError,
    ProviderRef,
    ProviderServer,
    ResourceState,
    Secret,
    reveal,
)
from tests.program.runner import (  # noqa: E402
    DYNAMIC,
    PROJECT,
    ProgramRun,
    RecordingMonitor,
    run_program,
    stack_config,
    to_harness,
    to_program,
)

NOT_THE_ENGINE = "offline stand-in built from the test harness, NOT the Pulumi engine"
STATE_FORMAT = "modal-llm-offline-stack/1"
# Same default as scripts/local-env.sh: the local stack holds emulator-only keys.
DEFAULT_LOCAL_PASSPHRASE = "local-emulator"  # noqa: S105
KDF_ROUNDS = 200_000
SECRET_TAG = "__offline_secret__"  # noqa: S105 (a marker key, not a secret)
SYMBOLS = {
    "create": "+ ",
    "update": "~ ",
    "replace": "+-",
    "delete": "- ",
    "same": "  ",
}
PLAN_WORDS = {
    "create": "to create",
    "update": "to update",
    "replace": "to replace",
    "delete": "to delete",
    "same": "unchanged",
}
DONE_WORDS = {
    "create": "created",
    "update": "updated",
    "replace": "replaced",
    "delete": "deleted",
    "same": "unchanged",
}


class OfflineStackError(Exception):
    """A problem the operator can fix; the message says what and how."""


# ---- secrets at rest -------------------------------------------------------------------------


class SecretBox:
    """Encrypts/decrypts JSON values with a passphrase (see the module docstring)."""

    def __init__(self, passphrase: str, salt: bytes) -> None:
        key = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), salt, KDF_ROUNDS, dklen=64)
        self.salt = salt
        self._enc_key, self._mac_key = key[:32], key[32:]

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        blocks = []
        for counter in range((length + 31) // 32):
            msg = nonce + counter.to_bytes(8, "big")
            blocks.append(hmac.new(self._enc_key, msg, hashlib.sha256).digest())
        return b"".join(blocks)[:length]

    def seal(self, value: Any) -> dict[str, str]:
        plain = json.dumps(value, sort_keys=True).encode()
        nonce = os.urandom(16)
        ct = bytes(a ^ b for a, b in zip(plain, self._keystream(nonce, len(plain)), strict=True))
        mac = hmac.new(self._mac_key, nonce + ct, hashlib.sha256).digest()
        return {
            "nonce": base64.b64encode(nonce).decode(),
            "ciphertext": base64.b64encode(ct).decode(),
            "mac": base64.b64encode(mac).decode(),
        }

    def open(self, sealed: Mapping[str, str], where: str) -> Any:
        nonce = base64.b64decode(sealed["nonce"])
        ct = base64.b64decode(sealed["ciphertext"])
        mac = hmac.new(self._mac_key, nonce + ct, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, base64.b64decode(sealed["mac"])):
            raise OfflineStackError(
                f"{where}: cannot decrypt with this passphrase (wrong passphrase or edited"
                " file). Set OFFLINE_STACK_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE) to the"
                " passphrase the state was written with."
            )
        ks = self._keystream(nonce, len(ct))
        return json.loads(bytes(a ^ b for a, b in zip(ct, ks, strict=True)))


def passphrase_for(stack: str) -> str:
    for var in ("OFFLINE_STACK_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE"):
        value = os.environ.get(var)
        if value:
            return value
    if stack == "local":
        return DEFAULT_LOCAL_PASSPHRASE
    raise OfflineStackError(
        f"stack '{stack}': no passphrase to encrypt the state's secrets. Export"
        " OFFLINE_STACK_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE) and rerun."
    )


def _seal_tree(value: Any, box: SecretBox) -> Any:
    if isinstance(value, Secret):
        return {SECRET_TAG: box.seal(reveal(value.value))}
    if isinstance(value, Mapping):
        return {k: _seal_tree(v, box) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_seal_tree(v, box) for v in value]
    return value


def _open_tree(value: Any, box: SecretBox, where: str) -> Any:
    if isinstance(value, dict):
        if set(value) == {SECRET_TAG}:
            return Secret(box.open(value[SECRET_TAG], where))
        return {k: _open_tree(v, box, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_open_tree(v, box, where) for v in value]
    return value


# ---- the state file --------------------------------------------------------------------------


@dataclass
class Options:
    """Resource options the engine keeps in its state."""

    secret_outputs: tuple[str, ...] = ()
    protect: bool = False
    retain_on_delete: bool = False


@dataclass
class StackState:
    """What the state file holds: the engine's resource states (creation order) + extras.

    The passphrase is asked for only when secrets must be read or written, so a preview of a
    stack without a state file needs none.
    """

    path: Path
    stack: str
    salt: bytes = field(default_factory=lambda: os.urandom(16))
    types: dict[str, str] = field(default_factory=dict)
    options: dict[str, Options] = field(default_factory=dict)
    _box: SecretBox | None = None

    @property
    def box(self) -> SecretBox:
        if self._box is None:
            self._box = SecretBox(passphrase_for(self.stack), self.salt)
        return self._box

    @classmethod
    def load(cls, path: Path, stack: str, engine: Engine) -> StackState:
        if not path.exists():
            return cls(path, stack)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise OfflineStackError(
                f"state file {path}: unreadable ({exc}); fix or move it away and rerun"
            ) from None
        if doc.get("format") != STATE_FORMAT or doc.get("stack") != stack:
            raise OfflineStackError(
                f"state file {path}: holds format {doc.get('format')!r} of stack"
                f" {doc.get('stack')!r}, expected {STATE_FORMAT!r} of stack '{stack}'."
                " Pass the right --state FILE."
            )
        state = cls(path, stack, base64.b64decode(doc["encryption"]["salt"]))
        box = state.box
        box.open(doc["encryption"]["check"], f"state file {path}")
        for r in doc["resources"]:
            where = f"state file {path}, resource {r['name']}"
            engine.states[r["name"]] = ResourceState(
                name=r["name"],
                provider=r["provider"],
                id=r["id"],
                inputs=_open_tree(r["inputs"], box, where),
                outputs=_open_tree(r["outputs"], box, where),
                secret_outputs=tuple(r.get("secret_outputs", ())),
            )
            state.types[r["name"]] = r["type"]
            state.options[r["name"]] = Options(
                tuple(r.get("secret_outputs", ())),
                bool(r.get("protect")),
                bool(r.get("retain_on_delete")),
            )
        return state

    def save(self, engine: Engine) -> None:
        resources = []
        for name, st in engine.states.items():
            opts = self.options.get(name, Options())
            resources.append(
                {
                    "name": name,
                    "type": self.types.get(name, ""),
                    "id": st.id,
                    "protect": opts.protect,
                    "retain_on_delete": opts.retain_on_delete,
                    "secret_outputs": list(st.secret_outputs),
                    "inputs": _seal_tree(st.inputs, self.box),
                    "outputs": _seal_tree(st.outputs, self.box),
                    "provider": st.provider if isinstance(st.provider, str) else "",
                }
            )
        doc = {
            "format": STATE_FORMAT,
            "note": f"written by scripts/offline_stack.py: {NOT_THE_ENGINE}",
            "stack": self.stack,
            "encryption": {
                "kdf": f"pbkdf2-hmac-sha256/{KDF_ROUNDS}",
                "cipher": "hmac-sha256-ctr + hmac-sha256 (encrypt-then-mac)",
                "salt": base64.b64encode(self.salt).decode(),
                "check": self.box.seal("offline-stack"),
            },
            "resources": resources,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, self.path)


# ---- showing values without secrets ---------------------------------------------------------

SECRET_SHOWN = "[secret]"  # noqa: S105 (what is shown instead of a secret)
UNKNOWN_SHOWN = "output<unknown>"


def _short(value: Any, limit: int = 70) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_unknown(value: Any) -> bool:
    return isinstance(value, Unknown) or value == UNKNOWN


def _as_json_object(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str) and value.startswith("{"):
        with contextlib.suppress(ValueError):
            parsed = json.loads(value)
            if isinstance(parsed, dict):
                return parsed
    return None


def diff_lines(old: Any, new: Any, path: str = "") -> list[str]:
    """`pulumi preview --diff`-style lines for changed keys; secrets as [secret], never values."""
    if isinstance(old, Secret) or isinstance(new, Secret):
        if reveal(old) == reveal(new):
            return []
        return [f"~ {path}: {SECRET_SHOWN}"]
    if _is_unknown(new):
        return [f"~ {path}: {_short(old)} => {UNKNOWN_SHOWN}"]
    old_obj = old if isinstance(old, dict) else _as_json_object(old)
    new_obj = new if isinstance(new, dict) else _as_json_object(new)
    if old_obj is not None and new_obj is not None:
        lines: list[str] = []
        for key in sorted(set(old_obj) | set(new_obj)):
            sub = f"{path}.{key}" if path else key
            if key not in old_obj:
                shown = SECRET_SHOWN if isinstance(new_obj[key], Secret) else _short(new_obj[key])
                lines.append(f"+ {sub}: {shown}")
            elif key not in new_obj:
                lines.append(f"- {sub}")
            else:
                lines += diff_lines(old_obj[key], new_obj[key], sub)
        return lines
    if old == new:
        return []
    return [f"~ {path}: {_short(old)} => {_short(new)}"]


def show_output(value: Any, show_secrets: bool) -> Any:
    """An exported value made printable: secrets hidden (unless asked), unknowns marked."""
    if isinstance(value, Unknown):
        return UNKNOWN_SHOWN
    if rpc.is_rpc_secret(value):
        if not show_secrets:
            return SECRET_SHOWN
        return show_output(rpc.unwrap_rpc_secret(value), show_secrets)
    if isinstance(value, dict):
        return {k: show_output(v, show_secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [show_output(v, show_secrets) for v in value]
    if isinstance(value, float) and value.is_integer():  # protobuf numbers are all floats
        return int(value)
    return value


def print_outputs(
    outputs: Mapping[str, Any], show_secrets: bool, out: TextIO, *, only_known: bool = False
) -> None:
    shown = {k: show_output(v, show_secrets) for k, v in outputs.items()}
    if only_known:
        shown = {k: v for k, v in shown.items() if v != UNKNOWN_SHOWN}
    if not shown:
        return
    out.write("Outputs:\n")
    width = max(len(k) for k in shown)
    for key in sorted(shown):
        value = shown[key]
        if isinstance(value, str) and "\n" in value:
            body = "\n".join("        " + line for line in value.rstrip("\n").split("\n"))
            out.write(f"    {key}: |\n{body}\n")
        elif isinstance(value, dict | list):
            text = json.dumps(value, indent=2, sort_keys=True)
            out.write(f"    {key:<{width}}: " + text.replace("\n", "\n    ") + "\n")
        else:
            rendered = value if value in (SECRET_SHOWN, UNKNOWN_SHOWN) else json.dumps(value)
            out.write(f"    {key:<{width}}: {rendered}\n")


# ---- the run ---------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    type: str
    op: str  # create | update | replace | delete | same
    lines: list[str] = field(default_factory=list)  # changed keys
    replaces: list[str] = field(default_factory=list)
    seconds: float = 0.0


class StandInEngine(Engine):
    """The harness Engine, keeping the last Diff answer and refusing to replace a resource
    the program protects (as Pulumi does, in preview and up)."""

    def __init__(self, server: ProviderServer) -> None:
        super().__init__(server)
        self.protected: set[str] = set()  # names protected in the stored state
        self.last_diff: DiffOutcome | None = None

    def plan(
        self, name: str, provider: ProviderRef, inputs: Mapping[str, Any]
    ) -> tuple[str, DiffOutcome | None, dict[str, Any]]:
        self.last_diff = None
        step, diff, checked = super().plan(name, provider, inputs)
        self.last_diff = diff
        if step == "replace" and name in self.protected:
            keys = ", ".join(diff.replaces) if diff is not None else "?"
            raise OfflineStackError(
                f"resource '{name}' is protected and a change of {keys} would replace it."
                " Revert that change, or remove the protection (e.g. protectCaches) first."
            )
        return step, diff, checked


class StepMocks(pulumi.runtime.Mocks):
    """Mocks whose answers come from the real providers through the harness Engine.

    apply=False (preview): Check + Diff only; a resource that changes is answered with its
    checked inputs (its computed outputs stay unknown, as in a Pulumi preview).
    apply=True (up): the Engine's step is applied; the answer is the provider's real outputs.
    """

    def __init__(
        self, engine: StandInEngine, state: StackState, apply: bool, out: TextIO | None
    ) -> None:
        self.engine = engine
        self.state = state
        self.apply = apply
        self.out = out
        self.lock = threading.Lock()  # the SDK registers from executor threads
        self.steps: list[Step] = []
        self.request_options: dict[tuple[str, str], Options] = {}
        self.error: BaseException | None = None

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        if not args.custom:
            return None, {}
        try:
            return self._step(args)
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def _step(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        inputs = dict(args.inputs)
        blob = rpc.unwrap_rpc_secret(inputs.pop("__provider"))
        news = to_harness(inputs)
        opts = self.request_options.get((args.typ, args.name), Options())
        short_type = args.typ.removeprefix(DYNAMIC)
        with self.lock:
            old = self.engine.states.get(args.name)
            if any(s.name == args.name for s in self.steps):
                raise OfflineStackError(
                    f"two resources named '{args.name}': this stand-in keys its state by name"
                )
            t0 = time.perf_counter()
            if self.apply:
                op = self.engine.up(args.name, blob, news, secret_outputs=opts.secret_outputs)
                st = self.engine.states[args.name]
                self.state.types[args.name] = short_type
                self.state.options[args.name] = opts
                self.state.save(self.engine)
                result_id, outputs = st.id, st.outputs
                checked = st.inputs
                diff = self.engine.last_diff
                replaces = list(diff.replaces) if diff is not None and op == "replace" else []
            else:
                op, diff, checked = self.engine.plan(args.name, blob, news)
                replaces = list(diff.replaces) if diff is not None else []
                if op == "same":
                    assert old is not None
                    result_id, outputs = old.id, old.outputs
                else:  # what a preview hands the program: the checked inputs
                    result_id, outputs = (old.id if old and op == "update" else ""), checked
            step = Step(args.name, short_type, op, replaces=replaces)
            step.seconds = time.perf_counter() - t0
            if old is not None and op in ("update", "replace"):
                step.lines = diff_lines(old.inputs, checked)
            self.steps.append(step)
            if self.apply and self.out is not None:
                print_step(step, self.out, done=True)
            return result_id, to_program(outputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


def monitor_for(mocks: pulumi.runtime.Mocks) -> RecordingMonitor:
    """A RecordingMonitor that hands each custom resource's options to StepMocks first."""

    class OptionsMonitor(RecordingMonitor):
        def RegisterResource(self, request: Any) -> Any:
            if request.custom and isinstance(mocks, StepMocks):
                mocks.request_options[(request.type, request.name)] = Options(
                    tuple(request.additionalSecretOutputs),
                    bool(request.protect),
                    bool(request.retainOnDelete),
                )
            return super().RegisterResource(request)

    return OptionsMonitor(mocks)


def print_step(step: Step, out: TextIO, *, done: bool) -> None:
    word = (DONE_WORDS if done else {k: k for k in SYMBOLS})[step.op]
    suffix = f" [replace on: {', '.join(step.replaces)}]" if step.replaces else ""
    timing = f" ({step.seconds:.1f}s)" if done and step.op != "same" else ""
    out.write(f"  {SYMBOLS[step.op]} {step.type:<22} {step.name:<26} {word}{suffix}{timing}\n")
    for line in step.lines:
        out.write(f"        {line}\n")


def summary(steps: list[Step], done: bool) -> str:
    words = DONE_WORDS if done else PLAN_WORDS
    parts = []
    for op in ("create", "update", "replace", "delete"):
        n = sum(1 for s in steps if s.op == op)
        if n:
            parts.append(f"{SYMBOLS[op].strip()} {n} {words[op]}")
    same = sum(1 for s in steps if s.op == "same")
    if same:
        parts.append(f"{same} unchanged")
    return "Resources: " + (", ".join(parts) if parts else "no resources")


# ---- setup -----------------------------------------------------------------------------------


def resolve_server_url(stack: str, flag: str | None) -> str:
    raw = yaml.safe_load((PROJECT_ROOT / f"Pulumi.{stack}.yaml").read_text()) or {}
    url = (
        flag
        or os.environ.get("MODAL_SERVER_URL")
        or (raw.get("config") or {}).get("modal:serverUrl")
    )
    if not url:
        raise OfflineStackError(
            f"stack '{stack}': no emulator URL. Pass --server-url http://127.0.0.1:PORT or"
            " export MODAL_SERVER_URL (start one with: .venv/bin/python -m emulator serve"
            " --port 8790)."
        )
    host = urlparse(url).hostname or ""
    loopback = host == "localhost"
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    if not loopback:
        raise OfflineStackError(
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
        raise OfflineStackError(
            f"no Modal emulator answers at {url} ({exc}). Start one: .venv/bin/python -m"
            f" emulator serve --port {port} --state .modal-emulator/state.sqlite3"
        ) from None


def secure_keys(stack: str) -> list[str]:
    raw = yaml.safe_load((PROJECT_ROOT / f"Pulumi.{stack}.yaml").read_text()) or {}
    return [
        k
        for k, v in (raw.get("config") or {}).items()
        if isinstance(v, dict) and set(v) == {"secure"}
    ]


@contextlib.contextmanager
def provider_server(
    stack: str, url: str, config: Mapping[str, str], secret_keys: list[str]
) -> Iterator[ProviderServer]:
    env = {k: v for k, v in os.environ.items() if k not in ("MODAL_ENVIRONMENT", "MODAL_PROFILE")}
    env["MODAL_SERVER_URL"] = url
    env.setdefault("MODAL_TOKEN_ID", "ak-local-emulator")  # the emulator accepts any token
    env.setdefault("MODAL_TOKEN_SECRET", "as-local-emulator")
    server_config = {k: Secret(v) if k in secret_keys else v for k, v in config.items()}
    server = ProviderServer(env=env, config=server_config, project=PROJECT, stack=stack)
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


def explain(exc: BaseException) -> str:
    """An operator-facing message for a failure (provider tracebacks cut to their end)."""
    if isinstance(exc, CheckFailed):
        name = str(exc).removeprefix("check failed for ").split(":", 1)[0]
        reasons = "; ".join(f"{prop}: {why}" for prop, why in exc.failures)
        return f"resource '{name}': the provider's Check refused the inputs: {reasons}"
    if isinstance(exc, ProviderCallError):
        tail = [ln for ln in exc.details.strip().splitlines() if ln.strip()][-6:]
        return f"provider {exc.method} failed ({exc.code.name}):\n  " + "\n  ".join(tail)
    return str(exc) or type(exc).__name__


# ---- commands --------------------------------------------------------------------------------


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`--config KEY=VALUE` pairs -> {"namespace:key": value}; bare keys get `modal-llm:`."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise OfflineStackError(f"--config {pair!r}: expected KEY=VALUE")
        overrides[key if ":" in key else f"{PROJECT}:{key}"] = value
    return overrides


def run_stack(
    command: str,
    stack: str,
    state_path: Path,
    url: str,
    show_secrets: bool,
    out: TextIO,
    overrides: Mapping[str, str] | None = None,
) -> int:
    config, secret_keys = stack_config(stack, {**(overrides or {}), "modal:serverUrl": url})
    with provider_server(stack, url, config, secret_keys) as server:
        engine = StandInEngine(server)
        state = StackState.load(state_path, stack, engine)
        engine.protected = {name for name, opts in state.options.items() if opts.protect}
        if command == "destroy":
            return destroy(engine, state, out)
        apply = command == "up"
        mocks = StepMocks(engine, state, apply=apply, out=out)
        verb = "Updating" if apply else "Previewing update of"
        out.write(f"{verb} stack '{stack}': {NOT_THE_ENGINE}\n")
        out.write(f"  emulator: {url}   state: {shown_path(state_path)}\n\n")
        try:
            run: ProgramRun | None = run_program(
                stack,
                config,
                secret_keys,
                mocks=mocks,
                preview=not apply,
                monitor_factory=monitor_for,
            )
        except BaseException as exc:  # the program or a provider failed
            if apply:
                state.save(engine)
            cause = mocks.error or exc
            # The program's pending registrations die with it: keep asyncio's noise out.
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            out.write(f"\nerror: {explain(cause)}\n")
            if apply:
                out.write("The state file keeps what was applied before the failure.\n")
            return 1
        assert run is not None
        registered = {s.name for s in mocks.steps}
        gone = [n for n in reversed(list(engine.states)) if n not in registered]
        for name in gone:
            step = Step(name, state.types.get(name, "?"), "delete")
            if apply:
                t0 = time.perf_counter()
                try:
                    delete_one(engine, state, name)
                except (OfflineStackError, ProviderCallError) as exc:
                    out.write(f"\nerror: deleting '{name}': {explain(exc)}\n")
                    out.write("The state file keeps every resource not deleted yet.\n")
                    return 1
                step.seconds = time.perf_counter() - t0
            mocks.steps.append(step)
            if apply:
                print_step(step, out, done=True)
        if not apply:
            for step in mocks.steps:
                print_step(step, out, done=False)
        out.write("\n")
        print_outputs(run.outputs, show_secrets, out, only_known=False)
        out.write("\n" + summary(mocks.steps, done=apply) + "\n")
        if apply:
            state.save(engine)
    return 0


def delete_one(engine: Engine, state: StackState, name: str) -> None:
    opts = state.options.get(name, Options())
    if opts.protect:
        raise OfflineStackError(
            f"resource '{name}' ({state.types.get(name)}) is protected (protect=True): not"
            " deleted. Remove the protection in the program's config (e.g. protectCaches)"
            " first, run up, then retry."
        )
    if opts.retain_on_delete:
        del engine.states[name]  # retainOnDelete: leave it in Modal, forget it
    else:
        engine.destroy(name)
    state.save(engine)


def destroy(engine: Engine, state: StackState, out: TextIO) -> int:
    out.write(f"Destroying stack '{state.stack}': {NOT_THE_ENGINE}\n\n")
    protected = [n for n in engine.states if state.options.get(n, Options()).protect]
    if protected:
        out.write(
            f"error: protected resources ({', '.join(protected)}): nothing deleted. Remove the"
            " protection in the program's config (e.g. protectCaches: false), run up, then"
            " destroy.\n"
        )
        return 1
    steps: list[Step] = []
    for name in reversed(list(engine.states)):
        t0 = time.perf_counter()
        try:
            delete_one(engine, state, name)
        except (OfflineStackError, ProviderCallError) as exc:
            out.write(f"\nerror: deleting '{name}': {explain(exc)}\n")
            out.write("The state file keeps every resource not deleted yet; fix it and rerun.\n")
            return 1
        step = Step(name, state.types.get(name, "?"), "delete", seconds=time.perf_counter() - t0)
        print_step(step, out, done=True)
        steps.append(step)
    if state.path.exists():
        state.save(engine)
    out.write("\n" + summary(steps, done=True) + "\n")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="offline_stack.py",
        description=(
            "Offline stand-in for `pulumi preview --diff` / `pulumi up` / `pulumi destroy`"
            " against the Modal emulator. NOT the Pulumi engine: it is built from the"
            " project's test harness (program under mocks + the SDK's dynamic-provider"
            " server), for machines without the Pulumi CLI. Deploy to real Modal with the CLI."
        ),
        epilog=(
            "State: .pulumi-offline/<stack>.json, secrets encrypted with OFFLINE_STACK_PASSPHRASE"
            " / PULUMI_CONFIG_PASSPHRASE (local stack default: local-emulator)."
        ),
    )
    parser.add_argument("command", choices=["preview", "up", "destroy"])
    parser.add_argument("--stack", default="local", help="stack name (Pulumi.<stack>.yaml)")
    parser.add_argument(
        "--state", type=Path, help="state file (default: .pulumi-offline/<stack>.json)"
    )
    parser.add_argument(
        "--server-url",
        help="emulator URL (default: env MODAL_SERVER_URL, else the stack's modal:serverUrl)",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "override one config value for this run only (never saved; objects/lists as JSON),"
            ' e.g. --config \'modal-llm:apiKeyRotation={"gateway": "2026-12-01"}\''
        ),
    )
    parser.add_argument(
        "--show-secrets", action="store_true", help="print secret outputs in clear (up/preview)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = parse_args(argv)
    stack_file = PROJECT_ROOT / f"Pulumi.{args.stack}.yaml"
    try:
        if not stack_file.exists():
            raise OfflineStackError(f"no stack file {stack_file.name} in {PROJECT_ROOT}")
        state_path = args.state or PROJECT_ROOT / ".pulumi-offline" / f"{args.stack}.json"
        url = resolve_server_url(args.stack, args.server_url)
        encrypted = secure_keys(args.stack)
        if encrypted and args.command == "up":
            raise OfflineStackError(
                f"stack '{args.stack}' has encrypted config ({', '.join(encrypted)}) that this"
                " stand-in cannot decrypt; it would deploy placeholder values. Use the Pulumi"
                " CLI for this stack."
            )
        if encrypted:
            out.write(
                f"note: encrypted config ({', '.join(encrypted)}) replaced by placeholder"
                " values for this preview\n"
            )
        if args.command != "preview":
            require_emulator(url)
        overrides = parse_overrides(args.config)
        return run_stack(
            args.command, args.stack, state_path, url, args.show_secrets, out, overrides
        )
    except OfflineStackError as exc:
        out.write(f"error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
