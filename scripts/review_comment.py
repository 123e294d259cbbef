"""The review stack's pull-request comment: a pure function from inputs to Markdown.

`render(ReviewComment(...))` takes
- `preview`: the `pulumi preview --json` document of the PR's code against the dev stack, as the
  real CLI prints it (pulumi/pulumi pkg/backend/display/json.go `ShowPreviewDigest`) or as
  `python -m pulumi_standin preview --json` prints it (the same shape,
  dev/pulumi_standin/preview_json.py);
- `dev_outputs`: dev's current stack outputs (`pulumi stack output --json --stack dev`; secret
  ones read `[secret]`): the OLD costs `monthly_cost_idle_usd`, `monthly_cost_worst_usd` and
  `services`. Without them, the old outputs the preview document carries (its root Stack
  step's `oldState.outputs`) are used;
- `new_costs`: the same three figures for the PR's code (`scripts/review_stack.py costs`, the
  PR's own cost model on the PR's Pulumi.dev.yaml). They cannot come from the preview document:
  `pulumi preview --json` has no new stack outputs (json.go ignores ResourceOutputsEvent);
- `review_outputs`: the review stack's non-secret outputs (`endpoint_url`, `proxy_token_id`,
  `served_model_name`, `environment`, `monthly_budget_usd`, `services`);
- how to read the review stack's secrets (`OutputReader`): the curl the comment shows reads the
  proxy token secret and the API key with `pulumi stack output ... --show-secrets` (or the
  stand-in's `output` command) into a private header file; no secret is ever in the comment.

and writes Markdown: the endpoint and that curl, the diff against dev per resource (op and
changed keys; short non-secret values shown old -> new, `[secret]` stays `[secret]`), the monthly
cost delta (idle and worst case, dev now -> with this PR, and the difference, in total and per
service), and one `⚠️` line per replace or delete of a protected or retainOnDelete resource
(from the steps' old/new state, and from a preview that the engine stopped on a protected
resource). The first line is `MARKER`, which the workflow looks for to update its ONE comment.

`render` does no I/O. `from_files` (and `python scripts/review_comment.py`, stdlib only, what
the workflow's comment job runs from the base branch) reads the files `scripts/review_stack.py`
writes (FILES) and calls it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import shlex
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

MARKER = "<!-- modal-llm-review-stack -->"
SECRET = "[secret]"  # noqa: S105 (what the engine shows instead of a secret)
UNKNOWN_PLACEHOLDER = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
ROOT_STACK_TYPE = "pulumi:pulumi:Stack"
DYNAMIC_PREFIX = "pulumi-python:dynamic/"
HIDDEN_KEYS = {"__provider"}
#: Step ops that remove or swap out the old object (json.go shows `replace`; with
#: --show-replacement-steps the engine's halves appear instead).
REPLACING_OPS = {"replace", "create-replacement", "delete-replaced"}
DELETING_OPS = {"delete", "delete-replaced", "discard", "discard-replaced"}
OP_SYMBOLS = {
    "create": "+",
    "update": "~",
    "replace": "+-",
    "create-replacement": "++",
    "delete-replaced": "--",
    "delete": "-",
    "same": " ",
    "read": ">",
    "import": "=",
}
#: What `scripts/review_stack.py` writes (plan: preview, dev outputs, costs; up: outputs, meta).
FILES = {
    "preview": "preview.json",
    "dev_outputs": "dev-outputs.json",
    "costs": "costs.json",
    "outputs": "review-outputs.json",
    "meta": "review.json",
    "comment": "comment.md",
}
MAX_CHANGED_KEYS = 12
MAX_SHOWN_VALUE = 40


# ---- PR-controlled values: inert Markdown ---------------------------------------------------
#
# Every file this module renders comes from a job that ran the PR's code (`plan`, `deploy`), so
# every value in them (endpoint, names, the preview's resources, keys, values and errors, the
# costs, the meta file) is the PR author's. None may reach the comment as Markdown or HTML: a
# value with a shape (a URL, a name, a commit, a time, a number) is checked against it and left
# out (or the curl refused) when it does not match; anything else is shown with `text()`, which
# makes every character literal. So no value can end a code fence or a table row, open an HTML
# comment or element, a link, a heading, or add a second marker line.

#: What may be shown in a code span as is: no backtick, pipe, `<`, whitespace or control char.
_CODE_SAFE = re.compile(r"[A-Za-z0-9._:/@=+,~%#-]{1,200}")
#: Strict shapes of the values the curl and the headings use.
SHAPES: dict[str, re.Pattern[str]] = {
    # http(s), a host, an optional port and a plain path: no whitespace, control character,
    # quote, backtick, `<`, `>`, `|`, query or fragment.
    "endpoint_url": re.compile(
        r"https?://[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(?::[0-9]{1,5})?"
        r"(?:/[A-Za-z0-9._~%/-]*)?"
    ),
    "proxy_token_id": re.compile(r"wk-[A-Za-z0-9]{1,64}"),
    "served_model_name": re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}"),
    "key_name": re.compile(r"[a-z0-9][a-z0-9_-]{0,63}"),
    "name": re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"),  # stack, environment
    "state": re.compile(r"/?[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*"),  # stand-in state file
    "head_sha": re.compile(r"[0-9a-f]{7,40}"),
    "updated_at": re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"),
}
#: The ASCII punctuation `text()` escapes: all of it but `"`, `'` and `,`, which start no
#: Markdown construct outside a link (and `[`, `(`, `<` are escaped, so there is no link).
_MD_PUNCT = frozenset("!#$%()*+-./:;=?@[\\]^_`{|}~")
#: What may be shown as plain text as is: a GPU (`A100-80GB`, `H100:2`), a resource type
#: (`modal:Volume`): letters, digits, `:`, `+`, `-`; no `_`, `*`, `.`, `/` (emphasis, links).
_PLAIN_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:+-]{0,79}")
_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def shaped(value: Any, shape: str) -> str | None:
    """`value` when it is a string of the strict shape `shape` (SHAPES), else None."""
    if isinstance(value, str) and SHAPES[shape].fullmatch(value):
        return value
    return None


def text(value: Any) -> str:
    """Any value as inert Markdown text: every ASCII punctuation character backslash-escaped
    (CommonMark: any ASCII punctuation may be; `\\|` is also GFM's escape of a pipe in a
    table cell), `<`, `>` and `&` as entities, and every control, format or line-separator
    character (newline, bidi overrides) written as `\\uXXXX`. The reader sees the characters;
    nothing in them is Markdown or HTML, and a URL in it is not linked (`:` and `.` escaped)."""
    raw = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    out = []
    for ch in raw:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(f"\\u{ord(ch):04x}")
        elif ch in _HTML:
            out.append(_HTML[ch])
        elif ch == "@":  # GitHub would mention `@someone` even escaped: a word joiner after it
            out.append("\\@\u2060")
        elif ch in _MD_PUNCT:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def plain(value: Any) -> str:
    """Plain text when the value is a word of `_PLAIN_SAFE` (a GPU, a type), else `text()`."""
    if isinstance(value, str) and _PLAIN_SAFE.fullmatch(value):
        return value
    return text(value)


def code(value: Any) -> str:
    """A code span when the value is plainly safe in one (`_CODE_SAFE`), else `text()`."""
    if isinstance(value, str) and _CODE_SAFE.fullmatch(value):
        return f"`{value}`"
    return text(value)


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fenced(info: str, lines: Sequence[str]) -> list[str]:
    """A fenced code block whose fence is longer than any backtick run in it (CommonMark: a
    fence closes only on a run at least as long). The lines are ours, built from shape-checked
    values; a line break inside one is refused rather than rendered."""
    if any(c in line for line in lines for c in "\r\n"):
        raise ValueError("a line of the code block holds a line break")
    runs = [len(m) for line in lines for m in re.findall(r"`+", line)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [fence + info, *lines, fence]


@dataclass(frozen=True)
class OutputReader:
    """How a reader of the comment gets the review stack's outputs.

    kind `cli`: `pulumi stack output NAME --stack STACK --show-secrets` (with the review stacks'
    backend selected, e.g. `pulumi login` to it); kind `standin`: the Pulumi stand-in's
    `output` command on its state file (emulator runs only)."""

    kind: str  # "cli" | "standin"
    stack: str
    state: str = ""  # stand-in: its state file
    python: str = ".venv/bin/python"

    def command(self, name: str, *, as_json: bool = False) -> str:
        if self.kind == "standin":
            parts = [self.python, "-m", "pulumi_standin", "output", name, "--stack", self.stack]
            if self.state:
                parts += ["--state", self.state]
            return shlex.join([*parts, "--show-secrets"])
        parts = ["pulumi", "stack", "output", name, "--stack", self.stack, "--show-secrets"]
        return shlex.join([*parts, "--json"] if as_json else parts)


@dataclass
class ReviewComment:
    """Everything the comment shows (see the module docstring)."""

    pr: int
    stack: str
    preview: Mapping[str, Any] | None
    new_costs: Mapping[str, Any]
    review_outputs: Mapping[str, Any]
    reader: OutputReader
    dev_outputs: Mapping[str, Any] | None = None
    base_stack: str = "dev"
    head_sha: str = ""
    engine_note: str = ""
    key_name: str = "gateway"
    spend_limit_usd: float | None = None
    sweep_days: int | None = None
    updated_at: str = ""
    notes: list[str] = field(default_factory=list)


# ---- reading the preview document ----------------------------------------------------------


def short_type(type_: str) -> str:
    return type_.removeprefix(DYNAMIC_PREFIX)


def resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if "::" in urn else urn


def _as_object(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        if isinstance(parsed, dict):
            return parsed
    return None


def _shown(value: Any) -> str:
    if value == UNKNOWN_PLACEHOLDER:
        return "(known after apply)"
    if value == SECRET:
        return SECRET
    shown = json.dumps(value, sort_keys=True)
    return text(shown) if len(shown) <= MAX_SHOWN_VALUE else ""


def changed_keys(old: Any, new: Any, path: str = "") -> list[tuple[str, str]]:
    """(dotted key, "old -> new" or "") for every leaf that differs. Objects and JSON-object
    strings are walked; a value is shown only when short and not secret on either side, as
    inert Markdown (`text()`: the values are the PR's)."""
    if old == new:
        return []
    old_obj, new_obj = _as_object(old), _as_object(new)
    if old_obj is not None and new_obj is not None and old != SECRET and new != SECRET:
        found: list[tuple[str, str]] = []
        for key in sorted(set(old_obj) | set(new_obj)):
            if not path and key in HIDDEN_KEYS:
                continue
            sub = f"{path}.{key}" if path else key
            if key not in old_obj:
                found.append((sub, "added"))
            elif key not in new_obj:
                found.append((sub, "removed"))
            else:
                found += changed_keys(old_obj[key], new_obj[key], sub)
        return found
    if SECRET in (old, new):
        return [(path, SECRET)]
    before, after = _shown(old), _shown(new)
    return [(path, f"{before} → {after}" if before and after else "")]


def _has_secret(*values: Any) -> bool:
    for value in values:
        if value == SECRET:
            return True
        if isinstance(value, dict):
            if any(_has_secret(v) for k, v in value.items() if k not in HIDDEN_KEYS):
                return True
        elif isinstance(value, list) and any(_has_secret(v) for v in value):
            return True
    return False


@dataclass
class StepView:
    name: str
    type: str
    op: str
    changes: list[tuple[str, str]]
    replace_reasons: list[str]
    #: protect / retainOnDelete of the state the step starts from, and of the new one.
    old_protect: bool
    new_protect: bool
    old_retain: bool

    @property
    def protect(self) -> bool:
        return self.old_protect or self.new_protect


def steps_of(preview: Mapping[str, Any]) -> list[StepView]:
    """The custom resources' steps of a preview document (the root Stack and components,
    which have no inputs of their own, are left out)."""
    views = []
    for step in preview.get("steps") or []:
        old = step.get("oldState") or {}
        new = step.get("newState") or {}
        type_ = str(new.get("type") or old.get("type") or "")
        if type_ == ROOT_STACK_TYPE or not (new.get("custom") or old.get("custom")):
            continue
        op = str(step.get("op") or "")
        changes: list[tuple[str, str]] = []
        if op in ("update", "replace") and old and new:
            changes = changed_keys(old.get("inputs") or {}, new.get("inputs") or {})
        reasons = [str(k) for k in step.get("diffReasons") or []]
        known = {c[0].split(".")[0] for c in changes}
        old_inputs, new_inputs = old.get("inputs") or {}, new.get("inputs") or {}
        for key in reasons:
            if key not in known and key not in HIDDEN_KEYS:
                secret = SECRET in (old_inputs.get(key), new_inputs.get(key))
                changes.append((key, SECRET if secret else ""))
        if op == "update" and not changes and _has_secret(new_inputs, old_inputs):
            # No changed keys from the engine (dynamic providers give none) and nothing
            # visible differs: what changed is behind [secret].
            changes.append(("(secret values)", ""))
        views.append(
            StepView(
                name=resource_name(str(step.get("urn") or "")),
                type=short_type(type_),
                op=op,
                changes=changes,
                replace_reasons=[str(k) for k in step.get("replaceReasons") or []],
                old_protect=bool(old.get("protect")),
                new_protect=bool(new.get("protect")),
                old_retain=bool(old.get("retainOnDelete")),
            )
        )
    return views


_PROTECT_ERROR = re.compile(
    r'unable to (?P<what>replace|delete) resource "(?P<urn>[^"]+)"\s*as it is currently marked'
    r" for protection"
)


def warnings_of(preview: Mapping[str, Any]) -> list[str]:
    """One `⚠️` line per replace/delete of a protected or retainOnDelete resource. What
    happens follows the engine: a replace or delete is refused while the resource is protected
    in the state AND in the program (step_generator.go; unprotecting and replacing in one run
    is allowed), and the old object of a retainOnDelete resource is dropped from the state
    without a provider Delete (step.go DeleteStep.Apply): it stays in Modal, unmanaged."""
    lines = []
    for view in steps_of(preview):
        replacing, deleting = view.op in REPLACING_OPS, view.op in DELETING_OPS
        if not (replacing or deleting) or not (view.protect or view.old_retain):
            continue
        what = "replaced" if replacing else "deleted"
        why = (
            f" (replace on: {', '.join(plain(r) for r in view.replace_reasons)})"
            if view.replace_reasons
            else ""
        )
        effects = []
        if view.old_protect and (view.new_protect or deleting):
            effects.append(
                f"it is **protected**: `pulumi up` of {{stack}} refuses to {what[:-1]} it"
            )
        elif view.old_protect:
            effects.append("this PR removes its **protection** in the same run")
        if view.old_retain:
            effects.append(
                "it is **retainOnDelete**: the old object is dropped from the stack but NOT"
                " deleted in Modal (it stays there, unmanaged, with its data)"
                if replacing
                else "it is **retainOnDelete**: it leaves the stack but is NOT deleted in"
                " Modal (it stays there, unmanaged)"
            )
        elif not (view.old_protect and view.new_protect):
            effects.append("the old object and its data are deleted")
        lines.append(
            f"⚠️ {code(view.name)} ({plain(view.type)}) would be **{what}**{why}:"
            f" {'; '.join(effects)}."
        )
    for diag in preview.get("diagnostics") or []:
        if str(diag.get("severity")) != "error":
            continue
        found = _PROTECT_ERROR.search(" ".join(str(diag.get("message") or "").split()))
        if found:
            urn = found["urn"]
            parts = urn.split("::")
            type_ = parts[-2].split("$")[-1] if len(parts) >= 2 else "?"
            lines.append(
                f"⚠️ {code(resource_name(urn))}"
                f" ({plain(short_type(type_))})"
                f" would be **{found['what']}d**, but it is **protected**: the preview stopped"
                " there (`pulumi up` of {stack} would fail)."
            )
    return lines


def old_outputs_of(preview: Mapping[str, Any]) -> dict[str, Any]:
    """The dev stack's outputs as the preview document carries them (root Stack oldState)."""
    for step in preview.get("steps") or []:
        old = step.get("oldState") or {}
        if old.get("type") == ROOT_STACK_TYPE:
            return dict(old.get("outputs") or {})
    return {}


def errors_of(preview: Mapping[str, Any]) -> list[str]:
    return [
        " ".join(str(d.get("message") or "").split())
        for d in preview.get("diagnostics") or []
        if str(d.get("severity")) == "error"
    ]


# ---- formatting ---------------------------------------------------------------------------


def money(value: Any) -> str:
    amount = number(value)
    return "n/a" if amount is None else f"${amount:,.2f}"


def delta(old: Any, new: Any) -> str:
    before, after = number(old), number(new)
    if before is None or after is None:
        return "n/a"
    diff = round(after - before, 2)
    if diff == 0:
        return "±$0.00"
    return f"{'+' if diff > 0 else '-'}${abs(diff):,.2f}"


def _cost(outputs: Mapping[str, Any] | None, key: str) -> Any:
    return (outputs or {}).get(key)


def _services(outputs: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    services = (outputs or {}).get("services")
    if not isinstance(services, dict):
        return {}
    return {str(k): v for k, v in services.items() if isinstance(v, dict)}


def _gpu(service: Mapping[str, Any] | None) -> str:
    if not service:
        return "—"
    gpu = plain(service.get("gpu") or "?")
    count = service.get("gpu_count") or 1
    return f"{text(count)} x {gpu}" if count != 1 else gpu


def cost_section(old: Mapping[str, Any] | None, new: Mapping[str, Any], base: str) -> list[str]:
    idle_old, idle_new = _cost(old, "monthly_cost_idle_usd"), _cost(new, "monthly_cost_idle_usd")
    worst_old = _cost(old, "monthly_cost_worst_usd")
    worst_new = _cost(new, "monthly_cost_worst_usd")
    lines = [
        f"### Monthly cost: `{base}` now → with this PR",
        "",
        "| | idle / month | worst case / month |",
        "|---|---:|---:|",
        f"| `{base}` now | {money(idle_old)} | {money(worst_old)} |",
        f"| with this PR | {money(idle_new)} | {money(worst_new)} |",
        f"| **difference** | **{delta(idle_old, idle_new)}** | **{delta(worst_old, worst_new)}** |",
        "",
    ]
    old_services, new_services = _services(old), _services(new)
    names = sorted(set(old_services) | set(new_services))
    if names:
        lines += [
            "| service | GPU | idle old → new | worst case old → new |",
            "|---|---|---:|---:|",
        ]
        for name in names:
            o, n = old_services.get(name), new_services.get(name)
            gpu_old, gpu_new = _gpu(o), _gpu(n)
            gpu = gpu_new if gpu_old == gpu_new else f"{gpu_old} → {gpu_new}"
            idle = (
                f"{money(_cost(o, 'monthly_cost_idle_usd'))} → "
                f"{money(_cost(n, 'monthly_cost_idle_usd'))}"
            )
            worst = (
                f"{money(_cost(o, 'monthly_cost_worst_usd'))} → "
                f"{money(_cost(n, 'monthly_cost_worst_usd'))}"
            )
            lines.append(f"| {code(name)} | {gpu} | {idle} | {worst} |")
        lines.append("")
    lines.append(
        "_idle: `min_containers` kept warm all month (+ pre-warm windows); worst case: every"
        " allowed container busy all month (components/cost.py: GPU, CPU and memory at Modal's"
        " rates, + `costOverheadPct` where a stack sets one)._"
    )
    return lines


def _summary_line(preview: Mapping[str, Any]) -> str:
    summary = preview.get("changeSummary") or {}
    words = {
        "create": "to create",
        "update": "to update",
        "replace": "to replace",
        "delete": "to delete",
        "same": "unchanged",
    }
    parts = [
        f"{OP_SYMBOLS.get(op, '').strip()} {int(summary[op])} {word}".strip()
        for op, word in words.items()
        if isinstance(summary.get(op), int)
        and not isinstance(summary.get(op), bool)
        and summary[op] > 0
    ]
    return ", ".join(parts) or "no resources"


def diff_section(preview: Mapping[str, Any] | None, base: str) -> list[str]:
    lines = [f"### Diff against `{base}`", ""]
    if preview is None:
        return [*lines, f"_No preview of `{base}` was made for this run._"]
    lines.append(
        f"`pulumi preview --stack {base}` with this PR's code: {_summary_line(preview)}"
        " (counts include component resources and the stack itself)."
    )
    lines.append("")
    changed = [v for v in steps_of(preview) if v.op not in ("same", "read")]
    if changed:
        lines += ["| | resource | type | what changes |", "|---|---|---|---|"]
        for view in changed:
            parts = []
            for key, shown in view.changes[:MAX_CHANGED_KEYS]:
                parts.append(code(key) + (f" {shown}" if shown else ""))
            if len(view.changes) > MAX_CHANGED_KEYS:
                parts.append(f"… {len(view.changes) - MAX_CHANGED_KEYS} more")
            if view.replace_reasons:
                parts.append(f"(replace on: {', '.join(code(r) for r in view.replace_reasons)})")
            what = "; ".join(parts) if parts else ("" if view.op in ("create", "delete") else "—")
            symbol = OP_SYMBOLS.get(view.op, "?")
            op = view.op if view.op in OP_SYMBOLS else text(view.op)
            lines.append(f"| `{symbol}` {op} | {code(view.name)} | {plain(view.type)} | {what} |")
    else:
        lines.append("No resource of the dev stack changes.")
    copy = preview.get("reviewCopy")
    hidden = copy.get("secretOnlyUpdates") if isinstance(copy, dict) else None
    if isinstance(hidden, int) and not isinstance(hidden, bool) and hidden > 0:
        lines += [
            "",
            f"_{hidden} update(s) that differ in secret values only are left out: this preview"
            f" ran against a copy of `{base}` without its secrets (scripts/review/devcopy.py),"
            " where no secret value can be compared._",
        ]
    errors = errors_of(preview)
    if errors:
        lines += ["", "The preview stopped with an error:", ""]
        lines += [f"> {text(e)}" for e in errors]
    return lines


def endpoint_section(c: ReviewComment) -> list[str]:
    """The endpoint and its curl. The curl is built only from values of their strict shape
    (SHAPES): a value that is not (a PR can make its outputs anything) gets no curl at all,
    and the comment names which output was refused, never shows it."""
    out = c.review_outputs
    lines = [f"### Endpoint of `{c.stack}`", ""]
    if not out.get("endpoint_url"):
        return [*lines, "_Not deployed (no `endpoint_url` output)._"]
    endpoint = shaped(out.get("endpoint_url"), "endpoint_url")
    model = shaped(out.get("served_model_name"), "served_model_name")
    token_id = shaped(out.get("proxy_token_id"), "proxy_token_id")
    key_name = shaped(c.key_name, "key_name")
    state = shaped(c.reader.state, "state") if c.reader.state else ""
    environment = shaped(out.get("environment"), "name") or c.stack
    if endpoint:
        lines.append(f"`{endpoint}` — Modal environment `{environment}`")
    services = _services(out)
    if len(services) > 1:
        lines.append("")
        for name, svc in sorted(services.items()):
            url = shaped(svc.get("endpoint_url"), "endpoint_url")
            served = shaped(svc.get("served_model_name"), "served_model_name")
            lines.append(
                f"- {code(name)}: {f'`{url}`' if url else '(no valid endpoint URL)'}"
                + (f" (`{served}`)" if served else "")
            )
    refused = [
        what
        for what, ok in (
            ("endpoint_url", endpoint),
            ("proxy_token_id", token_id),
            ("served_model_name", model),
            ("key name", key_name),
            ("state file", state is not None),
        )
        if not ok
    ]
    if refused or endpoint is None or token_id is None or model is None or key_name is None:
        return [
            *lines,
            "",
            f"_No curl: the review stack's {', '.join(f'`{r}`' for r in refused)} did not have"
            " the expected shape (an http(s) URL without spaces or control characters, names"
            " of letters, digits and `-`), so it is not shown here; see the deploy job's"
            " log._",
        ]
    reader = replace(c.reader, state=state or "")
    secret_cmd = reader.command("proxy_token_secret")
    keys_cmd = reader.command("api_keys", as_json=True)
    pick = shlex.quote(f"import json, sys; print(json.load(sys.stdin)[{json.dumps(key_name)}])")
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
        }
    )
    where = (
        "in the PR's checkout, with the stand-in's passphrase exported"
        if reader.kind == "standin"
        else "in a checkout of this repository, logged in to the review stacks' backend"
        f" (`pulumi login`), with `{c.stack}`'s passphrase exported"
    )
    lines += [
        "",
        f"Try it, {where}. The secrets are read from the stack into a private header file,"
        " never written here or on a command line; the first request cold-starts a container"
        " (the service scales to zero):",
        "",
        *fenced(
            "bash",
            [
                'umask 077 && H="$(mktemp)" && {',
                f"  printf 'Modal-Secret: %s\\n' \"$({secret_cmd})\"",
                f"  printf 'Authorization: Bearer %s\\n' \"$({keys_cmd} | python3 -c {pick})\"",
                '} > "$H"',
                "curl -sS --max-time 900"
                f" {shlex.quote(endpoint.rstrip('/') + '/v1/chat/completions')} \\",
                f'    -H {shlex.quote("Modal-Key: " + token_id)} -H @"$H"'
                " -H 'Content-Type: application/json' \\",
                f"    -d {shlex.quote(body)} \\",
                "    -w '\\nHTTP %{http_code}\\n'",
                'rm -f "$H"',
            ],
        ),
    ]
    return lines


def render(c: ReviewComment) -> str:
    """The whole comment (Markdown), starting with MARKER."""
    preview = c.preview
    old = c.dev_outputs
    if not old and preview is not None:
        old = old_outputs_of(preview)
    sha = shaped(c.head_sha, "head_sha")
    head = f" at `{sha[:12]}`" if sha else ""
    lines = [
        MARKER,
        f"## Review stack `{c.stack}`{head}",
        "",
    ]
    warnings = [w.replace("{stack}", f"`{c.base_stack}`") for w in warnings_of(preview or {})]
    if warnings:
        lines += [*warnings, ""]
    lines += endpoint_section(c)
    lines.append("")
    lines += cost_section(old, c.new_costs, c.base_stack)
    lines.append("")
    lines += diff_section(preview, c.base_stack)
    lines.append("")
    limit = number(c.spend_limit_usd)
    if limit is None:
        limit = number(c.review_outputs.get("monthly_budget_usd"))
    facts = [
        f"`{c.stack}` runs this PR's code in its own Modal environment, scaled to zero, with its"
        " own proxy token and API keys (nothing shared with dev)."
    ]
    if limit is not None:
        facts.append(
            f"Spend limit **{money(limit)}/month** (Modal's budget for the environment: its work"
            " stops when usage reaches it)."
        )
    days = number(c.sweep_days)
    if days and days > 0:
        facts.append(
            f"Closing or merging this PR destroys it; so does the nightly sweep once it has not"
            f" been deployed for {days:g} days."
        )
    else:
        facts.append("Closing or merging this PR destroys it.")
    lines.append(" ".join(facts))
    for note in c.notes:
        lines += ["", f"_{text(note)}_"]
    updated = shaped(c.updated_at, "updated_at")
    footer = [x for x in (c.engine_note, f"updated {updated}" if updated else "") if x]
    if footer:
        lines += ["", f"<sub>{' · '.join(footer)}</sub>"]
    return "\n".join(lines) + "\n"


def render_destroyed(pr: int, stack: str, *, reason: str, when: str = "") -> str:
    """The comment once the review stack is gone (closed/merged PR, or the nightly sweep)."""
    at = f" ({when})" if when else ""
    return (
        f"{MARKER}\n## Review stack `{stack}`: destroyed\n\n"
        f"`{stack}` and its Modal environment were destroyed{at}: {reason}. Nothing of it is"
        " left (environment, apps, secrets, volumes, proxy token, service user).\n"
    )


def render_skipped(pr: int, *, reason: str) -> str:
    return f"{MARKER}\n## No review stack for PR #{pr}\n\n{reason}\n"


def render_failed(pr: int, stack: str, *, what: str, run_url: str = "") -> str:
    """The comment when the deploy (or the teardown) failed: where to look, nothing else."""
    where = f" See the run: {run_url}" if run_url else ""
    return (
        f"{MARKER}\n## Review stack `{stack}`: {what} failed\n\n"
        f"{what.capitalize()} of PR #{pr}'s review stack failed.{where}\n"
    )


# ---- from the files of scripts/review_stack.py --------------------------------------------


def read_json(path: Path) -> Any:
    """A JSON file's value; None when the file does not exist; ValueError when it is
    unreadable (what a review stack's step left behind, or did not)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def from_files(
    src: Path,
    pr: int,
    *,
    closed: bool = False,
    reason: str = "",
    reader_python: str = ".venv/bin/python",
    base_stack: str = "dev",
    sweep_days: int | None = None,
    head_sha: str = "",
    failed: str = "",
    run_url: str = "",
) -> str:
    """The comment from what `plan` and `up` wrote to `src` (FILES); `closed`: the stack was
    destroyed (`reason` says why); `failed`: what failed (deploy, teardown)."""
    stack = f"pr-{pr}"
    if failed:
        return render_failed(pr, stack, what=failed, run_url=run_url)
    meta = read_json(src / FILES["meta"]) or {}
    if closed or not (src / FILES["outputs"]).exists():
        return render_destroyed(
            pr, stack, reason=reason or "the pull request was closed", when=_now()
        )
    kind = str(meta.get("engine") or "cli")
    engine_note = (
        "deployed by the Pulumi stand-in on the Modal emulator (NOT the Pulumi engine)"
        if kind == "standin"
        else "deployed with the Pulumi CLI"
    )
    if meta.get("flow") == "access":
        engine_note += f", as {stack}-deploy"
    comment = ReviewComment(
        pr=pr,
        stack=stack,
        preview=read_json(src / FILES["preview"]),
        new_costs=read_json(src / FILES["costs"]) or {},
        review_outputs=read_json(src / FILES["outputs"]) or {},
        dev_outputs=read_json(src / FILES["dev_outputs"]),
        reader=OutputReader(
            kind=kind, stack=stack, state=str(meta.get("state") or ""), python=reader_python
        ),
        base_stack=shaped(meta.get("base_stack"), "name") or base_stack,
        head_sha=str(meta.get("head_sha") or head_sha or ""),
        engine_note=engine_note,
        key_name=str(meta.get("key_name") or "gateway"),
        spend_limit_usd=meta.get("budget_usd"),
        sweep_days=meta.get("sweep_days") or sweep_days,
        updated_at=str(meta.get("updated_at") or ""),
    )
    return render(comment)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/review_comment.py",
        description="Render the review stack's PR comment from scripts/review_stack.py's files.",
    )
    parser.add_argument("--pr", type=int, required=True)
    parser.add_argument("--in-dir", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, help="default: stdout")
    parser.add_argument("--closed", action="store_true", help="the stack was destroyed")
    parser.add_argument("--reason", default="", help="with --closed: why")
    parser.add_argument("--failed", default="", help="what failed (deploy, teardown)")
    parser.add_argument("--run-url", default="", help="with --failed: the run to look at")
    parser.add_argument("--sweep-days", type=int)
    args = parser.parse_args(argv)
    try:
        text = from_files(
            args.in_dir,
            args.pr,
            closed=args.closed,
            reason=args.reason,
            sweep_days=args.sweep_days,
            failed=args.failed,
            run_url=args.run_url,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
