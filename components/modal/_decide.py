"""The release core: what an App release does next, decided from what was observed. No I/O.

Nothing here talks to Modal, reads a clock or a file, or imports modal or pulumi: every
function is a function of its arguments (tests/providers/test_33_release_core.py tables
them without the emulator). The effects (`_effects.py`) observe and act; the orchestration
(`_release.py`) runs observe -> decide -> apply.

```
  Observed (what Modal held before, what the publish left live, or why it is unknown)
      │  + the gate's Outcome (or none: the publish failed)
      ▼
  decide ──► Commit(version, record)            the release stands
         ──► RollBack(to vN)                    back to the last known-good version
         ──► UndoCreate(app, why)               stop what this release made
         ──► Stop(what, command)                end with what is live and what to run
```

What Modal holds about releases (the wire format, unchanged since issue 21):
- each deploy's deployment `tag` (modal 1.6.4 `deploy_app(tag=...)`, <= 50 chars, shown by
  `modal app history`) carries its spec and source digests: `spec.<12 hex>.src.<12 hex>`;
- each version's gate outcome is an App tag (`AppSetTags`/`AppGetTags`, modal 1.6.4
  `App.set_tags`/`get_tags`, keys and values <= 63 chars of `[A-Za-z0-9._-]`):
  `llm-iac.gate.v<N>` = `passed` | `failed` | `unverified` (a `Record`).
The last known-good version is the newest version recorded `passed`; a rollback never goes
to a version recorded `failed`. With no `passed` record (the gate was off, or records were
lost) the version that served before the release is the fallback, unless it failed its gate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ._rpc import Deployment
from .defaults import (
    GATE_TASK,
    GATE_TIMEOUT_S,
    MAX_RECORDS,
    MIN_STEP_S,
    ROLLBACK_MARGIN_S,
    SMOKE_REQUESTS,
)

RECORD_PREFIX = "llm-iac.gate.v"
PASSED, FAILED, UNVERIFIED = "passed", "failed", "unverified"
_TAG_RE = re.compile(r"^spec\.([0-9a-f]{12})\.src\.([0-9a-f]{12})$")


# ---- words and commands ----------------------------------------------------------------------


def deployment_tag(spec_digest: str, source_digest: str) -> str:
    """The deploy's `--tag`: what it ships, as digests (34 characters)."""
    return f"spec.{spec_digest[:12]}.src.{source_digest[:12]}"


def parse_deployment_tag(tag: str) -> tuple[str, str] | None:
    """(spec, source) digest prefixes of a tag we wrote; None for any other tag."""
    m = _TAG_RE.match(tag or "")
    return (m.group(1), m.group(2)) if m else None


def env_flag(env: str) -> str:
    return f" -e {env}" if env else ""


def rollback_command(name: str, env: str, version: int) -> str:
    """`modal app rollback` to `version`, ready to paste ("" without one)."""
    if not version:
        return ""
    return f"modal app rollback {name} v{version}" + env_flag(env)


def describe_target(props: Mapping[str, Any]) -> str:
    env = props.get("environment")
    return f"'{props.get('name')}' in environment '{env or '<default>'}'"


def smoke_words(task: str) -> str:
    """The smoke request of `task`, in words (an unknown task is a chat)."""
    return SMOKE_REQUESTS.get(task, SMOKE_REQUESTS[GATE_TASK])[1]


# ---- release records (structured; the wire format above) -----------------------------------


@dataclass(frozen=True)
class Record:
    """One version's gate outcome, as kept on the app: `llm-iac.gate.v<version>` = outcome."""

    version: int
    outcome: str

    @property
    def key(self) -> str:
        return f"{RECORD_PREFIX}{self.version}"

    @staticmethod
    def parse(key: str, value: str) -> Record | None:
        """The record an app tag holds (None: a tag that is not ours)."""
        if not (key.startswith(RECORD_PREFIX) and key[len(RECORD_PREFIX) :].isdigit()):
            return None
        return Record(int(key[len(RECORD_PREFIX) :]), str(value))


def records_of(tags: Mapping[str, str]) -> dict[int, str]:
    """{version: outcome} of every release record among `tags`."""
    found = (Record.parse(k, v) for k, v in tags.items())
    return {r.version: r.outcome for r in found if r is not None}


def with_records(current: Mapping[str, str], records: Mapping[int, str]) -> dict[str, str]:
    """`current` tags with `records` added, ours bounded to MAX_RECORDS (+ the newest
    passed); tags that are not ours pass through untouched."""
    ours = records_of(current)
    others = {k: str(v) for k, v in current.items() if Record.parse(k, v) is None}
    ours.update(records)
    newest = sorted(ours, reverse=True)
    keep = newest[:MAX_RECORDS]
    passed = [v for v in newest if ours[v] == PASSED][:1]
    return {**others, **{Record(v, ours[v]).key: ours[v] for v in {*keep, *passed}}}


@dataclass(frozen=True)
class Releases:
    """What Modal holds about an app's releases: its deployment history and tags."""

    app_id: str
    deployments: tuple[Deployment, ...]
    tags: Mapping[str, str]

    def live(self) -> Deployment | None:
        """The version serving now: the newest deployment (a rollback is a new one)."""
        return self.deployments[-1] if self.deployments else None

    def version(self) -> int:
        live = self.live()
        return live.version if live else 0

    def get(self, version: int) -> Deployment | None:
        return next((d for d in self.deployments if d.version == version), None)

    def outcome(self, version: int) -> str:
        return str(self.tags.get(Record(version, "").key, ""))

    def effective_tag(self, version: int) -> str:
        """The tag of what `version` runs: a rollback runs the version it went back to."""
        seen: set[int] = set()
        d = self.get(version)
        while d is not None and d.rollback_version and d.version not in seen:
            seen.add(d.version)
            if parse_deployment_tag(d.tag):
                return d.tag
            d = self.get(d.rollback_version)
        return d.tag if d is not None else ""

    def records(self) -> dict[int, str]:
        """{version: outcome} of every release record on the app."""
        return records_of(self.tags)

    def known_good(self) -> int:
        """The newest version recorded as having passed its gate (0: none)."""
        good = [d.version for d in self.deployments if self.outcome(d.version) == PASSED]
        return max(good) if good else 0

    def rollback_target(self) -> int:
        """Where a failed release goes back to: the last known-good version, else the one
        serving now unless it failed its gate (0: nowhere)."""
        good = self.known_good()
        if good:
            return good
        live = self.version()
        return live if live and self.outcome(live) != FAILED else 0

    def runs(self, tag: str) -> bool:
        """The live version runs the release tagged `tag` (a lost earlier publish of it)."""
        return bool(self.version()) and self.effective_tag(self.version()) == tag


def is_new(before: Releases | None, app_id: str, version: int) -> bool:
    """A publish made something new: nothing served before, another app, or a newer version."""
    return before is None or app_id != before.app_id or version > before.version()


@dataclass(frozen=True)
class Published:
    """What a publish left live: the app, its newest version, and whether it is new."""

    app_id: str
    version: int
    deployed_at: float
    web_url: str
    new: bool
    tag: str
    commit: str


# ---- the gate's outcome and the sentence of it --------------------------------------------


@dataclass(frozen=True)
class GateOutcome:
    """What the gate found. `stage` names where it stopped: passed, containers, crash-loop,
    ready, smoke, no-url, error (the gate itself or Modal failed); off (no gate) and
    unchanged (the version had passed before) when the gate did not run."""

    ok: bool
    stage: str
    reason: str
    seconds: float
    #: Refused because a deadline ran out (not because of what the version answered).
    timed_out: bool = False


@dataclass(frozen=True)
class Verdict:
    """What the `gate_result` output says, as data: how `version` stands (`stage`: passed,
    off, unchanged by a release; passed/failed/unverified/unrecorded read from the app's
    record by a refresh; stopped/missing when nothing serves)."""

    stage: str
    version: int = 0
    seconds: float = 0.0
    task: str = GATE_TASK
    read_by_refresh: bool = False


def gate_result(v: Verdict) -> str:
    """The `gate_result` output: the one place its sentence is written."""
    if v.stage in ("stopped", "missing"):
        return f"{v.stage}: nothing serves (read by refresh)"
    if v.read_by_refresh:
        if v.stage == "unrecorded":
            return f"unrecorded: v{v.version} has no release record (deployed outside Pulumi?)"
        return f"{v.stage}: v{v.version} (the release record on the app)"
    if v.stage == "off":
        what = f"v{v.version} not verified" if v.version else "not verified"
        return f"off: health_gate is false, {what}"
    if v.stage == "unchanged":
        return f"unchanged: v{v.version} (nothing new to publish) had passed its gate"
    return f"passed: v{v.version} answered /ready and {smoke_words(v.task)} in {v.seconds:.1f} s"


# ---- the policy: the release's knobs, from its inputs ---------------------------------------


def startup_budget(props: Mapping[str, Any]) -> float:
    """The service's start-up budget in seconds, `timeouts.startup_s` of the rendered spec
    (0: the spec has none). Read from the JSON only: this package never imports serving/."""
    try:
        spec = json.loads(str(props.get("spec_json") or ""))
        value = spec["timeouts"]["startup_s"]
    except (ValueError, KeyError, TypeError):
        return 0.0
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else 0.0


def custom_timeout(props: Mapping[str, Any], action: str) -> float:
    """The resource's customTimeouts for `action` in seconds (0: not set)."""
    timeouts = props.get("custom_timeouts")
    if not isinstance(timeouts, Mapping):
        return 0.0
    value = timeouts.get(action)
    try:
        return max(float(value), 0.0) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class Policy:
    """One release's knobs, all read from its inputs (see `policy`)."""

    name: str
    env: str
    action: str
    #: The deployment tag: the digests of what this release ships.
    tag: str
    label: str
    gate_on: bool
    task: str
    #: The gate's whole deadline (start-up + request, halved by customTimeouts).
    gate_deadline: float
    #: The wait for the first `/ready` 200 (the start-up budget, within the deadline).
    ready_s: float
    #: What a refused release may spend rolling back.
    rollback_margin: float
    #: A failed release of an app that served before is rolled back, never stopped.
    keep_on_failure: bool = False


def policy(
    props: Mapping[str, Any],
    action: str,
    digests: Mapping[str, str],
    *,
    keep_on_failure: bool = False,
) -> Policy:
    """The release's knobs. customTimeouts (Pulumi's resource option) bound the whole step:
    half for the gate, the rest (less MIN_STEP_S) for a rollback and its re-check. A version
    that never gets ready is refused once its start-up budget is spent (the gate's budget is
    start-up + request: it bounds a version that got ready). The rollback gets the fixed
    ROLLBACK_MARGIN_S, printed when the gate starts, whatever the gate's own budget."""
    budget = float(props.get("health_gate_timeout_s") or GATE_TIMEOUT_S)
    limit = custom_timeout(props, action)
    deadline = min(budget, limit / 2) if limit else budget
    startup = startup_budget(props)
    margin = min(ROLLBACK_MARGIN_S, limit / 2 - MIN_STEP_S) if limit else ROLLBACK_MARGIN_S
    return Policy(
        name=str(props["name"]),
        env=str(props.get("environment") or ""),
        action=action,
        tag=deployment_tag(digests["spec_digest"], digests["source_digest"]),
        label=describe_target(props),
        gate_on=bool(props.get("health_gate")),
        task=str(props.get("gate_task") or GATE_TASK),
        gate_deadline=deadline,
        ready_s=min(startup, deadline) if startup else deadline,
        rollback_margin=max(margin, MIN_STEP_S),
        keep_on_failure=keep_on_failure,
    )


# ---- what was observed, and what to do -------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """What the release saw. `before`: the app serving under the name before (None: none);
    `published`: what the publish left live (None: nothing new found after a failed
    publish, or it could not be looked for: `look_error`); `read_error`: the publish
    answered but what it left live could not be read back."""

    policy: Policy
    before: Releases | None = None
    published: Published | None = None
    publish_error: str = ""
    look_error: str = ""
    read_error: str = ""

    @property
    def pre(self) -> int:
        """The version serving before the release (0: none)."""
        return self.before.version() if self.before else 0

    @property
    def target(self) -> int:
        """Where a failed release goes back to (0: nowhere)."""
        return self.before.rollback_target() if self.before else 0


@dataclass(frozen=True)
class Commit:
    """The release stands: record `record` for `version` ("" records nothing: what is live
    could not be read), outputs say what is live."""

    version: int
    record: str
    known_good: int
    #: The rollback line of the outputs: back to the known-good version before this release.
    rollback_to: int
    verdict: Verdict


@dataclass(frozen=True)
class RollBack:
    """The published version failed its gate: record it failed, roll back to `to`."""

    to: int
    failed: int


@dataclass(frozen=True)
class UndoCreate:
    """Stop what this release made: the app `app_id`, or (`app_id` "") whatever is deployed
    under the name after a failed create publish; `failed`: the version to record failed."""

    app_id: str
    why: str = ""
    failed: int = 0


@dataclass(frozen=True)
class Stop:
    """End the release with an error: `what` happened and what is live, in words that name
    the `command` the user must run to settle it ("" when nothing is left to do by hand);
    `failed`: the version to record failed first (0: none)."""

    what: str
    command: str = ""
    failed: int = 0


Decision = Commit | RollBack | UndoCreate | Stop


def skip_gate(observed: Observed) -> GateOutcome | None:
    """The outcome of a release the gate need not (or cannot) look at; None: run the gate."""
    published, p = observed.published, observed.policy
    if observed.read_error:
        return GateOutcome(False, "error", observed.read_error, 0.0)
    if not p.gate_on:
        return GateOutcome(True, "off", "health_gate is off: not verified", 0.0)
    if published is None:
        return None
    before = observed.before
    if not published.new and before is not None and before.outcome(published.version) == PASSED:
        return GateOutcome(True, "unchanged", f"v{published.version} already passed its gate", 0.0)
    if not published.version:
        return GateOutcome(False, "error", "the published version could not be read", 0.0)
    return None


def decide(observed: Observed, outcome: GateOutcome | None) -> Decision:
    """What the release does next (see the module docstring)."""
    p, before, published = observed.policy, observed.before, observed.published
    pre, target = observed.pre, observed.target
    if published is None:
        return _after_failed_publish(observed)
    v = published.version
    if observed.read_error and not p.gate_on:
        # Nothing is verified anyway: Modal completed the deploy, so the release stands;
        # `read_back_error` says what is unknown (issue 11.5).
        return Commit(v, "", 0, target, Verdict("off"))
    if outcome is not None and outcome.ok:
        record = PASSED if (p.gate_on or outcome.stage == "unchanged") else UNVERIFIED
        good = v if record == PASSED else (before.known_good() if before else 0)
        verdict = Verdict(outcome.stage, v, outcome.seconds, p.task)
        return Commit(v, record, good, target if target != v else 0, verdict)
    if not published.new:
        return Stop(
            f"Nothing new was published: v{v} is what served before this release; left as it"
            " is (now recorded as failed, so no rollback goes to it).",
            failed=v,
        )
    if not p.keep_on_failure or (before is not None and published.app_id != before.app_id):
        return UndoCreate(published.app_id, failed=v)
    if target and target != v:
        return RollBack(target, failed=v)
    return UndoCreate(
        published.app_id, why=f"no earlier version passed its gate (v{pre})", failed=v
    )


def _after_failed_publish(observed: Observed) -> Decision:
    """The publish failed and looking again found nothing new (or could not look)."""
    p, name, flag = observed.policy, observed.policy.name, env_flag(observed.policy.env)
    error = observed.publish_error
    if observed.look_error:
        if observed.before is None:
            stop = f"modal app stop {name}{flag}"
            return Stop(
                f"{error} Whether it reached Modal could not be checked ({observed.look_error}):"
                f" look for it with `modal app list{flag}` and stop it (`{stop}`) before"
                " rerunning.",
                command=stop,
            )
        undo = rollback_command(name, p.env, observed.target) or f"modal app stop {name}"
        return Stop(
            f"{error} Whether it published a new version could not be checked"
            f" ({observed.look_error}): run `modal app history {name}{flag}`; if a version newer"
            f" than v{observed.pre} is there, it passed no gate: `{undo}`.",
            command=undo,
        )
    if observed.before is None:
        return UndoCreate("")
    return Stop(
        f"{error} Nothing was published: v{observed.pre} (checked in Modal's history just now)"
        " keeps serving."
    )


def recheck_record(check: GateOutcome) -> str:
    """The record of the known-good version re-checked after a rollback: it answered again
    (passed), ran out of the margin (unverified: a cold start may take longer), or did not."""
    return PASSED if check.ok else (UNVERIFIED if check.timed_out else FAILED)


@dataclass
class Timeline:
    """Where a release's time went (seconds), for the progress lines and the error."""

    started: float
    published: float = 0.0
    gate: float = 0.0
    ready_s: float = 0.0
    stage: str = ""
    rollback: float = 0.0
    margin: float = 0.0
    rollback_what: str = ""

    def line(self, ended: float) -> str:
        """`Timeline: publish 1.2 s | waiting for ready 20.1 s (...) | refused | rollback ...`."""
        parts = [f"publish {self.published:.1f} s"]
        ready = f" (start-up budget {self.ready_s:g} s: timeouts.startup_s)" if self.ready_s else ""
        parts.append(f"waiting for ready {self.gate:.1f} s{ready}")
        parts.append(f"refused ({self.stage})" if self.stage else "passed")
        if self.rollback_what:
            parts.append(
                f"{self.rollback_what} {self.rollback:.1f} s (rollback margin {self.margin:g} s)"
            )
        return f"Timeline: {' | '.join(parts)} | {ended - self.started:.1f} s in all."


@dataclass(frozen=True)
class ReleaseResult:
    """What a release says about itself: the App's release outputs (`outputs()`)."""

    app_id: str
    version: int
    previous_version: int
    known_good_version: int
    deployment_tag: str
    commit: str
    verdict: Verdict
    gate_seconds: float
    rollback_command: str
    web_url: str
    read_back_error: str = ""

    def outputs(self) -> dict[str, Any]:
        """Each field under its own name, but the verdict as its `gate_result` sentence."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "verdict"}
        out["gate_seconds"] = round(self.gate_seconds, 3)
        return {**out, "gate_result": gate_result(self.verdict)}
