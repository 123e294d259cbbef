"""Values as the engine holds them: `Secret` wrappers, the preview `UNKNOWN`, wire conversion.

The program side uses the SDK's rpc secret envelopes and `pulumi.output.Unknown`; the provider
side (gRPC) strips secrets because the SDK's dynamic-provider server answers
`acceptSecrets=False` to Configure (pulumi/dynamic/__main__.py, SDK 3.272.0), so the engine
sends it plain values and re-marks outputs itself. `to_harness` / `to_program` convert between
the two sides.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict
from pulumi.output import Unknown
from pulumi.runtime import rpc

UNKNOWN = rpc.UNKNOWN
PROVIDER_KEY = "__provider"

_SIG = rpc._special_sig_key
_SECRET_SIG = rpc._special_secret_sig


@dataclass(frozen=True)
class Secret:
    """A value the program marked secret (`pulumi.Output.secret`)."""

    value: Any

    def __repr__(self) -> str:
        return "Secret(<redacted>)"


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


def stored_form(value: Any) -> Any:
    """How the engine persists a value: secrets become opaque ciphertext."""
    if isinstance(value, Secret):
        return {"ciphertext": "<encrypted>"}
    if isinstance(value, Mapping):
        return {k: stored_form(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [stored_form(v) for v in value]
    return value


def to_struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({k: wire(v) for k, v in props.items() if v is not None})
    return s


def wire(value: Any) -> Any:
    if isinstance(value, Secret):  # only used for Configure (acceptSecrets=True there)
        return {_SIG: _SECRET_SIG, "value": wire(value.value)}
    if isinstance(value, Mapping):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [wire(v) for v in value]
    return value


def from_wire(value: Any) -> Any:
    """Struct JSON → Python, turning wire secrets into Secret (engine: KeepSecrets=true)."""
    if isinstance(value, dict):
        if value.get(_SIG) == _SECRET_SIG:
            return Secret(from_wire(value.get("value")))
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


def _pb_value(v: Any) -> Any:
    if isinstance(v, struct_pb2.Struct):
        return {k: _pb_value(x) for k, x in v.items()}
    if isinstance(v, struct_pb2.ListValue):
        return [_pb_value(x) for x in v]
    return v


def struct_to_py(s: struct_pb2.Struct) -> dict[str, Any]:
    try:
        raw = MessageToDict(s)
    except ValueError:  # NaN/inf have no JSON form; walk the Struct instead
        raw = _pb_value(s)
    out = from_wire(raw)
    assert isinstance(out, dict)
    return out


def redact_wire_secrets(value: Any) -> Any:
    """JSON of a response with every wire secret replaced (the engine encrypts those)."""
    if isinstance(value, dict):
        if value.get(_SIG) == _SECRET_SIG:
            return {"ciphertext": "<encrypted>"}
        return {k: redact_wire_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_wire_secrets(v) for v in value]
    return value


def to_harness(value: Any) -> Any:
    """Program-side values (rpc secret envelopes, Unknown) -> engine-side values."""
    if isinstance(value, Unknown):
        return UNKNOWN
    if rpc.is_rpc_secret(value):
        return Secret(to_harness(rpc.unwrap_rpc_secret(value)))
    if isinstance(value, dict):
        return {k: to_harness(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_harness(v) for v in value]
    return value


def to_program(value: Any) -> Any:
    """Engine-side values -> what the engine hands the program (secrets re-marked)."""
    if isinstance(value, Secret):
        return rpc.wrap_rpc_secret(reveal(value.value))
    if isinstance(value, dict):
        return {k: to_program(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_program(v) for v in value]
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
