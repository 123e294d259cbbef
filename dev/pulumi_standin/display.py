"""What a plan or an apply prints: steps, changed keys, outputs; never a secret value.

Step lines and the provider's progress lines (`print_progress`, written from the provider
server's reader thread while a call runs) go out whole, one write each, and are flushed at
once, so a pipe (`make up | tee`, a test reading the stand-in's stdout) sees them as they come.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from pulumi.output import Unknown
from pulumi.runtime import rpc

from pulumi_standin.values import UNKNOWN, Secret, reveal

SYMBOLS = {
    "create": "+ ",
    "update": "~ ",
    "replace": "+-",
    "delete": "- ",
    "same": "  ",
    "skip": "  ",
    "refresh": "~ ",
}
PLAN_WORDS = {
    "create": "to create",
    "update": "to update",
    "replace": "to replace",
    "delete": "to delete",
    "same": "unchanged",
    "skip": "not targeted",
    "refresh": "to refresh",
}
DONE_WORDS = {
    "create": "created",
    "update": "updated",
    "replace": "replaced",
    "delete": "deleted",
    "same": "unchanged",
    "skip": "not targeted",
    "refresh": "refreshed",  # a refresh's Read changed what the state holds (drift)
}


@dataclass
class Step:
    name: str
    type: str
    op: str  # create | update | replace | delete | same | skip | refresh
    lines: list[str] = field(default_factory=list)  # changed keys
    replaces: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""


#: In-flight provider calls, as a progress line names them.
CALL_VERBS = {
    "Create": "creating",
    "Update": "updating",
    "Delete": "deleting",
    "Read": "reading",
    "Check": "checking",
    "Diff": "diffing",
}
CALL_SYMBOLS = {"Create": "+ ", "Update": "~ ", "Delete": "- ", "Read": "~ "}
DYNAMIC_PREFIX = "pulumi-python:dynamic/"
_WRITE = threading.Lock()


def emit(out: TextIO, text: str) -> None:
    """Write `text` in one piece and flush it (lines from two threads never interleave)."""
    with _WRITE:
        out.write(text)
        with contextlib.suppress(AttributeError, ValueError, OSError):
            out.flush()


def print_progress(method: str, type_: str, name: str, text: str, out: TextIO) -> None:
    """One line the provider printed while `method` ran for resource `name`, in the step
    table's columns: `  ~  modal:App   tiny-app   updating | info: App ...`. Without a call
    (`name` empty) it is the provider's own: `  .. provider | <line>`."""
    if not name:
        emit(out, f"  .. provider | {text}\n")
        return
    short = type_.removeprefix(DYNAMIC_PREFIX) or "?"
    symbol = CALL_SYMBOLS.get(method, "  ")
    verb = CALL_VERBS.get(method, method.lower())
    emit(out, f"  {symbol} {short:<22} {name:<26} {verb} | {text}\n")


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


def print_step(step: Step, out: TextIO, *, done: bool) -> None:
    word = (DONE_WORDS if done else {k: k for k in SYMBOLS})[step.op]
    suffix = f" [replace on: {', '.join(step.replaces)}]" if step.replaces else ""
    timing = f" ({step.seconds:.1f}s)" if done and step.op not in ("same", "skip") else ""
    note = f" {step.note}" if step.note else ""
    text = f"  {SYMBOLS[step.op]} {step.type:<22} {step.name:<26} {word}{suffix}{timing}{note}\n"
    text += "".join(f"        {line}\n" for line in step.lines)
    emit(out, text)


def summary(steps: list[Step], done: bool) -> str:
    words = DONE_WORDS if done else PLAN_WORDS
    parts = []
    for op in ("create", "update", "replace", "delete", "refresh"):
        n = sum(1 for s in steps if s.op == op)
        if n:
            parts.append(f"{SYMBOLS[op].strip()} {n} {words[op]}")
    same = sum(1 for s in steps if s.op == "same")
    if same:
        parts.append(f"{same} unchanged")
    skipped = sum(1 for s in steps if s.op == "skip")
    if skipped:
        parts.append(f"{skipped} not targeted")
    return "Resources: " + (", ".join(parts) if parts else "no resources")
